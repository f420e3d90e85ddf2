"""gpushare registered with the apiserver, and knowing when a registration is in force.

`Registration` applies (server-side apply) and deletes what `gpushare webhook-config`
prints: the webhook configurations and the safety-net ValidatingAdmissionPolicy with its
binding. The apiserver picks them up through informers, a moment after the write (about a
second for admission policies, which it compiles), so only polling tells when one is in
force: `probe()` asks with two server-side dry runs (an annotated pod, and a pod asking for
the shared resource by hand) what the apiserver does right now, and every change of
registration waits on it.
`GpushareWebhook` ties a running `WebhookServer` to its registration in one control plane.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from harness.api import create_pod, status_message
from harness.cli import webhook_configuration
from harness.processes import wait_for
from harness.webhookserver import WebhookServer
from webhook.constants import APPLIED_ANNOTATION, FRACTION_ANNOTATION

SHARED_RESOURCE = "nvidia.com/gpu.shared"
MUTATING_WEBHOOK = "mutate.gpushare.io"
VALIDATING_WEBHOOK = "validate.gpushare.io"
SAFETY_NET_POLICY = "gpushare"
# How the apiserver words a denial by a ValidatingAdmissionPolicy (k8s.io/apiserver,
# pkg/admission/plugin/policy/validating/dispatcher.go).
SAFETY_NET_DENIAL = (
    f"ValidatingAdmissionPolicy '{SAFETY_NET_POLICY}' with binding '{SAFETY_NET_POLICY}' "
    "denied request: "
)
APPLY_CONTENT_TYPE = "application/apply-patch+yaml"
FIELD_MANAGER = "gpushare-e2e"
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"  # never pulled: there is no kubelet


def excluded_namespaces(documents: Sequence[Mapping[str, Any]]) -> set[str]:
    """The namespaces the namespaceSelectors (of every webhook and of the safety-net
    policy) keep away from gpushare."""
    selectors = [w["namespaceSelector"] for d in documents for w in d.get("webhooks", ())]
    selectors += [
        d["spec"]["matchConstraints"]["namespaceSelector"]
        for d in documents
        if d["kind"] == "ValidatingAdmissionPolicy"
    ]
    names: set[str] = set()
    for selector in selectors:
        for expression in selector.get("matchExpressions", []):
            if (
                expression["key"] == "kubernetes.io/metadata.name"
                and expression["operator"] == "NotIn"
            ):
                names.update(expression["values"])
    return names


@dataclass(frozen=True)
class Registration:
    """Writes and removes admission webhook configurations (server-side apply)."""

    api: k8s.ApiClient

    @property
    def _admission(self) -> k8s.AdmissionregistrationV1Api:
        return k8s.AdmissionregistrationV1Api(self.api)

    def apply(self, documents: Sequence[Mapping[str, Any]]) -> None:
        for document in documents:
            name = document["metadata"]["name"]
            options: dict[str, Any] = {
                "field_manager": FIELD_MANAGER,
                "force": True,
                "_content_type": APPLY_CONTENT_TYPE,
            }
            if document["kind"] == "MutatingWebhookConfiguration":
                self._admission.patch_mutating_webhook_configuration(
                    name, dict(document), **options
                )
            elif document["kind"] == "ValidatingWebhookConfiguration":
                self._admission.patch_validating_webhook_configuration(
                    name, dict(document), **options
                )
            elif document["kind"] == "ValidatingAdmissionPolicy":
                self._admission.patch_validating_admission_policy(name, dict(document), **options)
            elif document["kind"] == "ValidatingAdmissionPolicyBinding":
                self._admission.patch_validating_admission_policy_binding(
                    name, dict(document), **options
                )
            else:
                raise ValueError(f"not an admission configuration: {document['kind']}")

    def delete(
        self, name: str, *, mutating: bool = True, validating: bool = True, policy: bool = True
    ) -> None:
        """Delete the configurations (and the safety-net policy and binding) called `name`;
        absent ones are fine."""
        deletes = []
        if mutating:
            deletes.append(self._admission.delete_mutating_webhook_configuration)
        if validating:
            deletes.append(self._admission.delete_validating_webhook_configuration)
        if policy:
            deletes.append(self._admission.delete_validating_admission_policy_binding)
            deletes.append(self._admission.delete_validating_admission_policy)
        for delete in deletes:
            try:
                delete(name)
            except ApiException as exc:
                if exc.status != 404:
                    raise


class Probe(NamedTuple):
    """What the apiserver does right now with two dry-run pods.

    Each field is "mutated" (admitted with our annotation), "admitted" (admitted as sent) or
    "rejected: <message>".
    """

    annotated: str
    direct: str


def probe_pod(name: str, *, annotated: bool) -> dict[str, Any]:
    """An annotated pod, or one asking for the shared resource by hand."""
    container: dict[str, Any] = {"name": "main", "image": PAUSE_IMAGE}
    metadata: dict[str, Any] = {"name": name}
    if annotated:
        metadata["annotations"] = {FRACTION_ANNOTATION: "0.5"}
    else:
        resources = {SHARED_RESOURCE: "1"}
        container["resources"] = {"requests": resources, "limits": resources}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {"containers": [container]},
    }


def _probe_one(api: k8s.ApiClient, namespace: str, pod: dict[str, Any]) -> str:
    try:
        admitted = create_pod(api, namespace, pod, dry_run=True)
    except ApiException as exc:
        return f"rejected: {status_message(exc)}"
    annotations = admitted.pod["metadata"].get("annotations") or {}
    return "mutated" if APPLIED_ANNOTATION in annotations else "admitted"


def probe(api: k8s.ApiClient, namespace: str) -> Probe:
    """Server-side dry runs (no side effects) of an annotated and of a direct-request pod."""
    suffix = uuid.uuid4().hex[:8]
    return Probe(
        annotated=_probe_one(api, namespace, probe_pod(f"probe-a-{suffix}", annotated=True)),
        direct=_probe_one(api, namespace, probe_pod(f"probe-d-{suffix}", annotated=False)),
    )


def wait_for_probe(
    api: k8s.ApiClient,
    namespace: str,
    expected: Callable[[Probe], bool],
    what: str,
    timeout: float = 30.0,
) -> Probe:
    """Poll `probe()` until `expected` holds; the last probe goes into the timeout message."""
    last: list[Probe] = []

    def check() -> Probe | None:
        result = probe(api, namespace)
        last[:] = [result]
        return result if expected(result) else None

    return wait_for(
        what, check, timeout=timeout, interval=0.05, on_timeout=lambda: f"last probe: {last}"
    )


def denied_by_safety_net(answer: str) -> bool:
    """A probe answer: refused by the safety-net ValidatingAdmissionPolicy."""
    return answer.startswith("rejected: ") and SAFETY_NET_DENIAL in answer


def denied_by_validating_webhook(answer: str) -> bool:
    """A probe answer: refused by the (opt-in) pod validating webhook."""
    return answer.startswith(f'rejected: admission webhook "{VALIDATING_WEBHOOK}" denied')


def registered(result: Probe) -> bool:
    """gpushare's default registration is in force: the mutating webhook answers and the
    safety net refuses the pod asking by hand."""
    return result.annotated == "mutated" and denied_by_safety_net(result.direct)


def registered_with_validating_webhook(result: Probe) -> bool:
    """The opt-in registration (`--validating-webhook pods --no-safety-net-policy`) is in
    force: both webhooks answer."""
    return result.annotated == "mutated" and denied_by_validating_webhook(result.direct)


def unregistered(result: Probe) -> bool:
    """No webhook of gpushare is in force: both pods go through as sent."""
    return result == Probe("admitted", "admitted")


@dataclass
class GpushareWebhook:
    """`gpushare serve` plus its registration in one control plane.

    `documents` are the configurations `gpushare webhook-config --ca <ca> --url <server>
    --policies <policies>` prints: the default registration that `register()` puts in force
    and that `registered_as()` comes back to.
    """

    server: WebhookServer
    api: k8s.ApiClient
    probe_namespace: str
    documents: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.documents:
            self.documents = self.configuration()

    @property
    def registration(self) -> Registration:
        return Registration(self.api)

    @property
    def policies(self) -> Path:
        return self.server.policies

    def configuration(self, *extra_args: str, url: str | None = None) -> list[dict[str, Any]]:
        """`gpushare webhook-config` for this server (or `url`), with `extra_args`."""
        return webhook_configuration(
            self.server.ca_file,
            url or self.server.url,
            "--policies",
            str(self.server.policies),
            *extra_args,
        )

    def probe(self) -> Probe:
        return probe(self.api, self.probe_namespace)

    def wait(self, expected: Callable[[Probe], bool], what: str, timeout: float = 30.0) -> Probe:
        return wait_for_probe(self.api, self.probe_namespace, expected, what, timeout)

    def register(self) -> None:
        """Apply the default registration and wait until the mutating webhook answers and
        the safety net refuses pods asking by hand."""
        self.registration.apply(self.documents)
        self.wait(registered, "gpushare's webhooks and safety-net policy to be in force")

    def unregister(self) -> None:
        """Delete the registration and wait until pods go through as sent."""
        for name in dict.fromkeys(d["metadata"]["name"] for d in self.documents):
            self.registration.delete(name)
        self.wait(unregistered, "gpushare's webhooks to be gone")

    def swap(
        self,
        documents: Sequence[Mapping[str, Any]],
        expected: Callable[[Probe], bool],
        what: str,
        timeout: float = 30.0,
        *,
        drop_safety_net: bool = False,
    ) -> Probe:
        """Apply `documents` (replacing same-named ones) and wait until `expected` holds;
        `drop_safety_net` first deletes the safety-net policy and binding of the same name
        (for registrations printed with `--no-safety-net-policy`)."""
        if drop_safety_net:
            for name in {d["metadata"]["name"] for d in documents}:
                self.registration.delete(name, mutating=False, validating=False)
        self.registration.apply(documents)
        return self.wait(expected, what, timeout)

    def restore(self, extra_names: Sequence[str] = ()) -> None:
        """Back to the default registration: delete `extra_names`, re-apply, wait."""
        for name in extra_names:
            self.registration.delete(name)
        self.register()
