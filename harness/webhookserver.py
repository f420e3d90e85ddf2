"""`gpushare serve` (gunicorn, TLS) as a subprocess on a free loopback port.

Certificates come from `gpushare certs`; the server's /metrics counters and its JSON
admission log are what tests read to see which requests reached it and how each ended.
"""

from __future__ import annotations

import ctypes
import http.client
import json
import signal
import ssl
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from harness.cli import GPUSHARE, REPO, clean_environment, write_certificates
from harness.processes import LOOPBACK, ControlPlaneError, free_ports, terminate, wait_for

SERVER_START_TIMEOUT_S = 60.0
ADMISSION_LOG_DEADLINE_SECONDS = 5.0

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """preexec_fn: SIGKILL this child when the thread that started it dies.

    The process execs into the gunicorn arbiter (the signal setting survives exec), and
    gunicorn workers exit once their arbiter is gone, so a killed test run leaves nothing.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def start_logged_process(
    command: Sequence[str], log_path: Path, env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start `command` with stdout and stderr appended to `log_path`, dying with us."""
    with log_path.open("ab") as log:
        return subprocess.Popen(
            list(command),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env=dict(env) if env is not None else clean_environment(),
            start_new_session=True,
            preexec_fn=_die_with_parent,  # noqa: PLW1509 - only calls prctl(2)
        )


class AdmissionCounts(dict[tuple[str, str], float]):
    """gpushare_admission_requests_total by (endpoint, outcome), summed over workers."""

    def total(self, endpoint: str | None = None) -> float:
        return sum(v for (e, _), v in self.items() if endpoint is None or e == endpoint)

    def minus(self, before: AdmissionCounts) -> dict[tuple[str, str], float]:
        """The counts that changed since `before`, as plain numbers."""
        keys = set(self) | set(before)
        changed = {k: self.get(k, 0.0) - before.get(k, 0.0) for k in keys}
        return {k: v for k, v in changed.items() if v}


@dataclass
class WebhookServer:
    """A running `gpushare serve` (the gunicorn arbiter after exec) on a loopback port."""

    process: subprocess.Popen[bytes]
    port: int
    cert_dir: Path
    policies: Path
    log_path: Path

    @property
    def url(self) -> str:
        return f"https://{LOOPBACK}:{self.port}"

    @property
    def ca_file(self) -> Path:
        return self.cert_dir / "ca.crt"

    @classmethod
    def start(
        cls,
        workdir: Path,
        policies: Path,
        *,
        workers: int | None = 2,
        threads: int | None = 4,
        extra_args: Sequence[str] = (),
        timeout: float = SERVER_START_TIMEOUT_S,
    ) -> WebhookServer:
        """`gpushare certs`, then `gpushare serve`; returns once /readyz answers 200."""
        workdir.mkdir(parents=True, exist_ok=True)
        cert_dir = write_certificates(workdir / "certs")
        server = cls.launch(
            workdir,
            policies,
            cert_dir,
            workers=workers,
            threads=threads,
            extra_args=extra_args,
        )
        server.wait_ready_or_stop(timeout)
        return server

    @classmethod
    def launch(
        cls,
        workdir: Path,
        policies: Path,
        cert_dir: Path,
        *,
        port: int | None = None,
        name: str = "gpushare-serve",
        workers: int | None = 2,
        threads: int | None = 4,
        extra_args: Sequence[str] = (),
    ) -> WebhookServer:
        """`gpushare serve` of `cert_dir` as it is (files or a Secret-style mount) on `port`
        (a free one by default), without waiting for it: see `wait_ready_or_stop`."""
        workdir.mkdir(parents=True, exist_ok=True)
        if port is None:
            (port,) = free_ports(1)
        log_path = workdir / f"{name}.log"
        command = [
            *GPUSHARE,
            "serve",
            "--host",
            LOOPBACK,
            "--port",
            str(port),
            "--cert-dir",
            str(cert_dir),
            "--policies",
            str(policies),
            "--state-dir",
            str(workdir / f"{name}-state"),
            # None: what `gpushare serve` chooses by itself.
            *(["--workers", str(workers)] if workers is not None else []),
            *(["--threads", str(threads)] if threads is not None else []),
            *extra_args,
        ]
        return cls(start_logged_process(command, log_path), port, cert_dir, policies, log_path)

    def wait_ready_or_stop(self, timeout: float = SERVER_START_TIMEOUT_S) -> None:
        """`wait_ready`, stopping the server if it never gets ready."""
        try:
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise

    def check_alive(self) -> None:
        code = self.process.poll()
        if code is not None:
            raise ControlPlaneError(f"gpushare serve exited with code {code}\n{self.log_tail()}")

    def wait_ready(self, timeout: float) -> None:
        def ready() -> bool | None:
            self.check_alive()
            status, _ = self.get("/readyz")
            return True if status == 200 else None

        wait_for("gpushare serve /readyz", ready, timeout=timeout, on_timeout=self.log_tail)

    def ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file))

    def get(self, path: str) -> tuple[int, bytes]:
        connection = http.client.HTTPSConnection(
            LOOPBACK, self.port, context=self.ssl_context(), timeout=10
        )
        try:
            connection.request("GET", path)
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    def admission_counts(self) -> AdmissionCounts:
        """The webhook's own request counters, from /metrics."""
        status, body = self.get("/metrics")
        if status != 200:
            raise AssertionError(f"/metrics answered {status}: {body[:200]!r}")
        counts = AdmissionCounts()
        for family in text_string_to_metric_families(body.decode()):
            for sample in family.samples:
                if sample.name == "gpushare_admission_requests_total":
                    key = (sample.labels["endpoint"], sample.labels["outcome"])
                    counts[key] = counts.get(key, 0.0) + sample.value
        return counts

    def admissions(
        self, namespace: str | None = None, pod: str | None = None
    ) -> list[dict[str, Any]]:
        """The JSON admission log lines (one per request answered), optionally filtered.

        Workers write these lines in batches, up to 0.2 s late: first wait until there are
        as many as /metrics has counted admissions (both are recorded for every request).
        """
        answered = sum(self.admission_counts().values())
        deadline = time.monotonic() + ADMISSION_LOG_DEADLINE_SECONDS
        entries = self._admission_lines()
        while len(entries) < answered and time.monotonic() < deadline:
            time.sleep(0.05)
            entries = self._admission_lines()
        return [
            entry
            for entry in entries
            if (namespace is None or entry.get("namespace") == namespace)
            and (pod is None or entry.get("pod") == pod)
        ]

    def _admission_lines(self) -> list[dict[str, Any]]:
        entries = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            if not line.startswith("{"):
                continue
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue
            if entry.get("message") == "admission":
                entries.append(entry)
        return entries

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError as exc:
            return f"--- gpushare serve: cannot read {self.log_path}: {exc}"
        return f"--- gpushare serve ({self.log_path}) ---\n" + "\n".join(text[-lines:])

    def stop(self, grace: float = 30.0) -> None:
        """SIGTERM (gunicorn drains), then SIGKILL after `grace` seconds."""
        terminate(self.process, grace)
