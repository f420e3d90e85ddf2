"""A node daemon's life as a process: its status server up, its loop run until SIGTERM or
SIGINT sets the stop event, then the server down and the previous signal handlers back.

Shared by the MPS daemon launcher and the node agent, which differ only in the loop they
run (``run``).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType

from webhook.node.events import emit
from webhook.node.status_server import StatusServer


def run_until_signalled(server: StatusServer, run: Callable[[threading.Event], int]) -> int:
    """Start ``server``, call ``run`` with an event SIGTERM and SIGINT set, return its exit
    status; the server stops and the handlers are restored however ``run`` ends."""
    stop = threading.Event()

    def request_stop(signum: int, frame: FrameType | None) -> None:
        del frame
        emit("signal", f"Received {signal.Signals(signum).name}; shutting down.")
        stop.set()

    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    server.start()
    address = f"{server.address[0]}:{server.address[1]}"
    emit("listening", f"Serving /healthz, /readyz and /metrics on {address}.", address=address)
    try:
        return run(stop)
    finally:
        server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
