"""Refuse to start where another server already listens.

Each worker binds its own listening socket with ``SO_REUSEPORT`` (gunicorn's ``reuse_port``),
and Linux lets any process of the same user join such a group: a second ``gpushare serve``
on the same port would start without error and quietly take a share of the first one's
connections, possibly answering with other policies. Before any socket of ours exists, a
probe binds the address without ``SO_REUSEPORT``; that bind fails while any socket listens
there, reuse-port or not (socket(7)). ``SO_REUSEADDR`` on the probe keeps connections of an
earlier run in TIME_WAIT from blocking a restart.
"""

from __future__ import annotations

import errno
import socket


class PortInUseError(RuntimeError):
    """Another server listens on the address; gunicorn prints this and exits 1."""


def refuse_if_taken(host: str, port: int, flag: str = "--port") -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as error:
            if error.errno != errno.EADDRINUSE:
                raise
            raise PortInUseError(
                f"Another server already listens on {host}:{port}. Stop it, or start this one "
                f"on another port ({flag}); two servers on one port would share its "
                "connections."
            ) from None
