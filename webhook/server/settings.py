"""The serve settings and their one transport: ``GPUSHARE_*`` environment variables.

``gpushare serve`` turns its flags into these variables and execs gunicorn; a container image
can run gunicorn directly with the same variables. The gunicorn config module
(``gunicorn_conf``) and the WSGI entry point (``wsgi``) both read them back with
``ServeSettings.from_environ``, so there is exactly one place that names every setting.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from webhook.errors import GpushareError

ENV_PREFIX = "GPUSHARE_"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8443
# The plain-HTTP port that serves /metrics alone (0: none; /metrics stays on the admission
# port too). Off by default for local runs; the chart and deploy/base set 9090.
DEFAULT_METRICS_PORT = 0
# The apiserver takes request bodies of up to 3 MiB (and etcd stores at most 1.5 MiB); the
# review adds its envelope. A decoded body takes about 20 times its size in memory, so large
# bodies take turns per worker (``body_budget``): the cap, the worker count and the
# Deployment's memory limit are sized together in docs/reliability.md.
DEFAULT_MAX_BODY_BYTES = 3 * 1024 * 1024 + 64 * 1024
# A whole request (TLS handshake included) must arrive within this many seconds of its first
# byte being awaited; the apiserver sends a review in one go (http_protocol).
DEFAULT_REQUEST_READ_TIMEOUT_SECONDS = 10.0
# Open connections per worker, idle ones included; at the cap the oldest unfinished one
# makes room for a new one.
DEFAULT_MAX_CONNECTIONS = 1000
DEFAULT_POLICY_POLL_SECONDS = 2.0
# The server must not close an idle connection the apiserver is about to reuse, which a 2 s
# keep-alive (gunicorn's default) makes likely under light load; Go's http.Transport drops
# idle connections after 90 s itself.
DEFAULT_KEEPALIVE_SECONDS = 75
DEFAULT_GRACEFUL_TIMEOUT_SECONDS = 25
DEFAULT_THREADS = 4
# Request bodies up to this size are answered in the worker's event loop, which spares each
# the hand-off to a thread and back; larger ones, whose decoding takes long enough to hold up
# the loop, go to a thread. 0 sends every request to a thread.
DEFAULT_LOOP_ANSWER_MAX_BYTES = 64 * 1024


class SettingsError(GpushareError):
    """A ``GPUSHARE_*`` variable holds a value that cannot be used."""


def default_workers() -> int:
    return max(1, min(4, os.cpu_count() or 1))


@dataclass(frozen=True)
class ServeSettings:
    """Everything the running webhook needs; field ``x`` travels as ``GPUSHARE_X``."""

    tls_cert: Path
    tls_key: Path
    policies: Path
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    metrics_port: int = DEFAULT_METRICS_PORT
    workers: int = dataclasses.field(default_factory=default_workers)
    threads: int = DEFAULT_THREADS
    policy_poll_seconds: float = DEFAULT_POLICY_POLL_SECONDS
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    request_read_timeout_seconds: float = DEFAULT_REQUEST_READ_TIMEOUT_SECONDS
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    loop_answer_max_bytes: int = DEFAULT_LOOP_ANSWER_MAX_BYTES
    keepalive_seconds: int = DEFAULT_KEEPALIVE_SECONDS
    graceful_timeout_seconds: int = DEFAULT_GRACEFUL_TIMEOUT_SECONDS
    log_level: str = "info"
    # Admission requests must present a client certificate that chains to this CA.
    client_ca: Path | None = None

    def __post_init__(self) -> None:
        if self.metrics_port and self.metrics_port == self.port:
            raise SettingsError(
                f"{ENV_PREFIX}METRICS_PORT={self.metrics_port} is the admission port: "
                "choose another port for /metrics, or 0 for none."
            )

    @property
    def bind(self) -> str:
        return self._address(self.port)

    @property
    def metrics_bind(self) -> str | None:
        """Where the plain-HTTP metrics listener binds (the admission host), if anywhere."""
        return self._address(self.metrics_port) if self.metrics_port else None

    def _address(self, port: int) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{port}"

    def to_environ(self) -> dict[str, str]:
        values: dict[str, str] = {}
        for item in dataclasses.fields(self):
            value = getattr(self, item.name)
            if value is not None:
                values[ENV_PREFIX + item.name.upper()] = str(value)
        return values

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> ServeSettings:
        source = os.environ if environ is None else environ
        raw = {
            item.name: source[ENV_PREFIX + item.name.upper()]
            for item in dataclasses.fields(cls)
            if ENV_PREFIX + item.name.upper() in source
        }
        missing = [
            ENV_PREFIX + name.upper()
            for name in ("tls_cert", "tls_key", "policies")
            if not raw.get(name)
        ]
        if missing:
            raise SettingsError(
                f"Set {', '.join(missing)} (or start the server with `gpushare serve`, which "
                "sets them)."
            )
        values: dict[str, object] = {}
        for name, text in raw.items():
            values[name] = _parse(name, text)
        return cls(**values)  # type: ignore[arg-type]


def environ_settings(
    names: Iterable[str], environ: Mapping[str, str] | None = None
) -> dict[str, object]:
    """The ``GPUSHARE_*`` variables set for these fields, parsed; a bad one is named in a
    ``SettingsError``. ``gpushare serve`` takes them as the defaults of its flags."""
    source = os.environ if environ is None else environ
    values: dict[str, object] = {}
    for name in names:
        text = source.get(ENV_PREFIX + name.upper())
        if text:
            values[name] = _parse(name, text)
    return values


def _parse(name: str, text: str) -> object:
    variable = ENV_PREFIX + name.upper()
    try:
        if name in ("tls_cert", "tls_key", "policies", "client_ca"):
            return Path(text)
        if name in (
            "port",
            "workers",
            "threads",
            "max_body_bytes",
            "keepalive_seconds",
            "graceful_timeout_seconds",
            "max_connections",
        ):
            number = int(text)
            if number < 1:
                raise ValueError
            return number
        if name in ("loop_answer_max_bytes", "metrics_port"):
            number = int(text)
            if number < 0:
                raise SettingsError(f"{variable}={text!r} must be 0 or a positive number.")
            return number
        if name in ("policy_poll_seconds", "request_read_timeout_seconds"):
            seconds = float(text)
            if seconds <= 0:
                raise ValueError
            return seconds
    except ValueError:
        raise SettingsError(f"{variable}={text!r} must be a positive number.") from None
    return text
