"""MpsControl against the stand-in control program, and the defaults derived from a pool."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from node_fakes import FakeMps, fake_state, pid_gone, wait_until

from webhook.core.policy.model import Allocation, Mode, MpsSettings, Policy, Pool
from webhook.node.errors import MpsControlError, NodeSetupError
from webhook.node.mps_control import (
    MpsControl,
    MpsDefaults,
    ServerStatus,
    daemon_defaults,
    parse_server_status,
    resolve_binary,
)
from webhook.node.nvml import GpuDevice
from webhook.node.pools import PoolRef


def gpu(index: int, memory_mib: int = 81920) -> GpuDevice:
    return GpuDevice(index, f"GPU-{index}", "NVIDIA A100-SXM4-80GB", memory_mib, (8, 0))


def ref(
    replicas: int = 4,
    allocation: Allocation = Allocation.REPLICA_CLASS,
    mps: MpsSettings | None = None,
) -> PoolRef:
    pool = Pool(name="p", replicas=replicas, gpu_memory_mib=81920)
    policy = Policy(
        name="pol",
        source="test.yaml",
        mode=Mode.MPS_DAEMON,
        pools=(pool,),
        allocation=allocation,
        mps=mps or MpsSettings(),
    )
    return PoolRef(policy, pool)


# -- defaults -----------------------------------------------------------------------------


def test_replica_class_defaults_are_one_slot_per_gpu() -> None:
    defaults = daemon_defaults(ref(replicas=4), [gpu(0), gpu(1, memory_mib=40960)])
    assert defaults.active_thread_percentage == 25
    assert defaults.pinned_memory_mib == {0: 20480, 1: 10240}


def test_slot_memory_rounds_down_and_threads_floor() -> None:
    defaults = daemon_defaults(ref(replicas=3), [gpu(0, memory_mib=24564)])
    assert defaults.pinned_memory_mib == {0: 8188}  # floor(24564 / 3)
    assert defaults.active_thread_percentage == 33


def test_thread_overprovision_raises_the_daemon_share_but_caps_at_100() -> None:
    assert daemon_defaults(ref(4, mps=MpsSettings(thread_overprovision=2.0)), [gpu(0)]) == (
        MpsDefaults(50, {0: 20480})
    )
    capped = daemon_defaults(ref(2, mps=MpsSettings(thread_overprovision=4.0)), [gpu(0)])
    assert capped.active_thread_percentage == 100


def test_count_allocation_allows_the_whole_gpu() -> None:
    defaults = daemon_defaults(ref(10, allocation=Allocation.COUNT), [gpu(0, 24576)])
    assert defaults == MpsDefaults(100, {0: 24576})


def test_limits_the_policy_does_not_enforce_are_not_sent() -> None:
    off = MpsSettings(enforce_thread_percentage=False, enforce_memory_limit=False)
    defaults = daemon_defaults(ref(4, mps=off), [gpu(0)])
    assert defaults.commands() == []


def test_commands_set_memory_per_index_then_threads() -> None:
    defaults = MpsDefaults(25, {1: 10240, 0: 20480})
    assert defaults.commands() == [
        "set_default_device_pinned_mem_limit 0 20480M",
        "set_default_device_pinned_mem_limit 1 10240M",
        "set_default_active_thread_percentage 25",
    ]


def test_more_replicas_than_mps_clients_is_refused() -> None:
    with pytest.raises(NodeSetupError, match="at most 48 clients per GPU"):
        daemon_defaults(ref(replicas=64), [gpu(0)])


@pytest.mark.parametrize(
    ("reply", "status"),
    [
        ("ACTIVE\n", ServerStatus.ACTIVE),
        ("FAULT\n", ServerStatus.FAULT),
        ("Server 4000 status: FAULT", ServerStatus.FAULT),
        ("initializing", ServerStatus.INITIALIZING),
        ("", ServerStatus.UNKNOWN),
        ("DEFAULTED", ServerStatus.UNKNOWN),  # a word containing FAULT is not FAULT
    ],
)
def test_server_status_is_read_by_word(reply: str, status: ServerStatus) -> None:
    assert parse_server_status(reply) is status


# -- the binary -----------------------------------------------------------------------------


def test_missing_binary_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(NodeSetupError, match=r"'/nonexistent/mps-control' was not found"):
        resolve_binary("/nonexistent/mps-control")
    plain = tmp_path / "not-executable"
    plain.write_text("#!/bin/sh\n")
    with pytest.raises(NodeSetupError, match="exists but is not executable"):
        resolve_binary(str(plain))


def test_a_binary_that_starts_no_daemon_is_reported(tmp_path: Path) -> None:
    control = MpsControl("/bin/true", tmp_path / "pipe", tmp_path / "log", start_timeout_s=0.5)
    with pytest.raises(MpsControlError, match="no live daemon wrote"):
        control.start_daemon()


def test_a_failing_start_reports_the_programs_message(fake_mps: FakeMps) -> None:
    fake_mps.touch("fake-start-fails")
    with pytest.raises(MpsControlError, match=r"exited with code 1: .*fake-start-fails"):
        fake_mps.control().start_daemon()


# -- talking to the daemon ----------------------------------------------------------------


def test_start_apply_defaults_query_and_quit(fake_mps: FakeMps) -> None:
    control = fake_mps.control()
    pid = control.start_daemon()
    assert control.daemon_alive() and control.daemon_pid() == pid
    control.apply_defaults(MpsDefaults(25, {0: 20480, 1: 10240}))
    state = fake_state(fake_mps.pipe)
    assert state["threads"] == 25.0
    assert state["pinned"] == {"0": "20480M", "1": "10240M"}
    assert control.server_pids() == []
    control.send("fake_connect_client 1000 111")
    control.send("fake_connect_client 1000 222")
    (server,) = control.server_pids()
    assert control.client_pids(server) == [111, 222]
    assert control.server_status(server) is ServerStatus.ACTIVE
    fake_mps.touch("fake-fault")
    assert control.server_status(server) is ServerStatus.FAULT
    control.quit()
    wait_until("daemon exit after quit", lambda: pid_gone(pid))
    assert not control.daemon_alive()


def test_commands_reach_the_daemon_through_the_pipe_directory_env(fake_mps: FakeMps) -> None:
    control = fake_mps.control()
    control.start_daemon()
    env = control.environment()
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(fake_mps.pipe)
    assert env["CUDA_MPS_LOG_DIRECTORY"] == str(fake_mps.log)
    assert fake_mps.log.is_dir()
    assert fake_mps.commands()[0].startswith("daemon-start ")


def test_readback_mismatch_is_an_error(fake_mps: FakeMps) -> None:
    control = fake_mps.control()
    control.start_daemon()
    # 0 is refused by the stand-in, as an out-of-range value would be by the real daemon.
    with pytest.raises(MpsControlError, match="failed with exit code 1"):
        control.apply_defaults(MpsDefaults(0, {}))


def test_a_hanging_daemon_times_out(fake_mps: FakeMps) -> None:
    control = fake_mps.control(command_timeout_s=0.5)
    control.start_daemon()
    fake_mps.touch("fake-hang")
    with pytest.raises(MpsControlError, match=r"got no answer .* within"):
        control.server_pids()


def test_commands_without_a_daemon_fail(fake_mps: FakeMps) -> None:
    with pytest.raises(MpsControlError, match="Cannot find MPS control daemon"):
        fake_mps.control().server_pids()


def test_a_stale_pid_file_is_replaced(fake_mps: FakeMps) -> None:
    # A PID that cannot be alive (above the kernel's pid_max) left by an earlier container.
    (fake_mps.pipe / "nvidia-cuda-mps-control.pid").write_text("4194305")
    control = fake_mps.control()
    pid = control.start_daemon()
    assert pid != 4194305 and pid != os.getpid()
