"""The other schemes' capacity models (issue 12), by hand on small policies, and every
example policy of policies/examples planned without a crash: packed, denied with the core's
reason, or said to be not modelled."""

from __future__ import annotations

from pathlib import Path

import pytest

from webhook.core import load_policies, load_policy_text
from webhook.plan import plan
from webhook.plan.csv_input import parse_table
from webhook.plan.isolation import NOT_MODELLED, isolation
from webhook.plan.outcome import PoolOutcome, SchemeOutcome

REPO = Path(__file__).resolve().parents[2]


def policy(name: str, mode: str, extra: str = "") -> str:
    return (
        "apiVersion: gpushare.io/v1alpha1\nkind: GpuSharingPolicy\n"
        f"metadata: {{name: {name}}}\nspec:\n  default: true\n  mode: {mode}\n{extra}"
    )


MIX = parse_table("name,fraction,count\nhalf,0.5,3\nquarter,0.25,2\n", "mix.csv")


def only(name: str, text: str) -> tuple[SchemeOutcome, PoolOutcome]:
    """The one pool of the one scheme: policy ``name`` on MIX."""
    (result,) = plan(MIX, load_policy_text(text), names=[name])
    (pool,) = result.pools
    return result, pool


def test_vcuda_packs_cores_and_memory_units() -> None:
    """16 GiB GPUs: 0.5 -> 50 cores + 32 units of 256 MiB, 0.25 -> 25 + 16; bins of
    (100, 64): [half half] [half quarter quarter]: 2 GPUs, the lower bound."""
    _, pool = only("vcuda", policy("vcuda", "tencent-vcuda", "  gpuMemory: 16Gi\n"))
    assert pool.capacity == (100, 64)
    assert [list(b) for b in pool.packing.bins] == [[("half", 2)], [("half", 1), ("quarter", 2)]]
    assert (pool.gpus, pool.lower_bound_gpus) == (2, 2)
    assert "no constant bound" in pool.bound  # two dimensions
    assert isolation("tencent-vcuda").memory == "hard (vcuda-controller)"


def test_hami_packs_memory_cores_and_tasks() -> None:
    """80 GiB: 0.5 -> 40960 MiB + 50 cores + one of 10 tasks: the same 2 GPUs."""
    result, pool = only("hami", policy("hami", "hami", "  gpuMemory: 80Gi\n"))
    assert pool.capacity == (81920, 100, 10)
    assert pool.gpus == 2
    # 3 x 40960 + 2 x 20480 MiB and 3 x 50 + 2 x 25 cores fill the two GPUs exactly.
    assert result.idle_memory_mib == pytest.approx(0)
    assert result.idle_gpus == pytest.approx(2 - 2.0)


def test_aws_vgpu_counts_vgpus() -> None:
    """10 vGPUs a GPU, one-GPU nodes: 0.5 -> 5, 0.25 -> 3 (ceil 2.5): [5 5] [5 3] [3]: 3
    GPUs over a lower bound of ceil(21/10) = 3."""
    extra = "  gpuMemory: 16Gi\n  awsVgpu: {vgpusPerGpu: 10, singleGpuNodes: true}\n"
    _, pool = only("vgpu", policy("vgpu", "aws-vgpu", extra))
    assert pool.capacity == (10,)
    assert [list(b) for b in pool.packing.bins] == [
        [("half", 2)],
        [("half", 1), ("quarter", 1)],
        [("quarter", 1)],
    ]


def test_kai_is_said_not_modelled() -> None:
    (result,) = plan(MIX, load_policy_text(policy("kai", "kai")), names=["kai"])
    assert result.pools == ()
    assert [item.workload for item in result.not_modelled] == ["half", "quarter"]
    assert "hands these pods to KAI-Scheduler" in result.not_modelled[0].reasons[0]


def test_unknown_modes_have_no_isolation_claims() -> None:
    assert isolation("some-future-scheme") is NOT_MODELLED


def test_every_example_policy_plans(tmp_path: Path) -> None:
    """Each example, every workload: packed, denied (with the core's reason) or not
    modelled (with why); the packings hold their bounds."""
    table = "name,fraction,memory,count\na,0.5,,3\nb,0.25,,5\nc,,8Gi,2\nd,2,,1\n"
    workloads = parse_table(table, "mix.csv")
    results = plan(workloads, load_policies(REPO / "policies/examples"), gpus_per_node=4)
    assert len(results) == 1 + len(list((REPO / "policies/examples").glob("*.yaml")))
    for result in results[1:]:
        packed = sum(pool.pods for pool in result.pools)
        unserved = sum(i.pods for i in (*result.denied, *result.not_modelled, *result.untouched))
        assert packed + unserved == 11, result.scheme.name
        assert all(i.reasons and all(i.reasons) for i in (*result.denied, *result.not_modelled))
        for pool in result.pools:
            assert pool.gpus >= pool.lower_bound_gpus
