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

from webhook.cli.host_addresses import (
    DOCKER_DESKTOP_HOST,
    LOCAL_CLUSTER_NAMES,
    MINIKUBE_HOST,
    HostAddress,
    host_addresses,
    host_name,
)
from webhook.core import default_policies_path, load_policies
from webhook.errors import GpushareError, PolicyError
from webhook.install import (
    CertificateError,
    CertificateFiles,
    IPAddress,
    certificate_names,
    ensure_local_certificates,
    load_certificate,
)
from webhook.server import (
    DEFAULT_HOST,
    GUNICORN_CONFIG,
    WSGI_APP,
    ServeSettings,
    build_server_context,
)

STATE_DIR_VARIABLE = "GPUSHARE_STATE_DIR"
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
    # Names and addresses the local certificate carries besides the ones serve works out.
    dns_names: tuple[str, ...] = ()
    ip_addresses: tuple[IPAddress, ...] = ()


@dataclass(frozen=True)
class Prepared:
    settings: ServeSettings
    ca_cert: Path | None


def _local_names(host: str, source: CertificateSource) -> tuple[list[str], list[IPAddress]]:
    """What the local certificate names: loopback, the bound host, and for a wildcard host
    every name and address a local cluster may use to reach this machine (host_addresses)."""
    dns_names = ["localhost"]
    addresses: list[IPAddress] = [ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")]
    if host in WILDCARD_HOSTS:
        dns_names += [*LOCAL_CLUSTER_NAMES, *filter(None, [host_name()])]
        addresses += [item.address for item in _reachable(host, host_addresses())]
    else:
        try:
            addresses.append(ipaddress.ip_address(host))
        except ValueError:
            dns_names.append(host)
    dns_names += source.dns_names
    addresses += source.ip_addresses
    return list(dict.fromkeys(dns_names)), list(dict.fromkeys(addresses))


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
    if (source.tls_cert or source.tls_key or source.cert_dir) and (
        source.dns_names or source.ip_addresses
    ):
        raise ServeError(
            "--ip and --dns name what the local certificate is for; a certificate of your "
            "own (--tls-cert, --cert-dir) carries its names already: issue it with them "
            "(gpushare certs --ip ... --dns ...), or leave out the certificate flags."
        )
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
    dns_names, addresses = _local_names(host, source)
    try:
        files = ensure_local_certificates(state_dir / "certs", dns_names, addresses)
    except (CertificateError, OSError) as error:
        raise ServeError(
            f"Cannot create local certificates in {state_dir / 'certs'}: {error}"
        ) from None
    return files.serving_cert, files.serving_key, files.ca_cert


def service_url(settings: ServeSettings, host: str | None = None) -> str:
    host = host or ("127.0.0.1" if settings.host in WILDCARD_HOSTS else settings.host)
    if ":" in host:
        host = f"[{host}]"
    return f"https://{host}:{settings.port}"


def startup_message(prepared: Prepared, addresses: Sequence[HostAddress] | None = None) -> str:
    """What serves where, with which certificate, how to stop it and the
    ``gpushare webhook-config`` line for each cluster that can reach it."""
    settings = prepared.settings
    dns_names, ips = _certificate_names(settings.tls_cert)
    names = [*sorted(dns_names), *(str(ip) for ip in sorted(ips, key=_address_key))]
    where = " (every address of this machine)" if settings.host in WILDCARD_HOSTS else ""
    pid = os.getpid()  # gunicorn keeps it: serve execs the arbiter
    lines = [
        f"gpushare: serving {service_url(settings, settings.host or '0.0.0.0')}{where}: "
        "/mutate, /validate, /healthz, /readyz, /metrics",
        f"gpushare: policies from {settings.policies}",
        f"gpushare: certificate {settings.tls_cert} for {', '.join(names) or 'no name'}",
        f"gpushare: pid {pid}; stop it with Ctrl-C, or kill -TERM {pid} to let in-flight "
        "requests finish first",
        "gpushare: point an apiserver at it with:",
    ]
    if settings.metrics_bind:
        metrics = f"http://{settings.metrics_bind}/metrics"
        lines.insert(1, f"gpushare: metrics over plain HTTP at {metrics}")
    for label, url, note in _targets(settings, addresses):
        lines.append(f"  {label}:")
        lines.append(f"    {_config_line(prepared, url)}")
        lines += [f"    ({note})"] if note else []
    if settings.host not in WILDCARD_HOSTS and _is_loopback(settings.host):
        lines.append(
            f"gpushare: {settings.host} is reachable from this machine only; for kind or "
            "minikube, serve with --host 0.0.0.0"
        )
    return "\n".join(lines)


def _targets(
    settings: ServeSettings, addresses: Sequence[HostAddress] | None
) -> list[tuple[str, str, str]]:
    """(who, URL, note) for each client the served address can take: see host_addresses."""
    if settings.host not in WILDCARD_HOSTS:
        return [("an apiserver that reaches this address", service_url(settings), "")]
    found = _reachable(settings.host, host_addresses() if addresses is None else addresses)
    bridges = [a for a in found if a.on_docker_bridge and a.address.version == 4]
    others = ", ".join(str(a.address) for a in found if a not in bridges[:1]) or "none"
    kind_note = (
        f"this machine's address on a docker bridge ({bridges[0].interface}): check it is the "
        "IPv4 gateway `docker network inspect kind` shows"
        if bridges
        else "GATEWAY: the IPv4 gateway `docker network inspect kind` shows, an address of "
        "this machine"
    )
    kind_host = str(bridges[0].address) if bridges else "GATEWAY"
    return [
        ("an apiserver on this machine", service_url(settings, "127.0.0.1"), ""),
        ("minikube (its node's /etc/hosts names this machine)",
         service_url(settings, MINIKUBE_HOST), ""),
        ("kind on Linux", service_url(settings, kind_host),
         f"{kind_note}; this machine's other addresses: {others}"),
        ("kind or minikube on Docker Desktop (macOS, Windows)",
         service_url(settings, DOCKER_DESKTOP_HOST), ""),
    ]  # fmt: skip


def _reachable(host: str, addresses: Sequence[HostAddress]) -> list[HostAddress]:
    """The addresses a wildcard bind answers on: 0.0.0.0 is IPv4 only, :: both families."""
    return [a for a in addresses if host != "0.0.0.0" or a.address.version == 4]


def _config_line(prepared: Prepared, url: str) -> str:
    ca = prepared.ca_cert or "<the CA that signed the serving certificate>"
    return f"gpushare webhook-config --ca {ca} --url {url} | kubectl apply -f -"


def _certificate_names(path: Path) -> tuple[set[str], set[IPAddress]]:
    try:
        return certificate_names(load_certificate(path))
    except (CertificateError, OSError, ValueError):
        return set(), set()


def _address_key(address: IPAddress) -> tuple[int, IPAddress]:
    return (address.version, address)


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


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
