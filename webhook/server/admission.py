"""What an admission endpoint decides for a decoded request: the scope rules, then the core.

``endpoint.AdmissionEndpoint`` reads and decodes the request; this module decides it:

- ``pod_handler``: the scope rules before the core sees a pod. Only CREATE of core v1 pods is
  looked at (anything else is allowed unchanged), a pod whose field types the core cannot
  read is a 400, and a worker with no policies loaded answers 503 rather than guess. The
  core's ``Verdict`` becomes an ``AdmissionResponse``.
- Workloads (Deployment, Job, RayCluster, ... : ``webhook.core.workload_kinds``) are the
  validating endpoint's too: a template check is validation, and templates are not
  patched there. The mutating endpoint patches one thing in a workload: the share a
  template Kueue manages must carry for Kueue to charge it (``_charge_for_kueue``). On
  CREATE, and on an UPDATE that changes the pod template, the template is evaluated as the
  pods it will make: denied with their reasons after a prefix naming the
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
    Planned,
    PolicySet,
    Shape,
    TooManyTemplatesError,
    Untouched,
    Verdict,
    WorkloadKind,
    WorkloadVerdict,
    check_workload,
    kueue_charge,
    kueue_queue,
    pod_shape_problem,
    pod_size_problem,
    remembered_mutate,
    template_changed,
    template_pod,
    templates_at,
    validate,
    workload_kind,
)
from webhook.policy_store import PolicyStore
from webhook.server.review import (
    AdmissionRequest,
    AdmissionResponse,
    Outcome,
    allowed,
    denied,
    errored,
    patched,
)

log = logging.getLogger("gpushare.server")

# What an admission endpoint does with a decoded request.
Decide = Callable[[AdmissionRequest], AdmissionResponse]
CoreDecision = Callable[[Mapping[str, Any], str, PolicySet], Verdict]


class Endpoint(StrEnum):
    MUTATE = "mutate"
    VALIDATE = "validate"


# The mutating webhook answers a template's replicas from one plan (``remembered_mutate``):
# it only encodes the verdict, so sharing it is safe here.
CORE_DECISIONS: dict[Endpoint, CoreDecision] = {
    Endpoint.MUTATE: remembered_mutate,
    Endpoint.VALIDATE: validate,
}


def pod_handler(endpoint: Endpoint, store: PolicyStore) -> Decide:
    """The handler of ``endpoint``: scope rules, then the core's mutate or validate."""
    may_patch = endpoint is Endpoint.MUTATE

    def handle(request: AdmissionRequest) -> AdmissionResponse:
        if not request.is_pod_create:
            if may_patch:
                return _charge_for_kueue(request, store)
            return _handle_workload(request, store)
        pod = request.object
        if pod is None:
            return errored(400, "request.object is missing for a pod CREATE.")
        # No apiserver sends a pod with ``metadata: true`` or ``env: "x"``; the core would
        # answer some of those and patch others into something the apiserver cannot apply.
        problem = pod_shape_problem(pod)
        if problem is not None:
            return errored(400, problem)
        too_large = pod_size_problem(pod)
        if too_large is not None:
            return denied(422, [too_large])
        policies = store.policies
        if policies is None:
            return errored(503, "No valid policies are loaded yet; see /readyz for the problems.")
        # dryRun gets the same answer: the webhook has no side effects (only the showback
        # counter leaves dry runs out, endpoint.py). The decision is looked up per call so
        # that tests can swap one in.
        verdict = CORE_DECISIONS[endpoint](pod, request.namespace, policies)
        return _response(verdict, may_patch)

    return handle


_WORKLOAD_OPERATIONS = ("CREATE", "UPDATE")


def _handle_workload(request: AdmissionRequest, store: PolicyStore) -> AdmissionResponse:
    """A workload's pod templates, checked as its pods; anything else is allowed unchanged."""
    if request.sub_resource or request.operation not in _WORKLOAD_OPERATIONS:
        return allowed(outcome=Outcome.SKIPPED)
    policies = store.policies
    kind = workload_kind(request.group, request.kind, policies)
    if kind is None:
        return allowed(outcome=Outcome.SKIPPED)
    workload = request.object
    if workload is None:
        return errored(400, f"request.object is missing for a {kind.kind} {request.operation}.")
    if request.operation == "UPDATE" and not template_changed(request.old_object, workload, kind):
        return allowed(outcome=Outcome.SKIPPED)
    # A cluster-scoped kind's templates make pods in the namespaces of the objects that use
    # them; they are read as if in the default namespace (the kind's note says so).
    namespace = request.namespace or "default"
    problem = _template_problem(workload, kind, namespace)
    if problem is not None:
        return problem
    if policies is None:
        return errored(503, "No valid policies are loaded yet; see /readyz for the problems.")
    checked = check_workload(workload, kind, namespace, policies)
    if checked is None:
        return allowed(outcome=Outcome.SKIPPED)
    return _workload_response(checked)


def _charge_for_kueue(request: AdmissionRequest, store: PolicyStore) -> AdmissionResponse:
    """A workload Kueue manages: its templates get the share its pods will hold, so that
    Kueue charges it (``webhook.core.workload_quota``); anything else is left alone, and a
    template the validating webhook refuses is refused there."""
    if request.sub_resource or request.operation not in _WORKLOAD_OPERATIONS:
        return allowed(outcome=Outcome.SKIPPED)
    policies = store.policies
    kind = workload_kind(request.group, request.kind, policies)
    workload = request.object
    if kind is None or workload is None or kueue_queue(workload) is None or policies is None:
        return allowed(outcome=Outcome.SKIPPED)
    if request.operation == "UPDATE" and not template_changed(request.old_object, workload, kind):
        return allowed(outcome=Outcome.SKIPPED)
    if _template_problem(workload, kind, request.namespace or "default") is not None:
        return allowed(outcome=Outcome.SKIPPED)  # the validating webhook says why
    checked = check_workload(workload, kind, request.namespace or "default", policies)
    charge = kueue_charge(checked) if checked is not None else None
    if charge is None or (not charge.patch and not charge.warnings):
        return allowed(outcome=Outcome.SKIPPED)
    if not charge.patch:
        return allowed(list(charge.warnings), policy=charge.policy)
    return patched(charge.patch, list(charge.warnings), charge.policy)


def _template_problem(
    workload: Mapping[str, Any], kind: WorkloadKind, namespace: str
) -> AdmissionResponse | None:
    """A template the core cannot read: its field types (400) or its size (422)."""
    try:
        found = templates_at(workload, kind)
    except TooManyTemplatesError:
        return None  # check_workload refuses it, saying why
    for at in found:
        root = f"request.object.{at.where}"
        if type(at.value) is not dict:
            return errored(400, f"{root} must be an object.")
        pod = (
            at.value
            if at.site.shape is Shape.POD_TEMPLATE
            else template_pod(workload, kind, at, namespace)
        )
        if pod is None:
            continue
        problem = pod_shape_problem(pod, root)
        if problem is not None:
            return errored(400, problem)
        too_large = pod_size_problem(pod, root)
        if too_large is not None:
            return denied(422, [too_large])
    return None


def _workload_response(checked: WorkloadVerdict) -> AdmissionResponse:
    if not checked.allowed:
        own = [w for t in checked.denied for w in t.pod.warnings]
        return denied(checked.code, checked.admission_reasons, own, checked.policy)
    if all(isinstance(t.decision, Untouched) for t in checked.templates) and not checked.notes:
        return allowed(checked.warnings, outcome=Outcome.SKIPPED, policy=checked.policy)
    return allowed(checked.warnings, policy=checked.policy)


def _response(verdict: Verdict, may_patch: bool) -> AdmissionResponse:
    if not verdict.allowed:
        return denied(verdict.code, verdict.reasons, verdict.warnings, verdict.policy)
    if isinstance(verdict.decision, Untouched):
        return allowed(verdict.warnings, outcome=Outcome.SKIPPED, policy=verdict.policy)
    # A validating webhook may not patch; the apiserver would reject the response.
    if verdict.patch and may_patch:
        return patched(
            verdict.patch, verdict.warnings, verdict.policy, milli_gpus=_milli_gpus(verdict)
        )
    return allowed(verdict.warnings, policy=verdict.policy)


def _milli_gpus(verdict: Verdict) -> int | None:
    """The share the pod holds, where its policy counts shares (the applied record's
    ``milliGpus``, ``webhook.core.share_accounting``); None elsewhere."""
    decision = verdict.decision
    if not isinstance(decision, Planned):
        return None
    milli = decision.record.get("milliGpus")
    return milli if type(milli) is int else None
