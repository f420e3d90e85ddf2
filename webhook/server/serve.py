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
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from webhook.core import default_policies_path, load_policies
from webhook.errors import GpushareError, PolicyError
from webhook.install.certs import CertificateError, CertificateFiles, ensure_local_certificates
from webhook.server.settings import DEFAULT_HOST, ServeSettings
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
class CertificateSource:
    """Where the serving certificate comes from, as the user chose it.

    Both ``tls_cert`` and ``tls_key``; else ``cert_dir`` (laid out by ``gpushare certs``);
    else a local CA and certificate created once in ``state_dir`` (default ``.state``).
    """

    tls_cert: Path | None = None
    tls_key: Path | None = None
    cert_dir: Path | None = None
    state_dir: Path | None = None


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


def prepare(
    policies: Path | None,
    certificates: CertificateSource,
    tuning: Mapping[str, object] | None = None,
) -> Prepared:
    """Resolve defaults, create local certificates if needed, and check everything loads.

    ``tuning`` holds the ``ServeSettings`` fields the user set (by field name); the rest keep
    the defaults ``ServeSettings`` declares.
    """
    policies = policies or default_policies_path()
    try:
        load_policies(policies)
    except PolicyError as error:
        raise ServeError(
            f"The policies in {policies} do not load:\n  " + "\n  ".join(error.problems)
        ) from None
    tuning = dict(tuning or {})
    tls_cert, tls_key, ca_cert = _certificate_files(
        certificates, str(tuning.get("host", DEFAULT_HOST))
    )
    try:
        build_server_context(tls_cert, tls_key)
    except (OSError, ValueError) as error:
        raise ServeError(
            f"The certificate {tls_cert} and key {tls_key} do not load: {error}. Create them "
            "with `gpushare certs`, or leave out the certificate flags for local ones."
        ) from None
    client_ca = tuning.get("client_ca")
    if client_ca is not None:
        try:
            build_server_context(tls_cert, tls_key, Path(str(client_ca)))
        except (OSError, ValueError) as error:
            raise ServeError(
                f"The client CA {client_ca} does not load: {error}. Pass the PEM certificate "
                "of the CA that signed the apiserver's client certificate."
            ) from None
        tuning["client_ca"] = Path(str(client_ca)).absolute()
    # absolute(), not resolve(): resolving would pin the current target of a Secret or
    # ConfigMap mount's ``..data`` symlink, and the next swap would go unseen.
    settings = ServeSettings(
        tls_cert=tls_cert.absolute(),
        tls_key=tls_key.absolute(),
        policies=policies.absolute(),
        **tuning,  # type: ignore[arg-type]
    )
    return Prepared(settings, ca_cert.absolute() if ca_cert else None)


def _certificate_files(source: CertificateSource, host: str) -> tuple[Path, Path, Path | None]:
    """The serving certificate, its key, and the CA certificate where one is known."""
    if source.tls_cert or source.tls_key:
        if not (source.tls_cert and source.tls_key):
            raise ServeError("Pass both --tls-cert and --tls-key, or neither.")
        sibling = source.tls_cert.parent / "ca.crt"
        return source.tls_cert, source.tls_key, sibling if sibling.exists() else None
    if source.cert_dir is not None:
        files = CertificateFiles(source.cert_dir)
        ca = files.ca_cert if files.ca_cert.exists() else None
        return files.serving_cert, files.serving_key, ca
    state_dir = source.state_dir or default_state_dir()
    dns_names, addresses = _local_names(host)
    try:
        files = ensure_local_certificates(state_dir / "certs", dns_names, addresses)
    except (CertificateError, OSError) as error:
        raise ServeError(
            f"Cannot create local certificates in {state_dir / 'certs'}: {error}"
        ) from None
    return files.serving_cert, files.serving_key, files.ca_cert


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
    # glibc gives each thread a heap of its own (up to 8 per core), and a large request's
    # memory then stays spread over them; two keep a worker's size near its working set.
    environ.setdefault("MALLOC_ARENA_MAX", "2")
    sys.stdout.flush()
    sys.stderr.flush()
    command = gunicorn_command()
    os.execve(command[0], command, environ)
