"""Whether this node enforces the driver memory limit, and the label that says so.

``verdict`` is the pure judgement (facts in, label and annotations out). The node enforces
the limit only when all of these hold (docs/enforcement.md cites each):

- the driver is branch ``MIN_DRIVER_BRANCH`` or later: ``nvmlDeviceSetMemoryLimits_v1``, which
  the hook calls, first appears in NVML's R615 headers (nvidia-ml-py 13.615.71, not
  13.610.43), and NVIDIA's Dynamo guide "Per-GPU Compute and Memory Limits with MPS" asks for
  "NVIDIA driver r615 or newer";
- the cgroup hierarchy is v2 (the hook refuses v1: "setting GPU memory limits is only
  supported in cgroup v2", toolkit v1.20.1);
- the device plugin injects through CDI (its spec, kind ``cdi_specs.DEVICE_PLUGIN_KIND``, is
  on the node) and that spec gives every GPU of the node the ``apply-cuda-memory-limits``
  hook; no GPU is in MIG mode (NVML: "MIG handles are not supported").

``DriverLimitLabel`` publishes the verdict through ``NodeApi`` only when it changed (a failed
write leaves it unknown, so the next round writes again), and on shutdown sets the label to
"false": fail closed, since nothing vouches for the node while no agent runs on it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass

from webhook.constants import (
    DRIVER_LIMIT_FACTS_ANNOTATION,
    DRIVER_LIMIT_LABEL,
    DRIVER_LIMIT_REASON_ANNOTATION,
)
from webhook.node.cdi_specs import DEVICE_PLUGIN_KIND, MEMORY_LIMIT_HOOK
from webhook.node.driver_limit_facts import NodeFacts, driver_branch
from webhook.node.errors import NodeApiError
from webhook.node.events import emit
from webhook.node.node_api import NodeApi

MIN_DRIVER_BRANCH = 615


@dataclass(frozen=True)
class Verdict:
    """The label's value, the reason (None when enforced) and the facts, as published."""

    enforced: bool
    reason: str | None
    facts: Mapping[str, object]

    def labels(self) -> dict[str, str | None]:
        return {DRIVER_LIMIT_LABEL: "true" if self.enforced else "false"}

    def annotations(self) -> dict[str, str | None]:
        return {
            DRIVER_LIMIT_REASON_ANNOTATION: self.reason,
            DRIVER_LIMIT_FACTS_ANNOTATION: json.dumps(
                self.facts, sort_keys=True, separators=(",", ":")
            ),
        }


def verdict(facts: NodeFacts) -> Verdict:
    """The label for these facts, with the first thing missing as its reason."""
    missing = _first_missing(facts)
    return Verdict(enforced=missing is None, reason=missing, facts=published_facts(facts))


def published_facts(facts: NodeFacts) -> dict[str, object]:
    """What the facts annotation holds (short, stable keys)."""
    plugin = [s for s in facts.specs if s.kind == DEVICE_PLUGIN_KIND]
    covered = frozenset().union(*(s.hook_gpu_ids for s in plugin)) if plugin else frozenset()
    return {
        "driverVersion": facts.driver_version,
        "cgroup": "v2" if facts.cgroup_v2 else "v1",
        "cdiKinds": sorted({s.kind for s in facts.specs if s.kind}),
        "devicePluginCdi": bool(plugin),
        "hookGpus": f"{sum(g.uuid in covered for g in facts.gpus)}/{len(facts.gpus)}",
        "mpsReady": facts.mps_ready,
    }


def _first_missing(facts: NodeFacts) -> str | None:
    """One sentence: what is missing and what to do; None when nothing is."""
    for check in (_driver_missing, _cgroup_missing, _gpus_missing, _hook_missing):
        reason = check(facts)
        if reason is not None:
            return reason
    return None


def _driver_missing(facts: NodeFacts) -> str | None:
    branch = driver_branch(facts.driver_version)
    if branch is None:
        detail = facts.driver_error or f"version {facts.driver_version!r} is unreadable"
        return (
            f"The NVIDIA driver's version is unknown ({detail.rstrip('.')}): run the node "
            "agent with the NVIDIA runtime and NVIDIA_DRIVER_CAPABILITIES including utility."
        )
    if branch < MIN_DRIVER_BRANCH:
        return (
            f"The NVIDIA driver is {facts.driver_version}, older than branch "
            f"R{MIN_DRIVER_BRANCH} that per-cgroup GPU memory limits need: upgrade the driver "
            f"to R{MIN_DRIVER_BRANCH} or later."
        )
    return None


def _cgroup_missing(facts: NodeFacts) -> str | None:
    if facts.cgroup_v2:
        return None
    return (
        "The node runs cgroup v1, where the toolkit's apply-cuda-memory-limits hook fails "
        "every container that asks for a limit: move the node to cgroup v2 "
        "(systemd.unified_cgroup_hierarchy=1)."
    )


def _gpus_missing(facts: NodeFacts) -> str | None:
    if not facts.gpus:
        detail = f" ({facts.gpu_error.rstrip('.')})" if facts.gpu_error else ""
        return (
            f"NVML lists no GPU on this node{detail}: run the node agent on GPU nodes only, "
            "with the NVIDIA runtime and NVIDIA_VISIBLE_DEVICES=all."
        )
    mig = [str(g.index) for g in facts.gpus if g.mig_enabled]
    if mig:
        return (
            f"GPU(s) {', '.join(mig)} are in MIG mode, which NVML's memory limits do not "
            "support: disable MIG on them or keep pods that need the limit off this node."
        )
    return None


def _hook_missing(facts: NodeFacts) -> str | None:
    plugin = [s for s in facts.specs if s.kind == DEVICE_PLUGIN_KIND]
    if not plugin:
        others = sorted({s.kind for s in facts.specs if s.kind})
        seen = f" (CDI kinds found: {', '.join(others)})" if others else ""
        return (
            f"The device plugin does not inject GPUs through CDI: no {DEVICE_PLUGIN_KIND} "
            f"spec under the CDI directories{seen}; set the device plugin's "
            "deviceListStrategy to cdi-cri (GPU Operator: cdi.enabled=true)."
        )
    covered = frozenset().union(*(s.hook_gpu_ids for s in plugin))
    uncovered = [g for g in facts.gpus if g.uuid not in covered]
    if uncovered:
        names = ", ".join(f"{g.index} ({g.uuid})" for g in uncovered)
        where = ", ".join(str(s.path) for s in plugin)
        return (
            f"The device plugin's CDI spec ({where}) has no {MEMORY_LIMIT_HOOK} hook for "
            f"GPU(s) {names}: run a device plugin built with nvidia-container-toolkit "
            "v1.20.1 or later (GPU Operator with toolkit v1.20.1+)."
        )
    return None


class DriverLimitLabel:
    """The node's label and annotations, written when the verdict changes."""

    def __init__(self, node: NodeApi) -> None:
        self.node = node
        self._published: Verdict | None = None

    @property
    def published(self) -> Verdict | None:
        """What the node shows, as far as this agent knows (None: unknown)."""
        return self._published

    def publish(self, current: Verdict) -> bool:
        """Write ``current`` unless the node already shows it; False if the write failed."""
        if self._published == current:
            return True
        try:
            self.node.patch_metadata(labels=current.labels(), annotations=current.annotations())
        except NodeApiError as exc:
            self._published = None
            emit(
                "node_patch_failed",
                f"{exc} Will retry at the next round.",
                level=logging.WARNING,
                label=DRIVER_LIMIT_LABEL,
            )
            return False
        before, self._published = self._published, current
        if before is None or before.enforced != current.enforced or before.reason != current.reason:
            _announce(self.node.node_name, current)
        return True

    def withdraw(self) -> bool:
        """On shutdown: the label to "false" (fail closed); False if the node refused."""
        stopped = Verdict(
            enforced=False,
            reason=(
                "The gpushare node agent stopped, so nothing checks this node's driver "
                "memory limit: start the agent again (its DaemonSet) to label the node."
            ),
            facts=self._published.facts if self._published else {},
        )
        return self.publish(stopped)


def _announce(node: str, current: Verdict) -> None:
    if current.enforced:
        emit(
            "driver_limit_enforced",
            f"Node {node} enforces the driver memory limit: labelled {DRIVER_LIMIT_LABEL}=true.",
            node=node,
        )
    else:
        emit(
            "driver_limit_not_enforced",
            f"Node {node} labelled {DRIVER_LIMIT_LABEL}=false: {current.reason}",
            level=logging.WARNING,
            node=node,
            reason=current.reason,
        )
