"""From a decoded admission request to the webhook's answer, via the pure core.

Owns the scope rules the transport applies before the core sees a pod: only CREATE of core
v1 pods is looked at (anything else is allowed unchanged), excluded namespaces and mirror
pods are skipped, and a worker with no policies loaded answers 503 rather than guess. The
core's ``Outcome`` becomes a named reply; a core exception becomes a 500 that still echoes
the uid, so the apiserver's failurePolicy decides.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from webhook.constants import (
    MIRROR_POD_ANNOTATION,
)
from webhook.core import PolicySet, Verdict, mutate, validate
from webhook.server.pod_shape import pod_shape_problem
from webhook.server.policy_store import PolicyStore
from webhook.server.review import (
    AdmissionRequest,
    MalformedReviewError,
    Outcome,
    Reply,
    allowed,
    decode_review,
    denied,
    errored,
    patched,
)

log = logging.getLogger("gpushare.admission")

# The kubelet marks the API copy of a static pod with this annotation; such mirror pods
# cannot be changed by admission (the kubelet recreates them from the file).

CoreDecision = Callable[[Mapping[str, Any], str, PolicySet], Verdict]


class Endpoint(StrEnum):
    MUTATE = "mutate"
    VALIDATE = "validate"


CORE_DECISIONS: dict[Endpoint, CoreDecision] = {
    Endpoint.MUTATE: mutate,
    Endpoint.VALIDATE: validate,
}


@dataclass(slots=True)
class Answer:
    """A reply plus what was understood of the request, for the admission log line."""

    reply: Reply
    request: AdmissionRequest | None = None
    policy: str | None = None


def is_mirror_pod(pod: Mapping[str, Any]) -> bool:
    # dict, not Mapping: decoded JSON has no other mappings, and an isinstance test against
    # an ABC costs several times more on every admission.
    metadata = pod.get("metadata")
    if not isinstance(metadata, dict):
        return False
    annotations = metadata.get("annotations")
    return isinstance(annotations, dict) and MIRROR_POD_ANNOTATION in annotations


@dataclass(frozen=True)
class AdmissionHandler:
    """Answers AdmissionReview bodies for one endpoint."""

    endpoint: Endpoint
    store: PolicyStore
    excluded_namespaces: frozenset[str] = frozenset({"kube-system"})

    def answer(self, body: bytes) -> Answer:
        try:
            request = decode_review(body)
        except MalformedReviewError as bad:
            return Answer(errored(bad.http_status, bad.message, bad.uid))
        try:
            return self._decide(request)
        except Exception:
            log.exception(
                "admission failed", extra={"uid": request.uid, "endpoint": str(self.endpoint)}
            )
            return Answer(
                errored(500, "The webhook failed to evaluate the pod; see its logs.", request.uid),
                request,
            )

    def _decide(self, request: AdmissionRequest) -> Answer:
        if not request.is_pod_create:
            return Answer(allowed(request.uid, outcome=Outcome.SKIPPED), request)
        pod = request.object
        if pod is None:
            return Answer(
                errored(400, "request.object is missing for a pod CREATE.", request.uid), request
            )
        if request.namespace in self.excluded_namespaces or is_mirror_pod(pod):
            return Answer(allowed(request.uid, outcome=Outcome.SKIPPED), request)
        # No apiserver sends a pod with ``metadata: true`` or ``env: "x"``. The core would
        # answer some of those anyway (a number where the annotation should be a string) and
        # patch others into something the apiserver cannot apply; a 400 naming the field is
        # the clear answer.
        problem = pod_shape_problem(pod)
        if problem is not None:
            return Answer(errored(400, problem, request.uid), request)
        policies = self.store.policies
        if policies is None:
            return Answer(
                errored(
                    503,
                    "No valid policies are loaded yet; see /readyz for the problems.",
                    request.uid,
                ),
                request,
            )
        # dryRun needs no special case: the webhook has no side effects, so a dry run gets
        # exactly the answer a real request would.
        outcome = CORE_DECISIONS[self.endpoint](pod, request.namespace, policies)
        return Answer(self._reply(request.uid, outcome), request, outcome.policy)

    def _reply(self, uid: str, outcome: Verdict) -> Reply:
        if not outcome.allowed:
            return denied(uid, outcome.code, outcome.reasons, outcome.warnings)
        if outcome.patch and self.endpoint is Endpoint.MUTATE:
            return patched(uid, outcome.patch, outcome.warnings)
        # A validating webhook may not patch; the apiserver would reject the response.
        return allowed(uid, outcome.warnings)
