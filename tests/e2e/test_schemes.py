"""One annotated workload, every device-plugin scheme (issue 12): admitted by the real
webhook and bound by the real kube-scheduler to the node of the scheme its namespace's
policy names.

`gpushare serve` runs with the scheme examples of policies/examples (aws-vgpu, tencent-vcuda,
aliyun-gpushare, hami, kai, aks-mps; plus the bundled default for the registration probe)
and is registered through the apiserver as `gpushare webhook-config` prints it. Fake nodes
(created through the API, capacity written through the status subresource, as each
scheme's device plugin would) advertise what each scheme's plugin advertises:

- aws-vgpu: `k8s.amazonaws.com/vgpu: 10`, label `k8s.amazonaws.com/accelerator=vgpu`,
  taint `k8s.amazonaws.com/vgpu:NoSchedule` (the plugin's DaemonSet tolerates it);
- tencent-vcuda: `tencent.com/vcuda-core: 100`, `tencent.com/vcuda-memory: 64` (16 GiB);
- aliyun-gpushare: `aliyun.com/gpu-mem: 24` (GiB), label `gpushare=true`;
- hami: `nvidia.com/gpu: 10` (vGPUs), and `nvidia.com/gpumem`, `nvidia.com/gpucores`, which
  real HAMi leaves to hami-scheduler's extender (managedResources ignored by the
  scheduler); here a plain kube-scheduler profile named hami-scheduler counts them;
- kai: a GPU node; kai-scheduler is, likewise, a kube-scheduler profile of that name (KAI's
  own reservation pods and binder are not run: the hand-over is what is tested);
- aks-mps: `nvidia.com/gpu.shared: 4`, GFD labels replicas=4 / sharing-strategy=mps, taint
  `sku=gpu:NoSchedule`.

The second scheduler (profiles hami-scheduler and kai-scheduler) is the harness's own
kube-scheduler binary started with a KubeSchedulerConfiguration. Every node also carries a
label of this test run, which the pods select, so nodes of other tests never take them;
within the run only the scheme's own node has what the admitted pod asks for.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import REPO, unique_name
from gpu_nodes import FakeGpuNode
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from harness.api import as_json, create_pod
from harness.controlplane import ControlPlane
from harness.processes import Component, free_ports, wait_for
from harness.registration import GpushareWebhook
from harness.webhookserver import WebhookServer
from webhook.constants import APPLIED_ANNOTATION

RUN_LABEL = "e2e.gpushare.io/schemes-run"
BIND_TIMEOUT_S = 60.0
# The node the kai-scheduler stand-in may use (see second_scheduler).
KAI_GPU_NODE_LABEL = "gpushare.test/kai-gpu-node"
EXAMPLES = ("aws-vgpu", "tencent-vcuda", "aliyun-gpushare", "hami", "kai", "aks-mps")


@dataclass(frozen=True)
class SchemeNode(FakeGpuNode):
    """A fake node advertising a scheme's resources instead of one shared resource."""

    advertised: Mapping[str, str] = field(default_factory=dict)

    def resources(self) -> dict[str, str]:
        return {"cpu": self.cpu, "memory": self.memory, "pods": self.pods, **self.advertised}


@dataclass(frozen=True)
class Scheme:
    """A scheme's namespace prefix (its example policy's match), node and expectations."""

    policy: str
    namespace_prefix: str
    node: SchemeNode
    taints: tuple[dict[str, str], ...] = ()
    scheduler: str = "default-scheduler"


def _schemes(run: str) -> list[Scheme]:
    def node(name: str, advertised: dict[str, str], labels: dict[str, str]) -> SchemeNode:
        return SchemeNode(
            name=f"{run}-{name}",
            advertised=advertised,
            extra_labels={RUN_LABEL: run, **labels},
        )

    return [
        Scheme(
            "aws-vgpu",
            "aws-vgpu-",
            node(
                "aws",
                {"k8s.amazonaws.com/vgpu": "10"},
                {"k8s.amazonaws.com/accelerator": "vgpu"},
            ),
            ({"key": "k8s.amazonaws.com/vgpu", "value": "true", "effect": "NoSchedule"},),
        ),
        Scheme(
            "tencent-vcuda",
            "vcuda-",
            node("vcuda", {"tencent.com/vcuda-core": "100", "tencent.com/vcuda-memory": "64"}, {}),
        ),
        Scheme(
            "aliyun-gpushare",
            "aliyun-",
            node("aliyun", {"aliyun.com/gpu-mem": "24"}, {"gpushare": "true"}),
        ),
        Scheme(
            "hami",
            "hami-",
            node(
                "hami",
                {
                    "nvidia.com/gpu": "10",
                    "nvidia.com/gpumem": "81920",
                    "nvidia.com/gpucores": "100",
                },
                {},
            ),
            scheduler="hami-scheduler",
        ),
        Scheme(
            "kai",
            "kai-",
            node("kai", {"nvidia.com/gpu": "1"}, {KAI_GPU_NODE_LABEL: "true"}),
            scheduler="kai-scheduler",
        ),
        Scheme(
            "aks-mps",
            "aks-",
            node(
                "aks",
                {"nvidia.com/gpu.shared": "4"},
                {"nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.sharing-strategy": "mps"},
            ),
            ({"key": "sku", "value": "gpu", "effect": "NoSchedule"},),
        ),
    ]


@pytest.fixture(scope="module")
def scheme_policies(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("scheme-policies")
    shutil.copy(REPO / "policies/default.yaml", directory / "default.yaml")
    for name in EXAMPLES:
        shutil.copy(REPO / "policies/examples" / f"{name}.yaml", directory / f"{name}.yaml")
    return directory


@pytest.fixture(scope="module")
def scheme_webhook(
    control_plane: ControlPlane,
    probe_namespace: str,
    scheme_policies: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[GpushareWebhook]:
    """`gpushare serve` on the scheme examples, registered for this module only."""
    server = WebhookServer.start(tmp_path_factory.mktemp("scheme-webhook"), scheme_policies)
    try:
        webhook = GpushareWebhook(server, control_plane.api, probe_namespace)
        webhook.register()
        try:
            yield webhook
        finally:
            webhook.unregister()
    finally:
        server.stop()


@pytest.fixture(scope="module")
def second_scheduler(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Component]:
    """kube-scheduler with the profiles hami-scheduler and kai-scheduler."""
    workdir = tmp_path_factory.mktemp("second-scheduler")
    config = workdir / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kubescheduler.config.k8s.io/v1",
                "kind": "KubeSchedulerConfiguration",
                "clientConnection": {"kubeconfig": str(control_plane.kubeconfig)},
                "leaderElection": {"leaderElect": False},
                "profiles": [
                    {"schedulerName": "hami-scheduler"},
                    {
                        "schedulerName": "kai-scheduler",
                        # A KAI pod asks for no extended resource (KAI accounts GPU shares
                        # itself), so a plain profile would bind it to any node; KAI places
                        # it on a GPU node it manages. The added affinity stands in for that.
                        "pluginConfig": [
                            {
                                "name": "NodeAffinity",
                                "args": {
                                    "addedAffinity": {
                                        "requiredDuringSchedulingIgnoredDuringExecution": {
                                            "nodeSelectorTerms": [
                                                {
                                                    "matchExpressions": [
                                                        {
                                                            "key": KAI_GPU_NODE_LABEL,
                                                            "operator": "Exists",
                                                        }
                                                    ]
                                                }
                                            ]
                                        }
                                    }
                                },
                            }
                        ],
                    },
                ],
            }
        )
    )
    [port] = free_ports(1)
    scheduler = Component.start(
        "second-scheduler",
        control_plane.binary,
        ["scheduler", f"--config={config}", "--bind-address=127.0.0.1", f"--secure-port={port}"],
        workdir,
    )
    try:
        yield scheduler
    finally:
        scheduler.stop()


@pytest.fixture
def scheme_nodes(
    fake_nodes: Callable[[FakeGpuNode], k8s.V1Node], core_v1: k8s.CoreV1Api
) -> tuple[str, list[Scheme]]:
    run = unique_name("schemes")
    schemes = _schemes(run)
    for scheme in schemes:
        fake_nodes(scheme.node)
        if scheme.taints:
            core_v1.patch_node(scheme.node.name, {"spec": {"taints": list(scheme.taints)}})
    return run, schemes


@pytest.fixture
def scheme_namespaces(core_v1: k8s.CoreV1Api) -> Iterator[Callable[[str], str]]:
    created: list[str] = []

    def make(prefix: str) -> str:
        name = unique_name(prefix.rstrip("-"))
        core_v1.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name)))
        created.append(name)
        return name

    try:
        yield make
    finally:
        for name in created:
            core_v1.delete_collection_namespaced_pod(name, grace_period_seconds=0)
            core_v1.delete_namespace(name)


def _workload(run: str) -> dict[str, Any]:
    """The same annotated pod under every scheme: a quarter of a GPU."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "trainer", "annotations": {"gpu-fraction": "0.25"}},
        "spec": {
            "nodeSelector": {RUN_LABEL: run},
            "containers": [{"name": "train", "image": "registry.example.com/train:1.0"}],
        },
    }


def _bound(core_v1: k8s.CoreV1Api, namespace: str, name: str) -> dict[str, Any]:
    def bound() -> dict[str, Any] | None:
        pod = as_json(core_v1.api_client, core_v1.read_namespaced_pod(name, namespace))
        return pod if pod["spec"].get("nodeName") else None

    return wait_for(f"pod {namespace}/{name} to be bound", bound, timeout=BIND_TIMEOUT_S)


def test_one_workload_is_admitted_and_bound_under_every_scheme(
    scheme_webhook: GpushareWebhook,
    second_scheduler: Component,
    core_v1: k8s.CoreV1Api,
    scheme_nodes: tuple[str, list[Scheme]],
    scheme_namespaces: Callable[[str], str],
) -> None:
    run, schemes = scheme_nodes
    admitted: dict[str, dict[str, Any]] = {}
    for scheme in schemes:
        namespace = scheme_namespaces(scheme.namespace_prefix)
        admitted[scheme.policy] = create_pod(scheme_webhook.api, namespace, _workload(run)).pod
    for scheme in schemes:
        pod = admitted[scheme.policy]
        record = json.loads(pod["metadata"]["annotations"][APPLIED_ANNOTATION])
        assert record["policy"] == scheme.policy
        assert pod["spec"]["schedulerName"] == scheme.scheduler
        bound = _bound(core_v1, pod["metadata"]["namespace"], "trainer")
        assert bound["spec"]["nodeName"] == scheme.node.name, (scheme.policy, record)

    limits = {
        policy: pod["spec"]["containers"][0].get("resources", {}).get("limits", {})
        for policy, pod in admitted.items()
    }
    assert limits == {
        "aws-vgpu": {"k8s.amazonaws.com/vgpu": "3"},
        "tencent-vcuda": {"tencent.com/vcuda-core": "25", "tencent.com/vcuda-memory": "16"},
        "aliyun-gpushare": {"aliyun.com/gpu-mem": "6"},
        "hami": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "20480", "nvidia.com/gpucores": "25"},
        "kai": {},
        "aks-mps": {"nvidia.com/gpu.shared": "1"},
    }
    assert admitted["aws-vgpu"]["spec"]["hostIPC"] is True
    assert admitted["hami"]["metadata"]["labels"] == {"hami.io/webhook": "ignore"}
    assert admitted["kai"]["metadata"]["labels"] == {"kai.scheduler/queue": "default-queue"}


def test_a_pod_sent_to_kai_scheduler_is_left_to_kai(
    scheme_webhook: GpushareWebhook,
    second_scheduler: Component,
    core_v1: k8s.CoreV1Api,
    scheme_nodes: tuple[str, list[Scheme]],
    scheme_namespaces: Callable[[str], str],
) -> None:
    """Under the hami policy, a pod that names kai-scheduler is not given HAMi resources."""
    run, schemes = scheme_nodes
    namespace = scheme_namespaces("hami-")
    pod = _workload(run)
    pod["spec"]["schedulerName"] = "kai-scheduler"
    admitted = create_pod(scheme_webhook.api, namespace, pod).pod
    assert APPLIED_ANNOTATION not in admitted["metadata"]["annotations"]
    assert (
        "resources" not in admitted["spec"]["containers"][0]
        or not admitted["spec"]["containers"][0]["resources"]
    )
    bound = _bound(core_v1, namespace, "trainer")
    # kai-scheduler binds it, on the GPU node its stand-in may use (second_scheduler).
    (kai,) = [s for s in schemes if s.policy == "kai"]
    assert bound["spec"]["nodeName"] == kai.node.name


def test_a_share_the_scheme_cannot_express_is_refused_through_the_apiserver(
    scheme_webhook: GpushareWebhook, scheme_namespaces: Callable[[str], str]
) -> None:
    namespace = scheme_namespaces("vcuda-")
    pod = _workload("none")
    pod["metadata"]["annotations"] = {"gpu-memory": "200Mi"}
    with pytest.raises(ApiException) as raised:
        create_pod(scheme_webhook.api, namespace, pod)
    assert "under one tencent.com/vcuda-memory block (256Mi)" in str(raised.value.body)
