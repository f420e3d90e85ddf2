"""A stand-in for ``nvidia-cuda-mps-control`` that speaks its protocol, for machines without GPUs.

Like the real program (NVIDIA MPS docs, "Appendix: Tools and Interface Reference"):

* ``fake_mps_control.py -d`` daemonises and writes ``nvidia-cuda-mps-control.pid`` into
  ``$CUDA_MPS_PIPE_DIRECTORY``; the parent returns once the daemon is up;
* without ``-d`` it reads commands on stdin, one per line, and prints answers on stdout:
  ``set_default_active_thread_percentage``, ``get_default_active_thread_percentage``,
  ``set_default_device_pinned_mem_limit``, ``get_default_device_pinned_mem_limit``,
  ``get_server_list``, ``get_server_status``, ``get_client_list``, ``start_server -uid``,
  ``quit``. Defaults are lost on ``quit`` and only reach servers started after them.

State lives in the pipe directory (``fake-state.json`` under a lock), and every command is
appended to ``fake-commands.log`` so tests can check what was sent and in which order. Tests
steer it with files in the pipe directory:

* ``fake-die``: the daemon exits at once with code 3, leaving its PID file (a crash);
* ``fake-fault``: every server reports FAULT;
* ``fake-hang``: commands never answer (the client sleeps until killed);
* ``fake-start-fails``: ``-d`` prints an error and exits 1;
* ``fake-early-client``: the new daemon starts with a server (and client) already running,
  as if a client had connected before the defaults were sent.

Extra commands for tests: ``fake_connect_client <uid> <client-pid>`` starts a server for the
UID if none runs (with the defaults in force at that moment) and attaches the client;
``fake_end_server <pid>`` makes a server exit.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

PID_FILE = "nvidia-cuda-mps-control.pid"
STATE_FILE = "fake-state.json"
LOG_FILE = "fake-commands.log"
FIRST_SERVER_PID = 4_000_000  # above pid_max defaults, so never a real process


def pipe_directory() -> Path:
    value = os.environ.get("CUDA_MPS_PIPE_DIRECTORY")
    if not value:
        # The real tool falls back to /tmp/nvidia-mps; the fake refuses, so a launcher that
        # forgets to pass the variable fails its tests.
        print("fake-mps-control: CUDA_MPS_PIPE_DIRECTORY is not set", file=sys.stderr)
        sys.exit(2)
    return Path(value)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def daemon_pid(pipe: Path) -> int | None:
    try:
        text = (pipe / PID_FILE).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


@contextlib.contextmanager
def locked_state(pipe: Path) -> Iterator[dict[str, Any]]:
    with open(pipe / "fake-state.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        path = pipe / STATE_FILE
        state: dict[str, Any] = json.loads(path.read_text()) if path.exists() else fresh_state()
        yield state
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        tmp.replace(path)


def fresh_state() -> dict[str, Any]:
    return {"threads": 100.0, "pinned": {}, "servers": {}, "next_pid": FIRST_SERVER_PID}


def log(pipe: Path, entry: str) -> None:
    with open(pipe / LOG_FILE, "a") as out:
        out.write(json.dumps({"t": time.monotonic_ns(), "cmd": entry}) + "\n")


# -- daemon -------------------------------------------------------------------------------


def start_daemon(pipe: Path) -> int:
    pipe.mkdir(parents=True, exist_ok=True)
    if (pipe / "fake-start-fails").exists():
        print("fake-mps-control: cannot start the daemon (fake-start-fails)", file=sys.stderr)
        return 1
    existing = daemon_pid(pipe)
    if existing is not None and alive(existing):
        print("An instance of this daemon is already running", file=sys.stderr)
        return 1
    (pipe / PID_FILE).unlink(missing_ok=True)
    if os.fork() > 0:
        # Parent: return once the daemon has written its PID file, as -d does.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            pid = daemon_pid(pipe)
            if pid is not None and alive(pid):
                return 0
            time.sleep(0.01)
        return 1
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    with locked_state(pipe) as state:
        state.clear()
        state.update(fresh_state())
        if (pipe / "fake-early-client").exists():
            # A client that connected before the launcher could send the defaults.
            start_server(state, 0)["clients"].append(1)
    log(pipe, f"daemon-start {os.getpid()}")
    (pipe / PID_FILE).write_text(str(os.getpid()))
    run_daemon(pipe)
    os._exit(0)


def run_daemon(pipe: Path) -> None:
    while True:
        if (pipe / "fake-die").exists():
            (pipe / "fake-die").unlink(missing_ok=True)
            log(pipe, "daemon-crash")
            os._exit(3)
        if (pipe / "fake-quit").exists():
            (pipe / "fake-quit").unlink(missing_ok=True)
            (pipe / PID_FILE).unlink(missing_ok=True)
            log(pipe, "daemon-quit")
            return
        time.sleep(0.02)


# -- client -------------------------------------------------------------------------------


def run_client(pipe: Path) -> int:
    for raw in sys.stdin.read().splitlines():
        command = raw.strip()
        if not command:
            continue
        log(pipe, command)
        pid = daemon_pid(pipe)
        if pid is None or not alive(pid):
            print("Cannot find MPS control daemon process", file=sys.stderr)
            return 1
        while (pipe / "fake-hang").exists():
            time.sleep(0.05)
        code = answer(pipe, command.split())
        if code != 0:
            return code
    return 0


def answer(pipe: Path, words: list[str]) -> int:
    name, args = words[0], words[1:]
    if name == "quit":
        (pipe / "fake-quit").touch()
        pid = daemon_pid(pipe)
        deadline = time.monotonic() + 5
        while pid is not None and alive(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        return 0
    with locked_state(pipe) as state:
        servers: dict[str, Any] = state["servers"]
        if name == "set_default_active_thread_percentage" and len(args) == 1:
            value = float(args[0])
            if not 0 < value <= 100:
                print(f"Invalid active thread percentage {args[0]}")
                return 1
            state["threads"] = value
        elif name == "get_default_active_thread_percentage" and not args:
            print(f"{state['threads']:.1f}")
        elif name == "set_default_device_pinned_mem_limit" and len(args) == 2:
            if not args[1][:-1].isdigit() or args[1][-1] not in "MG":
                print(f"Invalid memory limit {args[1]}")
                return 1
            state["pinned"][args[0]] = args[1]
        elif name == "get_default_device_pinned_mem_limit" and len(args) == 1:
            print(state["pinned"].get(args[0], "0"))
        elif name == "get_server_list" and not args:
            for pid in servers:
                print(pid)
        elif name == "get_server_status" and len(args) == 1:
            if args[0] not in servers:
                print(f"Server {args[0]} not found")
                return 1
            print("FAULT" if (pipe / "fake-fault").exists() else "ACTIVE")
        elif name == "get_client_list" and len(args) == 1:
            for client in servers.get(args[0], {}).get("clients", []):
                print(client)
        elif name == "start_server" and len(args) == 2 and args[0] == "-uid":
            start_server(state, int(args[1]))
        elif name == "fake_end_server" and len(args) == 1:
            servers.pop(args[0], None)
        elif name == "fake_connect_client" and len(args) == 2:
            server = next((s for s in servers.values() if s["uid"] == int(args[0])), None)
            if server is None:
                server = start_server(state, int(args[0]))
            server["clients"].append(int(args[1]))
        else:
            print(f"Unrecognized command: {' '.join(words)}")
            return 1
    return 0


def start_server(state: dict[str, Any], uid: int) -> dict[str, Any]:
    pid = state["next_pid"]
    state["next_pid"] = pid + 1
    server = {
        "uid": uid,
        "clients": [],
        # What the real server would inherit: the defaults in force when it starts.
        "threads": state["threads"],
        "pinned": dict(state["pinned"]),
    }
    state["servers"][str(pid)] = server
    return server


def main() -> int:
    pipe = pipe_directory()
    if sys.argv[1:] == ["-d"]:
        return start_daemon(pipe)
    if sys.argv[1:]:
        print(f"fake-mps-control: unknown arguments {sys.argv[1:]}", file=sys.stderr)
        return 2
    return run_client(pipe)


if __name__ == "__main__":
    sys.exit(main())
