"""One scheme's outcome: the fates of the workloads packed per pool, and the totals.

Per pool (``Demand.group``): the admitted pods packed by first-fit decreasing
(``packing``), the GPUs that takes (bins; for whole GPUs the GPUs asked), the nodes
(GPUs / GPUs per node, rounded up: any GPUs can be grouped into nodes, since no shared pod
spans two GPUs; for whole GPUs the node bins themselves), the lower bound, and what the
bound on the packing is. Per scheme: those summed, against one GPU per pod, the compute and
memory asked but left idle on the GPUs used, what is isolated, the pods not served with
the core's reasons, and each quota on GPU shares against what the scheme's workloads ask of
it (``quota_fit``). ``plan``: every scheme's outcome, side by side.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from webhook.core import PolicySet
from webhook.plan.demand import Demand
from webhook.plan.isolation import Isolation, isolation
from webhook.plan.packing import Item, Packing, first_fit_decreasing
from webhook.plan.quota_fit import QuotaFit, check_quotas
from webhook.plan.quota_input import ShareQuota
from webhook.plan.schemes import Fate, Scheme, fates, schemes
from webhook.plan.workload import Workload

DEFAULT_GPUS_PER_NODE = 8
EXACT = "exact: every pod takes the same share, so any order fills the same bins"
ONE_DIMENSION = "FFD <= 11/9 x optimum + 6/9 (Dosa 2007); optimum >= lower bound"
SEVERAL_DIMENSIONS = "vector FFD, no constant bound; optimum >= lower bound"


@dataclass(frozen=True)
class PoolOutcome:
    group: str
    unit: str
    capacity: tuple[int, ...]
    gpus_per_node: int
    node_bins: bool
    packing: Packing
    pods: int
    gpus: int
    nodes: int
    lower_bound_gpus: int
    asked_gpus: float  # the GPU shares asked, summed
    gpu_memory_mib: int | None
    asked_memory_mib: float | None
    bound: str
    sizes: Mapping[str, tuple[int, ...]]  # each packed label's size


@dataclass(frozen=True)
class NotServed:
    workload: str
    pods: int
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class SchemeOutcome:
    scheme: Scheme
    pools: tuple[PoolOutcome, ...]
    denied: tuple[NotServed, ...]
    not_modelled: tuple[NotServed, ...]
    untouched: tuple[NotServed, ...]
    isolation: tuple[tuple[str, Isolation], ...]  # per mode used
    modes: tuple[str, ...] = field(default=())
    quotas: tuple[QuotaFit, ...] = ()  # each quota on GPU shares given, against the fates

    @property
    def pods_served(self) -> int:
        return sum(pool.pods for pool in self.pools)

    @property
    def gpus(self) -> int:
        return sum(pool.gpus for pool in self.pools)

    @property
    def nodes(self) -> int:
        return sum(pool.nodes for pool in self.pools)

    @property
    def lower_bound_gpus(self) -> int:
        return sum(pool.lower_bound_gpus for pool in self.pools)

    @property
    def one_gpu_per_pod(self) -> int:
        """GPUs without sharing: one per shared pod, k per pod asking k whole GPUs."""
        return sum((round(pool.asked_gpus) if pool.node_bins else pool.pods) for pool in self.pools)

    @property
    def idle_gpus(self) -> float:
        """GPU compute asked by nobody on the GPUs used (whole GPUs count as used)."""
        return sum(pool.gpus - pool.asked_gpus for pool in self.pools if not pool.node_bins)

    @property
    def idle_memory_mib(self) -> float | None:
        """GPU memory asked by nobody on the shared GPUs used; None where a pool's GPU
        memory is not declared (the policy leaves it to the nodes)."""
        total = 0.0
        for pool in self.pools:
            if pool.node_bins:
                continue
            if pool.gpu_memory_mib is None or pool.asked_memory_mib is None:
                return None
            total += pool.gpus * pool.gpu_memory_mib - pool.asked_memory_mib
        return total

    @property
    def pods_not_served(self) -> int:
        return sum(item.pods for item in (*self.denied, *self.not_modelled))


def _bound(items: Sequence[Item]) -> str:
    if len({item.size for item in items}) == 1:
        return EXACT
    return ONE_DIMENSION if len(items[0].size) == 1 else SEVERAL_DIMENSIONS


def pack_pool(group: str, demands: Sequence[tuple[Demand, int, str]]) -> PoolOutcome:
    """Pack one pool's admitted pods: (demand, pods, workload name) each."""
    first = demands[0][0]
    sizes: dict[str, tuple[int, ...]] = {}
    items = []
    for demand, count, name in demands:
        label = name
        if sizes.get(label, demand.size) != demand.size:  # one name, two sizes: tell apart
            label = f"{name} ({'/'.join(map(str, demand.size))} {demand.unit})"
        sizes[label] = demand.size
        items.append(Item(label, demand.size, count))
    packing = first_fit_decreasing(first.capacity, items)
    pods = sum(count for _, count, _ in demands)
    asked = sum(demand.share * count for demand, count, _ in demands)
    memories = [demand.memory_mib for demand, _, _ in demands]
    asked_memory = (
        None
        if any(m is None for m in memories)
        else sum((d.memory_mib or 0.0) * c for d, c, _ in demands)
    )
    if first.node_bins:
        gpus = sum(demand.size[0] * count for demand, count, _ in demands)
        nodes, lower = packing.bin_count, gpus
    else:
        gpus = packing.bin_count
        nodes, lower = math.ceil(gpus / first.gpus_per_node), packing.lower_bound
    return PoolOutcome(
        group,
        first.unit,
        first.capacity,
        first.gpus_per_node,
        first.node_bins,
        packing,
        pods,
        gpus,
        nodes,
        lower,
        asked,
        first.gpu_memory_mib,
        asked_memory,
        _bound(items),
        sizes,
    )


def _too_big(demand: Demand) -> str:
    """Why no bin can hold the pod ("" when one can): only whole GPUs can ask more than a
    node of --gpus-per-node GPUs has; the core keeps shares within a GPU."""
    if all(size <= room for size, room in zip(demand.size, demand.capacity, strict=True)):
        return ""
    return (
        f"asks {demand.size[0]} {demand.unit} on one node, but the nodes of "
        f"{demand.group} have {demand.capacity[0]}: give --gpus-per-node the nodes' GPU count"
    )


def outcome(
    scheme: Scheme, fates: Sequence[Fate], quotas: Sequence[ShareQuota] = ()
) -> SchemeOutcome:
    groups: dict[str, list[tuple[Demand, int, str]]] = defaultdict(list)
    denied, not_modelled, untouched = [], [], []
    modes: dict[str, None] = {}
    checked: dict[int, str] = {}
    for fate in fates:
        count, name = fate.workload.count, fate.workload.name
        if count == 0:
            continue
        if fate.mode:
            modes[fate.mode] = None
        too_big = ""
        if fate.demand is not None:
            if id(fate.demand) not in checked:  # equal workloads share one demand
                checked[id(fate.demand)] = _too_big(fate.demand)
            too_big = checked[id(fate.demand)]
        if fate.demand is not None and too_big:
            denied.append(NotServed(name, count, (too_big,)))
        elif fate.demand is not None:
            groups[fate.demand.group].append((fate.demand, count, name))
        elif fate.denied:
            denied.append(NotServed(name, count, fate.denied))
        elif fate.not_modelled:
            not_modelled.append(NotServed(name, count, (fate.not_modelled,)))
        else:
            untouched.append(NotServed(name, count, (fate.untouched or "",)))
    pools = tuple(pack_pool(group, demands) for group, demands in sorted(groups.items()))
    return SchemeOutcome(
        scheme,
        pools,
        tuple(denied),
        tuple(not_modelled),
        tuple(untouched),
        tuple((mode, isolation(mode)) for mode in sorted(modes)),
        tuple(sorted(modes)),
        check_quotas(quotas, fates),
    )


def plan(
    workloads: Sequence[Workload],
    policies: PolicySet,
    *,
    names: Sequence[str] = (),
    gpus_per_node: int = DEFAULT_GPUS_PER_NODE,
    quotas: Sequence[ShareQuota] = (),
) -> list[SchemeOutcome]:
    """Every scheme's outcome for the workloads, in scheme order; each checked against the
    ``quotas`` on GPU shares."""
    return [
        outcome(scheme, fates(scheme, workloads, gpus_per_node), quotas)
        for scheme in schemes(policies, names)
    ]
