"""gunicorn settings and hooks for the webhook: ``gunicorn -c python:webhook.server.gunicorn_conf``.

Reads the ``GPUSHARE_*`` variables (``settings``) so ``gpushare serve`` and a container that
runs gunicorn directly serve identically. What matters here:

- ``async_worker.AsyncioWorker``: one asyncio event loop per worker (llhttp framing), which
  keeps connections alive as the apiserver wants, bounds what each client may hold (read
  deadlines, a connection cap, buffered bytes) and answers small reviews in the loop.
- ``reuse_port``: every worker listens on a socket of its own. With one shared socket the
  worker that wakes first takes a whole burst of the apiserver's long-lived connections,
  leaving the other cores idle for as long as those connections live (bench/README.md).
- ``certfile``/``keyfile`` name the serving pair; the worker takes a context per new
  connection from ``tls.ServingCertificate``, which enforces TLS 1.2+ and follows
  certificate files replaced on disk, so new connections get a new certificate without a
  restart.
- ``bind`` holds the admission address and, with ``GPUSHARE_METRICS_PORT``, the metrics
  address: every worker gets a listener of its own on both, and serves the second over plain
  HTTP with ``/metrics`` alone (``async_worker``), under the same bounds as the first.
- ``on_starting`` refuses to start where another server listens on either port
  (``port_guard``).
- Logs are JSON lines on stderr (``webhook.json_logging``); the admission lines go through
  ``batched_log.BatchedLineHandler``, written in batches rather than one write each.
- ``PROMETHEUS_MULTIPROC_DIR`` is set before anything imports ``prometheus_client``, so
  metrics are summed over all workers; stale files from an earlier run are removed.
- No control socket: gunicorn 25.1+ would otherwise create one under ``~/.gunicorn/``.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from webhook.policy_store import LAST_GOOD_VARIABLE
from webhook.server.gunicorn_logger import logging_config
from webhook.server.settings import ServeSettings

_MULTIPROC_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"
_created_metrics_dir: str | None = None
if not os.environ.get(_MULTIPROC_VARIABLE):
    _created_metrics_dir = tempfile.mkdtemp(prefix="gpushare-metrics-")
    os.environ[_MULTIPROC_VARIABLE] = _created_metrics_dir
_metrics_dir = Path(os.environ[_MULTIPROC_VARIABLE])
_metrics_dir.mkdir(parents=True, exist_ok=True)

_settings = ServeSettings.from_environ()

# The last good policy texts, shared by this server's workers (see policy_store): a
# directory of this server's own, removed on exit.
_runtime_dir = tempfile.mkdtemp(prefix="gpushare-run-")
os.environ[LAST_GOOD_VARIABLE] = os.path.join(_runtime_dir, "last-good-policies.json")

# No log line shows the process or thread names, so records need not look them up (the
# logging HOWTO's "Optimization" section).
logging.logThreads = False
logging.logProcesses = False
logging.logMultiprocessing = False


# The admission address, then the plain-HTTP metrics address if there is one; the worker
# tells them apart by port (async_worker.py).
bind = [_settings.bind, *filter(None, [_settings.metrics_bind])]
# Each worker binds a listening socket of its own with SO_REUSEPORT (gunicorn >= 24), so the
# kernel, not the first worker to wake, decides which worker takes a new connection.
reuse_port = True
workers = _settings.workers
# An asyncio loop per worker: no client that sends slowly or nothing holds anything but
# its own connection (async_worker.py, http_protocol.py).
worker_class = "webhook.server.async_worker.AsyncioWorker"
threads = _settings.threads
worker_connections = _settings.max_connections
keepalive = _settings.keepalive_seconds
graceful_timeout = _settings.graceful_timeout_seconds
timeout = 30
certfile = str(_settings.tls_cert)
keyfile = str(_settings.tls_key)
preload_app = False
proc_name = "gpushare"
control_socket_disable = True
accesslog = None
# Access lines are off (gunicorn.access at WARNING): do not build them either.
logger_class = "webhook.server.gunicorn_logger.QuietAccessLogger"
logconfig_dict = logging_config(_settings.log_level)
loglevel = _settings.log_level
# The worker heartbeat file: /dev/shm avoids disk-backed /tmp stalls (and works with a
# read-only root filesystem in a container).
worker_tmp_dir = "/dev/shm" if os.path.isdir("/dev/shm") else None


def on_starting(server: Any) -> None:
    from webhook.server.port_guard import PortInUseError, refuse_if_taken

    try:
        refuse_if_taken(_settings.host, _settings.port)
        if _settings.metrics_port:
            refuse_if_taken(_settings.host, _settings.metrics_port, "--metrics-port")
    except PortInUseError:
        on_exit(server)
        raise
    # Counters of an earlier run in the same directory would otherwise be added to ours.
    for stale in _metrics_dir.glob("*.db"):
        stale.unlink(missing_ok=True)


def child_exit(server: Any, worker: Any) -> None:
    from webhook.server.metrics import mark_worker_dead

    mark_worker_dead(worker.pid)


def on_exit(server: Any) -> None:
    shutil.rmtree(_runtime_dir, ignore_errors=True)
    if _created_metrics_dir is not None:
        shutil.rmtree(_created_metrics_dir, ignore_errors=True)
