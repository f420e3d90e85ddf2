"""Fraction → pool and slots: replica classes, count mode, gpu-memory, policy bounds."""

from __future__ import annotations

from typing import Any

import pytest

from webhook.core.placement import Placement, format_fraction, place
from webhook.core.policy.model import Policy
from webhook.core.request import GpuRequest

from .support import policies_from, simple_policy


def _policy(**spec: Any) -> Policy:
    return policies_from(simple_policy("p", **spec)).policies[0]


def _fraction(text: str) -> GpuRequest:
    return GpuRequest(fraction=float(text), fraction_text=text)


def _memory(mib: float, text: str) -> GpuRequest:
    return GpuRequest(memory_mib=mib, memory_text=text)


def _placed(policy: Policy, request: GpuRequest) -> Placement:
    result = place(policy, request)
    assert isinstance(result, Placement), result
    return result


def _refused(policy: Policy, request: GpuRequest) -> list[str]:
    result = place(policy, request)
    assert isinstance(result, list), result
    return result


REPLICA_POOLS = [
    {"name": "r2", "replicas": 2},
    {"name": "r3", "replicas": 3},
    {"name": "r4", "replicas": 4},
    {"name": "r8", "replicas": 8},
]


@pytest.mark.parametrize(
    ("fraction", "pool"),
    [
        ("0.5", "r2"),
        ("0.49", "r2"),
        ("0.34", "r2"),
        ("0.3333", "r3"),
        ("0.3", "r3"),
        ("0.26", "r3"),
        ("0.25", "r4"),
        ("0.2", "r4"),
        ("0.126", "r4"),
        ("0.125", "r8"),
        ("0.05", "r8"),
    ],
)
def test_replica_class_takes_one_slot_of_the_smallest_slice_that_covers_the_fraction(
    fraction: str, pool: str
) -> None:
    placement = _placed(_policy(pools=REPLICA_POOLS, fraction={"min": 0.01}), _fraction(fraction))
    assert placement.pool.name == pool
    assert placement.slots == 1
    assert placement.fraction == pytest.approx(float(fraction))


def test_replica_class_does_not_depend_on_pool_order() -> None:
    policy = _policy(pools=list(reversed(REPLICA_POOLS)))
    assert _placed(policy, _fraction("0.25")).pool.name == "r4"


def test_replica_class_tie_between_equal_pools_keeps_the_first_listed() -> None:
    pools = [
        {"name": "a100-half", "replicas": 2, "nodeSelector": {"gpu": "a100"}},
        {"name": "h100-half", "replicas": 2, "nodeSelector": {"gpu": "h100"}},
    ]
    assert _placed(_policy(pools=pools), _fraction("0.5")).pool.name == "a100-half"


def test_fraction_larger_than_every_slice_is_refused_naming_the_largest_slice() -> None:
    refused = _refused(_policy(), _fraction("0.6"))
    assert refused == [
        "gpu-fraction \"0.6\" does not fit any GPU pool: the largest slice policy 'p' offers is "
        "1/2 of a GPU (pool 'half'). Ask for less, or for a whole GPU with gpu-fraction: \"1\"."
    ]


COUNT_POOLS = [{"name": "single", "replicas": 10, "gpusPerNode": 1}]


@pytest.mark.parametrize(
    ("fraction", "slots"),
    [
        ("0.1", 1),
        ("0.05", 1),
        ("0.11", 2),
        ("0.25", 3),
        ("0.3", 3),  # 0.3 * 10 is 3.0000000000000004 in binary floating point
        ("0.7", 7),  # 7.000000000000001
        ("0.9", 9),
        ("0.99", 10),
    ],
)
def test_count_allocation_takes_ceil_fraction_times_replicas_slots(
    fraction: str, slots: int
) -> None:
    policy = _policy(allocation="count", pools=COUNT_POOLS, fraction={"min": 0.01})
    placement = _placed(policy, _fraction(fraction))
    assert placement.slots == slots
    assert placement.granted == pytest.approx(slots / 10)
    assert placement.reason.startswith(f"pool 'single' (1/10 of a GPU per slot) takes {slots} slot")


def test_count_allocation_picks_the_pool_granting_the_least() -> None:
    pools = [
        {"name": "r4", "replicas": 4, "gpusPerNode": 1},
        {"name": "r10", "replicas": 10, "gpusPerNode": 1},
        {"name": "r3", "replicas": 3, "gpusPerNode": 1},
    ]
    policy = _policy(allocation="count", pools=pools)
    # 0.3: r4 → 2/4 = 0.5, r10 → 3/10 = 0.3, r3 → 1/3
    placement = _placed(policy, _fraction("0.3"))
    assert (placement.pool.name, placement.slots) == ("r10", 3)
    # 0.6: r4 → 3/4, r10 → 6/10, r3 → 2/3
    assert _placed(policy, _fraction("0.6")).pool.name == "r10"
    # 0.65: r4 → 0.75, r10 → 0.7, r3 → 0.6667
    placement = _placed(policy, _fraction("0.65"))
    assert (placement.pool.name, placement.slots) == ("r3", 2)


def test_gpu_memory_becomes_the_fraction_of_the_pool_memory() -> None:
    policy = _policy(mode="mps", gpuMemory="80Gi", pools=REPLICA_POOLS)
    placement = _placed(policy, _memory(20480, "20Gi"))
    assert placement.fraction == pytest.approx(0.25)
    assert placement.pool.name == "r4"
    assert placement.memory_mib == 20480


def test_gpu_memory_over_pools_of_different_memory_picks_the_least_granted() -> None:
    pools = [
        {"name": "l4-half", "replicas": 2, "gpuMemory": "24Gi"},
        {"name": "h100-eighth", "replicas": 8, "gpuMemory": "80Gi"},
    ]
    policy = _policy(mode="mps", pools=pools)
    # 10Gi: l4 → 0.4167 (needs the 1/2 slot), h100 → 0.125 (fits 1/8).
    placement = _placed(policy, _memory(10240, "10Gi"))
    assert placement.pool.name == "h100-eighth"
    assert placement.memory_mib == 10240
    # 12Gi: l4 → exactly 1/2; h100 → 0.15 > 1/8: only the L4 pool fits.
    assert _placed(policy, _memory(12288, "12Gi")).pool.name == "l4-half"


def test_gpu_memory_prefers_a_pool_where_the_share_is_within_bounds() -> None:
    """4Gi is 0.05 of an 80Gi GPU (below min 0.1) but 0.167 of a 24Gi one: the L4 pool serves."""
    pools = [
        {"name": "h100-eighth", "replicas": 8, "gpuMemory": "80Gi"},
        {"name": "l4-quarter", "replicas": 4, "gpuMemory": "24Gi"},
    ]
    policy = _policy(mode="mps", pools=pools, fraction={"min": 0.1, "max": 0.5})
    assert _placed(policy, _memory(4096, "4Gi")).pool.name == "l4-quarter"
    # 2Gi is below min on both: refused, naming the share on the pool that would grant least.
    (problem,) = _refused(policy, _memory(2048, "2Gi"))
    assert problem.startswith("gpu-memory \"2Gi\" (0.025 of a GPU in pool 'h100-eighth')")
    assert "below the smallest share" in problem


def test_gpu_memory_without_any_pool_memory_is_sized_by_the_nodes() -> None:
    # Tests of the node-sized placement: tests/core/test_gpu_memory_on_mixed_gpus.py
    placement = _placed(_policy(), _memory(10240, "10Gi"))
    assert placement.node_gpu_memory_mib == 20480


def test_gpu_memory_skips_pools_without_memory() -> None:
    pools = [
        {"name": "unknown", "replicas": 8},
        {"name": "known", "replicas": 2, "gpuMemory": "40Gi"},
    ]
    placement = _placed(_policy(pools=pools), _memory(10240, "10Gi"))
    assert placement.pool.name == "known"
    assert placement.fraction == pytest.approx(0.25)


def test_gpu_memory_larger_than_any_slice_is_refused_naming_the_memory() -> None:
    policy = _policy(mode="mps", gpuMemory="80Gi", pools=REPLICA_POOLS)
    assert _refused(policy, _memory(50 * 1024, "50Gi"))[0].startswith(
        'gpu-memory "50Gi" does not fit any GPU pool'
    )


@pytest.mark.parametrize(
    ("fraction", "fits"), [("0.1", True), ("0.0999", False), ("0.4", True), ("0.4001", False)]
)
def test_policy_bounds_are_inclusive(fraction: str, fits: bool) -> None:
    policy = _policy(fraction={"min": 0.1, "max": 0.4})
    result = place(policy, _fraction(fraction))
    assert isinstance(result, Placement) is fits


def test_below_min_and_above_max_say_what_the_policy_allows() -> None:
    policy = _policy(fraction={"min": 0.1, "max": 0.4})
    assert _refused(policy, _fraction("0.05")) == [
        "gpu-fraction \"0.05\" is below the smallest share policy 'p' allows (0.1): ask for at "
        "least that much."
    ]
    assert _refused(policy, _fraction("0.45")) == [
        "gpu-fraction \"0.45\" is above the largest share policy 'p' allows (0.4): ask for less, "
        "or for whole GPUs."
    ]


def test_bounds_on_gpu_memory_name_the_memory_and_the_fraction_it_means() -> None:
    policy = _policy(mode="mps", gpuMemory="80Gi", pools=REPLICA_POOLS, fraction={"min": 0.1})
    assert _refused(policy, _memory(4096, "4Gi")) == [
        "gpu-memory \"4Gi\" (0.05 of a GPU in pool 'r8') is below the smallest share policy 'p' "
        "allows (0.1): ask for at least that much."
    ]


def test_fraction_and_memory_that_agree_within_one_percent_are_placed_by_fraction() -> None:
    policy = _policy(mode="mps", gpuMemory="80Gi", pools=REPLICA_POOLS)
    request = GpuRequest(
        fraction=0.25, fraction_text="0.25", memory_mib=20400, memory_text="20400Mi"
    )
    placement = _placed(policy, request)
    assert placement.fraction == 0.25
    assert placement.pool.name == "r4"


def test_fraction_and_memory_that_disagree_are_refused() -> None:
    policy = _policy(mode="mps", gpuMemory="80Gi", pools=REPLICA_POOLS)
    request = GpuRequest(fraction=0.25, fraction_text="0.25", memory_mib=30720, memory_text="30Gi")
    assert _refused(policy, request) == [
        "gpu-fraction \"0.25\" means 20480Mi on pool 'r4' (81920Mi per GPU), but gpu-memory says "
        '"30Gi": keep only one of the two annotations.'
    ]


def test_fraction_and_memory_on_a_pool_without_memory_cannot_be_compared() -> None:
    pools = [
        {"name": "unknown", "replicas": 2},
        {"name": "known", "replicas": 2, "gpuMemory": "40Gi"},
    ]
    request = GpuRequest(fraction=0.5, fraction_text="0.5", memory_mib=20480, memory_text="20Gi")
    [problem] = _refused(_policy(pools=pools), request)
    assert problem.startswith('gpu-fraction "0.5" and gpu-memory "20Gi" cannot be checked')


def test_memory_mib_is_floored_and_none_without_pool_memory() -> None:
    policy = _policy(mode="mps", gpuMemory="24Gi", pools=[{"name": "r10", "replicas": 10}])
    assert _placed(policy, _fraction("0.1")).memory_mib == 2457  # 2457.6
    assert _placed(_policy(), _fraction("0.5")).memory_mib is None


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0.5, "0.5"),
        (1 / 3, "0.3333"),
        (0.1 + 0.2, "0.3"),
        (0.29, "0.29"),
        (1.0, "1"),
        (0.00001, "0"),
        (0.48, "0.48"),
        (0.123456, "0.1234"),
    ],
)
def test_format_fraction_uses_at_most_four_decimals_without_trailing_zeros(
    value: float, text: str
) -> None:
    assert format_fraction(value) == text
