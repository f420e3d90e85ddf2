"""When gpushare's webhook is down or slow: what kube-apiserver really does with each pod.

Every configuration here is what `gpushare webhook-config` prints, only pointed at a dead
port (connection refused: the webhook is not running) or at a relay that holds connections
back (slower than `timeoutSeconds`), with `--failure-policy` and `--timeout` as a cluster
admin would set them. Kubernetes documents the contract: a call that fails or times out is
an error under `failurePolicy: Fail` (the request is rejected) and is skipped under
`Ignore` (the request goes on as if the webhook did not exist). `matchConditions` keep
ordinary pods away from the webhook, so an outage never blocks them.

What really happens under Ignore, measured here: the annotated pod is admitted exactly as
written: no GPU resource, no node selector, no limits; the annotation alone does nothing
(the pod gets no GPU at all). That is why gpushare's default is Fail, made safe by
matchConditions. The safety net (the ValidatingAdmissionPolicy evaluated inside the
apiserver, which no outage of the webhook takes down) follows the failure policy it is
printed with: printed with Fail it refuses an annotated pod the webhook never mutated
(tests/e2e/test_safety_net_policy.py); printed with Ignore, as `--failure-policy Ignore`
prints it, it lets that pod through, so Ignore really fails open, and still refuses a pod
asking for the shared resource by hand, annotated or not: Ignore excuses the webhook's
absence, not a share taken without gpushare's limits. The opt-in pod validating webhook, when
it answers while the mutating call did not, still refuses the unmutated pod. The tests of
what Ignore alone does register the webhooks without the safety net
(`--validating-webhook pods --no-safety-net-policy`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from network_faults import DelayingProxy, closed_port
from pods import annotated_pod, plain_pod

from harness.api import as_json, create_pod, status_message
from harness.controlplane import ControlPlane
from harness.registration import (
    MUTATING_WEBHOOK,
    SAFETY_NET_DENIAL,
    SHARED_RESOURCE,
    VALIDATING_WEBHOOK,
    GpushareWebhook,
    Probe,
    denied_by_safety_net,
)
from webhook.constants import APPLIED_ANNOTATION, FRACTION_ANNOTATION

# The webhooks alone, as before the safety net: the pod validating webhook, no policy.
WEBHOOKS_ONLY = ("--validating-webhook", "pods", "--no-safety-net-policy")
# The relay holds connections far longer than the webhook timeout; teardown releases them.
SLOW_DELAY_S = 20.0
TIMEOUT_S = 1


@pytest.fixture
def webhook(gpushare_webhook: GpushareWebhook) -> Iterator[GpushareWebhook]:
    """The module's registration; whatever a test swaps in, the printed one comes back."""
    try:
        yield gpushare_webhook
    finally:
        gpushare_webhook.restore()


def failed_open(control_plane: ControlPlane, webhook: str, url: str) -> bool:
    """Whether kube-apiserver logged that a call of `webhook` at `url` failed open.

    Under Ignore this line is the only trace of the failed call: the client sees a normal
    answer, so it is what tells "ignored" apart from "not registered".
    """
    (apiserver,) = [c for c in control_plane.components if c.name == "kube-apiserver"]
    return any(
        f"failing open {webhook}:" in line and f"{url}/" in line
        for line in apiserver.log_path.read_text(errors="replace").splitlines()
    )


def failed_call(result: str, webhook: str) -> bool:
    return result.startswith("rejected: ") and f'failed calling webhook "{webhook}"' in result


def unmutated(pod: dict[str, object], written: dict[str, object]) -> bool:
    """The admitted pod carries nothing of gpushare's: no record, no resource, no selector."""
    text = repr(pod)
    return (
        APPLIED_ANNOTATION not in text
        and SHARED_RESOURCE not in text
        and "nodeSelector" not in pod["spec"]  # type: ignore[operator]
        and pod["metadata"]["annotations"] == written["metadata"]["annotations"]  # type: ignore[index]
    )


def timed_create(
    webhook: GpushareWebhook, namespace: str, pod: dict[str, object]
) -> tuple[float, dict[str, object] | ApiException]:
    started = time.monotonic()
    try:
        admitted: dict[str, object] | ApiException = create_pod(webhook.api, namespace, pod).pod
    except ApiException as exc:
        admitted = exc
    return time.monotonic() - started, admitted


# -- down -----------------------------------------------------------------------------------


def test_down_with_fail_rejects_annotated_pods_and_admits_ordinary_ones(
    webhook: GpushareWebhook, core_v1: k8s.CoreV1Api, namespace: str
) -> None:
    dead = f"https://127.0.0.1:{closed_port()}"
    documents = webhook.configuration("--failure-policy", "Fail", url=dead)
    webhook.swap(
        documents,
        lambda p: failed_call(p.annotated, MUTATING_WEBHOOK) and denied_by_safety_net(p.direct),
        "the dead registration (Fail) to be in force",
    )

    with pytest.raises(ApiException) as caught:
        create_pod(webhook.api, namespace, annotated_pod("annotated"))
    ordinary = create_pod(webhook.api, namespace, plain_pod("ordinary")).pod

    message = status_message(caught.value)
    assert f'failed calling webhook "{MUTATING_WEBHOOK}"' in message
    assert "connection refused" in message
    assert caught.value.status == 500
    assert ordinary["metadata"]["name"] == "ordinary"
    stored = as_json(webhook.api, core_v1.list_namespaced_pod(namespace))
    assert [p["metadata"]["name"] for p in stored["items"]] == ["ordinary"]


def test_down_with_ignore_admits_annotated_pods_unmutated(
    webhook: GpushareWebhook, control_plane: ControlPlane, namespace: str
) -> None:
    """Both webhooks down and Ignore, no safety net: the annotated pod is stored exactly as
    written.

    The client gets no error and no warning; only the apiserver's log says it failed open.
    """
    dead = f"https://127.0.0.1:{closed_port()}"
    documents = webhook.configuration("--failure-policy", "Ignore", *WEBHOOKS_ONLY, url=dead)
    assert {w["failurePolicy"] for d in documents for w in d["webhooks"]} == {"Ignore"}
    webhook.swap(
        documents,
        lambda p: (
            p == Probe("admitted", "admitted")
            and failed_open(control_plane, MUTATING_WEBHOOK, dead)
        ),
        "the dead registration (Ignore) to be in force",
        drop_safety_net=True,
    )
    pod = annotated_pod("annotated")

    admitted = create_pod(webhook.api, namespace, pod)

    assert unmutated(admitted.pod, pod)
    assert admitted.warnings == []
    assert webhook.server.admissions(namespace) == []
    assert failed_open(control_plane, VALIDATING_WEBHOOK, dead)


def test_down_with_ignore_and_its_safety_net_admits_annotated_pods_unmutated(
    webhook: GpushareWebhook, control_plane: ControlPlane, namespace: str
) -> None:
    """Everything `webhook-config --failure-policy Ignore` prints, the webhook unreachable:
    the annotated pod is admitted as written, and the safety net printed with Ignore does not
    refuse it for being unmutated. Asking for the shared resource by hand is refused all the
    same, without the annotation or with it: the webhook's absence excuses no hand ask, nor
    a device variable set by hand."""
    dead = f"https://127.0.0.1:{closed_port()}"
    documents = webhook.configuration("--failure-policy", "Ignore", url=dead)
    (policy,) = [d for d in documents if d["kind"] == "ValidatingAdmissionPolicy"]
    assert policy["spec"]["failurePolicy"] == "Ignore"
    webhook.swap(
        documents,
        lambda p: (
            p.annotated == "admitted"
            and denied_by_safety_net(p.direct)
            and failed_open(control_plane, MUTATING_WEBHOOK, dead)
        ),
        "the dead registration (Ignore) and its safety net to be in force",
    )
    pod = annotated_pod("annotated")

    admitted = create_pod(webhook.api, namespace, pod)

    assert unmutated(admitted.pod, pod)
    assert APPLIED_ANNOTATION not in admitted.pod["metadata"]["annotations"]
    assert admitted.warnings == []

    shared = {SHARED_RESOURCE: "1"}
    by_hand = plain_pod("by-hand", resources={"requests": shared, "limits": shared})
    with pytest.raises(ApiException) as caught:
        create_pod(webhook.api, namespace, by_hand)
    assert caught.value.status == 403
    assert status_message(caught.value).endswith(
        SAFETY_NET_DENIAL + f"container 'main' asks for {SHARED_RESOURCE} directly, which "
        "policy 'default' does not allow: remove it and annotate the pod with "
        f'{FRACTION_ANNOTATION}: "0.5" (or the share you need) instead.'
    )

    annotated_by_hand = annotated_pod(
        "annotated-by-hand", resources={"requests": shared, "limits": shared}
    )
    with pytest.raises(ApiException) as caught:
        create_pod(webhook.api, namespace, annotated_by_hand)
    assert caught.value.status == 403
    assert status_message(caught.value).endswith(
        SAFETY_NET_DENIAL + f"container 'main' asks for {SHARED_RESOURCE} directly, which "
        "policy 'default' does not allow, and gpushare's mutating webhook did not mutate this "
        "pod (failurePolicy Ignore admits a pod as written, not a share asked for by hand): "
        "remove it; the pod's annotation asks for the share."
    )
    # Nor does it excuse a device variable set by hand (enforcement.deviceVariables: deny),
    # in a pod the webhook never sees or one it did not mutate.
    devices = {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}
    for pod in (
        plain_pod("devices", env=[devices]),
        annotated_pod("annotated-devices", env=[devices]),
    ):
        with pytest.raises(ApiException) as caught:
            create_pod(webhook.api, namespace, pod)
        assert caught.value.status == 403
        assert SAFETY_NET_DENIAL + "NVIDIA_VISIBLE_DEVICES is set by hand in container 'main'" in (
            status_message(caught.value)
        )
    stored = as_json(webhook.api, k8s.CoreV1Api(webhook.api).list_namespaced_pod(namespace))
    assert [p["metadata"]["name"] for p in stored["items"]] == ["annotated"]
    assert webhook.server.admissions(namespace) == []


def test_mutating_down_with_ignore_is_refused_by_the_pod_validating_webhook_if_up(
    webhook: GpushareWebhook, namespace: str
) -> None:
    """Mutating webhook unreachable (Ignore), the opt-in pod validating webhook answering
    (`--validating-webhook pods`, printed with Fail): it finds no gpushare.io/applied record
    on the annotated pod and refuses it as never mutated. Ignore on the mutating webhook
    alone does not fail open past a validating webhook that is up."""
    dead = f"https://127.0.0.1:{closed_port()}"
    documents = webhook.configuration("--failure-policy", "Ignore", *WEBHOOKS_ONLY, url=dead)
    live = webhook.configuration(*WEBHOOKS_ONLY)
    mutating = [d for d in documents if d["kind"] == "MutatingWebhookConfiguration"]
    others = [d for d in live if d["kind"] != "MutatingWebhookConfiguration"]
    denied_by = f'admission webhook "{VALIDATING_WEBHOOK}" denied the request: '
    webhook.swap(
        [*mutating, *others],
        lambda p: p.annotated.startswith("rejected: ") and denied_by in p.annotated,
        "the dead mutating webhook (Ignore) next to the live validating webhook",
        drop_safety_net=True,
    )

    with pytest.raises(ApiException) as caught:
        create_pod(webhook.api, namespace, annotated_pod("annotated"))

    message = status_message(caught.value)
    assert denied_by + "This pod asks for a GPU share but was never mutated by gpushare" in message
    assert caught.value.status == 403
    decisions = [(e["endpoint"], e["decision"]) for e in webhook.server.admissions(namespace)]
    assert decisions == [("validate", "denied")]


# -- slow -----------------------------------------------------------------------------------


@pytest.fixture
def slow_path(webhook: GpushareWebhook) -> Iterator[DelayingProxy]:
    """A relay in front of the real webhook that holds every connection SLOW_DELAY_S."""
    with DelayingProxy(webhook.server.port, SLOW_DELAY_S) as proxy:
        yield proxy


def test_slower_than_timeout_with_fail_is_rejected_after_the_timeout(
    webhook: GpushareWebhook, slow_path: DelayingProxy, namespace: str
) -> None:
    """timeoutSeconds 1, Fail: rejected with a timeout error after about a second.

    Then, with the relay made transparent and the same configuration, the same pod is
    mutated: the timeout, not the path, was the cause.
    """
    url = f"https://127.0.0.1:{slow_path.port}"
    documents = webhook.configuration(
        "--failure-policy", "Fail", "--timeout", str(TIMEOUT_S), url=url
    )
    webhook.swap(
        documents,
        lambda p: failed_call(p.annotated, MUTATING_WEBHOOK),
        "the slow registration (Fail) to be in force",
    )

    elapsed, result = timed_create(webhook, namespace, annotated_pod("annotated"))
    ordinary_elapsed, ordinary = timed_create(webhook, namespace, plain_pod("ordinary"))

    assert isinstance(result, ApiException)
    message = status_message(result)
    assert f'failed calling webhook "{MUTATING_WEBHOOK}"' in message
    assert "context deadline exceeded" in message or "Timeout" in message
    assert result.status == 500
    assert TIMEOUT_S * 0.9 <= elapsed < SLOW_DELAY_S / 2
    assert isinstance(ordinary, dict)
    assert ordinary_elapsed < TIMEOUT_S

    slow_path.delay = 0
    webhook.wait(
        lambda p: p.annotated == "mutated", "the same registration, made fast, to mutate again"
    )
    _, fast = timed_create(webhook, namespace, annotated_pod("annotated-fast"))
    assert isinstance(fast, dict)
    assert APPLIED_ANNOTATION in fast["metadata"]["annotations"]  # type: ignore[index]


def test_slower_than_timeout_with_ignore_is_admitted_unmutated(
    webhook: GpushareWebhook, control_plane: ControlPlane, slow_path: DelayingProxy, namespace: str
) -> None:
    """timeoutSeconds 1, Ignore: admitted as written once both calls have timed out."""
    url = f"https://127.0.0.1:{slow_path.port}"
    documents = webhook.configuration(
        "--failure-policy", "Ignore", "--timeout", str(TIMEOUT_S), *WEBHOOKS_ONLY, url=url
    )
    webhook.swap(
        documents,
        lambda p: (
            p == Probe("admitted", "admitted") and failed_open(control_plane, MUTATING_WEBHOOK, url)
        ),
        "the slow registration (Ignore) to be in force",
        timeout=60,
        drop_safety_net=True,
    )
    pod = annotated_pod("annotated")

    elapsed, admitted = timed_create(webhook, namespace, pod)

    assert isinstance(admitted, dict)
    assert unmutated(admitted, pod)
    # One timeout per webhook (mutating, then validating), not the relay's delay.
    assert TIMEOUT_S * 0.9 <= elapsed < SLOW_DELAY_S / 2
    assert webhook.server.admissions(namespace) == []
