"""``gpushare check-admission``: does the apiserver reach the webhook? Asked as a pod would.

After an install or upgrade (the Helm chart's post-install hook Job and its `helm test` pod,
deploy/admission-check without Helm) a wrong guess must not ship silently: a NetworkPolicy
that leaves out the apiserver's addresses, a Service without endpoints, a caBundle that does
not fit. Each shows the same way: an annotated pod is refused (failurePolicy Fail), or
admitted unshared (Ignore). So the check does what a user would, without leaving anything
behind: a server-side dry run (``dryRun=All``: every admission step runs, mutating webhooks
and the safety net included, and nothing is stored) of a pod annotated ``gpu-fraction:
"0.5"``, in a namespace gpushare serves. It passes only if the pod comes back carrying
gpushare's record (``gpushare.io/applied``), the proof that ``mutate.gpushare.io`` answered.

Endpoints and caBundle take a moment after an install, so a failed attempt is tried again
until ``timeout`` has passed; an answer that cannot change by waiting (no right to create
pods there, no such namespace) ends it at once. Every attempt is reported, and the last
reason, with what to look at, is the failure's message.

RBAC it needs: ``create`` on pods in that one namespace (a dry run is authorised as the
create it stands for).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from webhook.constants import APPLIED_ANNOTATION, FRACTION_ANNOTATION
from webhook.install.webhook_config import MUTATING_WEBHOOK_NAME

# The Kubernetes client is an optional extra (webhook/cli/cluster_client.py): only the
# caller's ApiClient is used here, and the client's own errors are imported when a check runs.
if TYPE_CHECKING:
    from kubernetes import client as k8s

CHECK_FRACTION = "0.5"
# Never pulled: a dry run schedules and starts nothing.
CHECK_IMAGE = "registry.k8s.io/pause:3.10"
POD_NAME_PREFIX = "gpushare-admission-check-"
DEFAULT_CHECK_NAMESPACE = "default"
DEFAULT_CHECK_TIMEOUT_SECONDS = 60
RETRY_INTERVAL_SECONDS = 5.0
# Seconds for connecting and for the answer: the apiserver waits up to the webhook's own
# timeout (at most 30 s) before it answers.
REQUEST_TIMEOUT = (5.0, 40.0)
MAX_RESPONSE_BYTES = 4 << 20
# How the apiserver's RBAC authorizer words a refusal (a webhook's or a policy's 403 differs).
RBAC_REFUSAL = 'cannot create resource "pods"'


def check_pod(image: str = CHECK_IMAGE) -> dict[str, Any]:
    """The annotated pod the check sends: the smallest a user would write, within the
    restricted Pod Security Standard so a namespace enforcing it takes it too."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": POD_NAME_PREFIX,
            "annotations": {FRACTION_ANNOTATION: CHECK_FRACTION},
            "labels": {"app.kubernetes.io/name": "gpushare-admission-check"},
        },
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [
                {
                    "name": "check",
                    "image": image,
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                        "runAsUser": 65535,
                    },
                }
            ],
        },
    }


@dataclass(frozen=True)
class Attempt:
    """One dry run: passed, or why not; ``final`` when trying again cannot help."""

    passed: bool
    reason: str
    final: bool = False


@dataclass(frozen=True)
class CheckResult:
    passed: bool
    attempts: int
    message: str


UNREACHABLE_HINT = (
    "the apiserver could not get an answer from gpushare's webhook. Check that its pods "
    "are ready and its Service has endpoints, that caBundle is set, and that no "
    "NetworkPolicy keeps the apiserver's addresses from port 8443 (the chart's "
    "networkPolicy.apiserverCIDRs, deploy/components/networkpolicy; docs/deploying.md)"
)


def unmutated_hint(namespace: str) -> str:
    return (
        f"the pod was admitted without gpushare's record ({APPLIED_ANNOTATION}): "
        f"{MUTATING_WEBHOOK_NAME} did not mutate it. Either the apiserver could not reach the "
        "webhook and failurePolicy Ignore let the pod through unshared (see its pods, "
        "Service endpoints and NetworkPolicy), or the webhook does not serve namespace "
        f"{namespace} (excluded by the policies or labelled gpushare.io/webhook=exclude: "
        "check another with --namespace)"
    )


@dataclass
class AdmissionCheck:
    """The edge: one dry-run create per ``attempt`` through the API."""

    api: k8s.ApiClient
    namespace: str = DEFAULT_CHECK_NAMESPACE
    image: str = CHECK_IMAGE

    def attempt(self) -> Attempt:
        from urllib3.exceptions import HTTPError  # the client's transport

        try:
            status, answer = self._dry_run_create()
        except (HTTPError, OSError) as error:
            return Attempt(False, f"the apiserver did not answer: {type(error).__name__}: {error}")
        if not 200 <= status <= 299:
            return self._refused(status, answer)
        annotations = (answer.get("metadata") or {}).get("annotations") or {}
        record = annotations.get(APPLIED_ANNOTATION)
        if not record:
            return Attempt(False, unmutated_hint(self.namespace))
        return Attempt(True, f"{MUTATING_WEBHOOK_NAME} mutated it: {APPLIED_ANNOTATION}={record}")

    def _refused(self, status: int, answer: dict[str, Any]) -> Attempt:
        message = str(answer.get("message") or answer or "no message")
        refused = f"the apiserver refused the pod (HTTP {status}): {message}"
        if f'failed calling webhook "{MUTATING_WEBHOOK_NAME}"' in message:
            return Attempt(False, f"{refused}; {UNREACHABLE_HINT}")
        if "never mutated by gpushare" in message:  # the safety net, under Ignore
            return Attempt(False, f"{refused}; {UNREACHABLE_HINT}")
        # No credentials, no right to create pods there (RBAC), no such namespace: no
        # waiting changes these. Other refusals (a webhook's 403 included) may.
        final = (
            status == 401
            or (status == 403 and RBAC_REFUSAL in message)
            or (status == 404 and "namespaces" in message)
        )
        return Attempt(False, refused, final=final)

    def _dry_run_create(self) -> tuple[int, dict[str, Any]]:
        """POST the pod with dryRun=All as raw JSON; (HTTP status, the JSON answer)."""
        call = self.api.param_serialize(
            "POST",
            "/api/v1/namespaces/{namespace}/pods",
            path_params={"namespace": self.namespace},
            query_params=[("dryRun", "All")],
            header_params={"Content-Type": "application/json", "Accept": "application/json"},
            body=check_pod(self.image),
            auth_settings=["BearerToken"],
        )
        response = self.api.call_api(*call, _request_timeout=REQUEST_TIMEOUT)
        data: bytes = response.read()  # type: ignore[no-untyped-call]
        try:
            answer = json.loads(data[:MAX_RESPONSE_BYTES]) if data else {}
        except ValueError:
            answer = {"message": data[:500].decode(errors="replace")}
        return int(response.status), answer if isinstance(answer, dict) else {}


def run_check(
    attempt: Callable[[], Attempt],
    timeout_seconds: float,
    report: Callable[[str], None],
    *,
    interval: float = RETRY_INTERVAL_SECONDS,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> CheckResult:
    """Attempt until one passes, one is final, or ``timeout_seconds`` have passed; each
    failed attempt is reported as it happens."""
    deadline = clock() + timeout_seconds
    count = 0
    while True:
        count += 1
        result = attempt()
        if result.passed:
            return CheckResult(True, count, result.reason)
        report(f"attempt {count}: {result.reason}")
        if result.final or clock() + interval > deadline:
            return CheckResult(False, count, result.reason)
        sleep(interval)
