"""``gpushare serve``: settle the settings, check them, then become gunicorn.

Everything that can be wrong is checked here, in the foreground, with a message that says
what to fix (unreadable policies, a certificate that does not load), before gunicorn forks
workers that would only log it. With no flags it makes the local defaults work: a CA and
serving certificate in the state directory, the bundled policies, 127.0.0.1:8443.

Then it execs gunicorn with the ``GPUSHARE_*`` variables, so the process the user started
(and signals, e.g. SIGTERM for a graceful stop) is the gunicorn arbiter itself.
"""

from __future__ import annotations

import ipaddress
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from webhook.core import default_policies_path, load_policies
from webhook.errors import GpushareError, PolicyError
from webhook.install.certs import CertificateError, CertificateFiles, ensure_local_certificates
from webhook.server.settings import ServeSettings
from webhook.server.tls import build_server_context

STATE_DIR_VARIABLE = "GPUSHARE_STATE_DIR"
GUNICORN_CONFIG = "python:webhook.server.gunicorn_conf"
WSGI_APP = "webhook.server.wsgi:app"
WILDCARD_HOSTS = ("0.0.0.0", "::", "")


class ServeError(GpushareError):
    """``gpushare serve`` cannot start; the message says what to change."""


def default_state_dir(environ: Mapping[str, str] | None = None) -> Path:
    source = os.environ if environ is None else environ
    return Path(source.get(STATE_DIR_VARIABLE) or ".state")


@dataclass(frozen=True)
class ServeRequest:
    """What the user asked for on the command line (None: use the default)."""

    host: str
    port: int
    policies: Path | None
    tls_cert: Path | None
    tls_key: Path | None
    cert_dir: Path | None
    state_dir: Path | None
    workers: int | None
    threads: int
    exclude_namespaces: Sequence[str]
    policy_poll_seconds: float
    max_body_bytes: int
    keepalive_seconds: int
    graceful_timeout_seconds: int
    log_level: str


@dataclass(frozen=True)
class Prepared:
    settings: ServeSettings
    ca_cert: Path | None


def _local_names(
    host: str,
) -> tuple[list[str], list[ipaddress.IPv4Address | ipaddress.IPv6Address]]:
    dns_names = ["localhost"]
    addresses: list[ipaddress.IPv4Address | ipaddress.IPv6Address] = [
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address("::1"),
    ]
    if host not in WILDCARD_HOSTS:
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            if host not in dns_names:
                dns_names.append(host)
        else:
            if address not in addresses:
                addresses.append(address)
    return dns_names, addresses


def prepare(request: ServeRequest) -> Prepared:
    """Resolve defaults, create local certificates if needed, and check everything loads."""
    policies = request.policies or default_policies_path()
    try:
        load_policies(policies)
    except PolicyError as error:
        raise ServeError(
            f"The policies in {policies} do not load:\n  " + "\n  ".join(error.problems)
        ) from None

    ca_cert: Path | None
    if request.tls_cert or request.tls_key:
        if not (request.tls_cert and request.tls_key):
            raise ServeError("Pass both --tls-cert and --tls-key, or neither.")
        tls_cert, tls_key = request.tls_cert, request.tls_key
        sibling = tls_cert.parent / "ca.crt"
        ca_cert = sibling if sibling.exists() else None
    elif request.cert_dir is not None:
        files = CertificateFiles(request.cert_dir)
        tls_cert, tls_key = files.serving_cert, files.serving_key
        ca_cert = files.ca_cert if files.ca_cert.exists() else None
    else:
        state_dir = request.state_dir or default_state_dir()
        dns_names, addresses = _local_names(request.host)
        try:
            files = ensure_local_certificates(state_dir / "certs", dns_names, addresses)
        except (CertificateError, OSError) as error:
            raise ServeError(
                f"Cannot create local certificates in {state_dir / 'certs'}: {error}"
            ) from None
        tls_cert, tls_key, ca_cert = files.serving_cert, files.serving_key, files.ca_cert
    try:
        build_server_context(tls_cert, tls_key)
    except (OSError, ValueError) as error:
        raise ServeError(
            f"The certificate {tls_cert} and key {tls_key} do not load: {error}. Create them "
            "with `gpushare certs`, or leave out the certificate flags for local ones."
        ) from None

    excluded = tuple(dict.fromkeys(("kube-system", *request.exclude_namespaces)))
    optional: dict[str, object] = {}
    if request.workers is not None:
        optional["workers"] = request.workers
    # absolute(), not resolve(): resolving would pin the current target of a Secret or
    # ConfigMap mount's ``..data`` symlink, and the next swap would go unseen.
    settings = ServeSettings(
        tls_cert=tls_cert.absolute(),
        tls_key=tls_key.absolute(),
        policies=policies.absolute(),
        host=request.host,
        port=request.port,
        threads=request.threads,
        exclude_namespaces=excluded,
        policy_poll_seconds=request.policy_poll_seconds,
        max_body_bytes=request.max_body_bytes,
        keepalive_seconds=request.keepalive_seconds,
        graceful_timeout_seconds=request.graceful_timeout_seconds,
        log_level=request.log_level,
        **optional,  # type: ignore[arg-type]
    )
    return Prepared(settings, ca_cert.absolute() if ca_cert else None)


def service_url(settings: ServeSettings) -> str:
    host = "127.0.0.1" if settings.host in WILDCARD_HOSTS else settings.host
    if ":" in host:
        host = f"[{host}]"
    return f"https://{host}:{settings.port}"


def startup_message(prepared: Prepared) -> str:
    settings = prepared.settings
    url = service_url(settings)
    ca = prepared.ca_cert or "<the CA that signed the serving certificate>"
    return "\n".join(
        [
            f"gpushare: serving {url} (/mutate, /validate, /healthz, /readyz, /metrics)",
            f"gpushare: policies from {settings.policies}",
            f"gpushare: certificate {settings.tls_cert}",
            "gpushare: point an apiserver at it with:",
            f"    gpushare webhook-config --ca {ca} --url {url} | kubectl apply -f -",
        ]
    )


def gunicorn_command() -> list[str]:
    return [sys.executable, "-m", "gunicorn", "--config", GUNICORN_CONFIG, WSGI_APP]


def exec_gunicorn(settings: ServeSettings) -> None:
    """Replace this process with the gunicorn arbiter; returns only if exec fails."""
    environ = dict(os.environ)
    environ.update(settings.to_environ())
    sys.stdout.flush()
    sys.stderr.flush()
    command = gunicorn_command()
    os.execve(command[0], command, environ)
