"""``gpushare plan`` against the real kube-scheduler: the same pods, through the real webhook,
bound by the scheduler onto fake nodes advertising the same pools.

For each pool of a mix the scheduler gets the plan's lower bound of nodes to begin with,
all the pool's pods (created in a shuffled order, not the plan's), and one more node each
time pods stay Pending with no room for them left on any node (by the scheduler's own
per-node count, so a pod still in back-off is waited for, not counted as needing a node),
until every pod is bound: the nodes it needed. The plan is then held to what it claims
(webhook/plan/packing.py):

- every pod takes one slot of the pool (replica-class): the plan's node count is exact, the
  scheduler needs exactly as many;
- several sizes in one dimension (count allocation, whole GPUs): the plan is first-fit
  decreasing, never under the lower bound and at most 11/9 x optimum + 6/9, and the
  scheduler can do no better than the optimum, so plan <= 11/9 x scheduler + 6/9.

The scheduler counts per NODE (the device plugin advertises GPUs x replicas of one
resource), so the comparison is in nodes, with the plan told the nodes' GPU count. The
figures are printed side by side (run with -s to see them).

The plan read back from the cluster (``--cluster`` with the harness's kubeconfig) must
equal the plan made from the manifests.

Memory slices under DRA consumable capacity are held to the same bound against the
scheduler's DRA allocator (one 80Gi device a node, published as a ResourceSlice; claims
made from the templates by kube-controller-manager's resourceclaim controller). The e2e
webhook serves no dra policy, so those pods are mutated by the same core offline
(``gpushare mutate``) and created as mutated.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import unique_name
from gpu_nodes import FakeGpuNode
from kubernetes import client as k8s
from pods import annotated_pod

from harness.api import as_json, create_pod, ensure_namespace
from harness.controlplane import ControlPlane
from harness.processes import wait_for
from harness.registration import GpushareWebhook
from tests.long_runs import LONG, scaled
from webhook.cli import main

POOL_LABEL = "e2e.gpushare.io/plan-pool"
MIX_LABEL = "e2e.gpushare.io/plan-mix"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
GPUS_PER_NODE = 2
SETTLE_TIMEOUT_S = 60.0
# A DRA pod the scheduler tried while other pods' claims were still in flight is put in its
# unschedulable queue, which an event or the periodic flush (podMaxInUnschedulablePodsDuration,
# 5 minutes) empties: in a full suite run one such pod was retried about 70 s later.
DRA_SETTLE_TIMEOUT_S = 330.0
QUIET_S = 1.5
# The inference-mps-daemon policy (policies/examples/mps-daemon.yaml): count allocation on
# one-GPU L4 nodes of 10 slots, only in the namespace "inference", only on ready nodes.
COUNT_NAMESPACE = "inference"
GPU_RESOURCES = {"nvidia.com/gpu.shared", "nvidia.com/gpu"}

NodeFactory = Callable[[FakeGpuNode], k8s.V1Node]


@dataclass(frozen=True)
class PoolNodes:
    """How the nodes of one of the plan's pools look to the scheduler."""

    group: str  # the plan's pool name
    node: Callable[[str], FakeGpuNode]
    # The GPU taint of test_scheduling_gpu, on pools whose policy injects its toleration
    # (the default); the mps-daemon example injects none.
    tainted: bool = True


def shared_pool(
    group: str, replicas: int, gpus: int = GPUS_PER_NODE, tainted: bool = True, **extra: Any
) -> PoolNodes:
    return PoolNodes(
        group, lambda name: FakeGpuNode(name=name, replicas=replicas, gpus=gpus, **extra), tainted
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
        tainted=False,
        product="NVIDIA-L4",
        gpu_memory_mib=23034,
        extra_labels={"gpushare.io/mps-ready": "true"},
    ),
}

# (name, namespace, policy, pods, fractions): each pod's fraction drawn with a fixed seed.
# The large mixes only with GPUSHARE_LONG_TESTS=1 (tests/long_runs.py).
MIXES = [
    ("small", None, "default", 8, ["0.5", "0.25", "0.1", "1", "2"]),
    ("medium", None, "default", 24, ["0.5", "0.25", "0.25", "0.1", "1", "2"]),
    *([("large", None, "default", 96, ["0.5", "0.25", "0.1", "0.1", "1", "2"])] if LONG else []),
    (
        "count",
        COUNT_NAMESPACE,
        "inference-mps-daemon",
        scaled(20, 60),
        ["0.5", "0.3", "0.2", "0.1", "0.7"],
    ),
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


@dataclass
class Run:
    """One pool's pods and nodes in the cluster, and when the scheduler is done with them.

    ``sizes``: what each pod takes of a node (slots, GPUs or MiB, as the scheduler counts
    them), ``capacity``: what a node has. The scheduler is done when it has spoken on every
    pod and no Pending pod fits the room left on any node (so a pod still in back-off, up to
    10 s, is waited for instead of counted as needing a node), then a quiet spell passed.
    """

    core: k8s.CoreV1Api
    namespace: str
    label: str
    capacity: int
    sizes: dict[str, int]
    nodes: list[str] = field(default_factory=list)
    settle_timeout: float = SETTLE_TIMEOUT_S

    def _room_left(self, states: dict[str, str | None]) -> bool:
        used = dict.fromkeys(self.nodes, 0)
        for pod, node in states.items():
            if node:
                used[node] = used.get(node, 0) + self.sizes[pod]
        largest = max((self.capacity - u for u in used.values()), default=0)
        return any(node == "" and self.sizes[pod] <= largest for pod, node in states.items())

    def messages(self) -> dict[str, str]:
        """Why each Pending pod waits, in the scheduler's words (for a timeout's report)."""
        listed = self.core.list_namespaced_pod(
            self.namespace, label_selector=f"{POOL_LABEL}={self.label}"
        )
        return {
            pod["metadata"]["name"]: condition.get("message", "")
            for pod in as_json(self.core.api_client, listed)["items"]
            for condition in pod.get("status", {}).get("conditions", [])
            if condition["type"] == "PodScheduled" and condition["status"] == "False"
        }

    def settled(self) -> dict[str, str | None]:
        def check() -> dict[str, str | None] | None:
            states = pod_states(self.core, self.namespace, self.label)
            if any(node is None for node in states.values()) or self._room_left(states):
                return None
            return states

        states = wait_for(
            f"the scheduler to settle on {self.label}",
            check,
            timeout=self.settle_timeout,
            on_timeout=lambda: json.dumps(self.messages()),
        )
        while True:
            time.sleep(QUIET_S)
            again = pod_states(self.core, self.namespace, self.label)
            if again == states:
                return states
            states = again

    def until_all_bound(self, add: Callable[[str], None], most: int) -> int:
        """Add nodes (``add`` makes one by name) while pods stay Pending; the nodes used."""
        states = self.settled()
        while not all(states.values()):
            assert len(self.nodes) < most, f"{self.label}: the scheduler still leaves pods"
            self.nodes.append(f"{self.label}-{len(self.nodes)}")
            add(self.nodes[-1])
            states = self.settled()
        return len({node for node in states.values() if node})


def slots_taken(pod: dict[str, Any]) -> int:
    """The extended GPU resource the pod's containers ask (as admitted)."""
    total = 0
    for container in pod["spec"]["containers"]:
        limits = container.get("resources", {}).get("limits", {})
        total += sum(int(v) for k, v in limits.items() if k in GPU_RESOURCES)
    return total


@pytest.fixture
def count_namespace(core_v1: k8s.CoreV1Api) -> str:
    ensure_namespace(core_v1, COUNT_NAMESPACE)
    return COUNT_NAMESPACE


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
    """Bind the pool's pods from the lower bound of nodes up; check the plan's bound."""
    spec = POOLS[pool["pool"]]
    names = {entry["workload"] for contents in pool["bins"] for entry in contents}
    mine = [p for p in pods if f"Pod/{namespace}/{p['metadata']['name']}" in names]
    capacity = next(int(v) for k, v in spec.node("x").resources().items() if k in GPU_RESOURCES)
    run = Run(core, namespace, label, capacity, {})

    def add(name: str) -> None:
        node = spec.node(name)
        labels = {**node.extra_labels, POOL_LABEL: label}
        fake_nodes(FakeGpuNode(**{**node.__dict__, "extra_labels": labels}))
        if spec.tainted:
            core.patch_node(name, {"spec": {"taints": [GPU_TAINT]}})

    lower = math.ceil(pool["lowerBoundGpus"] / pool["gpusPerNode"])
    for _ in range(lower):  # nodes before pods: a pod meeting no node backs off
        run.nodes.append(f"{label}-{len(run.nodes)}")
        add(run.nodes[-1])
    for pod in random.Random(len(mine)).sample(mine, len(mine)):  # not the plan's order
        labels = {**pod["metadata"]["labels"], POOL_LABEL: label}
        spec_ = {**pod["spec"], "nodeSelector": {POOL_LABEL: label}}
        body = {**pod, "metadata": {**pod["metadata"], "labels": labels}, "spec": spec_}
        admitted = create_pod(webhook.api, namespace, body).pod
        run.sizes[admitted["metadata"]["name"]] = slots_taken(admitted)
    used = run.until_all_bound(add, pool["nodes"] + 6)
    assert used >= lower and pool["nodes"] >= lower
    if pool["bound"].startswith("exact"):
        assert used == pool["nodes"], f"{pool['pool']}: an exact plan, and the scheduler differs"
    else:
        assert pool["nodes"] <= math.floor(11 / 9 * used + 6 / 9), pool["pool"]
    kind = "exact" if pool["bound"].startswith("exact") else "FFD"
    return (pool["pool"], pool["pods"], lower, pool["nodes"], used, kind)


# -- DRA consumable capacity: the scheduler's own accounting of each device's memory -------
# A dra policy of its own (its DeviceClass and driver names are this module's, so nothing
# clashes with tests/e2e/test_dra.py); each fake node publishes one 80Gi device with
# consumable memory in 1Mi steps, the way NVIDIA's driver does with consumable shares
# (kubernetes-sigs/dra-driver-nvidia-gpu, --consumable-shares=memory). The devices publish
# exactly the policy's gpuMemory: the plan takes gpuMemory as each device's capacity.
DRA_CLASS = "plan.gpu.example.com"
DRA_DEVICE_MIB = 80 * 1024
DRA_POLICY = f"""apiVersion: gpushare.io/v1alpha1
kind: GpuSharingPolicy
metadata: {{name: plan-dra}}
spec:
  default: true
  mode: dra
  gpuMemory: 80Gi
  fraction: {{min: 0.05, max: 1}}
  dra: {{deviceClassName: {DRA_CLASS}, driver: {DRA_CLASS}, capacity: memory, granularity: 1Gi}}
"""
DRA_MIXES = [
    ("dra-small", 10, ["0.5", "0.3", "0.25", "0.1"]),
    ("dra-mixed", scaled(30, 90), ["0.6", "0.5", "0.3", "0.25", "0.2", "0.1"]),
]
RESOURCE_API = "/apis/resource.k8s.io/v1"


def resource_call(api: k8s.ApiClient, method: str, path: str, body: Any = None) -> None:
    """One raw call to resource.k8s.io/v1 (the generated models lag behind its fields)."""
    headers = {"Accept": "application/json", "Content-Type": "application/json"}
    call = api.param_serialize(
        method, path, header_params=headers, body=body, auth_settings=["BearerToken"]
    )
    response = api.call_api(*call)
    response.read()
    assert 200 <= response.status <= 299 or (method == "DELETE" and response.status == 404), (
        f"{method} {path}: {response.status}"
    )


def claimed_mib(pod: dict[str, Any]) -> int:
    """The memory a dra pod's claim asks, from its template's name (gpushare-<policy>-20gi)."""
    size = pod["spec"]["resourceClaims"][0]["resourceClaimTemplateName"].rsplit("-", 1)[1]
    return int(size[:-2]) * (1024 if size.endswith("gi") else 1)


def dra_slice(node: str) -> dict[str, Any]:
    memory = f"{DRA_DEVICE_MIB}Mi"
    device = {
        "name": "gpu-0",
        "allowMultipleAllocations": True,
        "attributes": {"type": {"string": "gpu"}},
        "capacity": {
            "memory": {
                "value": memory,
                "requestPolicy": {
                    "default": memory,
                    "validRange": {"min": "1Mi", "max": memory, "step": "1Mi"},
                },
            }
        },
    }
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-plan"},
        "spec": {
            "driver": DRA_CLASS,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [device],
        },
    }


def dra_claimed_pods(
    policy_file: Path, namespace: str, label: str, mix: str, size: int, fractions: list[str]
) -> tuple[list[dict[str, Any]], Path]:
    """The mix's pods as the core mutates them under the dra policy (gpushare mutate), and
    the manifest they came from."""
    pods = mix_pods(mix, label, size, fractions)
    listed = [{**pod, "metadata": {**pod["metadata"], "namespace": namespace}} for pod in pods]
    manifest = policy_file.parent / f"{mix}.json"
    manifest.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": listed}))
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = main(["mutate", "-f", str(manifest), "--policies", str(policy_file), "-o", "json"])
    assert code == 0
    mutated = [entry["result"] for entry in json.loads(stdout.getvalue())["documents"]]
    for pod in mutated:
        # No gpushare annotation left: a webhook registered by another test never re-plans
        # these pods under its own policies (matchConditions look for the annotations).
        pod["metadata"]["annotations"] = {}
        pod["spec"]["nodeSelector"] = {POOL_LABEL: label}
        pod["metadata"]["labels"] = {**pod["metadata"]["labels"], POOL_LABEL: label}
    return mutated, manifest


def dra_templates(policy_file: Path, namespace: str, names: set[str]) -> list[dict[str, Any]]:
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = main(["dra-templates", "--policies", str(policy_file), "-n", namespace])
    assert code == 0
    return [d for d in yaml.safe_load_all(stdout.getvalue()) if d["metadata"]["name"] in names]


@pytest.mark.timeout(900)  # a pod may wait out the scheduler's flush (DRA_SETTLE_TIMEOUT_S)
def test_dra_plan_agrees_with_the_scheduler(
    control_plane: ControlPlane,
    api_client: k8s.ApiClient,
    core_v1: k8s.CoreV1Api,
    fake_nodes: NodeFactory,
    namespace: str,
    tmp_path: Path,
) -> None:
    """Memory slices under DRA consumable capacity: the plan's GPUs (first-fit decreasing
    on each device's memory) against the devices the scheduler's DRA allocator needed,
    one device a node, nodes added from the lower bound while a pod is Pending."""
    control_plane.start_controller_manager(
        ["resourceclaim-controller"], ready_log="Starting resource claim controller"
    )
    policy_file = tmp_path / "dra.yaml"
    policy_file.write_text(DRA_POLICY)
    device_class = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": DRA_CLASS},
        "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{DRA_CLASS}'"}}]},
    }
    resource_call(api_client, "POST", f"{RESOURCE_API}/deviceclasses", device_class)
    slices: list[str] = []
    templates: set[str] = set()
    rows: list[Row] = []
    try:
        for mix, size, fractions in DRA_MIXES:
            label = unique_name(mix)
            pods, manifest = dra_claimed_pods(policy_file, namespace, label, mix, size, fractions)
            (scheme,) = run_plan(
                "-f",
                str(manifest),
                "--policies",
                str(policy_file),
                "--policy",
                "plan-dra",
                "--gpus-per-node",
                "1",
            )["schemes"]
            (pool,) = scheme["pools"]
            names = {p["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] for p in pods}
            for template in dra_templates(policy_file, namespace, names - templates):
                path = f"{RESOURCE_API}/namespaces/{namespace}/resourceclaimtemplates"
                resource_call(api_client, "POST", path, template)
            templates |= names

            def add(name: str, label: str = label) -> None:
                fake_nodes(FakeGpuNode(name=name, extra_labels={POOL_LABEL: label}))
                resource_call(api_client, "POST", f"{RESOURCE_API}/resourceslices", dra_slice(name))
                slices.append(f"{name}-plan")

            sizes = {p["metadata"]["name"]: claimed_mib(p) for p in pods}
            run = Run(core_v1, namespace, label, DRA_DEVICE_MIB, sizes, [], DRA_SETTLE_TIMEOUT_S)
            lower = pool["lowerBoundGpus"]
            for _ in range(lower):  # nodes and slices before pods
                run.nodes.append(f"{label}-{len(run.nodes)}")
                add(run.nodes[-1])
            for pod in random.Random(size).sample(pods, len(pods)):
                create_pod(api_client, namespace, pod)
            used = run.until_all_bound(add, pool["gpus"] + 6)
            assert used >= lower and pool["gpus"] >= lower
            assert pool["gpus"] <= math.floor(11 / 9 * used + 6 / 9)
            rows.append((pool["pool"], pool["pods"], lower, pool["gpus"], used, "FFD"))
    finally:
        core_v1.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
        for name in slices:
            resource_call(api_client, "DELETE", f"{RESOURCE_API}/resourceslices/{name}")
        resource_call(api_client, "DELETE", f"{RESOURCE_API}/deviceclasses/{DRA_CLASS}")
    print("\nplan vs kube-scheduler (DRA), GPUs (one a node):")
    for row in rows:
        print(f"{row[0]:30} {row[1]:5d} {row[2]:6d} {row[3]:5d} {row[4]:6d}  {row[5]}")


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
