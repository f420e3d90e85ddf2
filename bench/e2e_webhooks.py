"""The webhooks e2e_bench.py measures beside gpushare, and the check that its peer does
gpushare's work.

- `GoWebhook`: a Go webhook of harness/tools, built (or found in its cache) by its build.sh,
  served over TLS on a loopback port with gpushare's serving certificate, registered as the
  only mutating webhook for pod creates of its namespace: the no-op webhook
  (`noop_webhook`, the floor any webhook pays) and the controller-runtime peer
  (`peer_webhook`, harness/tools/cr-webhook: the mutation gpushare's default policy makes of
  the bench pod, written the way controller-runtime's users write a webhook);
- `webhook_alone`: gpushare's MutatingWebhookConfiguration from the shipped documents, alone
  (no safety-net policy), under names of its own so the apiserver's metrics tell it apart;
- `stored_differences`: where two pods the apiserver stored differ, server-set fields aside.
"""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.binary import HarnessBuildError, run_build_script
from harness.processes import LOOPBACK, free_ports, terminate
from harness.webhookserver import start_logged_process

REPO = Path(__file__).resolve().parents[1]
BUILD_TIMEOUT_S = 600.0
NOOP_NAME = "noop.bench.gpushare.io"
PEER_NAME = "peer.bench.gpushare.io"
ALONE_NAME = "webhook-alone.bench.gpushare.io"
# Fields the apiserver sets on every create, different from one create to the next (the
# namespace: each mode has its own). Nothing of the mutation is left out: the peer writes
# the same gpushare.io/applied annotation as gpushare.
SERVER_SET_FIELDS = ("uid", "creationTimestamp", "resourceVersion", "managedFields", "namespace")


class GoWebhook:
    """A Go webhook of harness/tools, served over TLS on loopback, registered for pods."""

    def __init__(
        self,
        tool: str,
        name: str,
        workdir: Path,
        cert_dir: Path,
        extra_args: Sequence[str] = (),
    ) -> None:
        script = REPO / "harness/tools" / tool / "build.sh"
        binary = run_build_script(
            script, f"tools/{tool}/build.sh", HarnessBuildError, BUILD_TIMEOUT_S
        )
        self.name = name
        self.port = free_ports(1)[0]
        self.cert_dir = cert_dir
        command = [
            str(binary),
            "-addr",
            f"{LOOPBACK}:{self.port}",
            "-cert",
            str(cert_dir / "tls.crt"),
            "-key",
            str(cert_dir / "tls.key"),
            *extra_args,
        ]
        self.process = start_logged_process(command, workdir / f"{tool}.log")

    def configuration(self) -> dict[str, Any]:
        ca = base64.b64encode((self.cert_dir / "ca.crt").read_bytes()).decode()
        return {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": self.name},
            "webhooks": [
                {
                    "name": self.name,
                    "admissionReviewVersions": ["v1"],
                    "sideEffects": "None",
                    "failurePolicy": "Fail",
                    "timeoutSeconds": 10,
                    "clientConfig": {
                        "url": f"https://{LOOPBACK}:{self.port}/mutate",
                        "caBundle": ca,
                    },
                    "rules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE"],
                            "resources": ["pods"],
                        }
                    ],
                }
            ],
        }

    def stop(self) -> None:
        terminate(self.process, 5.0)


def noop_webhook(workdir: Path, cert_dir: Path) -> GoWebhook:
    """harness/tools/noop-webhook: allowed, no patch (standard library only)."""
    return GoWebhook("noop-webhook", NOOP_NAME, workdir, cert_dir)


def peer_webhook(
    workdir: Path, cert_dir: Path, policy_version: str, http1: bool = False
) -> GoWebhook:
    """harness/tools/cr-webhook, writing ``policy_version`` (the default policy's, as
    gpushare writes it) into its gpushare.io/applied annotation; with ``http1``, offering
    HTTP/1.1 only, as kubebuilder's scaffold configures controller-runtime."""
    flags = ["-policy-version", policy_version, *(["-disable-http2"] if http1 else [])]
    return GoWebhook("cr-webhook", PEER_NAME, workdir, cert_dir, flags)


def webhook_alone(documents: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """gpushare's mutating webhook for pods from ``documents`` (what `gpushare
    webhook-config` prints), as it is there but alone: without the safety-net policy, the
    validating webhooks and the mutating webhooks for workloads, its configuration and
    webhook renamed so that it can be in force beside the shipped one."""
    pods = [
        (document, webhook)
        for document in documents
        if document["kind"] == "MutatingWebhookConfiguration"
        for webhook in document["webhooks"]
        if any("pods" in rule.get("resources", ()) for rule in webhook.get("rules", ()))
    ]
    if len(pods) != 1:
        raise ValueError(f"expected one mutating webhook for pods, found {len(pods)}")
    document, webhook = copy.deepcopy(pods[0])
    alone = {**document, "metadata": {"name": ALONE_NAME}}
    alone["webhooks"] = [{**webhook, "name": ALONE_NAME}]
    return [alone]


def _differences(path: str, expected: Any, actual: Any, label: str) -> Iterator[str]:
    if isinstance(expected, dict) and isinstance(actual, dict):
        for key in sorted(set(expected) | set(actual)):
            where = f"{path}.{key}" if path else key
            if key not in actual:
                yield f"{where}: {expected[key]!r} only under gpushare's webhook"
            elif key not in expected:
                yield f"{where}: {actual[key]!r} only under {label}"
            else:
                yield from _differences(where, expected[key], actual[key], label)
    elif isinstance(expected, list) and isinstance(actual, list) and len(expected) == len(actual):
        for index, (left, right) in enumerate(zip(expected, actual, strict=True)):
            yield from _differences(f"{path}[{index}]", left, right, label)
    elif expected != actual or type(expected) is not type(actual):
        where = path or "(the pod)"
        yield f"{where}: {expected!r} under gpushare's webhook, {actual!r} under {label}"


def without_server_set(
    pod: Mapping[str, Any], *, any_toleration_order: bool = False
) -> dict[str, Any]:
    """``pod`` without the metadata the apiserver sets anew on each create (and with its
    tolerations sorted, with ``any_toleration_order``)."""
    result = copy.deepcopy(dict(pod))
    metadata = result.get("metadata", {})
    for key in SERVER_SET_FIELDS:
        metadata.pop(key, None)
    spec = result.get("spec", {})
    if any_toleration_order and "tolerations" in spec:
        spec["tolerations"].sort(key=lambda t: json.dumps(t, sort_keys=True))
    return result


def stored_differences(
    expected: Mapping[str, Any],
    actual: Mapping[str, Any],
    label: str = "the peer",
    *,
    any_toleration_order: bool = False,
) -> list[str]:
    """Field by field, where ``actual`` (the pod the apiserver stored under ``label``) differs
    from ``expected`` (stored under gpushare's webhook), server-set fields aside; empty when
    they are the same pod. With ``any_toleration_order`` the same tolerations in another
    order are the same (the reference policy: see e2e_bench.check_same_pod)."""
    return list(
        _differences(
            "",
            without_server_set(expected, any_toleration_order=any_toleration_order),
            without_server_set(actual, any_toleration_order=any_toleration_order),
            label,
        )
    )
