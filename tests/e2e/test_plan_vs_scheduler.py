"""``gpushare plan`` against the real kube-scheduler: the same pods, through the real webhook,
bound by the scheduler onto fake nodes advertising the same pools.

For each pool of a mix the scheduler gets the plan's lower bound of nodes to begin with,
all the pool's pods (created in a shuffled order, not the plan's), and one more node each
time pods stay Pending, until every pod is bound: the nodes it needed. The plan is then
held to what it claims (webhook/plan/packing.py):

- every pod takes one slot of the pool (replica-class): the plan's node count is exact, the
  scheduler needs exactly as many;
- several sizes in one dimension (count allocation, whole GPUs): the plan is first-fit
  decreasing, never under the lower bound and at most 11/9 x optimum + 6/9, and the
  scheduler can do no better than the optimum, so plan <= 11/9 x scheduler + 6/9.

The scheduler counts per NODE (the device plugin advertises GPUs x replicas of one
resource), so the comparison is in nodes, with the plan told the nodes' GPU count. The
figures are printed side by side (run with -s to see them).

Last, the plan read back from the cluster (``--cluster`` with the harness's kubeconfig)
must equal the plan made from the manifests.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import unique_name
from gpu_nodes import FakeGpuNode
from kubernetes import client as k8s
from pods import annotated_pod

from harness.api import as_json, create_pod, ensure_namespace
from harness.controlplane import ControlPlane
from harness.processes import wait_for
from harness.registration import GpushareWebhook
from webhook.cli import main

POOL_LABEL = "e2e.gpushare.io/plan-pool"
MIX_LABEL = "e2e.gpushare.io/plan-mix"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
GPUS_PER_NODE = 2
SETTLE_TIMEOUT_S = 60.0
QUIET_S = 1.5
# The inference-mps-daemon policy (policies/examples/mps-daemon.yaml): count allocation on
# one-GPU L4 nodes of 10 slots, only in the namespace "inference", only on ready nodes.
COUNT_NAMESPACE = "inference"

NodeFactory = Callable[[FakeGpuNode], k8s.V1Node]


@dataclass(frozen=True)
class PoolNodes:
    """How the nodes of one of the plan's pools look to the scheduler."""

    group: str  # the plan's pool name
    node: Callable[[str], FakeGpuNode]


def shared_pool(group: str, replicas: int, gpus: int = GPUS_PER_NODE, **extra: Any) -> PoolNodes:
    return PoolNodes(
        group, lambda name: FakeGpuNode(name=name, replicas=replicas, gpus=gpus, **extra)
    )


POOLS = {
    "default/ts-half": shared_pool("default/ts-half", 2),
    "default/ts-quarter": shared_pool("default/ts-quarter", 4),
    "default/whole GPUs": PoolNodes(
        "default/whole GPUs",
        lambda name: FakeGpuNode(
            name=name, gpus=GPUS_PER_NODE, sharing_strategy="none", shared_resource="nvidia.com/gpu"
        ),
    ),
    "inference-mps-daemon/l4-mps": shared_pool(
        "inference-mps-daemon/l4-mps",
        10,
        gpus=1,
        product="NVIDIA-L4",
        gpu_memory_mib=23034,
        extra_labels={"gpushare.io/mps-ready": "true"},
    ),
}

# (name, namespace, policy, pods, fractions): each pod's fraction drawn with a fixed seed.
MIXES = [
    ("small", None, "default", 8, ["0.5", "0.25", "0.1", "1", "2"]),
    ("medium", None, "default", 24, ["0.5", "0.25", "0.25", "0.1", "1", "2"]),
    ("large", None, "default", 48, ["0.5", "0.25", "0.1", "0.1", "1", "2"]),
    ("count", COUNT_NAMESPACE, "inference-mps-daemon", 20, ["0.5", "0.3", "0.2", "0.1", "0.7"]),
]


def run_plan(*argv: str) -> dict[str, Any]:
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main(["plan", *argv, "-o", "json"])
    assert code == 0, stderr.getvalue()
    report: dict[str, Any] = json.loads(stdout.getvalue())
    return report


def mix_pods(mix: str, label: str, pods: int, fractions: list[str]) -> list[dict[str, Any]]:
    chooser = random.Random(pods)
    result = []
    for n in range(pods):
        pod = annotated_pod(f"{mix}-{n:03d}", chooser.choice(fractions))
        pod["metadata"]["labels"] = {MIX_LABEL: label}
        result.append(pod)
    return result


def pod_states(core: k8s.CoreV1Api, namespace: str, label: str) -> dict[str, str | None]:
    """Each pod: its node, "" where the scheduler said Unschedulable, None before any word."""
    listed = core.list_namespaced_pod(namespace, label_selector=f"{POOL_LABEL}={label}")
    states: dict[str, str | None] = {}
    for item in as_json(core.api_client, listed)["items"]:
        node = item["spec"].get("nodeName")
        conditions = item.get("status", {}).get("conditions", [])
        refused = any(c["type"] == "PodScheduled" and c["status"] == "False" for c in conditions)
        states[item["metadata"]["name"]] = node or ("" if refused else None)
    return states


def settled(core: k8s.CoreV1Api, namespace: str, label: str, before: int) -> dict[str, str | None]:
    """The states once the scheduler has spoken on every pod and bound more than ``before``
    (a new node always takes a pending pod: none is larger than a node), and then a quiet
    spell passed with nothing changing (bindings in flight land before counting)."""

    def check() -> dict[str, str | None] | None:
        states = pod_states(core, namespace, label)
        bound = sum(1 for node in states.values() if node)
        if any(node is None for node in states.values()) or (bound <= before < len(states)):
            return None
        return states

    states = wait_for("the scheduler to settle", check, timeout=SETTLE_TIMEOUT_S)
    while True:
        time.sleep(QUIET_S)
        again = pod_states(core, namespace, label)
        if again == states:
            return states
        states = again


@pytest.fixture
def count_namespace(core_v1: k8s.CoreV1Api) -> str:
    ensure_namespace(core_v1, COUNT_NAMESPACE)
    return COUNT_NAMESPACE


def add_node(core: k8s.CoreV1Api, fake_nodes: NodeFactory, group: str, label: str, n: int) -> None:
    node = POOLS[group].node(f"{label}-{n}")
    labels = {**node.extra_labels, POOL_LABEL: label}
    fake_nodes(FakeGpuNode(**{**node.__dict__, "extra_labels": labels}))
    core.patch_node(node.name, {"spec": {"taints": [GPU_TAINT]}})


Row = tuple[str, int, int, int, int, str]


def scheduler_agrees(
    core: k8s.CoreV1Api,
    fake_nodes: NodeFactory,
    webhook: GpushareWebhook,
    namespace: str,
    label: str,
    pods: list[dict[str, Any]],
    pool: dict[str, Any],
) -> Row:
    """Bind the pool's pods, a node at a time from the lower bound; check the bound."""
    names = {entry["workload"] for contents in pool["bins"] for entry in contents}
    mine = [p for p in pods if f"Pod/{namespace}/{p['metadata']['name']}" in names]
    for pod in random.Random(len(mine)).sample(mine, len(mine)):  # not the plan's order
        labels = {**pod["metadata"]["labels"], POOL_LABEL: label}
        spec = {**pod["spec"], "nodeSelector": {POOL_LABEL: label}}
        create_pod(
            webhook.api,
            namespace,
            {**pod, "metadata": {**pod["metadata"], "labels": labels}, "spec": spec},
        )
    lower = math.ceil(pool["lowerBoundGpus"] / pool["gpusPerNode"])
    nodes = max(1, lower)
    for n in range(nodes):
        add_node(core, fake_nodes, pool["pool"], label, n)
    states = settled(core, namespace, label, -1)
    while not all(states.values()):
        assert nodes < pool["nodes"] + 6, f"{pool['pool']}: the scheduler still leaves pods"
        add_node(core, fake_nodes, pool["pool"], label, nodes)
        nodes += 1
        states = settled(core, namespace, label, sum(1 for node in states.values() if node))
    used = len({node for node in states.values() if node})
    assert used >= lower and pool["nodes"] >= lower
    if pool["bound"].startswith("exact"):
        assert used == pool["nodes"], f"{pool['pool']}: an exact plan, and the scheduler differs"
    else:
        assert pool["nodes"] <= math.floor(11 / 9 * used + 6 / 9), pool["pool"]
    return (
        pool["pool"],
        pool["pods"],
        lower,
        pool["nodes"],
        used,
        "exact" if pool["bound"].startswith("exact") else "FFD",
    )


def test_plan_agrees_with_the_scheduler(
    gpushare_webhook: GpushareWebhook,
    core_v1: k8s.CoreV1Api,
    fake_nodes: NodeFactory,
    namespace: str,
    count_namespace: str,
    webhook_policies: Path,
    control_plane: ControlPlane,
    tmp_path: Path,
) -> None:
    """Every mix, every pool: the plan's nodes against the scheduler's (printed), within the
    plan's stated bound; then the plan read from the cluster equals the manifests' plan."""
    rows: list[Row] = []
    for mix, mix_namespace, policy, size, fractions in MIXES:
        where = mix_namespace or namespace
        label = unique_name(mix)
        pods = mix_pods(mix, label, size, fractions)
        manifest = tmp_path / f"{mix}.json"
        listed = [{**pod, "metadata": {**pod["metadata"], "namespace": where}} for pod in pods]
        manifest.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": listed}))
        common = ["--policies", str(webhook_policies), "--policy", policy]
        common += ["--gpus-per-node", str(GPUS_PER_NODE)]
        (scheme,) = run_plan("-f", str(manifest), *common)["schemes"]
        assert scheme["denied"] == [] and scheme["notModelled"] == []
        try:
            for n, pool in enumerate(scheme["pools"]):
                rows.append(
                    scheduler_agrees(
                        core_v1, fake_nodes, gpushare_webhook, where, f"{label}-{n}", pods, pool
                    )
                )
            kubeconfig = str(control_plane.kubeconfig)
            selector = f"{MIX_LABEL}={label}"
            (read_back,) = run_plan(
                "--cluster", "--kubeconfig", kubeconfig, "-n", where, "-l", selector, *common
            )["schemes"]
            figures = ("podsServed", "gpus", "nodes", "lowerBoundGpus")
            assert {k: read_back[k] for k in figures} == {k: scheme[k] for k in figures}
        finally:
            if mix_namespace:
                core_v1.delete_collection_namespaced_pod(
                    where, label_selector=f"{MIX_LABEL}={label}", grace_period_seconds=0
                )
    print("\nplan vs kube-scheduler, nodes per pool:")
    print(f"{'pool':30} {'pods':>5} {'lower':>6} {'plan':>5} {'sched':>6}  bound")
    for row in rows:
        print(f"{row[0]:30} {row[1]:5d} {row[2]:6d} {row[3]:5d} {row[4]:6d}  {row[5]}")
