"""The HTTP layer through a WSGI test client: envelope, bad input, decisions, scope."""

from __future__ import annotations

import copy
import io
import json
import logging
from typing import Any

import jsonpatch
import pytest
from prometheus_client.parser import text_string_to_metric_families
from werkzeug.test import Client

from webhook.policy_store import PolicyStore
from webhook.server import admission
from webhook.server import metrics as server_metrics
from webhook.server.app import create_app
from webhook.server.metrics import AdmissionMetrics

from .support import annotated_pod, decoded_patch, plain_pod, review, share_counting_policies

UID = "0a1b2c3d-0000-4000-8000-000000000001"


def post(client: Client, path: str, payload: Any) -> tuple[int, dict[str, Any]]:
    response = client.post(path, data=json.dumps(payload), content_type="application/json")
    assert response.mimetype == "application/json"
    return response.status_code, response.get_json()


def assert_envelope(body: dict[str, Any], uid: str = UID) -> dict[str, Any]:
    assert body["apiVersion"] == "admission.k8s.io/v1"
    assert body["kind"] == "AdmissionReview"
    response: dict[str, Any] = body["response"]
    assert response["uid"] == uid
    assert ("patch" in response) == ("patchType" in response)
    return response


# -- decisions ------------------------------------------------------------------------------


def test_annotated_pod_is_patched_and_the_patch_applies(client: Client) -> None:
    pod = annotated_pod("0.5")
    status, body = post(client, "/mutate", review(pod))
    assert status == 200
    response = assert_envelope(body)
    assert response["allowed"] is True
    assert response["patchType"] == "JSONPatch"
    patched = jsonpatch.apply_patch(pod, decoded_patch(response))
    limits = patched["spec"]["containers"][0]["resources"]["limits"]
    requests = patched["spec"]["containers"][0]["resources"]["requests"]
    assert limits["nvidia.com/gpu.shared"] == requests["nvidia.com/gpu.shared"] == "1"


def test_mutating_the_mutated_pod_yields_no_patch(client: Client) -> None:
    pod = annotated_pod("0.25")
    _, first = post(client, "/mutate", review(pod))
    mutated = jsonpatch.apply_patch(pod, decoded_patch(first["response"]))
    _, second = post(client, "/mutate", review(mutated))
    response = assert_envelope(second)
    assert response["allowed"] is True
    assert "patch" not in response and "patchType" not in response


def test_dry_run_gets_the_same_answer(client: Client) -> None:
    pod = annotated_pod("0.5")
    _, real = post(client, "/mutate", review(pod))
    _, dry = post(client, "/mutate", review(pod, dry_run=True))
    assert dry["response"] == real["response"]


def test_policy_violation_is_denied_with_200_and_status(client: Client) -> None:
    status, body = post(client, "/mutate", review(annotated_pod("0.9")))
    assert status == 200
    response = assert_envelope(body)
    assert response["allowed"] is False
    assert response["status"]["code"] in (403, 422)
    assert "0.9" in response["status"]["message"]
    assert "patch" not in response


@pytest.mark.parametrize("fraction", [str(2**64), "9" * 5000])
def test_huge_fractions_are_denied_not_errors(client: Client, fraction: str) -> None:
    """A value no real pod carries is a 422 denial, never a 5xx that failurePolicy Ignore
    would turn into an unmutated pod."""
    for path in ("/mutate", "/validate"):
        status, body = post(client, path, review(annotated_pod(fraction)))
        response = assert_envelope(body)
        assert status == 200 and response["allowed"] is False
        assert response["status"]["code"] == 422


def test_unreadable_fraction_is_denied_with_a_message(client: Client) -> None:
    _, body = post(client, "/mutate", review(annotated_pod("half")))
    response = assert_envelope(body)
    assert response["allowed"] is False
    assert "half" in response["status"]["message"]


def test_pod_without_annotation_is_allowed_unchanged(client: Client) -> None:
    _, body = post(client, "/mutate", review(plain_pod()))
    response = assert_envelope(body)
    assert response == {"uid": UID, "allowed": True}


def test_validate_accepts_what_mutate_produced(client: Client) -> None:
    pod = annotated_pod("0.5")
    _, mutated_answer = post(client, "/mutate", review(pod))
    mutated = jsonpatch.apply_patch(pod, decoded_patch(mutated_answer["response"]))
    status, body = post(client, "/validate", review(mutated))
    assert status == 200
    assert assert_envelope(body) == {"uid": UID, "allowed": True}


def test_validate_denies_a_pod_whose_injected_limits_were_removed(client: Client) -> None:
    pod = annotated_pod("0.5")
    _, mutated_answer = post(client, "/mutate", review(pod))
    tampered = jsonpatch.apply_patch(pod, decoded_patch(mutated_answer["response"]))
    # python:3.11 runs no framework, so it gets no framework env: take the pool's selector.
    del tampered["spec"]["nodeSelector"]
    _, body = post(client, "/validate", review(tampered))
    response = assert_envelope(body)
    assert response["allowed"] is False
    assert response["status"]["code"] == 403
    assert "changed afterwards" in response["status"]["message"]


def test_validate_denies_a_direct_shared_resource_request(client: Client) -> None:
    pod = plain_pod()
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu.shared"] = "1"
    _, body = post(client, "/validate", review(pod))
    response = assert_envelope(body)
    assert response["allowed"] is False
    assert "gpu-fraction" in response["status"]["message"]


def test_validate_never_sends_a_patch(client: Client) -> None:
    _, body = post(client, "/validate", review(annotated_pod("0.5")))
    response = assert_envelope(body)
    assert "patch" not in response


def test_warnings_are_short(client: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    from webhook.core.verdict import Verdict

    def noisy(pod: Any, namespace: str, policies: Any) -> Verdict:
        return Verdict(True, warnings=("x" * 300, "short note", "tab\there"))

    monkeypatch.setitem(admission.CORE_DECISIONS, admission.Endpoint.MUTATE, noisy)
    _, body = post(client, "/mutate", review(annotated_pod()))
    warnings = assert_envelope(body)["warnings"]
    assert all(len(warning) < 120 for warning in warnings)
    assert warnings[1:] == ["short note", "tab here"]


# -- scope ----------------------------------------------------------------------------------


@pytest.mark.parametrize("operation", ["UPDATE", "DELETE", "CONNECT"])
def test_only_create_is_mutated(client: Client, operation: str) -> None:
    _, body = post(client, "/mutate", review(annotated_pod(), operation=operation))
    assert assert_envelope(body) == {"uid": UID, "allowed": True}


def test_other_kinds_are_allowed_unchanged(client: Client) -> None:
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}}
    payload = review(deployment, kind=("apps", "v1", "Deployment"), resource="deployments")
    _, body = post(client, "/mutate", payload)
    assert assert_envelope(body) == {"uid": UID, "allowed": True}


def test_pod_subresources_are_allowed_unchanged(client: Client) -> None:
    payload = review(annotated_pod(), subResource="binding")
    _, body = post(client, "/mutate", payload)
    assert assert_envelope(body) == {"uid": UID, "allowed": True}


@pytest.mark.parametrize("namespace", ["kube-system", "gpushare-system"])
def test_excluded_namespaces_are_skipped(client: Client, namespace: str) -> None:
    pod = annotated_pod(namespace=namespace)
    _, body = post(client, "/mutate", review(pod, namespace=namespace))
    response = assert_envelope(body)
    assert response["allowed"] is True and "patch" not in response
    assert response["warnings"] == [
        f"gpu-fraction ignored: namespace {namespace!r} is excluded from GPU sharing"
    ]


def test_namespace_comes_from_the_request(client: Client) -> None:
    pod = annotated_pod(namespace="ml")  # the object may claim any namespace, or none
    _, body = post(client, "/mutate", review(pod, namespace="kube-system"))
    response = assert_envelope(body)
    assert response["allowed"] is True and "patch" not in response


def test_mirror_pods_are_skipped(client: Client) -> None:
    pod = annotated_pod()
    pod["metadata"]["annotations"]["kubernetes.io/config.mirror"] = "abc123"
    for path in ("/mutate", "/validate"):
        _, body = post(client, path, review(pod))
        assert assert_envelope(body) == {"uid": UID, "allowed": True}


# -- bad input --------------------------------------------------------------------------------


def error_of(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status
    assert response.mimetype == "application/json"
    body = response.get_json()
    assert body["apiVersion"] == "admission.k8s.io/v1" and body["kind"] == "AdmissionReview"
    result: dict[str, Any] = body["response"]
    assert result["allowed"] is False
    assert result["status"]["code"] == status
    assert result["status"]["message"]
    return result


@pytest.mark.parametrize("path", ["/mutate", "/validate"])
def test_empty_body_is_400(client: Client, path: str) -> None:
    error = error_of(client.post(path, data=b"", content_type="application/json"), 400)
    assert "empty" in error["status"]["message"]


def test_invalid_json_is_400(client: Client) -> None:
    response = client.post("/mutate", data=b'{"apiVersion": ', content_type="application/json")
    assert "not valid JSON" in error_of(response, 400)["status"]["message"]


@pytest.mark.parametrize("content_type", ["text/plain", "application/yaml", None])
def test_wrong_content_type_is_415(client: Client, content_type: str | None) -> None:
    data = json.dumps(review(annotated_pod())).encode()
    response = client.post("/mutate", data=data, content_type=content_type)
    error_of(response, 415)


def test_content_type_parameters_are_accepted(client: Client) -> None:
    data = json.dumps(review(annotated_pod())).encode()
    response = client.post("/mutate", data=data, content_type="application/json; charset=utf-8")
    assert response.status_code == 200


@pytest.mark.parametrize("body", ["[]", '"review"', "42", "null"])
def test_non_object_body_is_400(client: Client, body: str) -> None:
    error_of(client.post("/mutate", data=body, content_type="application/json"), 400)


def test_missing_request_is_400(client: Client) -> None:
    payload = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}
    error = error_of(client.post("/mutate", json=payload), 400)
    assert "no request" in error["status"]["message"]


@pytest.mark.parametrize("request_value", [None, [], "x", 3])
def test_non_object_request_is_400(client: Client, request_value: Any) -> None:
    payload = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}
    payload["request"] = request_value
    error_of(client.post("/mutate", json=payload), 400)


@pytest.mark.parametrize(
    ("api_version", "kind"),
    [
        ("admission.k8s.io/v1beta1", "AdmissionReview"),
        ("admission.k8s.io/v1", "Pod"),
        (None, None),
    ],
)
def test_wrong_version_or_kind_is_400_with_uid(
    client: Client, api_version: str | None, kind: str | None
) -> None:
    payload = review(annotated_pod())
    payload["apiVersion"], payload["kind"] = api_version, kind
    error = error_of(client.post("/mutate", json=payload), 400)
    assert error["uid"] == UID
    assert "admission.k8s.io/v1" in error["status"]["message"]


@pytest.mark.parametrize("uid", [None, "", 7])
def test_missing_uid_is_400(client: Client, uid: Any) -> None:
    payload = review(annotated_pod())
    payload["request"]["uid"] = uid
    error_of(client.post("/mutate", json=payload), 400)


@pytest.mark.parametrize(
    ("field", "value"),
    [("object", "pod"), ("object", [1]), ("kind", "Pod"), ("operation", 5), ("dryRun", "yes")],
)
def test_non_object_fields_are_400_with_uid(client: Client, field: str, value: Any) -> None:
    payload = review(annotated_pod())
    payload["request"][field] = value
    error = error_of(client.post("/mutate", json=payload), 400)
    assert error["uid"] == UID


def test_pod_create_without_object_is_400(client: Client) -> None:
    error = error_of(client.post("/mutate", json=review(None)), 400)
    assert error["uid"] == UID


def test_body_over_the_cap_is_413_by_content_length(store: PolicyStore) -> None:
    app = create_app(store, max_body_bytes=1024)
    data = json.dumps(review(annotated_pod(), padding="x" * 2000)).encode()
    error_of(Client(app).post("/mutate", data=data, content_type="application/json"), 413)


def test_body_over_the_cap_is_413_without_content_length(store: PolicyStore) -> None:
    """A chunked body (no Content-Length) is cut off at the cap, not read to its end."""

    class EndlessBody(io.RawIOBase):
        def __init__(self) -> None:
            self.served = 0

        def readable(self) -> bool:
            return True

        def readinto(self, buffer: Any) -> int:
            buffer[:] = b"x" * len(buffer)
            self.served += len(buffer)
            return len(buffer)

    endless = EndlessBody()
    app = create_app(store, max_body_bytes=100_000)
    environ = {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": "/mutate",
        "SERVER_NAME": "localhost",
        "SERVER_PORT": "443",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "wsgi.url_scheme": "https",
        "CONTENT_TYPE": "application/json",
        "HTTP_TRANSFER_ENCODING": "chunked",
        "wsgi.input": endless,
        "wsgi.input_terminated": True,  # gunicorn sets it: the server ends chunked bodies
        "wsgi.errors": io.StringIO(),
    }
    statuses: list[str] = []
    body = b"".join(app(environ, lambda status, headers: statuses.append(status)))
    assert statuses == ["413 Request Entity Too Large"]
    assert json.loads(body)["response"]["status"]["code"] == 413
    assert endless.served <= 100_000 + 64 * 1024


def test_default_cap_admits_a_3_mib_review(client: Client) -> None:
    payload = review(annotated_pod())
    payload["request"]["object"]["metadata"]["annotations"]["big"] = "x" * (3 * 1024 * 1024)
    status, _ = post(client, "/mutate", payload)
    assert status == 200


# -- internal errors and missing policies ----------------------------------------------------


def test_core_exception_is_500_with_uid(client: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(pod: Any, namespace: str, policies: Any) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setitem(admission.CORE_DECISIONS, admission.Endpoint.MUTATE, broken)
    error = error_of(client.post("/mutate", json=review(annotated_pod())), 500)
    assert error["uid"] == UID
    assert "boom" not in error["status"]["message"]  # internals stay in the log


def test_failure_outside_the_core_is_a_json_500(
    client: Client,
    monkeypatch: pytest.MonkeyPatch,
    admission_log_stream: io.StringIO,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A failure in the admission layer itself (here: reading the body) is still enveloped."""
    from webhook.server import endpoint as endpoint_module

    def broken(environ: object, max_body_bytes: int) -> bytes:
        raise ConnectionResetError("client went away")

    caplog.set_level(logging.INFO, logger="gpushare.admission")
    monkeypatch.setattr(endpoint_module, "read_body", broken)
    error = error_of(client.post("/mutate", json=review(annotated_pod())), 500)
    assert "went away" not in error["status"]["message"]
    (line,) = [json.loads(line) for line in admission_log_stream.getvalue().splitlines()]
    assert line["decision"] == "error" and line["status"] == 500


def test_no_policies_loaded_is_503(tmp_path: Any) -> None:
    broken = tmp_path / "policies"
    broken.mkdir()
    (broken / "bad.yaml").write_text("kind: GpuSharingPolicy\n")
    app = create_app(PolicyStore.loaded(broken))
    client = Client(app)
    error = error_of(client.post("/mutate", json=review(annotated_pod())), 503)
    assert error["uid"] == UID
    assert client.get("/readyz").status_code == 503
    # Out-of-scope requests need no policies.
    assert (
        client.post("/mutate", json=review(annotated_pod(), operation="DELETE")).status_code == 200
    )


@pytest.mark.parametrize(
    ("method", "path", "status", "reason", "hint"),
    [
        ("GET", "/mutate", 405, "MethodNotAllowed", "use POST"),
        ("POST", "/nope", 404, "NotFound", "/mutate"),
        ("POST", "/healthz", 405, "MethodNotAllowed", "use GET"),
    ],
)
def test_unknown_routes_answer_json(
    client: Client, method: str, path: str, status: int, reason: str, hint: str
) -> None:
    error = error_of(client.open(path, method=method), status)
    assert error["status"]["reason"] == reason
    assert hint in error["status"]["message"]


def test_head_is_answered_like_get(client: Client) -> None:
    assert client.open("/healthz", method="HEAD").status_code == 200


# -- logs, health, metrics ------------------------------------------------------------------


def test_one_json_log_line_per_admission(
    client: Client, admission_log_stream: io.StringIO, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gpushare.admission")
    post(client, "/mutate", review(annotated_pod(), uid="u-1"))
    post(client, "/validate", review(plain_pod(), uid="u-2"))
    client.post("/mutate", data=b"{", content_type="application/json")
    lines = [json.loads(line) for line in admission_log_stream.getvalue().splitlines()]
    assert len(lines) == 3
    first, second, third = lines
    assert first["uid"] == "u-1" and first["namespace"] == "ml" and first["pod"] == "trainer-"
    assert first["decision"] == "patched" and first["endpoint"] == "mutate"
    assert first["policy"] == "default" and first["duration_ms"] >= 0
    assert second["decision"] == "allowed" and second["endpoint"] == "validate"
    assert third["decision"] == "rejected" and third["level"] == "warning"


def test_healthz(client: Client) -> None:
    assert client.get("/healthz").get_json() == {"status": "ok"}


def test_readyz_reports_policies(client: Client) -> None:
    response = client.get("/readyz")
    assert response.status_code == 200
    body = response.get_json()
    assert body["ready"] is True
    assert body["policies"]["loaded"] is True
    assert body["policies"]["count"] == 1
    assert body["policies"]["last_reload_failed_at"] is None
    assert set(body["policies"]) == {
        "loaded",
        "count",
        "loaded_at",
        "reloads_ok",
        "reloads_failed",
        "last_reload_failed_at",
    }


def test_metrics_count_requests_by_endpoint_and_outcome(client: Client) -> None:
    post(client, "/mutate", review(annotated_pod()))
    post(client, "/mutate", review(annotated_pod("0.9")))
    post(client, "/validate", review(plain_pod()))
    client.post("/mutate", data=b"", content_type="application/json")
    text = client.get("/metrics").get_data(as_text=True)
    assert 'gpushare_admission_requests_total{endpoint="mutate",outcome="patched"} 1.0' in text
    assert 'gpushare_admission_requests_total{endpoint="mutate",outcome="denied"} 1.0' in text
    assert 'gpushare_admission_requests_total{endpoint="validate",outcome="allowed"} 1.0' in text
    assert 'gpushare_admission_requests_total{endpoint="mutate",outcome="rejected"} 1.0' in text
    assert 'gpushare_admission_duration_seconds_count{endpoint="mutate"} 3.0' in text
    assert 'gpushare_policy_reloads_total{result="failed"} 0.0' in text
    assert "gpushare_policies_loaded 1.0" in text


# -- showback: shares admitted per namespace ---------------------------------------------------

SHARES = "gpushare_admitted_milligpus_total"


def admitted_shares(client: Client) -> dict[tuple[str, str], float]:
    """The showback counter's samples, by (namespace, policy)."""
    found = {}
    for family in text_string_to_metric_families(client.get("/metrics").get_data(as_text=True)):
        for sample in family.samples:
            if sample.name == SHARES:
                found[(sample.labels["namespace"], sample.labels["policy"])] = sample.value
    return found


@pytest.fixture
def share_client(tmp_path: Any, metrics: AdmissionMetrics) -> Client:
    """The bundled policy with quota.shareResource on."""
    store = PolicyStore.loaded(share_counting_policies(tmp_path / "policies"))
    return Client(create_app(store, metrics=metrics))


def test_admitted_shares_count_by_namespace_and_policy(share_client: Client) -> None:
    _, body = post(share_client, "/mutate", review(annotated_pod("0.5")))
    assert body["response"]["patchType"] == "JSONPatch"
    assert admitted_shares(share_client) == {("ml", "default"): 500.0}
    # A pool of quarters: 0.25 holds 250; another namespace has a series of its own.
    post(share_client, "/mutate", review(annotated_pod("0.25")))
    post(share_client, "/mutate", review(annotated_pod("0.5"), namespace="team-b"))
    assert admitted_shares(share_client) == {("ml", "default"): 750.0, ("team-b", "default"): 500.0}


def test_dry_runs_denials_and_validation_add_no_shares(share_client: Client) -> None:
    _, dry = post(share_client, "/mutate", review(annotated_pod("0.5"), dry_run=True))
    assert dry["response"]["patchType"] == "JSONPatch"  # the same answer, not counted
    post(share_client, "/mutate", review(annotated_pod("0.9")))  # denied: over the max
    post(share_client, "/validate", review(annotated_pod("0.5")))
    post(share_client, "/mutate", review(plain_pod()))  # no annotation: skipped
    assert admitted_shares(share_client) == {}


def test_a_policy_without_a_quota_section_adds_no_shares(client: Client) -> None:
    _, body = post(client, "/mutate", review(annotated_pod("0.5")))
    assert body["response"]["patchType"] == "JSONPatch"
    assert admitted_shares(client) == {}
    assert SHARES + "{" not in client.get("/metrics").get_data(as_text=True)


def test_admitted_share_series_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server_metrics, "MAX_SHARE_SERIES", 2)
    metrics = AdmissionMetrics()
    for namespace in ("a", "b", "c", "d", "a"):
        metrics.observe_admitted_share(namespace, "p", 100)
    metrics.observe_admitted_share("e", "q", 7)
    values = {
        (sample.labels["namespace"], sample.labels["policy"]): sample.value
        for sample in metrics.admitted_milli_gpus.collect()[0].samples
        if sample.name == SHARES
    }
    # The first two namespaces keep their own series; the rest sum under "_other", per policy.
    assert values == {
        ("a", "p"): 200.0,
        ("b", "p"): 100.0,
        ("_other", "p"): 200.0,
        ("_other", "q"): 7.0,
    }


def test_request_object_is_not_modified(client: Client) -> None:
    payload = review(annotated_pod())
    before = copy.deepcopy(payload)
    post(client, "/mutate", payload)
    assert payload == before


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("metadata",), True, "request.object.metadata must be an object"),
        (("metadata", "annotations"), ["gpu-fraction"], "annotations must be an object"),
        (("metadata", "annotations", "gpu-fraction"), 0.5, "['gpu-fraction'] must be a string"),
        (("spec", "containers"), {"name": "main"}, "spec.containers must be an array"),
        (("spec", "containers", 0, "env", 0, "value"), 3, "env[0].value must be a string"),
        (("spec", "containers", 0, "resources", "limits"), "1", "limits must be an object"),
        # Read by the inference-server check (inference_servers.find_server).
        (("spec", "containers", 0, "command"), True, "command must be an array, not a boolean"),
        (("spec", "containers", 0, "args"), ["--port", 8000], "args[1] must be a string"),
        # Read by the dra mode (mode_edits).
        (("spec", "containers", 0, "resources", "claims"), True, "claims must be an array"),
        (("spec", "resourceClaims"), [None], "resourceClaims[0] must be an object, not null"),
    ],
)
def test_pod_fields_of_the_wrong_type_are_400_naming_the_field(
    client: Client, path: tuple[str | int, ...], value: Any, message: str
) -> None:
    pod = annotated_pod()
    parent: Any = pod
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    for endpoint in ("/mutate", "/validate"):
        error = error_of(client.post(endpoint, json=review(pod)), 400)
        assert error["uid"] == UID
        assert message in error["status"]["message"]
