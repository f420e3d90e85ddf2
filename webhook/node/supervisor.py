"""Keeping one node's MPS control daemon healthy, and telling the cluster whether it is.

The supervisor owns the daemon's life cycle and decides when the node is ready; it drives
``compute_mode`` (the GPUs' mode), ``mps_control`` (the daemon) and ``readiness`` (label and
annotations on the Node):

1. remove a ready label a previous launcher may have left (not ready until proven);
2. put the GPUs in EXCLUSIVE_PROCESS where the policy asks (degraded, not fatal, without
   the privilege);
3. start ``nvidia-cuda-mps-control -d``, send the pool's ``set_default_*`` limits and read
   them back, then probe ``get_server_list``; only then
4. label the node ``<ready_label>=true`` and annotate it with GPU count, memory and limits.

Then, every interval: is the daemon process alive, does it answer ``get_server_list``, is
any server in FAULT? A dead daemon is restarted with exponential backoff; a daemon that
stops answering is killed and restarted after a few failed checks; a faulted server takes
the label off (no new pods) but is left alone, because MPS recovers it by itself once its
clients have exited (NVIDIA MPS docs, "Error containment"). Each transition is one event
line (``webhook.node.events``). On stop (SIGTERM), the label comes off first, then ``quit``
goes to the daemon, then the compute modes are restored.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from webhook.node.compute_mode import ComputeModes
from webhook.node.errors import MpsControlError
from webhook.node.events import emit
from webhook.node.mps_control import MpsControl, MpsDefaults, ServerStatus
from webhook.node.node_api import NodeApi
from webhook.node.nvml import GpuDevice, Nvml
from webhook.node.readiness import NodeReadiness, node_annotations
from webhook.node.status_server import Health, LauncherMetrics, loop_alive


@dataclass(frozen=True)
class SupervisorSettings:
    """Timing of checks, restarts and shutdown."""

    check_interval_s: float = 5.0
    backoff_initial_s: float = 1.0
    backoff_max_s: float = 60.0
    # A daemon that stayed healthy this long counts as recovered: the next failure starts
    # the backoff from the beginning again.
    backoff_reset_s: float = 120.0
    # Failed checks in a row before a live but silent daemon is killed and restarted.
    unresponsive_limit: int = 3
    quit_timeout_s: float = 15.0


def backoff_delay(failures: int, settings: SupervisorSettings) -> float:
    """Seconds to wait before restart number ``failures`` (1, 2, 4, ... up to the max)."""
    exponent = max(failures - 1, 0)
    return float(min(settings.backoff_max_s, settings.backoff_initial_s * 2.0**exponent))


class MpsSupervisor:
    """Runs the daemon for one node until ``stop`` is set."""

    def __init__(
        self,
        *,
        control: MpsControl,
        nvml: Nvml,
        gpus: Sequence[GpuDevice],
        defaults: MpsDefaults,
        node: NodeApi,
        ready_label: str,
        pool_name: str,
        set_exclusive: bool,
        settings: SupervisorSettings,
        metrics: LauncherMetrics,
    ) -> None:
        self.control = control
        self.nvml = nvml
        self.gpus = tuple(gpus)
        self.defaults = defaults
        self.node = node
        self.pool_name = pool_name
        self.settings = settings
        self.metrics = metrics
        self.compute_modes = ComputeModes(nvml, self.gpus, set_exclusive=set_exclusive)
        self.readiness = NodeReadiness(node, ready_label, metrics)
        self._failures = 0
        self._strikes = 0
        self._started_at = 0.0
        self._faulted: list[int] = []
        self._servers_before_defaults: set[int] = set()
        self._last_tick = time.monotonic()
        self._lock = threading.Lock()

    # -- probes -------------------------------------------------------------------------

    def health(self) -> Health:
        state = self.readiness.state()
        with self._lock:
            return Health(
                alive=loop_alive(self._last_tick, self.settings.check_interval_s),
                ready=state.ready and state.published is True,
                detail={
                    "node": self.node.node_name,
                    "pool": self.pool_name,
                    "labelPublished": state.published,
                    "reason": None if state.ready else state.reason,
                    "faultedServers": list(self._faulted),
                },
            )

    # -- life cycle ---------------------------------------------------------------------

    def run(self, stop: threading.Event) -> int:
        """Start, supervise until ``stop``, shut down. Exit code: 0, or 1 if the label
        could not be removed on the way out. Start failures raise."""
        try:
            self.start()
        except BaseException:
            self._teardown_daemon()
            self.compute_modes.restore()
            raise
        while not stop.wait(self.settings.check_interval_s):
            self.check(stop)
        return self.shutdown()

    def start(self) -> None:
        """Steps 1-4 of the module docstring; the first start must succeed or raise."""
        self._tick()
        self._set_ready(False, "starting")
        self.metrics.gpus.set(len(self.gpus))
        exclusive = self.compute_modes.apply()
        self.metrics.exclusive_process.set(1 if exclusive else 0)
        self.readiness.annotations = node_annotations(
            self.pool_name, self.gpus, self.defaults, exclusive
        )
        self._start_daemon()
        emit(
            "daemon_started",
            f"MPS control daemon started for pool {self.pool_name} on "
            f"{len(self.gpus)} GPU(s) with defaults applied.",
            pid=self.control.daemon_pid(),
            pool=self.pool_name,
            commands=self.defaults.commands(),
        )
        self._set_ready_unless_servers_lack_defaults()

    def _start_daemon(self) -> None:
        """Start the daemon, apply defaults, probe; MpsControlError if any step fails."""
        self.control.start_daemon()
        self.control.apply_defaults(self.defaults)
        # Defaults reach only servers spawned after them; a server already running was
        # started by a client that connected in the moment between -d and the defaults.
        self._servers_before_defaults = set(self.control.server_pids())
        if self._servers_before_defaults:
            emit(
                "server_without_defaults",
                "An MPS server started before the defaults were applied and runs without "
                "them; the node stays unready until it exits.",
                level=logging.WARNING,
                servers=sorted(self._servers_before_defaults),
            )
        self._started_at = time.monotonic()
        self._strikes = 0
        self.metrics.daemon_up.set(1)

    def check(self, stop: threading.Event) -> None:
        """One health check; restarts the daemon (with backoff) when it is gone."""
        self._tick()
        if not self.control.daemon_alive():
            self.metrics.daemon_up.set(0)
            emit(
                "daemon_died",
                "The MPS control daemon is no longer running; removing the ready label "
                "and restarting it.",
                level=logging.ERROR,
                pid=self.control.daemon_pid(),
            )
            self._restart(stop, "daemon exited")
            return
        try:
            servers = self.control.server_pids()
            statuses = {pid: self.control.server_status(pid) for pid in servers}
            clients = sum(len(self.control.client_pids(pid)) for pid in servers)
        except MpsControlError as exc:
            self._strikes += 1
            emit(
                "health_check_failed",
                f"Health check {self._strikes} of {self.settings.unresponsive_limit} failed: {exc}",
                level=logging.WARNING,
            )
            self._set_ready(False, f"daemon not answering: {exc}")
            if self._strikes >= self.settings.unresponsive_limit:
                emit(
                    "daemon_unresponsive",
                    "The MPS control daemon stopped answering; killing and restarting it.",
                    level=logging.ERROR,
                    pid=self.control.daemon_pid(),
                )
                self._teardown_daemon(graceful=False)
                self._restart(stop, "daemon unresponsive")
            return
        self._strikes = 0
        self.metrics.daemon_up.set(1)
        self.metrics.servers.set(len(servers))
        self.metrics.clients.set(clients)
        faulted = sorted(pid for pid, status in statuses.items() if status is ServerStatus.FAULT)
        self.metrics.faulted_servers.set(len(faulted))
        self._note_faults(faulted, statuses)
        self._servers_before_defaults &= set(servers)
        if time.monotonic() - self._started_at >= self.settings.backoff_reset_s:
            self._failures = 0
        if faulted:
            self._set_ready(False, f"MPS server(s) {faulted} in FAULT")
        else:
            self._set_ready_unless_servers_lack_defaults()

    def _note_faults(self, faulted: list[int], statuses: Mapping[int, ServerStatus]) -> None:
        if faulted and faulted != self._faulted:
            emit(
                "server_fault",
                "MPS server(s) in FAULT after a fatal GPU exception: every client on the GPU "
                "got the error and new clients are refused until those clients exit. "
                "Removing the ready label until the server recovers.",
                level=logging.ERROR,
                servers=faulted,
            )
        elif self._faulted and not faulted:
            emit("server_fault_cleared", "No MPS server is in FAULT any more.")
        unknown = sorted(pid for pid, s in statuses.items() if s is ServerStatus.UNKNOWN)
        if unknown:
            emit(
                "server_status_unknown",
                "get_server_status gave an answer without a known status word.",
                level=logging.WARNING,
                servers=unknown,
            )
        with self._lock:
            self._faulted = faulted

    def _restart(self, stop: threading.Event, reason: str) -> None:
        """Restart with exponential backoff until it works or ``stop`` is set."""
        self._set_ready(False, reason)
        while not stop.is_set():
            self._failures += 1
            delay = backoff_delay(self._failures, self.settings)
            emit(
                "daemon_restart_scheduled",
                f"Restarting the MPS control daemon in {delay:g}s (attempt {self._failures}).",
                delay_s=delay,
                attempt=self._failures,
                reason=reason,
            )
            if self._sleep(stop, delay):
                return
            self._tick()
            self.metrics.restarts.inc()
            try:
                self._start_daemon()
            except MpsControlError as exc:
                emit(
                    "daemon_restart_failed",
                    f"Restarting the MPS control daemon failed: {exc}",
                    level=logging.ERROR,
                    attempt=self._failures,
                )
                self._teardown_daemon(graceful=False)
                reason = str(exc)
                continue
            emit(
                "daemon_restarted",
                "MPS control daemon restarted with defaults applied.",
                pid=self.control.daemon_pid(),
                attempt=self._failures,
            )
            self._set_ready_unless_servers_lack_defaults()
            return

    def shutdown(self) -> int:
        """Label off, ``quit``, compute modes back. 1 if the label could not be removed."""
        self._tick()
        removed = self.readiness.withdraw()
        self._teardown_daemon()
        self.compute_modes.restore()
        self.nvml.shutdown()
        self.metrics.daemon_up.set(0)
        emit("stopped", "MPS daemon launcher stopped.", label_removed=removed)
        return 0 if removed else 1

    # -- helpers ------------------------------------------------------------------------

    def _sleep(self, stop: threading.Event, seconds: float) -> bool:
        """Wait ``seconds`` (True if ``stop`` came first), still ticking for /healthz: a long
        backoff is the supervisor working, not a stuck loop."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            if stop.wait(min(left, self.settings.check_interval_s)):
                return True
            self._tick()
        return stop.is_set()

    def _set_ready_unless_servers_lack_defaults(self) -> None:
        if self._servers_before_defaults:
            servers = sorted(self._servers_before_defaults)
            self._set_ready(False, f"MPS server(s) {servers} lack defaults")
        else:
            self._set_ready(True, "")

    def _tick(self) -> None:
        with self._lock:
            self._last_tick = time.monotonic()

    def _set_ready(self, ready: bool, reason: str) -> None:
        self.readiness.set(ready, reason)

    def _teardown_daemon(self, *, graceful: bool = True) -> None:
        self.control.stop_daemon(graceful=graceful, quit_timeout_s=self.settings.quit_timeout_s)
