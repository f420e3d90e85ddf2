"""From an admission request to its answer: decode once, handle, complete.

Owns the two steps between HTTP and the core, in the shape of controller-runtime's admission
package:

- ``review_pipeline``: Content-Type and size checks, ``decode_review`` (once), the handler,
  then ``AdmissionResponse.complete`` (the uid), whatever happened; a handler that raises
  becomes a 500 that still echoes the uid, so the apiserver's failurePolicy decides.
- ``pod_handler``: the scope rules before the core sees a pod. Only CREATE of core v1 pods is
  looked at (anything else is allowed unchanged), a pod whose field types the core cannot
  read is a 400, and a worker with no policies loaded answers 503 rather than guess. The
  core's ``Verdict`` becomes an ``AdmissionResponse``.
- Workloads (Deployment, Job, CronJob, ... : ``webhook.core.WORKLOAD_KINDS``) are the
  validating endpoint's too: a template check is validation, and templates are never
  patched. On CREATE, and on an UPDATE that changes the pod template, the template is
  evaluated as the pods it will make: denied with their reasons after a prefix naming the
  workload, or allowed with warnings saying what each pod will get. An UPDATE that leaves
  the template alone (scaling, a controller's own annotations, finalizers) is not looked at,
  so a policy changed since never blocks it.

Namespaces excluded by the policies' settings and mirror pods are the core's to skip.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from enum import StrEnum
from typing import Any

from webhook.core import (
    PolicySet,
    TemplateVerdict,
    Untouched,
    Verdict,
    check_template,
    mutate,
    pod_template,
    template_changed,
    validate,
    workload_kind,
)
from webhook.server.body_budget import BodyBudget
from webhook.server.pod_shape import pod_shape_problem
from webhook.server.policy_store import PolicyStore
from webhook.server.request_body import UnreadableBodyError
from webhook.server.review import (
    JSON_CONTENT_TYPE,
    AdmissionRequest,
    AdmissionResponse,
    MalformedReviewError,
    Outcome,
    allowed,
    decode_review,
    denied,
    errored,
    patched,
)

log = logging.getLogger("gpushare.server")

# What an admission endpoint does with a decoded request.
Handler = Callable[[AdmissionRequest], AdmissionResponse]
# Reads the request body: None when it is (or declares to be) over the cap.
BodyReader = Callable[[], bytes | None]
# An endpoint as the HTTP layer calls it: the request's Content-Type and a way to read its
# body in, the completed response out.
ReviewPipeline = Callable[[str, BodyReader], AdmissionResponse]
CoreDecision = Callable[[Mapping[str, Any], str, PolicySet], Verdict]


class Endpoint(StrEnum):
    MUTATE = "mutate"
    VALIDATE = "validate"


CORE_DECISIONS: dict[Endpoint, CoreDecision] = {
    Endpoint.MUTATE: mutate,
    Endpoint.VALIDATE: validate,
}
_HANDLER_FAILED = "The webhook failed to evaluate the pod; see its logs."
_READ_FAILED = "The webhook failed to read the request; see its logs."
_BUSY = "The webhook is busy decoding other large requests; try again."


def _decode_and_handle(body: bytes, handler: Handler) -> AdmissionResponse:
    try:
        request = decode_review(body)
    except MalformedReviewError as bad:
        return errored(bad.http_status, bad.message).complete(None, bad.uid)
    try:
        response = handler(request)
    except Exception:
        log.exception("admission failed", extra={"uid": request.uid})
        response = errored(500, _HANDLER_FAILED)
    return response.complete(request)


def review_pipeline(
    handler: Handler, max_body_bytes: int, budget: BodyBudget | None = None
) -> ReviewPipeline:
    """Decode once, handle, complete: the path every AdmissionReview takes.

    Answers given before a request is decoded have no uid to echo; their defaults are final.
    Large bodies wait for room in ``budget`` before they are decoded (``body_budget``).
    """
    budget = budget or BodyBudget(max_body_bytes)
    too_large = (
        f"The request body is larger than {max_body_bytes} bytes; the apiserver never sends "
        "more than 3 MiB."
    )

    def review(content_type: str, read_body: BodyReader) -> AdmissionResponse:
        if content_type != JSON_CONTENT_TYPE and not _is_json(content_type):
            return errored(
                415, f"Content-Type must be {JSON_CONTENT_TYPE}, not {content_type or 'missing'!r}."
            )
        try:
            body = read_body()
        except UnreadableBodyError as error:
            return errored(400, f"The request body could not be read ({error}).")
        except Exception:  # a bug in the reader
            log.exception("reading an admission request failed")
            return errored(500, _READ_FAILED)
        if body is None:
            return errored(413, too_large)
        with budget.hold(len(body)) as admitted:
            if not admitted:
                return errored(503, _BUSY)
            return _decode_and_handle(body, handler)

    return review


def _is_json(content_type: str) -> bool:
    return content_type.partition(";")[0].strip().lower() == JSON_CONTENT_TYPE


def pod_handler(endpoint: Endpoint, store: PolicyStore) -> Handler:
    """The handler of ``endpoint``: scope rules, then the core's mutate or validate."""
    may_patch = endpoint is Endpoint.MUTATE

    def handle(request: AdmissionRequest) -> AdmissionResponse:
        if not request.is_pod_create:
            if may_patch:
                return allowed(outcome=Outcome.SKIPPED)
            return _handle_workload(request, store)
        pod = request.object
        if pod is None:
            return errored(400, "request.object is missing for a pod CREATE.")
        # No apiserver sends a pod with ``metadata: true`` or ``env: "x"``; the core would
        # answer some of those and patch others into something the apiserver cannot apply.
        problem = pod_shape_problem(pod)
        if problem is not None:
            return errored(400, problem)
        policies = store.policies
        if policies is None:
            return errored(503, "No valid policies are loaded yet; see /readyz for the problems.")
        # dryRun needs no special case: the webhook has no side effects. The decision is
        # looked up per call so that tests can swap one in.
        verdict = CORE_DECISIONS[endpoint](pod, request.namespace, policies)
        return _response(verdict, may_patch)

    return handle


_WORKLOAD_OPERATIONS = ("CREATE", "UPDATE")


def _handle_workload(request: AdmissionRequest, store: PolicyStore) -> AdmissionResponse:
    """A workload's pod template, checked as its pods; anything else is allowed unchanged."""
    kind = workload_kind(request.group, request.kind)
    if kind is None or request.sub_resource or request.operation not in _WORKLOAD_OPERATIONS:
        return allowed(outcome=Outcome.SKIPPED)
    workload = request.object
    if workload is None:
        return errored(400, f"request.object is missing for a {kind.kind} {request.operation}.")
    if request.operation == "UPDATE" and not template_changed(request.old_object, workload, kind):
        return allowed(outcome=Outcome.SKIPPED)
    template = pod_template(workload, kind)
    if template is None:
        return allowed(outcome=Outcome.SKIPPED)
    root = f"request.object.{kind.where}"
    if type(template) is not dict:
        return errored(400, f"{root} must be an object.")
    problem = pod_shape_problem(template, root)
    if problem is not None:
        return errored(400, problem)
    policies = store.policies
    if policies is None:
        return errored(503, "No valid policies are loaded yet; see /readyz for the problems.")
    checked = check_template(workload, kind, request.namespace, policies)
    if checked is None:  # not reached: the template is an object
        return allowed(outcome=Outcome.SKIPPED)
    return _template_response(checked)


def _template_response(checked: TemplateVerdict) -> AdmissionResponse:
    if not checked.allowed:
        return denied(checked.code, checked.admission_reasons, checked.pod.warnings, checked.policy)
    if isinstance(checked.decision, Untouched):
        return allowed(checked.warnings, outcome=Outcome.SKIPPED, policy=checked.policy)
    return allowed(checked.warnings, policy=checked.policy)


def _response(verdict: Verdict, may_patch: bool) -> AdmissionResponse:
    if not verdict.allowed:
        return denied(verdict.code, verdict.reasons, verdict.warnings, verdict.policy)
    if isinstance(verdict.decision, Untouched):
        return allowed(verdict.warnings, outcome=Outcome.SKIPPED, policy=verdict.policy)
    # A validating webhook may not patch; the apiserver would reject the response.
    if verdict.patch and may_patch:
        return patched(verdict.patch, verdict.warnings, verdict.policy)
    return allowed(verdict.warnings, policy=verdict.policy)
