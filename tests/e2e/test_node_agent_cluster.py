"""``gpushare node-agent`` against the real kube-apiserver, with only the GPU faked.

The agent runs as a process (tests/node/fake_gpu_cluster_agent.py: the shipped CLI with a
``FakeNvml`` inventory) under a token of deploy/node-agent's ServiceAccount, so its real
``KubernetesNodeApi`` and ``KubernetesPodApi`` talk to the apiserver with the ClusterRole's
rights and no more. /proc, /sys/fs/cgroup and the CDI specs are directories in tmp_path.
There is no kubelet: the pods are bound at create (spec.nodeName) and their container IDs
written through the status subresource, and a fake /proc/<pid>/cgroup puts a GPU process in
each.

It must label its Node gpushare.io/driver-memory-limit=false with a reason while the device
plugin's CDI spec is missing, flip it to "true" once the spec carries the
apply-cuda-memory-limits hook, raise exactly one GpuMemoryUncapped Warning Event on the pod
whose process runs without a limit (however many rounds see it), list only its own node's
pods (a process of a pod bound elsewhere stays unattributed, with no Event), and set the
label to "false" on SIGTERM. Every request it sent is recorded: their verbs and resources
are exactly what the ClusterRole grants, and a SubjectAccessReview shows nothing more is
granted.
"""

from __future__ import annotations

import json
import secrets
import signal
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import unique_name
from gpu_nodes import FakeGpuNode
from kubernetes import client as k8s
from pods import annotated_pod

from harness.controlplane import ControlPlane
from harness.processes import ControlPlaneError, wait_for
from webhook.constants import (
    APPLIED_ANNOTATION,
    DRIVER_LIMIT_FACTS_ANNOTATION,
    DRIVER_LIMIT_LABEL,
    DRIVER_LIMIT_REASON_ANNOTATION,
)
from webhook.core import default_policies_path, load_policies, mutate, mutated_pod

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy/node-agent"
# The shipped CLI with a fake GPU inventory instead of NVML, real API clients (test-only).
FAKE_GPU_AGENT = REPO / "tests/node/fake_gpu_cluster_agent.py"
AGENT_NAMESPACE = "gpushare-node"
SERVICE_ACCOUNT = "gpushare-node-agent"
SERVICE_ACCOUNT_USER = f"system:serviceaccount:{AGENT_NAMESPACE}:{SERVICE_ACCOUNT}"
GPU_UUID = "GPU-e2e0aaaa-bbbb-cccc-dddd-000000000001"
GPU_MEMORY_MIB = 81920
PLANTED_PID, STRAY_PID = 4101, 4102
PLANTED_MIB = 30 * 1024
# How long the agent may take to show a round's result (rounds every INTERVAL_S; the margin
# is for a loaded machine and the first seconds of RBAC).
INTERVAL_S = 0.3
RESULT_TIMEOUT_S = 30.0
pytestmark = pytest.mark.timeout(180, func_only=True)


# -- deploy/node-agent's RBAC, and a kubeconfig of its ServiceAccount -------------------------


@pytest.fixture(scope="module")
def agent_kubeconfig(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Path]:
    """deploy/node-agent's namespace and RBAC applied (the DaemonSet cannot run without a
    kubelet), and a kubeconfig with a token of its ServiceAccount; the RBAC is deleted
    afterwards (the namespace stays: no namespace controller runs here)."""
    control_plane.kubectl("apply", "-f", str(DEPLOY / "namespace.yaml"))
    control_plane.kubectl("apply", "-f", str(DEPLOY / "rbac.yaml"))
    try:
        path = control_plane.service_account_kubeconfig(
            AGENT_NAMESPACE,
            SERVICE_ACCOUNT,
            tmp_path_factory.mktemp("node-agent") / "kubeconfig",
        )
        yield path
    finally:
        control_plane.kubectl("delete", "--ignore-not-found", "-f", str(DEPLOY / "rbac.yaml"))


def granted_rules() -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) of every rule of the shipped ClusterRole."""
    documents = yaml.safe_load_all((DEPLOY / "rbac.yaml").read_text())
    (role,) = [d for d in documents if d and d["kind"] == "ClusterRole"]
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def allowed(
    authz: k8s.AuthorizationV1Api,
    verb: str,
    resource: str,
    *,
    group: str = "",
    namespace: str = "",
    subresource: str = "",
) -> bool:
    """What the apiserver's authorizer says of the agent's ServiceAccount doing this."""
    review = k8s.V1SubjectAccessReview(
        spec=k8s.V1SubjectAccessReviewSpec(
            user=SERVICE_ACCOUNT_USER,
            groups=["system:serviceaccounts", f"system:serviceaccounts:{AGENT_NAMESPACE}"],
            resource_attributes=k8s.V1ResourceAttributes(
                verb=verb,
                resource=resource,
                group=group,
                namespace=namespace or None,
                subresource=subresource or None,
            ),
        )
    )
    return bool(authz.create_subject_access_review(review).status.allowed)


# -- the node: pods bound to it, their processes on its fake GPU --------------------------------


@dataclass(frozen=True)
class RunningPod:
    name: str
    uid: str
    container_id: str

    def cgroup(self) -> str:
        """The container's cgroup v2 path under the kubelet's systemd driver (BestEffort)."""
        uid = self.uid.replace("-", "_")
        return (
            f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uid}.slice/"
            f"cri-containerd-{self.container_id}.scope"
        )


def admitted_pod(name: str, namespace: str) -> dict[str, Any]:
    """An annotated 0.5-share pod as gpushare's mutating webhook leaves it (bundled policies,
    no gpuMemory: a share, and no driver limit)."""
    pod = annotated_pod(name, "0.5")
    verdict = mutate(pod, namespace, load_policies(default_policies_path()))
    assert verdict.allowed and verdict.decision is not None, verdict.reasons
    mutated = mutated_pod(pod, verdict.decision)
    env = {e["name"] for e in mutated["spec"]["containers"][0].get("env", [])}
    assert "NVIDIA_GPU_MEMORY_LIMIT" not in env, env
    return mutated


def run_pod(core_v1: k8s.CoreV1Api, namespace: str, name: str, node: str) -> RunningPod:
    """The admitted pod bound to ``node`` and, as a kubelet would report it, running."""
    pod = admitted_pod(name, namespace)
    pod["spec"]["nodeName"] = node
    created = core_v1.create_namespaced_pod(namespace, pod)
    container_id = secrets.token_hex(32)
    status = {
        "phase": "Running",
        "containerStatuses": [
            {
                "name": "main",
                "image": pod["spec"]["containers"][0]["image"],
                "imageID": "",
                "containerID": f"containerd://{container_id}",
                "ready": True,
                "started": True,
                "restartCount": 0,
                "state": {"running": {"startedAt": "2025-01-01T00:00:00Z"}},
            }
        ],
    }
    core_v1.patch_namespaced_pod_status(
        name, namespace, {"status": status}, _content_type="application/merge-patch+json"
    )
    return RunningPod(name, created.metadata.uid, container_id)


@dataclass(frozen=True)
class FakeHost:
    """The node's files: /proc, /sys/fs/cgroup under ``root``, the CDI directory."""

    root: Path

    @property
    def proc(self) -> Path:
        return self.root / "proc"

    @property
    def cdi(self) -> Path:
        return self.root / "var/run/cdi"

    def flags(self) -> list[str]:
        return ["--host-root", str(self.root), "--proc-root", str(self.proc),
                "--cdi-dir", str(self.cdi)]  # fmt: skip

    def cgroup_v2(self) -> None:
        marker = self.root / "sys/fs/cgroup/cgroup.controllers"
        marker.parent.mkdir(parents=True)
        marker.write_text("cpuset cpu io memory hugetlb pids rdma misc\n")

    def plant(self, pid: int, pod: RunningPod) -> None:
        (self.proc / str(pid)).mkdir(parents=True)
        (self.proc / str(pid) / "cgroup").write_text(f"0::{pod.cgroup()}\n")

    def device_plugin_spec(self) -> None:
        """The device plugin's CDI spec, with the memory-limit hook for the node's GPU (as
        nvidia-container-toolkit v1.20.1's nvcdi writes it)."""
        hook = {
            "hookName": "createRuntime",
            "path": "/usr/bin/nvidia-cdi-hook",
            "args": ["nvidia-cdi-hook", "apply-cuda-memory-limits", "--driver-root", "/",
                     "--gpu-id", GPU_UUID],
        }  # fmt: skip
        spec = {
            "cdiVersion": "0.5.0",
            "kind": "k8s.device-plugin.nvidia.com/gpu",
            "devices": [
                {
                    "name": GPU_UUID,
                    "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}], "hooks": [hook]},
                }
            ],
            "containerEdits": {"deviceNodes": [{"path": "/dev/nvidiactl"}]},
        }
        self.cdi.mkdir(parents=True, exist_ok=True)
        (self.cdi / "k8s.device-plugin.nvidia.com-gpu.json").write_text(json.dumps(spec))


# -- the agent process ------------------------------------------------------------------------


@dataclass
class Agent:
    process: subprocess.Popen[bytes]
    log: Path
    requests: Path

    def lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.log.read_text().splitlines() if line[:1] == "{"]

    def alive(self) -> None:
        """Stop a wait at once (with the log) if the agent died."""
        if self.process.poll() is not None:
            raise ControlPlaneError(
                f"the node agent exited with {self.process.returncode}:\n{self.log.read_text()}"
            )

    def wait(self, what: str, check: Callable[[], Any]) -> Any:
        def checked() -> Any:
            self.alive()
            result = check()
            return result if result is not None and result is not False else None

        return wait_for(what, checked, timeout=RESULT_TIMEOUT_S, on_timeout=self.log.read_text)

    def address(self) -> str:
        return str(
            self.wait(
                "the agent to listen",
                lambda: next(
                    (e["address"] for e in self.lines() if e.get("event") == "listening"), None
                ),
            )
        )

    def readyz(self) -> dict[str, Any]:
        try:
            with urllib.request.urlopen(f"http://{self.address()}/readyz", timeout=5) as answer:
                body: dict[str, Any] = json.loads(answer.read())
        except urllib.error.HTTPError as refused:  # 503 before the first label is written
            body = json.loads(refused.read())
        return body

    def sent(self) -> list[tuple[str, urllib.parse.SplitResult]]:
        lines = self.requests.read_text().splitlines() if self.requests.exists() else []
        return [
            (method, urllib.parse.urlsplit(url))
            for method, _, url in (line.partition(" ") for line in lines)
        ]


@pytest.fixture
def start_agent(agent_kubeconfig: Path, tmp_path: Path) -> Iterator[Callable[..., Agent]]:
    """Starts the agent for a node with a fake GPU inventory; killed at the end if running."""
    started: list[Agent] = []

    def start(node: str, host: FakeHost, inventory: dict[str, Any]) -> Agent:
        gpus = tmp_path / "gpus.json"
        gpus.write_text(json.dumps(inventory))
        log, requests = tmp_path / "agent.log", tmp_path / "requests.log"
        with log.open("wb") as stderr:
            process = subprocess.Popen(
                [sys.executable, str(FAKE_GPU_AGENT), str(gpus), str(requests), "node-agent",
                 "--node-name", node, "--kubeconfig", str(agent_kubeconfig),
                 "--interval", str(INTERVAL_S), "--listen", "127.0.0.1:0", *host.flags()],
                cwd=REPO, stdout=subprocess.DEVNULL, stderr=stderr,
            )  # fmt: skip
        agent = Agent(process, log, requests)
        started.append(agent)
        return agent

    try:
        yield start
    finally:
        for agent in started:
            if agent.process.poll() is None:
                agent.process.kill()
                agent.process.wait(timeout=10)


# -- the tests --------------------------------------------------------------------------------


def test_the_agent_labels_its_node_and_warns_once_on_an_uncapped_pod(
    core_v1: k8s.CoreV1Api,
    namespace: str,
    fake_nodes: Callable[[FakeGpuNode], k8s.V1Node],
    start_agent: Callable[..., Agent],
    tmp_path: Path,
) -> None:
    node, elsewhere = (
        FakeGpuNode(unique_name("agent-node")),
        FakeGpuNode(unique_name("agent-other")),
    )
    fake_nodes(node)
    fake_nodes(elsewhere)
    planted = run_pod(core_v1, namespace, "planted", node.name)
    stray = run_pod(core_v1, namespace, "stray", elsewhere.name)
    host = FakeHost(tmp_path / "host")
    host.cgroup_v2()
    host.plant(PLANTED_PID, planted)
    host.plant(STRAY_PID, stray)  # its cgroup names a pod, but one bound to another node
    inventory = {
        "gpus": [{"uuid": GPU_UUID, "name": "NVIDIA A100-SXM4-80GB", "memoryMiB": GPU_MEMORY_MIB}],
        "driverVersion": "615.43.02",
        "processes": {
            "0": [{"pid": PLANTED_PID, "usedMiB": PLANTED_MIB}, {"pid": STRAY_PID, "usedMiB": 512}]
        },
    }
    agent = start_agent(node.name, host, inventory)

    def metadata() -> k8s.V1ObjectMeta:
        return core_v1.read_node(node.name).metadata

    def label() -> str | None:
        return (metadata().labels or {}).get(DRIVER_LIMIT_LABEL)

    def events(pod: str) -> list[k8s.CoreV1Event]:
        found = core_v1.list_namespaced_event(
            namespace, field_selector=f"involvedObject.name={pod}"
        ).items
        return list(found)

    try:
        # No device plugin CDI spec: not enforced, and the annotation says why.
        agent.wait("the label false", lambda: label() == "false")
        annotations = metadata().annotations or {}
        assert "does not inject GPUs through CDI" in annotations[DRIVER_LIMIT_REASON_ANNOTATION]
        facts = json.loads(annotations[DRIVER_LIMIT_FACTS_ANNOTATION])
        assert facts["driverVersion"] == "615.43.02" and facts["cgroup"] == "v2"
        assert facts["devicePluginCdi"] is False and facts["hookGpus"] == "0/1"
        # GPU Feature Discovery's labels are untouched by the agent's merge patches.
        assert node.labels().items() <= (metadata().labels or {}).items()

        # The uncapped process's pod gets its Warning Event.
        (event,) = agent.wait("the GpuMemoryUncapped Event", lambda: events("planted"))
        assert (event.type, event.reason) == ("Warning", "GpuMemoryUncapped")
        assert event.involved_object.uid == planted.uid
        assert event.involved_object.kind == "Pod"
        assert event.source.component == "gpushare-node-agent"
        assert event.source.host == node.name
        assert event.message.startswith(
            f"Process {PLANTED_PID} (pod {namespace}/planted, container main) on GPU 0 "
            f"({GPU_UUID}) has no GPU memory limit at all"
        ), event.message

        # The device plugin's spec with the hook arrives: the label flips on a later round.
        host.device_plugin_spec()
        agent.wait("the label true", lambda: label() == "true")
        annotations = metadata().annotations or {}
        assert DRIVER_LIMIT_REASON_ANNOTATION not in annotations
        assert json.loads(annotations[DRIVER_LIMIT_FACTS_ANNOTATION])["hookGpus"] == "1/1"

        # Several rounds later: still exactly one Event, and none on the stray pod.
        rounds = agent.readyz()["rounds"]
        agent.wait("five more rounds", lambda: agent.readyz()["rounds"] >= rounds + 5)
        assert agent.readyz()["enforced"] is True
        assert [e.reason for e in events("planted")] == ["GpuMemoryUncapped"]
        assert events("stray") == []
        # The pods listed are the node's only: the stray pod's process is nobody's here.
        unattributed = [e for e in agent.lines() if e.get("event") == "gpu_process_unattributed"]
        assert [(e["pid"], e["pod"]) for e in unattributed] == [(STRAY_PID, None)]
        assert (
            f"of pod UID {stray.uid}, which is not bound to this node"
            in (unattributed[0]["message"])
        )
        uncapped = [e for e in agent.lines() if e.get("event") == "gpu_process_uncapped"]
        assert [(e["pid"], e["pod"], e["used_mib"]) for e in uncapped] == [
            (PLANTED_PID, "planted", PLANTED_MIB)
        ]

        # SIGTERM: the label goes to "false" (fail closed) before the agent exits 0.
        agent.process.send_signal(signal.SIGTERM)
        assert agent.process.wait(timeout=30) == 0
    finally:
        if agent.process.poll() is None:
            agent.process.kill()
            agent.process.wait(timeout=10)
    assert label() == "false"
    reason = (metadata().annotations or {})[DRIVER_LIMIT_REASON_ANNOTATION]
    assert reason.startswith("The gpushare node agent stopped"), reason
    assert [e.reason for e in events("planted")] == ["GpuMemoryUncapped"]
    assert (
        json.loads(
            core_v1.read_namespaced_pod("planted", namespace).metadata.annotations[
                APPLIED_ANNOTATION
            ]
        )["fraction"]
        == "0.5"
    )

    # What it sent: its own Node read and patched, its node's pods listed, Events created.
    sent = agent.sent()
    assert sent, "the agent sent no request"
    used = {_rbac(method, url) for method, url in sent}
    assert used == granted_rules(), sent
    lists = [url for method, url in sent if _rbac(method, url) == ("", "pods", "list")]
    for url in lists:
        assert url.path == "/api/v1/pods"
        query = urllib.parse.parse_qs(url.query)
        assert query["fieldSelector"] == [f"spec.nodeName={node.name}"], url
    assert {
        url.path for method, url in sent if method in ("GET", "PATCH") and "nodes" in url.path
    } == {f"/api/v1/nodes/{node.name}"}
    creates = {url.path for method, url in sent if method == "POST"}
    assert creates == {f"/api/v1/namespaces/{namespace}/events"}


def _rbac(method: str, url: urllib.parse.SplitResult) -> tuple[str, str, str]:
    """The (apiGroup, resource, verb) a core/v1 request needs (only what the agent sends)."""
    parts = url.path.strip("/").split("/")
    assert parts[:2] == ["api", "v1"], url
    rest = parts[2:]
    if rest[:1] == ["namespaces"] and len(rest) >= 3:
        rest = rest[2:]  # the namespace, then the resource
    resource, named = rest[0], len(rest) > 1
    verb = {
        "GET": "get" if named else "list",
        "PATCH": "patch",
        "POST": "create",
        "PUT": "update",
        "DELETE": "delete",
    }[method]
    if verb == "list" and "watch=true" in url.query:
        verb = "watch"
    return "", resource, verb


def test_the_cluster_role_grants_nothing_more_than_the_agent_uses(
    control_plane: ControlPlane, agent_kubeconfig: Path
) -> None:
    """The ServiceAccount may get and patch nodes, list pods and create Events; nothing
    else an agent might be tempted to use (asked of the apiserver's authorizer)."""
    authz = k8s.AuthorizationV1Api(control_plane.api)
    for verb, resource in (("get", "nodes"), ("patch", "nodes"), ("list", "pods")):
        assert allowed(authz, verb, resource), (verb, resource)
    assert allowed(authz, "create", "events", namespace="any-namespace")
    for verb, resource, namespace in (
        ("list", "nodes", ""),
        ("watch", "nodes", ""),
        ("update", "nodes", ""),
        ("delete", "nodes", ""),
        ("get", "pods", "any-namespace"),
        ("watch", "pods", ""),
        ("patch", "pods", "any-namespace"),
        ("delete", "pods", "any-namespace"),
        ("patch", "events", "any-namespace"),
        ("update", "events", "any-namespace"),
        ("list", "events", "any-namespace"),
        ("get", "secrets", AGENT_NAMESPACE),
        ("list", "configmaps", AGENT_NAMESPACE),
    ):
        assert not allowed(authz, verb, resource, namespace=namespace), (verb, resource)
    assert not allowed(authz, "patch", "nodes", subresource="status")
    assert not allowed(authz, "create", "events", group="events.k8s.io", namespace="any")
