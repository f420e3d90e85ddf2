"""Talking to NVIDIA's MPS control program, ``nvidia-cuda-mps-control``, and what to tell it.

The control program has two faces (NVIDIA MPS docs, "Appendix: Tools and Interface
Reference"): ``nvidia-cuda-mps-control -d`` starts the control daemon in the background, and
``nvidia-cuda-mps-control`` without flags reads commands on stdin and prints the answers on
stdout (``echo get_server_list | nvidia-cuda-mps-control``). Both find each other through
``CUDA_MPS_PIPE_DIRECTORY``; the daemon writes its PID to
``$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid``. NVIDIA's own device-plugin daemon
drives it the same way (k8s-device-plugin, cmd/mps-control-daemon/mps/daemon.go).

``MpsDefaults`` are the ``set_default_*`` commands derived from the node's pool;
``MpsControl`` starts the daemon, sends commands with a timeout and parses the answers, and
stops the daemon (``quit``, then signals for one that stays).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from webhook.constants import MPS_PIPE_DIRECTORY_VAR
from webhook.core import Allocation
from webhook.node.errors import MpsControlError, NodeSetupError
from webhook.node.events import emit
from webhook.node.nvml import GpuDevice
from webhook.node.pools import PoolRef

DEFAULT_CONTROL_BINARY = "nvidia-cuda-mps-control"
PID_FILE_NAME = "nvidia-cuda-mps-control.pid"
# Volta MPS serves at most 48 client contexts per GPU (NVIDIA MPS docs, "Limitations").
MAX_CLIENTS_PER_GPU = 48


@dataclass(frozen=True)
class MpsDefaults:
    """The daemon-wide limits every MPS server started later inherits.

    ``set_default_*`` "only affects the next server" (MPS docs), so they must be sent before
    the first client connects; client env can only tighten them further.
    """

    active_thread_percentage: int | None
    # NVML device index -> MiB. By index, as NVIDIA's daemon does: limits set by UUID were
    # not applied in its testing (k8s-device-plugin v0.15.0-rc.2 notes, daemon.go).
    pinned_memory_mib: Mapping[int, int]

    def commands(self) -> list[str]:
        lines = [
            f"set_default_device_pinned_mem_limit {index} {mib}M"
            for index, mib in sorted(self.pinned_memory_mib.items())
        ]
        if self.active_thread_percentage is not None:
            lines.append(f"set_default_active_thread_percentage {self.active_thread_percentage}")
        return lines


def daemon_defaults(ref: PoolRef, gpus: Sequence[GpuDevice]) -> MpsDefaults:
    """The defaults for the pool this node serves.

    replica-class: every client gets one slot, so the daemon enforces the slot itself:
    100/R percent of the threads (times the policy's overprovision, capped at 100) and
    floor(M/R) MiB of each GPU's memory M, as NVIDIA's MPS mode does (daemon.go,
    perDevicePinnedDeviceMemoryLimits and activeThreadPercentage).
    count: a pod may hold several slots, so the daemon allows the whole GPU and the env the
    webhook injects into each client does the limiting.
    Limits the policy does not enforce are left at the daemon's own defaults (100%, none).
    """
    policy, pool = ref.policy, ref.pool
    if pool.replicas > MAX_CLIENTS_PER_GPU:
        raise NodeSetupError(
            f"{ref.where} has {pool.replicas} replicas, but an MPS server serves at most "
            f"{MAX_CLIENTS_PER_GPU} clients per GPU: lower replicas to {MAX_CLIENTS_PER_GPU} "
            "or fewer."
        )
    whole = policy.allocation is Allocation.COUNT
    threads: int | None = None
    if policy.mps.enforce_thread_percentage:
        share = 100.0 if whole else 100.0 * policy.mps.thread_overprovision / pool.replicas
        # MPS rounds thread percentages down anyway (MPS docs); at least 1 keeps it valid.
        threads = max(1, min(100, math.floor(share)))
    memory: dict[int, int] = {}
    if policy.mps.enforce_memory_limit:
        for gpu in gpus:
            memory[gpu.index] = gpu.memory_mib if whole else gpu.memory_mib // pool.replicas
    return MpsDefaults(active_thread_percentage=threads, pinned_memory_mib=memory)


class ServerStatus(StrEnum):
    """What ``get_server_status <PID>`` reports for one MPS server."""

    ACTIVE = "ACTIVE"
    INITIALIZING = "INITIALIZING"
    # After a fatal GPU exception the server stays in FAULT and refuses new clients
    # (CUDA_ERROR_MPS_SERVER_NOT_READY) until every client on it has exited (MPS docs,
    # "Error containment"); only then does it recover.
    FAULT = "FAULT"
    UNKNOWN = "UNKNOWN"


def parse_server_status(reply: str) -> ServerStatus:
    """The status word in a ``get_server_status`` reply; UNKNOWN when none is recognised.

    The reply is matched by word rather than compared whole, because NVIDIA documents the
    command but not the exact text around the status.
    """
    words = reply.upper().replace(":", " ").split()
    for status in (ServerStatus.FAULT, ServerStatus.ACTIVE, ServerStatus.INITIALIZING):
        if status.value in words:
            return status
    return ServerStatus.UNKNOWN


def _pids(reply: str) -> list[int]:
    # get_server_list / get_client_list print one PID per line (MPS docs).
    return [int(word) for word in reply.split() if word.isdigit()]


def resolve_binary(binary: str) -> str:
    """The control program's absolute path, or NodeSetupError saying how to fix it."""
    found = shutil.which(binary)
    if found is None:
        path = Path(binary)
        if path.exists() and not os.access(path, os.X_OK):
            reason = "exists but is not executable"
        elif path.is_dir():
            reason = "is a directory"
        else:
            reason = "was not found"
        raise NodeSetupError(
            f"The MPS control program {binary!r} {reason}: install the NVIDIA driver's "
            "utilities on the node (the container gets them through the NVIDIA container "
            "runtime with NVIDIA_DRIVER_CAPABILITIES including compute,utility) or point "
            "--mps-control at nvidia-cuda-mps-control."
        )
    return found


class MpsControl:
    """One MPS control daemon: its binary, its pipe and log directories."""

    def __init__(
        self,
        binary: str,
        pipe_directory: Path,
        log_directory: Path,
        *,
        command_timeout_s: float = 10.0,
        start_timeout_s: float = 30.0,
    ) -> None:
        self.binary = binary
        self.pipe_directory = pipe_directory
        self.log_directory = log_directory
        self.command_timeout_s = command_timeout_s
        self.start_timeout_s = start_timeout_s

    @property
    def pid_file(self) -> Path:
        return self.pipe_directory / PID_FILE_NAME

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env[MPS_PIPE_DIRECTORY_VAR] = str(self.pipe_directory)
        env["CUDA_MPS_LOG_DIRECTORY"] = str(self.log_directory)
        # CUDA numbers devices fastest-first unless told otherwise; NVML numbers them by PCI
        # bus. The pinned-memory defaults are per index, so make both orders the same.
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        return env

    # -- the daemon ---------------------------------------------------------------------

    def start_daemon(self) -> int:
        """Run ``<binary> -d`` and wait for the daemon's PID file; return the daemon's PID."""
        self.pipe_directory.mkdir(parents=True, exist_ok=True)
        self.log_directory.mkdir(parents=True, exist_ok=True)
        self._remove_stale_pid_file()
        try:
            result = subprocess.run(
                [self.binary, "-d"],
                env=self.environment(),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=self.start_timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise MpsControlError(
                f"{self.binary} -d did not return within {self.start_timeout_s:.0f}s."
            ) from exc
        except OSError as exc:
            raise MpsControlError(f"{self.binary} -d could not be run: {exc}.") from exc
        if result.returncode != 0:
            raise MpsControlError(
                f"{self.binary} -d exited with code {result.returncode}: "
                f"{(result.stderr or result.stdout).strip() or 'no output'}."
            )
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            pid = self.daemon_pid()
            if pid is not None and process_alive(pid):
                return pid
            time.sleep(0.05)
        raise MpsControlError(
            f"{self.binary} -d returned but no live daemon wrote {self.pid_file} within "
            f"{self.start_timeout_s:.0f}s: is {self.binary} really nvidia-cuda-mps-control? "
            f"See {self.log_directory}/control.log."
        )

    def _remove_stale_pid_file(self) -> None:
        # The pipe directory is a hostPath that outlives containers; a PID file left by a
        # daemon of an earlier container must not pass for the new daemon's.
        pid = self.daemon_pid()
        if pid is not None and not process_alive(pid):
            self.pid_file.unlink(missing_ok=True)

    def daemon_pid(self) -> int | None:
        try:
            text = self.pid_file.read_text().strip()
        except OSError:
            return None
        return int(text) if text.isdigit() else None

    def daemon_alive(self) -> bool:
        pid = self.daemon_pid()
        return pid is not None and process_alive(pid)

    # -- commands -----------------------------------------------------------------------

    def send(self, command: str) -> str:
        """Send one command on stdin; return stdout. MpsControlError on failure or timeout."""
        try:
            result = subprocess.run(
                [self.binary],
                input=command + "\n",
                env=self.environment(),
                capture_output=True,
                text=True,
                timeout=self.command_timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise MpsControlError(
                f"'{command}' got no answer from the MPS control daemon within "
                f"{self.command_timeout_s:.0f}s."
            ) from exc
        except OSError as exc:
            raise MpsControlError(f"'{command}' could not be sent: {exc}.") from exc
        if result.returncode != 0:
            raise MpsControlError(
                f"'{command}' failed with exit code {result.returncode}: "
                f"{(result.stderr or result.stdout).strip() or 'no output'}."
            )
        return result.stdout

    def apply_defaults(self, defaults: MpsDefaults) -> None:
        """Send every default, then read the thread percentage back to prove they landed."""
        for command in defaults.commands():
            self.send(command)
        if defaults.active_thread_percentage is None:
            return
        reply = self.send("get_default_active_thread_percentage").strip()
        try:
            value = float(reply)
        except ValueError as exc:
            raise MpsControlError(
                f"get_default_active_thread_percentage answered {reply!r}, not a number."
            ) from exc
        if math.floor(value) != defaults.active_thread_percentage:
            raise MpsControlError(
                f"The daemon reports a default active thread percentage of {reply}, not the "
                f"{defaults.active_thread_percentage} just set."
            )

    def server_pids(self) -> list[int]:
        return _pids(self.send("get_server_list"))

    def server_status(self, server_pid: int) -> ServerStatus:
        return parse_server_status(self.send(f"get_server_status {server_pid}"))

    def client_pids(self, server_pid: int) -> list[int]:
        return _pids(self.send(f"get_client_list {server_pid}"))

    def quit(self) -> None:
        self.send("quit")

    # -- stopping -----------------------------------------------------------------------

    def stop_daemon(self, *, graceful: bool, quit_timeout_s: float) -> None:
        """``quit`` the daemon (if graceful) and wait for it, then make sure it is gone:
        SIGTERM, then SIGKILL. Each step is an event; nothing raises."""
        pid = self.daemon_pid()
        if pid is None or not process_alive(pid):
            return
        if graceful:
            try:
                self.quit()
                emit("daemon_quit", "Sent quit to the MPS control daemon.", pid=pid)
            except MpsControlError as exc:
                emit("daemon_quit_failed", f"quit failed: {exc}", level=logging.WARNING)
        if _wait_gone(pid, quit_timeout_s if graceful else 0.0):
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                return
            if _wait_gone(pid, 5.0):
                emit("daemon_killed", f"MPS control daemon ended with {sig.name}.", pid=pid)
                return
        emit("daemon_kill_failed", "The MPS control daemon survived SIGKILL.", pid=pid)


def process_alive(pid: int) -> bool:
    """Whether ``pid`` runs and is not a zombie; reaps it if it is our dead child.

    ``-d`` daemonises, so in a container whose PID 1 is the launcher the daemon becomes the
    launcher's child; when it dies it stays a zombie (which ``kill -0`` still finds) until
    reaped.
    """
    try:
        with open(f"/proc/{pid}/stat") as stat:
            state = stat.read().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return False
    if state in ("Z", "X"):
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        return False
    return True


def _wait_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        if not process_alive(pid):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
