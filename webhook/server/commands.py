"""The ``serve``, ``certs`` and ``webhook-config`` subcommands of the ``gpushare`` CLI.

``add_server_commands`` plugs them into the CLI's argparse subparsers; each sets
``func(args) -> int``. Parsing and printing only: the work is in ``serve``,
``webhook.install.certs`` and ``webhook.install.webhook_config``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from webhook.core import default_policies_path, load_policies
from webhook.errors import GpushareError, PolicyError
from webhook.install.certs import (
    CertificateError,
    parse_ip_addresses,
    service_dns_names,
    write_certificates,
)
from webhook.install.webhook_config import (
    DEFAULT_SHARED_RESOURCES,
    DEFAULT_TIMEOUT_SECONDS,
    FAILURE_POLICIES,
    ServiceTarget,
    UrlTarget,
    WebhookSettings,
    render_yaml,
    webhook_configurations,
)
from webhook.server import settings as serve_defaults
from webhook.server.serve import (
    CertificateSource,
    ServeError,
    exec_gunicorn,
    prepare,
    startup_message,
)

EXIT_USAGE = 2

Subparsers = Any  # argparse's _SubParsersAction is private; the CLI passes it through


def add_server_commands(subparsers: Subparsers) -> None:
    _add_serve(subparsers)
    _add_certs(subparsers)
    _add_webhook_config(subparsers)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive integer")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number")
    return value


def _add_serve(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="run the admission webhook over HTTPS (gunicorn)",
        description=(
            "Serve /mutate and /validate over TLS. With no flags: local certificates in the "
            "state directory, the bundled policies, 127.0.0.1:8443."
        ),
    )
    parser.add_argument("--host", default=serve_defaults.DEFAULT_HOST, help="address to bind")
    parser.add_argument("--port", type=_positive_int, default=serve_defaults.DEFAULT_PORT)
    parser.add_argument(
        "--policies",
        type=Path,
        help="policy file or directory (default: $GPUSHARE_POLICIES, ./policies, the "
        "checkout's policies/, /etc/gpushare/policies)",
    )
    certs = parser.add_argument_group("certificates (default: generated in the state dir)")
    certs.add_argument("--tls-cert", type=Path, help="serving certificate (PEM)")
    certs.add_argument("--tls-key", type=Path, help="serving key (PEM)")
    certs.add_argument(
        "--client-ca",
        type=Path,
        help="require /mutate and /validate callers to present a client certificate signed "
        "by this CA (the apiserver presents one when its AdmissionConfiguration names it; "
        "docs/reliability.md)",
    )
    certs.add_argument(
        "--cert-dir", type=Path, help="directory holding tls.crt and tls.key (a Secret mount)"
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        help="where local certificates go (default: $GPUSHARE_STATE_DIR or ./.state)",
    )
    _add_tuning_flags(parser)
    parser.set_defaults(func=run_serve)


def _add_tuning_flags(parser: argparse.ArgumentParser) -> None:
    # Tuning flags default to None so that ServeSettings' own defaults apply; ``dest`` is
    # the ServeSettings field each one sets.
    tuning = parser.add_argument_group("tuning (defaults: ServeSettings)")
    tuning.add_argument(
        "--workers", type=_positive_int, help="worker processes (default: CPUs, at most 4)"
    )
    tuning.add_argument(
        "--threads", type=_positive_int, help=f"default {serve_defaults.DEFAULT_THREADS}"
    )
    tuning.add_argument(
        "--policy-poll-seconds",
        type=_positive_float,
        help=f"default {serve_defaults.DEFAULT_POLICY_POLL_SECONDS}",
    )
    tuning.add_argument(
        "--max-body-bytes",
        type=_positive_int,
        help=f"default {serve_defaults.DEFAULT_MAX_BODY_BYTES}",
    )
    tuning.add_argument(
        "--request-read-timeout",
        dest="request_read_timeout_seconds",
        type=_positive_float,
        help="seconds a client gets to send a whole request, TLS handshake included "
        f"(default {serve_defaults.DEFAULT_REQUEST_READ_TIMEOUT_SECONDS})",
    )
    tuning.add_argument(
        "--max-connections",
        type=_positive_int,
        help="open connections per worker; at the cap the oldest unfinished one is closed "
        f"(default {serve_defaults.DEFAULT_MAX_CONNECTIONS})",
    )
    tuning.add_argument(
        "--keepalive",
        dest="keepalive_seconds",
        type=_positive_int,
        help=f"default {serve_defaults.DEFAULT_KEEPALIVE_SECONDS}",
    )
    tuning.add_argument(
        "--graceful-timeout",
        dest="graceful_timeout_seconds",
        type=_positive_int,
        help="seconds in-flight requests get to finish after SIGTERM (default "
        f"{serve_defaults.DEFAULT_GRACEFUL_TIMEOUT_SECONDS})",
    )
    tuning.add_argument("--log-level", choices=("debug", "info", "warning", "error"))


_TUNING_FIELDS = (
    "client_ca",
    "host",
    "port",
    "workers",
    "threads",
    "policy_poll_seconds",
    "max_body_bytes",
    "request_read_timeout_seconds",
    "max_connections",
    "keepalive_seconds",
    "graceful_timeout_seconds",
    "log_level",
)


def run_serve(args: argparse.Namespace) -> int:
    certificates = CertificateSource(args.tls_cert, args.tls_key, args.cert_dir, args.state_dir)
    tuning = {name: getattr(args, name) for name in _TUNING_FIELDS}
    tuning = {name: value for name, value in tuning.items() if value is not None}
    try:
        prepared = prepare(args.policies, certificates, tuning)
    except ServeError as error:
        print(f"gpushare serve: {error}", file=sys.stderr)
        return EXIT_USAGE
    print(startup_message(prepared), flush=True)
    exec_gunicorn(prepared.settings)
    return 1  # only reached if exec returned, which it does not without raising


def _add_certs(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "certs",
        help="create a CA and the webhook's serving certificate",
        description=(
            "Write ca.crt, tls.crt and tls.key (Secret-compatible names) and ca.key to --out. "
            "ECDSA P-256; SANs S, S.N and S.N.svc plus --ip and --dns."
        ),
    )
    parser.add_argument("--service", required=True, help="the webhook's Service name")
    parser.add_argument("--namespace", required=True, help="the Service's namespace")
    parser.add_argument("--out", required=True, type=Path, help="directory to write to")
    parser.add_argument("--ip", action="append", default=[], help="extra IP SAN (repeatable)")
    parser.add_argument("--dns", action="append", default=[], help="extra DNS SAN (repeatable)")
    parser.add_argument(
        "--renew", action="store_true", help="reuse the CA in --out; issue a new serving cert"
    )
    parser.add_argument("--days", type=_positive_int, default=365, help="serving cert lifetime")
    parser.set_defaults(func=run_certs)


def run_certs(args: argparse.Namespace) -> int:
    try:
        addresses = parse_ip_addresses(args.ip)
        names = list(dict.fromkeys([*service_dns_names(args.service, args.namespace), *args.dns]))
        files = write_certificates(
            args.out, names, addresses, renew=args.renew, valid_days=args.days
        )
    except (CertificateError, OSError) as error:
        print(f"gpushare certs: {error}", file=sys.stderr)
        return EXIT_USAGE
    print(f"wrote {files.ca_cert}, {files.serving_cert}, {files.serving_key}")
    print(f"CA key {files.ca_key}: keep it out of the Secret; `--renew` needs it.")
    print(
        f"kubectl -n {args.namespace} create secret generic {args.service}-tls "
        f"--from-file={files.ca_cert} --from-file={files.serving_cert} "
        f"--from-file={files.serving_key}"
    )
    return 0


def _add_webhook_config(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "webhook-config",
        help="print the Mutating/ValidatingWebhookConfiguration YAML",
        description=(
            "Print a MutatingWebhookConfiguration and a ValidatingWebhookConfiguration "
            "(admissionregistration.k8s.io/v1) for `kubectl apply -f -`."
        ),
    )
    parser.add_argument(
        "--ca",
        required=True,
        action="append",
        type=Path,
        help="CA certificate for caBundle; repeat to trust old and new CA during rotation",
    )
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--url", help="https URL of a webhook outside the cluster")
    target.add_argument("--service", help="the webhook's Service name (needs --namespace)")
    parser.add_argument("--namespace", help="the Service's namespace (excluded from the webhook)")
    parser.add_argument("--port", type=_positive_int, default=443, help="the Service's port")
    parser.add_argument("--failure-policy", choices=FAILURE_POLICIES, default="Fail")
    parser.add_argument(
        "--timeout", type=int, default=DEFAULT_TIMEOUT_SECONDS, help="seconds, 1-30"
    )
    parser.add_argument(
        "--shared-resource",
        action="append",
        default=[],
        metavar="NAME",
        help=f"resource the validating webhook watches (default: from --policies, else "
        f"{', '.join(DEFAULT_SHARED_RESOURCES)})",
    )
    parser.add_argument(
        "--policies",
        type=Path,
        help="the policies the webhook serves: their shared resources and excluded namespaces "
        "go into the configurations (default: as `gpushare serve` finds them)",
    )
    parser.add_argument("--name", default="gpushare", help="name of both configurations")
    parser.set_defaults(func=run_webhook_config)


def run_webhook_config(args: argparse.Namespace) -> int:
    if args.service and not args.namespace:
        print("gpushare webhook-config: --service needs --namespace.", file=sys.stderr)
        return EXIT_USAGE
    try:
        bundle = b"".join(path.read_bytes() for path in args.ca)
    except OSError as error:
        print(
            f"gpushare webhook-config: cannot read {error.filename}: {error.strerror}.",
            file=sys.stderr,
        )
        return EXIT_USAGE
    try:
        policies = load_policies(args.policies or default_policies_path())
    except PolicyError as error:
        print("gpushare webhook-config: " + "\n".join(error.problems), file=sys.stderr)
        return EXIT_USAGE
    shared = [*args.shared_resource, *sorted(policies.shared_resource_names)]
    # The policies' excluded namespaces are the one setting: the webhook skips them, and the
    # configurations keep them from reaching it.
    excluded = sorted(policies.excluded_namespaces)
    target: ServiceTarget | UrlTarget = (
        UrlTarget(args.url) if args.url else ServiceTarget(args.service, args.namespace, args.port)
    )
    settings = WebhookSettings(
        target=target,
        ca_bundle_pem=bundle,
        failure_policy=args.failure_policy,
        timeout_seconds=args.timeout,
        excluded_namespaces=tuple(excluded),
        shared_resources=tuple(dict.fromkeys(shared)) or DEFAULT_SHARED_RESOURCES,
        name=args.name,
    )
    try:
        documents = webhook_configurations(settings)
    except GpushareError as error:
        print(f"gpushare webhook-config: {error}", file=sys.stderr)
        return EXIT_USAGE
    sys.stdout.write(render_yaml(documents))
    return 0
