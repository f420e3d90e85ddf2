"""The schemes a plan compares, and each workload's fate under each: the core's own decision.

A scheme is a policy set. ``as configured`` is the set as loaded: each workload gets the
policy the webhook would pick for it (namespace, labels, priority). Then each policy of the
set on its own, applied to every workload whatever its namespace ("what if the whole mix
ran under this policy"): a copy of the policy that matches every namespace, in a set of its
own with the same excluded namespaces. Either way the decision is ``webhook.core.mutate``
(or ``check_template`` for a workload's template), the very code that answers the
apiserver, so the plan's pools, slots, whole GPUs and denials are the webhook's.

Workloads with equal pods (``Workload.same_pods_key``) are decided once per scheme.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from webhook.core import (
    Denied,
    Planned,
    Policy,
    PolicySet,
    Untouched,
    check_template,
    mutate,
)
from webhook.errors import GpushareError
from webhook.plan.capacity import demand
from webhook.plan.demand import Demand, NotModelled
from webhook.plan.workload import Workload

AS_CONFIGURED = "as configured"


@dataclass(frozen=True)
class Scheme:
    name: str
    policies: PolicySet
    mode: str  # the policy's mode, or "mixed" for the set as configured


@dataclass(frozen=True)
class Fate:
    """What one workload's pods get under a scheme."""

    workload: Workload
    demand: Demand | None = None
    not_modelled: str | None = None
    denied: tuple[str, ...] = ()
    untouched: str | None = None
    policy: str | None = None
    mode: str | None = None
    # The share each pod is charged in quota (gpushare.io/milligpu), where its policy sets
    # quota.shareResource: the applied record's milliGpus.
    milli_gpus: int | None = None

    def of(self, workload: Workload) -> Fate:
        """The same fate for another workload with equal pods (faster than ``replace``)."""
        return Fate(
            workload,
            self.demand,
            self.not_modelled,
            self.denied,
            self.untouched,
            self.policy,
            self.mode,
            self.milli_gpus,
        )


def everywhere(policy: Policy) -> Policy:
    """The policy, matching every namespace and pod (excluded namespaces aside)."""
    match = dataclasses.replace(
        policy.match, namespaces=("*",), exclude_namespaces=(), pod_labels=MappingProxyType({})
    )
    return dataclasses.replace(policy, match=match)


def schemes(policies: PolicySet, names: Sequence[str] = ()) -> list[Scheme]:
    """``as configured``, then each policy alone (only ``names`` where given)."""
    chosen = [p for p in policies.policies if not names or p.name in names]
    unknown = sorted(set(names) - {p.name for p in policies.policies})
    if unknown:
        raise GpushareError(
            f"no policy named {unknown[0]!r}; the policies are "
            f"{', '.join(p.name for p in policies.policies)}"
        )
    result = [] if names else [Scheme(AS_CONFIGURED, policies, "mixed")]
    for policy in chosen:
        alone = PolicySet((everywhere(policy),), policies.excluded_namespaces, policies.sources)
        result.append(Scheme(policy.name, alone, policy.mode.value))
    return result


def _decide(workload: Workload, policies: PolicySet) -> Any:
    if workload.kind is None or workload.at is None:
        return mutate(workload.document, workload.namespace, policies).decision
    verdict = check_template(
        workload.document, workload.kind, workload.namespace, policies, workload.at
    )
    return None if verdict is None else verdict.decision


def _fate(workload: Workload, decision: Any, gpus_per_node: int) -> Fate:
    if isinstance(decision, Denied):
        return Fate(workload, denied=decision.reasons, policy=decision.policy)
    if isinstance(decision, Planned):
        record: Mapping[str, Any] = decision.record
        mode = str(record.get("mode", ""))
        need = demand(decision.policy, record, gpus_per_node)
        milli = record.get("milliGpus") if decision.policy.quota.share_resource else None
        charged = milli if type(milli) is int else None
        name = decision.policy.name
        if isinstance(need, NotModelled):
            return Fate(
                workload, not_modelled=need.reason, policy=name, mode=mode, milli_gpus=charged
            )
        return Fate(workload, demand=need, policy=name, mode=mode, milli_gpus=charged)
    reason = decision.reason if isinstance(decision, Untouched) else "no pod template"
    return Fate(workload, untouched=reason)


def fates(scheme: Scheme, workloads: Sequence[Workload], gpus_per_node: int) -> list[Fate]:
    """Every workload's fate under ``scheme``, in input order; equal pods decided once."""
    decided: dict[bytes, Fate] = {}
    result = []
    for workload in workloads:
        key = workload.same_pods_key
        known = decided.get(key)
        if known is None:
            decision = _decide(workload, scheme.policies)
            known = _fate(workload, decision, gpus_per_node)
            decided[key] = known
        result.append(known if known.workload is workload else known.of(workload))
    return result
