"""The node agent's rounds on a fake node: GPUs and their processes through ``FakeNvml``, the
processes' cgroups in a /proc tree under tmp_path, the device plugin's CDI spec, the node's
pods through ``FakePodApi`` and its labels through ``RecordingNodeApi``.

The issue's "done when": the audit finds a planted uncapped process (and an over-share one,
and one in no pod); the label flips when the hook disappears; each finding is told once.
"""

from __future__ import annotations

import io
import json
import logging
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from agent_fakes import (
    GPU0,
    GPU1,
    MIB,
    FakePodApi,
    as_pod,
    fake_node_files,
    pod_json,
    shared_record,
    systemd_cgroup,
    write_cgroup_v2,
    write_plugin_spec,
    write_proc,
)
from fake_nvml import FakeNvml
from node_fakes import RecordingNodeApi, wait_until
from prometheus_client.parser import text_string_to_metric_families

from webhook.cli import build_parser
from webhook.cli.node_commands import run_node_agent_command
from webhook.constants import (
    DRIVER_LIMIT_FACTS_ANNOTATION,
    DRIVER_LIMIT_LABEL,
    DRIVER_LIMIT_REASON_ANNOTATION,
    GFD_REPLICAS_LABEL,
)
from webhook.node import AgentClients
from webhook.node import events as node_events
from webhook.node.agent_metrics import NodeAgentMetrics
from webhook.node.gpu_audit import OVER_SHARE, UNATTRIBUTED, UNCAPPED
from webhook.node.node_agent import AgentPaths, NodeAgent
from webhook.node.nvml import GpuProcess

REPO = Path(__file__).resolve().parents[2]
FAKE_AGENT = Path(__file__).resolve().parent / "fake_gpu_node_agent.py"
LIMITED = {"NVIDIA_GPU_MEMORY_REQUEST": "40960", "NVIDIA_GPU_MEMORY_LIMIT": "40960"}
MPS_LIMITED = {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=40960M"}


@dataclass
class FakeNode:
    """A GPU node in tmp_path and the agent that watches it."""

    root: Path
    nvml: FakeNvml
    node: RecordingNodeApi
    pods: FakePodApi
    agent: NodeAgent

    @property
    def proc(self) -> Path:
        return self.root / "proc"

    @property
    def cdi(self) -> Path:
        return self.root / "var/run/cdi"

    def run(self, pid: int, gpu: int, used_mib: int, n: int | None, *, mps: bool = False) -> None:
        """Process ``pid`` on GPU ``gpu``, in pod ``n``'s container (None: in no pod)."""
        self.nvml.gpu_processes.setdefault(gpu, []).append(GpuProcess(pid, used_mib * MIB, mps))
        cgroup = systemd_cgroup(n) if n is not None else "/system.slice/ollama.service"
        write_proc(self.proc, pid, cgroup)

    def add_pod(self, name: str, n: int, **fields: Any) -> None:
        self.pods.pods.append(as_pod(pod_json(name, n, **fields)))

    def metrics(self) -> dict[str, float]:
        text = self.agent.metrics.render().decode()
        return {
            sample.name + json.dumps(sample.labels, sort_keys=True): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }


@pytest.fixture
def node(tmp_path: Path) -> FakeNode:
    write_cgroup_v2(tmp_path)
    write_plugin_spec(tmp_path / "var/run/cdi", [GPU0, GPU1], hook=True)
    nvml = FakeNvml(gpus=[GPU0, GPU1])
    api = RecordingNodeApi(labels={GFD_REPLICAS_LABEL: "2"})
    pods = FakePodApi()
    paths = AgentPaths(
        host_root=tmp_path, proc_root=tmp_path / "proc", cdi_dirs=(tmp_path / "var/run/cdi",)
    )
    agent = NodeAgent(nvml=nvml, node=api, pods=pods, paths=paths, metrics=NodeAgentMetrics())
    return FakeNode(tmp_path, nvml, api, pods, agent)


@pytest.fixture
def event_log() -> Iterator[io.StringIO]:
    logger = logging.getLogger(node_events.LOGGER_NAME)
    saved = (list(logger.handlers), logger.level, logger.propagate)
    stream = io.StringIO()
    node_events.configure(stream)
    try:
        yield stream
    finally:
        logger.handlers[:], logger.level, logger.propagate = saved


def events_named(stream: io.StringIO, name: str) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    return [line for line in lines if line.get("event") == name]


# -- the audit ---------------------------------------------------------------------------------


def test_the_audit_finds_a_planted_uncapped_process(node: FakeNode) -> None:
    node.add_pod("capped", 1, env=LIMITED, applied=shared_record())
    node.add_pod("planted", 2, applied=shared_record())  # a share, and no limit at all
    node.run(101, 0, 30000, 1)
    node.run(102, 0, 30000, 2)
    result = node.agent.round()
    assert result.report is not None
    (finding,) = result.report.findings
    assert finding.kind == UNCAPPED
    assert finding.audited.pod is not None and finding.audited.pod.name == "planted"
    assert finding.message == (
        f"Process 102 (pod ml/planted, container main) on GPU 0 ({GPU0.uuid}) has no GPU "
        "memory limit at all: it can take the whole GPU from the pods sharing it. Have the "
        "policy require the driver limit (enforcement.driverMemoryLimit: require) or run the "
        "pod where MPS serves its GPU."
    )
    assert node.pods.events == [("ml/planted", "GpuMemoryUncapped", finding.message)]


def test_a_driver_limit_the_node_does_not_enforce_caps_nothing(node: FakeNode) -> None:
    write_plugin_spec(node.cdi, [GPU0, GPU1], hook=False)
    node.add_pod("limited", 1, env=LIMITED, applied=shared_record())
    node.add_pod("mps-client", 2, env=MPS_LIMITED, applied=shared_record(mode="mps"))
    node.add_pod("mps-bypass", 3, env=MPS_LIMITED, applied=shared_record(mode="mps"))
    node.run(101, 0, 1000, 1)
    node.run(102, 1, 1000, 2, mps=True)
    node.run(103, 1, 1000, 3)  # set the variable, but never reached the MPS daemon
    result = node.agent.round()
    assert result.report is not None
    found = {(f.audited.process.pid, f.kind) for f in result.report.findings}
    assert found == {(101, UNCAPPED), (103, UNCAPPED)}
    messages = {f.audited.process.pid: f.message for f in result.report.findings}
    assert "has NVIDIA_GPU_MEMORY_LIMIT, but this node does not enforce" in messages[101]
    assert "has CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, but is not an MPS client" in messages[103]


def test_over_share_counts_a_containers_processes_together(node: FakeNode) -> None:
    node.add_pod("greedy", 1, env=LIMITED, applied=shared_record())
    node.add_pod("half", 2, applied=shared_record("0.5"), env=MPS_LIMITED)
    node.run(101, 0, 30000, 1)
    node.run(102, 0, 20000, 1)  # together 50000 MiB > the 40960 MiB limit
    node.run(103, 1, 41000, 2, mps=True)  # above its 40960M MPS limit
    result = node.agent.round()
    assert result.report is not None
    found = sorted((f.audited.process.pid, f.kind) for f in result.report.findings)
    assert found == [(101, OVER_SHARE), (102, OVER_SHARE), (103, OVER_SHARE)]
    first = result.report.findings[0].message
    assert "uses 50000 MiB of the GPU, more than the 40960 MiB its limit and share allow" in first
    # One Event per pod and reason, not per process.
    assert [(pod, reason) for pod, reason, _ in node.pods.events] == [
        ("ml/greedy", "GpuMemoryOverShare"),
        ("ml/half", "GpuMemoryOverShare"),
    ]


def test_a_process_in_no_pod_on_a_shared_gpu_is_unattributed(node: FakeNode) -> None:
    node.run(4242, 0, 2048, None)
    node.add_pod("other", 9)  # a pod gpushare never mutated: attributed, not judged
    node.run(4343, 1, 2048, 9)
    result = node.agent.round()
    assert result.report is not None
    (finding,) = result.report.findings
    assert (finding.kind, finding.audited.process.pid) == (UNATTRIBUTED, 4242)
    assert finding.message == (
        f"Process 4242 on GPU 0 ({GPU0.uuid}) is in no pod (cgroup /system.slice/ollama.service) "
        "and uses 2048 MiB of a shared GPU: stop it, or run it as a pod that asks for its share."
    )
    assert node.pods.events == []  # no pod to put an Event on: the log line tells it
    # On a node that shares nothing, a host process next to whole-GPU pods is no finding.
    node.node.labels.clear()
    assert node.agent.round().report.findings == ()  # type: ignore[union-attr]


# -- the label ---------------------------------------------------------------------------------


def test_the_label_flips_when_the_hook_disappears_and_is_written_only_on_change(
    node: FakeNode,
) -> None:
    node.agent.round()
    node.agent.round()
    assert node.node.label_history(DRIVER_LIMIT_LABEL) == ["true"]
    assert DRIVER_LIMIT_REASON_ANNOTATION not in node.node.annotations
    facts = json.loads(node.node.annotations[DRIVER_LIMIT_FACTS_ANNOTATION])
    assert facts["hookGpus"] == "2/2" and facts["driverVersion"] == "615.43.02"
    write_plugin_spec(node.cdi, [GPU0], hook=True)  # the plugin's new spec: GPU 1 uncovered
    node.agent.round()
    assert node.node.label_history(DRIVER_LIMIT_LABEL) == ["true", "false"]
    assert (
        "has no apply-cuda-memory-limits hook for GPU(s) 1"
        in (node.node.annotations[DRIVER_LIMIT_REASON_ANNOTATION])
    )
    write_plugin_spec(node.cdi, [GPU0, GPU1], hook=True)
    node.agent.round()
    assert node.node.label_history(DRIVER_LIMIT_LABEL) == ["true", "false", "true"]
    assert DRIVER_LIMIT_REASON_ANNOTATION not in node.node.annotations


def test_a_failed_write_is_retried_and_shutdown_fails_closed(node: FakeNode) -> None:
    node.node.fail = True
    node.agent.round()
    assert node.agent.label.published is None and not node.agent.health().ready
    node.node.fail = False
    node.agent.round()
    assert node.node.labels[DRIVER_LIMIT_LABEL] == "true" and node.agent.health().ready
    assert node.agent.label.withdraw()
    assert node.node.labels[DRIVER_LIMIT_LABEL] == "false"
    assert node.node.annotations[DRIVER_LIMIT_REASON_ANNOTATION].startswith(
        "The gpushare node agent stopped"
    )


# -- telling and counting ----------------------------------------------------------------------


def test_findings_are_told_once_until_they_go_away(node: FakeNode, event_log: io.StringIO) -> None:
    node.add_pod("planted", 2, applied=shared_record())
    node.run(102, 0, 1000, 2)
    node.run(103, 0, 1000, 2)  # a second process of the same pod: the same Event
    node.pods.fail_events = True
    node.agent.round()
    assert node.pods.events == []  # refused: not remembered, tried again
    node.pods.fail_events = False
    for _ in range(3):
        node.agent.round()
    assert [reason for _, reason, _ in node.pods.events] == ["GpuMemoryUncapped"]
    node.nvml.gpu_processes.clear()
    node.agent.round()
    assert node.agent.reporter.told == frozenset()
    node.run(102, 0, 1000, 2)
    node.agent.round()
    assert [reason for _, reason, _ in node.pods.events] == ["GpuMemoryUncapped"] * 2
    lines = events_named(event_log, "gpu_process_uncapped")
    assert len(lines) == 3  # the refused round, the first told, the one after it went away
    assert (lines[-1]["namespace"], lines[-1]["pod"], lines[-1]["gpu"], lines[-1]["pid"]) == (
        "ml",
        "planted",
        0,
        102,
    )
    assert lines[-1]["used_mib"] == 1000 and lines[-1]["level"] == "warning"


def test_metrics_carry_the_rounds_values(node: FakeNode) -> None:
    node.add_pod("capped", 1, env=LIMITED, applied=shared_record())
    node.add_pod("planted", 2, applied=shared_record())
    node.run(101, 0, 30000, 1)
    node.run(102, 1, 45000, 2)  # uncapped and over its half share
    node.run(4242, 1, 512, None)
    node.agent.round()
    values = node.metrics()
    series = "gpushare_node_gpu_process_memory_bytes"
    capped = series + '{"container": "main", "gpu": "0", "namespace": "ml", "pod": "capped"}'
    assert values[capped] == 30000 * MIB
    assert values[series + '{"container": "", "gpu": "1", "namespace": "", "pod": ""}'] == 512 * MIB
    assert values["gpushare_node_gpu_processes{}"] == 3
    assert values["gpushare_node_gpu_processes_uncapped{}"] == 1
    assert values["gpushare_node_gpu_processes_over_share{}"] == 1
    assert values["gpushare_node_gpu_processes_unattributed{}"] == 1
    assert values["gpushare_node_driver_memory_limit_enforced{}"] == 1
    assert values["gpushare_node_audit_last_success_timestamp_seconds{}"] > 0
    # A container that stopped leaves no series behind; a failed audit counts.
    node.nvml.gpu_processes.clear()
    node.pods.fail_list = True
    node.run(101, 0, 30000, 1)
    node.agent.round()
    values = node.metrics()
    assert values["gpushare_node_audit_failures_total{}"] == 1
    node.pods.fail_list = False
    node.agent.round()
    assert [k for k in node.metrics() if k.startswith(series)] == [capped]


# -- the command -------------------------------------------------------------------------------


def test_once_prints_the_round_and_writes_nothing(
    node: FakeNode, capsys: pytest.CaptureFixture[str]
) -> None:
    node.add_pod("planted", 2, applied=shared_record())
    node.run(102, 0, 1000, 2)
    args = build_parser().parse_args(
        ["node-agent", "--once", "--node-name", "gpu-node-1", "--host-root", str(node.root),
         "--proc-root", str(node.proc), "--cdi-dir", str(node.cdi)]
    )  # fmt: skip
    clients = AgentClients(nvml=node.nvml, node=node.node, pods=node.pods)
    assert run_node_agent_command(args, clients) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["node"] == "gpu-node-1"
    assert printed["driverMemoryLimit"]["enforced"] is True
    (spec,) = printed["driverMemoryLimit"]["cdiSpecs"]
    assert spec["kind"] == "k8s.device-plugin.nvidia.com/gpu" and len(spec["hookGpus"]) == 2
    (finding,) = printed["findings"]
    assert (finding["kind"], finding["pod"], finding["pid"], finding["usedMiB"]) == (
        UNCAPPED,
        "planted",
        102,
        1000,
    )
    assert printed["auditError"] is None
    assert node.node.patches == [] and node.pods.events == []


def test_bad_options_stop_the_agent_with_one_line(
    node: FakeNode, capsys: pytest.CaptureFixture[str]
) -> None:
    clients = AgentClients(nvml=node.nvml, node=node.node, pods=node.pods)
    for argv, message in (
        (["node-agent", "--node-name", "n", "--interval", "0"], "--interval 0 must be more"),
        (["node-agent", "--node-name", "n", "--listen", "nowhere"], "is not HOST:PORT"),
        (["node-agent", "--node-name", ""], "The node name is unknown"),
    ):
        args = build_parser().parse_args(argv)
        assert run_node_agent_command(args, clients) == 1
        (line,) = capsys.readouterr().err.splitlines()
        assert json.loads(line)["event"] == "startup_failed"
        assert message in json.loads(line)["message"]


def test_the_agent_as_a_process_serves_metrics_and_fails_closed_on_sigterm(
    tmp_path: Path,
) -> None:
    """SIGTERM: the label goes to false before the process exits 0."""
    inventory, pods, flags = fake_node_files(tmp_path)
    stderr = tmp_path / "stderr"
    with stderr.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, str(FAKE_AGENT), str(inventory), str(pods), "node-agent",
             "--node-name", "gpu-node-1", "--listen", "127.0.0.1:0", "--interval", "0.2",
             *flags],
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=log,
        )  # fmt: skip
    try:
        address = wait_until("the agent listens", lambda: _listening(stderr, process), 30)
        body = wait_until(
            "a round's metrics",
            lambda: _scrape(address, "gpushare_node_gpu_processes_uncapped 1.0"),
            30,
        )
        assert "gpushare_node_gpu_processes_over_share 1.0" in body
        with urllib.request.urlopen(f"http://{address}/readyz", timeout=5) as response:
            assert json.loads(response.read())["enforced"] is True
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    lines = [json.loads(line) for line in stderr.read_text().splitlines()]
    last = [line for line in lines if line["event"].startswith("driver_limit_")][-1]
    assert last["event"] == "driver_limit_not_enforced"
    assert last["reason"].startswith("The gpushare node agent stopped")


def _listening(stderr: Path, process: subprocess.Popen[bytes]) -> str | None:
    assert process.poll() is None, stderr.read_text()
    for line in stderr.read_text().splitlines():
        if json.loads(line).get("event") == "listening":
            return str(json.loads(line)["address"])
    return None


def _scrape(address: str, wanted: str) -> str | None:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as response:
        body = response.read().decode()
    return body if wanted in body.splitlines() else None
