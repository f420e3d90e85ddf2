"""The plan's figures for a mix, computed by hand from the policies' pools, and the core's
own denial text for what no pool serves."""

from __future__ import annotations

from pathlib import Path

import pytest

from webhook.core import load_policies
from webhook.plan import plan
from webhook.plan.capacity import MODELS, demand
from webhook.plan.csv_input import read_table
from webhook.plan.demand import NotModelled
from webhook.plan.outcome import EXACT, SchemeOutcome


def by_name(results: list[SchemeOutcome]) -> dict[str, SchemeOutcome]:
    return {result.scheme.name: result for result in results}


def test_default_policy_by_hand(policy_dir: Path, mix_csv: Path) -> None:
    """Default (time-slicing, ts-half R=2, ts-quarter R=4), 4 GPUs a node:
    3 x 0.5 -> ts-half, ceil(3/2) = 2 GPUs; 10 x 0.25 + 7 x 0.1 -> ts-quarter one slot each,
    ceil(17/4) = 5 GPUs (2 nodes); 2 x "2" whole -> 4 GPUs, one node of 4. 0.7: denied."""
    policies = load_policies(policy_dir)
    results = by_name(plan(read_table(str(mix_csv)), policies, gpus_per_node=4))
    default = results["default"]
    pools = {pool.group: pool for pool in default.pools}
    assert {g: (p.pods, p.gpus, p.nodes) for g, p in pools.items()} == {
        "default/ts-half": (3, 2, 1),
        "default/ts-quarter": (17, 5, 2),
        "default/whole GPUs": (2, 4, 1),
    }
    assert all(pool.bound == EXACT for pool in default.pools)
    assert default.gpus == 11 and default.lower_bound_gpus == 11 and default.nodes == 4
    assert default.one_gpu_per_pod == 3 + 17 + 4
    # Asked: 1.5 + 2.5 + 0.7 GPUs on 7 shared GPUs.
    assert default.idle_gpus == pytest.approx(7 - 4.7)
    assert default.idle_memory_mib is None  # the default declares no gpuMemory
    (odd,) = default.denied
    assert (odd.workload, odd.pods) == ("odd", 1)
    assert odd.reasons == (
        "gpu-fraction \"0.7\" does not fit any GPU pool: the largest slice policy 'default' "
        "offers is 1/2 of a GPU (pool 'ts-half'). Ask for less, or for a whole GPU with "
        'gpu-fraction: "1".',
    )


def test_mps_policy_by_hand(policy_dir: Path, mix_csv: Path) -> None:
    """ml-mps (80 GiB GPUs, pools mps-2/4/8, fraction 0.1..0.5): 0.5 -> mps-2, 2 GPUs;
    0.25 -> mps-4, ceil(10/4) = 3; 0.1 -> mps-8, 1 GPU; whole -> 4. Idle memory: 6 shared
    GPUs x 80 GiB less 1.5 + 2.5 + 0.7 GPUs' worth."""
    results = by_name(plan(read_table(str(mix_csv)), load_policies(policy_dir), gpus_per_node=4))
    mps = results["ml-mps"]
    assert {p.group: p.gpus for p in mps.pools} == {
        "ml-mps/mps-2": 2,
        "ml-mps/mps-4": 3,
        "ml-mps/mps-8": 1,
        "ml-mps/whole GPUs": 4,
    }
    assert mps.gpus == 10
    assert mps.idle_memory_mib == pytest.approx((6 - 4.7) * 81920)
    assert dict(mps.isolation)["mps"].memory.startswith("hard")


def test_count_allocation_packs_slots_by_hand(policy_dir: Path, tmp_path: Path) -> None:
    """inference-mps-daemon: count allocation, l4-mps R=10, one GPU per node. 0.5 takes 5
    slots, 0.3 three, 0.2 two: 2 x 5, 3 x 3, 2 x 2 -> FFD: [5 5] [3 3 3] [2 2]: 3 GPUs,
    lower bound ceil(23/10) = 3."""
    table = tmp_path / "count.csv"
    table.write_text("name,fraction,count\nhalf,0.5,2\nthird,0.3,3\nfifth,0.2,2\n")
    results = plan(
        read_table(str(table)), load_policies(policy_dir), names=["inference-mps-daemon"]
    )
    (result,) = results
    (pool,) = result.pools
    assert pool.capacity == (10,) and pool.gpus_per_node == 1
    assert [list(b) for b in pool.packing.bins] == [
        [("half", 2)],
        [("third", 3)],
        [("fifth", 2)],
    ]
    assert (pool.gpus, pool.nodes, pool.lower_bound_gpus) == (3, 3, 3)
    assert "11/9" in pool.bound


def test_whole_gpus_over_a_node_are_not_served(policy_dir: Path, mix_csv: Path) -> None:
    results = by_name(plan(read_table(str(mix_csv)), load_policies(policy_dir), gpus_per_node=1))
    reasons = [r for item in results["default"].denied for r in item.reasons]
    assert (
        "asks 2 GPUs on one node, but the nodes of default/whole GPUs have 1: give "
        "--gpus-per-node the nodes' GPU count" in reasons
    )


def test_a_mode_without_a_model_is_said_not_modelled(
    policy_dir: Path, mix_csv: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scheme added to the core before its capacity model: its pods are listed, not
    packed, and nothing crashes."""
    monkeypatch.delitem(MODELS, "mps")
    results = by_name(plan(read_table(str(mix_csv)), load_policies(policy_dir), gpus_per_node=4))
    mps = results["ml-mps"]
    assert {p.group for p in mps.pools} == {"ml-mps/whole GPUs"}
    assert {item.workload for item in mps.not_modelled} == {"train", "infer", "tiny"}
    assert mps.not_modelled[0].reasons == (
        "mode 'mps' (policy 'ml-mps') is not modelled by gpushare plan yet: its pods are "
        "admitted but not packed",
    )


def test_demand_of_an_unknown_record(policy_dir: Path) -> None:
    policy = load_policies(policy_dir).policies[0]
    need = demand(policy, {"mode": "future-scheme"}, 8)
    assert isinstance(need, NotModelled)
    assert "mode 'future-scheme'" in need.reason


def test_as_configured_follows_each_workloads_namespace(policy_dir: Path, tmp_path: Path) -> None:
    """A 0.25 pod in ml-team goes to ml-mps (its match), one in web to the default."""
    table = tmp_path / "ns.csv"
    table.write_text("name,fraction,count,namespace\nml,0.25,4,ml-team\nweb,0.25,4,web\n")
    configured = plan(read_table(str(table)), load_policies(policy_dir))[0]
    assert configured.scheme.name == "as configured"
    assert {p.group: p.pods for p in configured.pools} == {
        "default/ts-quarter": 4,
        "ml-mps/mps-4": 4,
    }
