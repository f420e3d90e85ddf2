"""Processes on loopback, and waiting on them: what the control plane and gpushare's server share.

Every wait in the harness polls with a deadline (`wait_for`); nothing sleeps for a fixed
time. A component that dies while being waited for raises ControlPlaneError with the tail
of its log, so a failed start says why.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TypeVar

LOOPBACK = "127.0.0.1"
LOG_TAIL_LINES = 60

# Env var the harness binary reads to arm PR_SET_PDEATHSIG (SIGKILL), so a pytest killed with
# SIGKILL does not leave etcd and apiservers running (see pdeathsig_linux.go beside this file).
PARENT_PID_ENV = "GPUSHARE_HARNESS_PARENT_PID"

T = TypeVar("T")


class ControlPlaneError(RuntimeError):
    """A component failed to start or become ready; the message carries the log tails."""


def wait_for(
    what: str,
    check: Callable[[], T | None],
    *,
    timeout: float,
    interval: float = 0.1,
    on_timeout: Callable[[], str] | None = None,
) -> T:
    """Poll `check` until it returns something other than None; raise after `timeout` seconds.

    `check` may raise ControlPlaneError to stop early (a process died); other exceptions
    count as "not yet" and the last one is reported on timeout.
    """
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            result = check()
        except ControlPlaneError:
            raise
        except Exception as exc:  # any transient error just means "not ready yet"
            last_error = exc
            result = None
        if result is not None:
            return result
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_error!r})" if last_error else ""
            extra = f"\n{on_timeout()}" if on_timeout else ""
            raise ControlPlaneError(
                f"timed out after {timeout:.0f}s waiting for {what}{detail}{extra}"
            )
        time.sleep(interval)


def free_ports(count: int) -> list[int]:
    """Ask the kernel for `count` distinct free ports on 127.0.0.1.

    All sockets stay open until every port is picked, so the ports differ from each other;
    another process could still take one before our component binds it (then startup
    fails loudly with the component's log).
    """
    with ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((LOOPBACK, 0))
            ports.append(int(sock.getsockname()[1]))
        return ports


# --------------------------------------------------------------------------------------
# Processes


@dataclass
class Component:
    """One running harness subcommand with its log file."""

    name: str
    args: list[str]
    log_path: Path
    process: subprocess.Popen[bytes]
    _log: IO[bytes] = field(repr=False)

    @classmethod
    def start(cls, name: str, binary: Path, args: Sequence[str], log_dir: Path) -> Component:
        """Start `binary <args>` with stdout and stderr going to `<log_dir>/<name>.log`."""
        log_path = log_dir / f"{name}.log"
        log = log_path.open("ab")
        env = {**os.environ, PARENT_PID_ENV: str(os.getpid())}
        try:
            process = subprocess.Popen(
                [str(binary), *args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                # Own process group: a Ctrl-C in the terminal reaches pytest only, and
                # teardown decides the order in which components stop.
                start_new_session=True,
            )
        except BaseException:
            log.close()
            raise
        return cls(name=name, args=list(args), log_path=log_path, process=process, _log=log)

    def check_alive(self) -> None:
        """Raise ControlPlaneError (with the log tail) if the process has exited."""
        code = self.process.poll()
        if code is not None:
            raise ControlPlaneError(
                f"{self.name} exited with code {code} during startup\n{self.log_tail()}"
            )

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last `lines` lines of this component's log, with a header."""
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError as exc:
            return f"--- {self.name}: cannot read {self.log_path}: {exc}"
        tail = "\n".join(text[-lines:])
        return f"--- {self.name} ({self.log_path}, last {min(lines, len(text))} lines) ---\n{tail}"

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM, wait up to `grace` seconds, then SIGKILL; always close the log."""
        try:
            terminate(self.process, grace)
        finally:
            self._log.close()


def terminate(process: subprocess.Popen[bytes], grace: float) -> int:
    """SIGTERM ``process``, wait up to ``grace`` seconds, then SIGKILL; its exit status."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=grace)
    return process.returncode
