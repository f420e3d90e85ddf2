"""What the review fuzzers share: the app under fuzz, valid reviews to start from, and the
one check every answer must pass, whatever was sent.

Used by the hypothesis tests and by the atheris harness (``atheris_decoder.py``), so the
two judge answers the same way. The check is written from the README's promises, not from
the decoder's code: never a 5xx, always an AdmissionReview envelope, the uid echoed where
the request carries a readable one, and an allowed answer (with or without a patch) only
where the core, asked directly about the same pod, allows it with exactly that patch.
"""

from __future__ import annotations

import base64
import functools
import io
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonpatch
import orjson

from webhook.constants import APPLIED_ANNOTATION, REQUEST_ANNOTATIONS
from webhook.core import PolicySet, WorkloadKind, check_workload, mutate, validate, workload_kind
from webhook.policy_store import PolicyStore
from webhook.server.app import WebhookApp, create_app

REPO = Path(__file__).resolve().parents[2]
# The bundled default plus both examples: time-slicing, mps (ml-*) and mps-daemon
# (inference), so fuzzed pods reach every sharing mode.
POLICY_FILES = (
    REPO / "policies" / "default.yaml",
    REPO / "policies" / "examples" / "mps.yaml",
    REPO / "policies" / "examples" / "mps-daemon.yaml",
)
NAMESPACES = ("research", "ml-train", "inference", "kube-system", "gpushare-system", "")
PATHS = ("/mutate", "/validate")
JSON = "application/json"
# What a well-formed body may be answered with; 413 and 415 need a body over the cap or a
# Content-Type that is not JSON, which the fuzzers send only where they expect them.
ANSWERED_STATUSES = frozenset({200, 400})
REVIEW_API_VERSION = "admission.k8s.io/v1"


class WrongAnswerError(AssertionError):
    """An answer that breaks one of the promises; the message says which."""


def require(condition: object, message: str) -> None:
    """``assert`` that survives ``python -O`` (the atheris harness runs as a script)."""
    if not condition:
        raise WrongAnswerError(message)


@functools.cache
def fuzz_app() -> tuple[WebhookApp, PolicySet]:
    """One app (and its policies) for every example: building it costs more than a request."""
    with tempfile.TemporaryDirectory(prefix="gpushare-fuzz-") as folder:
        for file in POLICY_FILES:
            shutil.copy(file, Path(folder) / file.name)
        store = PolicyStore.loaded(folder)  # no polling: the folder may go once loaded
    policies = store.policies
    assert policies is not None, store.status().as_dict()
    return create_app(store), policies


def post(app: WebhookApp, path: str, body: bytes, content_type: str = JSON) -> tuple[int, bytes]:
    """POST ``body`` straight through the WSGI callable: (HTTP status, answer body)."""
    environ = {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": path,
        "CONTENT_TYPE": content_type,
        "CONTENT_LENGTH": str(len(body)),
        "SERVER_PROTOCOL": "HTTP/1.1",
        "wsgi.input": io.BytesIO(body),
    }
    status: list[str] = []

    def start_response(line: str, headers: list[tuple[str, str]], *_: Any) -> None:
        status.append(line)

    answer = b"".join(app(environ, start_response))
    return int(status[0].split()[0]), answer


# -- what was sent, read independently of the decoder -------------------------------------


def parsed(body: bytes) -> Any:
    """The body as JSON, or None where it is not JSON (the webhook uses orjson, so do we)."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return None


def sent_uid(review: Any) -> str:
    """The uid the answer must echo: ``request.uid`` where it is a string, else ""."""
    request = review.get("request") if type(review) is dict else None
    uid = request.get("uid") if type(request) is dict else None
    return uid if type(uid) is str else ""


def pod_create(review: Any) -> tuple[dict[str, Any], str] | None:
    """(pod, namespace) where the review asks to create a core v1 Pod, else None."""
    if type(review) is not dict or type(review.get("request")) is not dict:
        return None
    request = review["request"]
    kind, resource, pod = request.get("kind"), request.get("resource"), request.get("object")
    if type(kind) is not dict or type(resource) is not dict or type(pod) is not dict:
        return None
    namespace = request.get("namespace")
    if (
        kind.get("group") in ("", None)
        and kind.get("kind") == "Pod"
        and resource.get("resource") == "pods"
        and request.get("operation") == "CREATE"
        and request.get("subResource") in ("", None)
        and type(namespace) in (str, type(None))
    ):
        return pod, namespace or ""
    return None


def json_copy(value: Any) -> Any:
    """A deep copy of decoded JSON, without recursion: a pod may nest as deep as orjson reads
    (1,024 levels), deeper than ``copy.deepcopy`` goes under the default recursion limit."""
    if not isinstance(value, dict | list):
        return value
    top: Any = type(value)()
    pending = [(value, top)]
    while pending:
        source, target = pending.pop()
        items = source.items() if isinstance(source, dict) else enumerate(source)
        for key, child in items:
            copied = type(child)() if isinstance(child, dict | list) else child
            if copied is not child:
                pending.append((child, copied))
            if isinstance(target, dict):
                target[key] = copied
            else:
                target.append(copied)
    return top


def _is_json(content_type: str) -> bool:
    return content_type.partition(";")[0].strip().lower() == JSON


def check_answer(
    path: str,
    body: bytes,
    status: int,
    answer: bytes,
    policies: PolicySet,
    content_type: str = JSON,
) -> str:
    """Raise ``WrongAnswerError`` unless the answer keeps every promise; else its kind
    ("rejected", "denied", "allowed", "patched"), for the fuzzers' statistics."""
    require(status < 500, f"HTTP {status} for hostile input: {answer[:300]!r}")
    envelope = parsed(answer)
    require(type(envelope) is dict, f"the answer is not a JSON object: {answer[:300]!r}")
    require(envelope.get("apiVersion") == REVIEW_API_VERSION, f"apiVersion: {envelope}")
    require(envelope.get("kind") == "AdmissionReview", f"kind: {envelope}")
    response = envelope.get("response")
    require(type(response) is dict, f"no response object: {envelope}")
    if not _is_json(content_type):
        require(status == 415, f"Content-Type {content_type!r} answered {status}")
        require(response["uid"] == "" and response["allowed"] is False, response)
        return "rejected"
    review = parsed(body)
    require(status in ANSWERED_STATUSES, f"HTTP {status}: {response}")
    require(response.get("uid") == sent_uid(review), f"uid {response.get('uid')!r} echoed")
    require(type(response.get("allowed")) is bool, f"allowed: {response}")
    has_patch = "patch" in response or "patchType" in response
    require(
        ("patch" in response) == ("patchType" in response),
        f"patch and patchType come together: {response}",
    )
    if status != 200:
        require(response["allowed"] is False and not has_patch, f"HTTP {status}: {response}")
        require(
            response["status"]["code"] == status and response["status"]["message"],
            f"status: {response}",
        )
        return "rejected"
    if not response["allowed"]:
        require(not has_patch, f"a denial with a patch: {response}")
        _check_denial(path, review, response, policies)
        return "denied"
    return _check_allowed(path, review, response, policies)


def _core_verdict(path: str, pod: dict[str, Any], namespace: str, policies: PolicySet) -> Any:
    decide = mutate if path == "/mutate" else validate
    return decide(json_copy(pod), namespace, policies)


def workload_change(review: Any) -> tuple[dict[str, Any], WorkloadKind, str] | None:
    """(workload, kind, namespace) where the review creates or updates a workload with a
    pod template (Deployment, CronJob, ...), else None."""
    if type(review) is not dict or type(review.get("request")) is not dict:
        return None
    request = review["request"]
    kind, workload = request.get("kind"), request.get("object")
    if type(kind) is not dict or type(workload) is not dict:
        return None
    group = kind.get("group")
    found = workload_kind("" if group is None else group, kind.get("kind"))
    namespace = request.get("namespace")
    if (
        found is None
        or request.get("operation") not in ("CREATE", "UPDATE")
        or request.get("subResource") not in ("", None)
        or type(namespace) not in (str, type(None))
    ):
        return None
    return workload, found, namespace or ""


def _check_denial(path: str, review: Any, response: dict[str, Any], policies: PolicySet) -> None:
    create = pod_create(review)
    workload = workload_change(review) if path == "/validate" else None
    require(
        create is not None or workload is not None,
        f"a request that is no pod CREATE (nor a workload at /validate) was denied: {response}",
    )
    if create is not None:
        verdict = _core_verdict(path, *create, policies)
        allowed, code, reasons = verdict.allowed, verdict.code, verdict.reasons
    else:
        assert workload is not None
        document, kind, namespace = workload
        # A cluster-scoped kind's templates are read as if in the default namespace.
        checked = check_workload(document, kind, namespace or "default", policies)
        require(checked is not None, f"a workload without a template was denied: {response}")
        assert checked is not None
        allowed, code, reasons = checked.allowed, checked.code, checked.admission_reasons
    require(not allowed, f"the core allows what the webhook denied: {response}")
    require(response["status"]["code"] == code, f"code {code}: {response}")
    require(response["status"]["message"] == " ".join(reasons), f"message: {response}")


def _check_allowed(path: str, review: Any, response: dict[str, Any], policies: PolicySet) -> str:
    create = pod_create(review)
    if create is None:
        require("patch" not in response, f"a patch for a request that is no pod CREATE: {review}")
        return "allowed"
    pod, namespace = create
    verdict = _core_verdict(path, pod, namespace, policies)
    require(verdict.allowed, f"the webhook allowed what the core denies: {verdict.reasons}")
    if "patch" not in response:
        require(
            path == "/validate" or not verdict.patch,
            f"the core patches what the webhook allowed unchanged: {verdict.patch}",
        )
        return "allowed"
    require(path == "/mutate", f"{path} answered with a patch")
    require(response["patchType"] == "JSONPatch", f"patchType: {response}")
    patch = orjson.loads(base64.b64decode(response["patch"], validate=True))
    require(patch, "an empty patch was sent")
    require(patch == verdict.patch, f"the patch differs from the core's: {patch}")
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    require(
        any(key in annotations for key in REQUEST_ANNOTATIONS),
        f"a patch for a pod without {REQUEST_ANNOTATIONS}: {annotations}",
    )
    try:
        planned = jsonpatch.apply_patch(json_copy(pod), patch, in_place=True)
    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as error:
        raise WrongAnswerError(f"the patch does not apply to the pod: {error}") from error
    require(APPLIED_ANNOTATION in planned["metadata"]["annotations"], "no applied record")
    return "patched"


# -- where the fuzzers start ---------------------------------------------------------------


def seed_pod(fraction: str = "0.5", **annotations: str) -> dict[str, Any]:
    """An annotated pod with a main container, an init container and a sidecar."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "trainer",
            "namespace": "research",
            "labels": {"app": "trainer"},
            "annotations": {"gpu-fraction": fraction, **annotations},
        },
        "spec": {
            "initContainers": [{"name": "fetch", "image": "busybox", "command": ["true"]}],
            "containers": [
                {
                    "name": "main",
                    "image": "nvcr.io/nvidia/pytorch:25.01-py3",
                    "env": [
                        {"name": "EPOCHS", "value": "3"},
                        {"name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "value": "100"},
                        {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    ],
                    "resources": {"requests": {"cpu": "1"}, "limits": {"memory": "2Gi"}},
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                },
                {"name": "sidecar", "image": "envoy", "resources": {"limits": {"cpu": "100m"}}},
            ],
            "nodeSelector": {"kubernetes.io/arch": "amd64"},
            "tolerations": [{"key": "gpu", "operator": "Exists"}],
            "volumes": [{"name": "data", "emptyDir": {}}],
        },
    }


def seed_review(
    pod: dict[str, Any] | None, namespace: str = "research", uid: str = "fuzz-uid"
) -> dict[str, Any]:
    return {
        "apiVersion": REVIEW_API_VERSION,
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "name": "trainer",
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
            "object": pod,
            "oldObject": None,
            "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }


SEED_ANNOTATIONS: tuple[dict[str, str], ...] = (
    {"gpu-fraction": "0.5"},
    {"gpu-fraction": "0.25"},
    {"gpu-fraction": "0.1", "gpu-fraction-container-name": "sidecar"},
    {"gpu-fraction": "2"},
    {"gpu-fraction": "0.3", "gpu-memory": "24Gi"},
    {"gpu-memory": "8Gi"},
    {"gpu-fraction": "abc"},
    {"gpu-fraction": "0.5", "gpu-fraction-container-name": "fetch"},
)


def seed_reviews() -> Iterator[dict[str, Any]]:
    """Valid reviews over every policy (namespace) and each kind of annotation."""
    for namespace in NAMESPACES[:3]:
        for asked in SEED_ANNOTATIONS:
            pod = seed_pod()
            pod["metadata"]["annotations"] = dict(asked)
            pod["metadata"]["namespace"] = namespace
            yield seed_review(pod, namespace)
    plain = seed_pod()
    plain["metadata"]["annotations"] = {}
    yield seed_review(plain, "research")


def wrong_shapes() -> Iterator[dict[str, Any]]:
    """A few reviews that are no pod CREATE, so fuzzing starts from the skip and workload
    paths too."""
    update = seed_review(seed_pod())
    update["request"]["operation"] = "UPDATE"
    yield update
    binding = seed_review(seed_pod())
    binding["request"]["subResource"] = "binding"
    yield binding
    deployment = seed_review({"kind": "Deployment"})
    deployment["request"]["kind"] = {"group": "apps", "version": "v1", "kind": "Deployment"}
    yield deployment
    for fraction in ("0.5", "abc"):
        pod = seed_pod(fraction)
        template = {"metadata": pod["metadata"], "spec": pod["spec"]}
        workload = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}}
        workload["spec"] = {"replicas": 2, "template": template}
        review = seed_review(workload)
        request = review["request"]
        request["kind"] = {"group": "apps", "version": "v1", "kind": "Deployment"}
        request["resource"] = {"group": "apps", "version": "v1", "resource": "deployments"}
        yield review
