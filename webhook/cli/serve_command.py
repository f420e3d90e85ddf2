"""``gpushare serve``: its flags, their ``GPUSHARE_*`` variables, and the run.

A flag wins over its variable, the variable over ``ServeSettings``' default; ``serve --help``
lists the variables from ``ServeSettings``' fields, so the list cannot drift from what the
server reads. The work is in ``serve`` (checks, local certificates, exec of gunicorn).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import textwrap
from collections.abc import Iterable
from pathlib import Path

from webhook.cli.command_tree import Arguments, Commands
from webhook.cli.exit_codes import EXIT_FAILED, EXIT_USAGE
from webhook.cli.options import (
    add_certificate_name_options,
    add_policies_option,
    non_negative_int,
    positive_float,
    positive_int,
)
from webhook.cli.serve import (
    STATE_DIR_VARIABLE,
    CertificateSource,
    ServeError,
    exec_gunicorn,
    prepare,
    startup_message,
)
from webhook.install import CertificateError, parse_ip_addresses
from webhook.server import ENV_PREFIX, ServeSettings, SettingsError, environ_settings


def add_serve_command(subparsers: Commands) -> None:
    command = subparsers.add_parser(
        "serve",
        help="run the admission webhook over HTTPS (gunicorn)",
        description=textwrap.fill(
            "Serve /mutate, /validate, /healthz, /readyz and /metrics over TLS. With no "
            "flags: a local CA and serving certificate in the state directory, the bundled "
            "policies, https://127.0.0.1:8443. With --host 0.0.0.0 the local certificate "
            "also names the addresses a local cluster reaches this machine at "
            "(host.minikube.internal, host.docker.internal, this machine's addresses), and "
            "the start-up lines say which URL to give kind or minikube. Stop it with Ctrl-C, "
            "or SIGTERM to let in-flight requests finish.",
            width=88,
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    # The flags that set a ServeSettings field (their dest), for the list of variables.
    settings_flags = [
        command.add_argument(
            "--host",
            help="address to listen on; 0.0.0.0 for every address "
            f"(default {_field_default('host')})",
        ),
        command.add_argument(
            "--port",
            type=positive_int,
            help=f"port to listen on (default {_field_default('port')})",
        ),
        command.add_argument(
            "--metrics-port",
            type=non_negative_int,
            help="also serve /metrics alone over plain HTTP on this port, for scrapers that "
            "should not reach the admission port; 0: none, /metrics on the admission port "
            f"only (default {_field_default('metrics_port')})",
        ),
        add_policies_option(command),
        *_add_certificate_flags(command),
    ]
    command.add_argument(
        "--state-dir",
        type=Path,
        help=f"where local certificates go (default: ${STATE_DIR_VARIABLE} or ./.state)",
    )
    settings_flags += _add_tuning_flags(command)
    command.parser.epilog = environment_help(settings_flags)
    command.set_defaults(func=run_serve)


def _add_certificate_flags(parser: Arguments) -> list[argparse.Action]:
    certs = parser.add_argument_group("certificates (default: generated in the state dir)")
    flags = [
        certs.add_argument(
            "--tls-cert", type=Path, metavar="FILE", help="serving certificate (PEM)"
        ),
        certs.add_argument("--tls-key", type=Path, metavar="FILE", help="serving key (PEM)"),
        certs.add_argument(
            "--client-ca",
            type=Path,
            help="require /mutate and /validate callers to present a client certificate signed "
            "by this CA (the apiserver presents one when its AdmissionConfiguration names it; "
            "docs/reliability.md)",
        ),
    ]
    certs.add_argument(
        "--cert-dir", type=Path, help="directory holding tls.crt and tls.key (a Secret mount)"
    )
    add_certificate_name_options(certs, "the local certificate")
    return flags


def _add_tuning_flags(parser: Arguments) -> list[argparse.Action]:
    # Tuning flags default to None so that ServeSettings' own defaults apply; ``dest`` is
    # the ServeSettings field each one sets.
    tuning = parser.add_argument_group("tuning (defaults: ServeSettings)")
    workers = tuning.add_argument(
        "--workers", type=positive_int, help="worker processes (default: CPUs, at most 4)"
    )
    threads = tuning.add_argument(
        "--threads",
        type=positive_int,
        help=f"threads per worker (default {_field_default('threads')})",
    )
    poll = tuning.add_argument(
        "--policy-poll-seconds",
        type=positive_float,
        help="seconds between checks of the policy files for changes (default "
        f"{_field_default('policy_poll_seconds')})",
    )
    body = tuning.add_argument(
        "--max-body-bytes",
        type=positive_int,
        help="largest request body taken; larger ones get 413 (default "
        f"{_field_default('max_body_bytes')})",
    )
    connections = _add_connection_flags(tuning)
    log_level = tuning.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        help=f"least severe level logged (default {_field_default('log_level')})",
    )
    return [workers, threads, poll, body, *connections, log_level]


def _add_connection_flags(tuning: Arguments) -> list[argparse.Action]:
    """How long clients get, how many connections a worker holds, and where answers run."""
    return [
        tuning.add_argument(
            "--request-read-timeout",
            dest="request_read_timeout_seconds",
            type=positive_float,
            help="seconds a client gets to send a whole request, TLS handshake included "
            f"(default {_field_default('request_read_timeout_seconds')})",
        ),
        tuning.add_argument(
            "--max-connections",
            type=positive_int,
            help="open connections per worker; at the cap the oldest unfinished one is "
            f"closed (default {_field_default('max_connections')})",
        ),
        tuning.add_argument(
            "--loop-answer-max-bytes",
            type=non_negative_int,
            help="requests up to this size are answered in the worker's event loop, larger "
            "ones by a thread; 0: all by threads (default "
            f"{_field_default('loop_answer_max_bytes')})",
        ),
        tuning.add_argument(
            "--keepalive",
            dest="keepalive_seconds",
            type=positive_int,
            help="seconds an idle kept-alive connection stays open (default "
            f"{_field_default('keepalive_seconds')})",
        ),
        tuning.add_argument(
            "--graceful-timeout",
            dest="graceful_timeout_seconds",
            type=positive_int,
            help="seconds in-flight requests get to finish after SIGTERM (default "
            f"{_field_default('graceful_timeout_seconds')})",
        ),
    ]


LOG_LEVELS = ("debug", "info", "warning", "error")
# ServeSettings fields set by the flag of the same dest; GPUSHARE_<FIELD> is its default.
_TUNING_FIELDS = (
    "client_ca",
    "host",
    "port",
    "metrics_port",
    "workers",
    "threads",
    "policy_poll_seconds",
    "max_body_bytes",
    "request_read_timeout_seconds",
    "max_connections",
    "loop_answer_max_bytes",
    "keepalive_seconds",
    "graceful_timeout_seconds",
    "log_level",
)
_PATH_FIELDS = ("tls_cert", "tls_key", "policies")


def run_serve(args: argparse.Namespace) -> int:
    try:
        from_environ = environ_settings((*_TUNING_FIELDS, *_PATH_FIELDS))
        addresses = tuple(parse_ip_addresses(args.ip))
    except (SettingsError, CertificateError) as error:
        print(f"gpushare serve: {error}", file=sys.stderr)
        return EXIT_USAGE
    flags = {name: getattr(args, name) for name in (*_TUNING_FIELDS, *_PATH_FIELDS)}
    # A flag wins over its GPUSHARE_* variable, the variable over ServeSettings' default.
    chosen = {**from_environ, **{k: v for k, v in flags.items() if v is not None}}
    if chosen.get("log_level", "info") not in LOG_LEVELS:
        levels = ", ".join(LOG_LEVELS)
        print(f"gpushare serve: the log level must be one of {levels}.", file=sys.stderr)
        return EXIT_USAGE
    certificates = CertificateSource(
        _path(chosen.pop("tls_cert", None)),
        _path(chosen.pop("tls_key", None)),
        args.cert_dir,
        args.state_dir,
        dns_names=tuple(args.dns),
        ip_addresses=addresses,
    )
    policies = _path(chosen.pop("policies", None))
    try:
        prepared = prepare(policies, certificates, chosen)
    except (ServeError, SettingsError) as error:
        print(f"gpushare serve: {error}", file=sys.stderr)
        return EXIT_USAGE
    print(startup_message(prepared), flush=True)
    exec_gunicorn(prepared.settings)
    return EXIT_FAILED  # only reached if exec returned, which it does not without raising


def _path(value: object) -> Path | None:
    return None if value is None else Path(str(value))


def _field_default(name: str) -> object:
    field = ServeSettings.__dataclass_fields__[name]
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return None if field.default is dataclasses.MISSING else field.default


def environment_help(settings_flags: Iterable[argparse.Action]) -> str:
    """The GPUSHARE_* variables, one per ServeSettings field, with the flag that sets the
    same setting (``settings_flags``: their ``dest`` is the field) and its default:
    generated, so it lists exactly what the server reads."""
    flags = {action.dest: action.option_strings[0] for action in settings_flags}
    lines = [
        "environment:",
        "  Each setting is also a GPUSHARE_* variable: a flag wins over its variable, the",
        "  variable over the default. The variables carry the settings to the gunicorn",
        "  workers; gunicorn started directly (the container image) reads only them.",
    ]
    for field in dataclasses.fields(ServeSettings):
        default = _field_default(field.name)
        if field.name == "workers":
            default = "CPUs, at most 4"
        shown = "" if default is None else f" (default {default})"
        variable = f"{ENV_PREFIX}{field.name.upper()}"
        lines.append(f"  {variable:<42} {flags.get(field.name, '')}{shown}")
    lines.append(f"  {STATE_DIR_VARIABLE:<42} --state-dir (default ./.state)")
    return "\n".join(lines)
