"""The supervisor end to end against the stand-in control program (a real child process
that daemonises, keeps state in its pipe directory and can be told to die, fault or hang)."""

from __future__ import annotations

import json
import logging
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
from fake_nvml import FakeNvml
from node_fakes import FakeMps, RecordingNodeApi, pid_gone, wait_until

from webhook.node.errors import MpsControlError
from webhook.node.mps_control import MpsDefaults
from webhook.node.nvml import ComputeMode, GpuDevice
from webhook.node.status_server import LauncherMetrics, StatusServer
from webhook.node.supervisor import MpsSupervisor, SupervisorSettings, backoff_delay

LABEL = "gpushare.io/mps-ready"
FAST = SupervisorSettings(
    check_interval_s=0.05,
    backoff_initial_s=0.1,
    backoff_max_s=0.4,
    backoff_reset_s=60.0,
    unresponsive_limit=2,
    quit_timeout_s=5.0,
)
DEFAULTS = MpsDefaults(25, {0: 20480, 1: 20480})


def gpus() -> list[GpuDevice]:
    return [GpuDevice(i, f"GPU-{i}", "NVIDIA A100-SXM4-80GB", 81920, (8, 0)) for i in (0, 1)]


@dataclass
class Setup:
    fake: FakeMps
    node: RecordingNodeApi = field(default_factory=RecordingNodeApi)
    nvml: FakeNvml = field(default_factory=lambda: FakeNvml(gpus=gpus()))
    settings: SupervisorSettings = FAST
    metrics: LauncherMetrics = field(default_factory=LauncherMetrics)
    command_timeout_s: float = 5.0

    def supervisor(self) -> MpsSupervisor:
        return MpsSupervisor(
            control=self.fake.control(command_timeout_s=self.command_timeout_s),
            nvml=self.nvml,
            gpus=self.nvml.devices(),
            defaults=DEFAULTS,
            node=self.node,
            ready_label=LABEL,
            pool_name="a100-mps",
            set_exclusive=True,
            settings=self.settings,
            metrics=self.metrics,
        )

    def metric(self, name: str) -> float:
        value = self.metrics.registry.get_sample_value(name)
        return -1.0 if value is None else value


@dataclass
class Running:
    supervisor: MpsSupervisor
    stop: threading.Event
    thread: threading.Thread
    result: dict[str, Any]


@contextmanager
def running(setup: Setup) -> Iterator[Running]:
    """Run the supervisor in a thread; on exit stop it and wait (bounded) for shutdown."""
    supervisor = setup.supervisor()
    stop = threading.Event()
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["rc"] = supervisor.run(stop)
        except BaseException as exc:
            result["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    try:
        yield Running(supervisor, stop, thread, result)
    finally:
        stop.set()
        thread.join(timeout=20)
        assert not thread.is_alive(), "supervisor did not stop within 20s"


def events(caplog: pytest.LogCaptureFixture, name: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "event", None) == name]


def fields(record: logging.LogRecord) -> dict[str, Any]:
    """The record's attributes; ``emit`` puts the event's fields among them."""
    return dict(vars(record))


@pytest.fixture(autouse=True)
def _capture_events(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="gpushare.node")


def test_backoff_doubles_up_to_the_maximum() -> None:
    settings = SupervisorSettings(backoff_initial_s=1.0, backoff_max_s=60.0)
    assert [backoff_delay(n, settings) for n in range(1, 9)] == [1, 2, 4, 8, 16, 32, 60, 60]


def test_defaults_are_applied_before_the_ready_label(fake_mps: FakeMps) -> None:
    commands_at_label: list[list[str]] = []

    def snapshot(body: dict[str, Any]) -> None:
        if body["metadata"].get("labels", {}).get(LABEL) == "true":
            commands_at_label.append(fake_mps.commands())

    setup = Setup(fake_mps, node=RecordingNodeApi(labels={LABEL: "true"}, on_patch=snapshot))
    with running(setup):
        wait_until("ready label", lambda: setup.node.labels.get(LABEL) == "true")
    # A label left by an earlier launcher is removed before anything else happens.
    assert setup.node.label_history(LABEL)[:2] == [None, "true"]
    (sent,) = commands_at_label
    assert sent[0].startswith("daemon-start ")
    assert sent[1:5] == [
        "set_default_device_pinned_mem_limit 0 20480M",
        "set_default_device_pinned_mem_limit 1 20480M",
        "set_default_active_thread_percentage 25",
        "get_default_active_thread_percentage",
    ]
    assert setup.node.patches[1]["metadata"]["annotations"] == {
        "gpushare.io/mps-pool": "a100-mps",
        "gpushare.io/mps-gpus": "2",
        "gpushare.io/mps-gpu-memory-mib": "81920",
        "gpushare.io/mps-compute-mode": "EXCLUSIVE_PROCESS",
        "gpushare.io/mps-active-thread-percentage": "25",
        "gpushare.io/mps-pinned-memory-mib": "20480",
    }
    assert setup.nvml.compute_mode_changes[:2] == [
        (0, ComputeMode.EXCLUSIVE_PROCESS),
        (1, ComputeMode.EXCLUSIVE_PROCESS),
    ]


def test_a_dead_daemon_is_restarted_with_backoff(
    fake_mps: FakeMps, caplog: pytest.LogCaptureFixture
) -> None:
    setup = Setup(fake_mps)
    with running(setup) as run:
        wait_until("ready label", lambda: setup.node.labels.get(LABEL) == "true")
        first_pid = run.supervisor.control.daemon_pid()
        assert first_pid is not None
        fake_mps.touch("fake-start-fails")
        fake_mps.touch("fake-die")
        wait_until("label removed", lambda: LABEL not in setup.node.labels)
        wait_until(
            "three failed restarts", lambda: len(events(caplog, "daemon_restart_failed")) >= 3
        )
        fake_mps.clear("fake-start-fails")
        wait_until("label back", lambda: setup.node.labels.get(LABEL) == "true")
        second_pid = run.supervisor.control.daemon_pid()
        assert setup.metric("gpushare_mps_daemon_up") == 1.0
    assert pid_gone(first_pid) and second_pid != first_pid
    (died,) = events(caplog, "daemon_died")
    assert died.levelno == logging.ERROR
    delays = [fields(r)["delay_s"] for r in events(caplog, "daemon_restart_scheduled")]
    assert delays[:3] == [0.1, 0.2, 0.4] and max(delays) == 0.4
    restarts = len(events(caplog, "daemon_restart_failed")) + 1
    assert setup.metric("gpushare_mps_daemon_restarts_total") == restarts
    # The new daemon got the defaults again before the label came back.
    assert fake_mps.commands().count("set_default_active_thread_percentage 25") == 2
    assert setup.node.label_history(LABEL) == [None, "true", None, "true", None]


def test_a_faulted_server_takes_the_label_off_until_it_recovers(
    fake_mps: FakeMps, caplog: pytest.LogCaptureFixture
) -> None:
    setup = Setup(fake_mps)
    with running(setup) as run:
        wait_until("ready label", lambda: setup.node.labels.get(LABEL) == "true")
        pid = run.supervisor.control.daemon_pid()
        run.supervisor.control.send("fake_connect_client 1000 111")
        run.supervisor.control.send("fake_connect_client 1000 222")
        wait_until("clients counted", lambda: setup.metric("gpushare_mps_clients") == 2.0)
        fake_mps.touch("fake-fault")
        wait_until("label removed", lambda: LABEL not in setup.node.labels)
        assert setup.metric("gpushare_mps_servers_faulted") == 1.0
        assert not run.supervisor.health().ready
        fake_mps.clear("fake-fault")
        wait_until("label back", lambda: setup.node.labels.get(LABEL) == "true")
        # A fault is the server's to recover from: the daemon was not restarted.
        assert run.supervisor.control.daemon_pid() == pid
    (fault,) = events(caplog, "server_fault")
    assert fault.levelno == logging.ERROR and fields(fault)["servers"] == [4000000]
    assert len(events(caplog, "server_fault_cleared")) == 1
    assert setup.metric("gpushare_mps_daemon_restarts_total") == 0.0


def test_an_unresponsive_daemon_is_killed_and_restarted(
    fake_mps: FakeMps, caplog: pytest.LogCaptureFixture
) -> None:
    setup = Setup(fake_mps, command_timeout_s=0.3)
    with running(setup) as run:
        wait_until("ready label", lambda: setup.node.labels.get(LABEL) == "true")
        hung_pid = run.supervisor.control.daemon_pid()
        assert hung_pid is not None
        fake_mps.touch("fake-hang")
        wait_until("unresponsive", lambda: events(caplog, "daemon_unresponsive"), timeout=15)
        assert LABEL not in setup.node.labels
        fake_mps.clear("fake-hang")
        wait_until("label back", lambda: setup.node.labels.get(LABEL) == "true", timeout=15)
        assert run.supervisor.control.daemon_pid() != hung_pid
    assert pid_gone(hung_pid)
    assert len(events(caplog, "health_check_failed")) >= FAST.unresponsive_limit


def test_stop_removes_the_label_before_quitting_the_daemon(fake_mps: FakeMps) -> None:
    daemon_alive_at_removal: list[bool] = []
    setup = Setup(fake_mps)

    def check_order(body: dict[str, Any]) -> None:
        labels = body["metadata"].get("labels", {})
        if LABEL in labels and labels[LABEL] is None and "annotations" in body["metadata"]:
            daemon_alive_at_removal.append("quit" not in fake_mps.commands())

    setup.node.on_patch = check_order
    with running(setup) as run:
        wait_until("ready label", lambda: setup.node.labels.get(LABEL) == "true")
        pid = run.supervisor.control.daemon_pid()
        assert pid is not None
    assert run.result == {"rc": 0}
    assert daemon_alive_at_removal == [True]
    assert LABEL not in setup.node.labels and setup.node.annotations == {}
    assert "quit" in fake_mps.commands() and pid_gone(pid)
    assert setup.nvml.compute_mode_changes[-2:] == [
        (0, ComputeMode.DEFAULT),
        (1, ComputeMode.DEFAULT),
    ]
    assert setup.metric("gpushare_mps_node_ready") == 0.0


def test_without_privileges_it_runs_degraded_and_says_so(
    fake_mps: FakeMps, caplog: pytest.LogCaptureFixture
) -> None:
    setup = Setup(fake_mps, nvml=FakeNvml(gpus=gpus(), compute_mode_permission=False))
    with running(setup):
        wait_until("ready label", lambda: setup.node.labels.get(LABEL) == "true")
    (degraded,) = events(caplog, "compute_mode_degraded")
    assert degraded.levelno == logging.WARNING
    assert "CAP_SYS_ADMIN" in fields(degraded)["missing"]
    assert setup.node.patches[1]["metadata"]["annotations"]["gpushare.io/mps-compute-mode"] == (
        "DEFAULT (degraded)"
    )
    assert setup.metric("gpushare_mps_exclusive_process") == 0.0
    assert setup.nvml.compute_mode_changes == []


def test_a_failing_node_api_is_retried(fake_mps: FakeMps, caplog: pytest.LogCaptureFixture) -> None:
    setup = Setup(fake_mps)
    setup.node.fail = True
    with running(setup) as run:
        wait_until("patch failures", lambda: len(events(caplog, "node_patch_failed")) >= 2)
        assert not run.supervisor.health().ready
        setup.node.fail = False
        wait_until("ready label", lambda: setup.node.labels.get(LABEL) == "true")
        assert run.supervisor.health().ready


def test_a_first_start_that_fails_raises_and_labels_nothing(fake_mps: FakeMps) -> None:
    fake_mps.touch("fake-start-fails")
    setup = Setup(fake_mps)
    with running(setup) as run:
        run.thread.join(timeout=10)
    assert isinstance(run.result.get("error"), MpsControlError)
    assert setup.node.label_history(LABEL) == [None]
    # The compute mode it changed is put back.
    assert setup.nvml.compute_mode_changes[-1] == (1, ComputeMode.DEFAULT)


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read().decode()


def test_probes_and_metrics_over_http(fake_mps: FakeMps) -> None:
    setup = Setup(fake_mps)
    with running(setup) as run:
        server = StatusServer("127.0.0.1", 0, setup.metrics, run.supervisor.health)
        server.start()
        base = "http://{}:{}".format(*server.address)
        try:
            wait_until("ready", lambda: get(f"{base}/readyz")[0] == 200)
            run.supervisor.control.send("fake_connect_client 1000 111")
            wait_until("client counted", lambda: setup.metric("gpushare_mps_clients") == 1.0)
            code, body = get(f"{base}/metrics")
            assert code == 200
            for line in (
                "gpushare_mps_daemon_up 1.0",
                "gpushare_mps_gpus 2.0",
                "gpushare_mps_clients 1.0",
                "gpushare_mps_daemon_restarts_total 0.0",
                "gpushare_mps_node_ready 1.0",
            ):
                assert line in body.splitlines()
            fake_mps.touch("fake-fault")
            wait_until("not ready", lambda: get(f"{base}/readyz")[0] == 503)
            code, body = get(f"{base}/readyz")
            assert "FAULT" in json.loads(body)["reason"]
            # Liveness stays green: the supervisor, not the kubelet, handles MPS trouble.
            assert get(f"{base}/healthz")[0] == 200
            assert get(f"{base}/nope")[0] == 404
        finally:
            server.stop()


def test_a_server_started_before_the_defaults_keeps_the_node_unready(
    fake_mps: FakeMps, caplog: pytest.LogCaptureFixture
) -> None:
    fake_mps.touch("fake-early-client")
    setup = Setup(fake_mps)
    with running(setup) as run:
        (warning,) = wait_until(
            "server_without_defaults", lambda: events(caplog, "server_without_defaults")
        )
        assert fields(warning)["servers"] == [4000000]
        checks = len(fake_mps.commands())
        wait_until("a few more checks", lambda: len(fake_mps.commands()) > checks + 10)
        assert setup.node.label_history(LABEL) == [None]
        assert "lack defaults" in str(run.supervisor.health().detail["reason"])
        run.supervisor.control.send("fake_end_server 4000000")
        wait_until("ready label", lambda: setup.node.labels.get(LABEL) == "true")


def test_liveness_holds_through_a_long_backoff(fake_mps: FakeMps) -> None:
    slow = SupervisorSettings(
        check_interval_s=0.05, backoff_initial_s=2.0, backoff_max_s=2.0, quit_timeout_s=5.0
    )
    setup = Setup(fake_mps, settings=slow)
    with running(setup) as run:
        wait_until("ready label", lambda: setup.node.labels.get(LABEL) == "true")
        fake_mps.touch("fake-die")
        wait_until("label removed", lambda: LABEL not in setup.node.labels)
        # In the 2 s backoff the loop still ticks: the liveness clock stays fresh.
        last = run.supervisor._last_tick
        wait_until("a tick during the backoff", lambda: run.supervisor._last_tick > last, 1.0)
        assert LABEL not in setup.node.labels
        wait_until("label back", lambda: setup.node.labels.get(LABEL) == "true")
