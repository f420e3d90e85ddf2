"""The ``serve``, ``certs`` and ``webhook-config`` subcommands of the ``gpushare`` CLI.

``add_server_commands`` plugs them into the CLI's argparse subparsers; each sets
``func(args) -> int``. Parsing and printing only: the work is in ``serve`` (its flags in
``serve_command``), ``webhook.install.certs`` and ``webhook.install.webhook_config``.
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
from webhook.server.serve_command import POLICIES_HELP, add_serve, positive_int

EXIT_USAGE = 2

Subparsers = Any  # argparse's _SubParsersAction is private; the CLI passes it through


def add_server_commands(subparsers: Subparsers) -> None:
    add_serve(subparsers)
    _add_certs(subparsers)
    _add_webhook_config(subparsers)


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
    parser.add_argument("--days", type=positive_int, default=365, help="serving cert lifetime")
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
    parser.add_argument("--port", type=positive_int, default=443, help="the Service's port")
    parser.add_argument(
        "--failure-policy",
        choices=FAILURE_POLICIES,
        default="Fail",
        help="what the apiserver does with an annotated pod while the webhook cannot answer: "
        "Fail refuses it, Ignore admits it unmutated (default Fail)",
    )
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
        metavar="PATH",
        help="the policies the webhook serves: their shared resources and excluded namespaces "
        "go into the configurations; " + POLICIES_HELP,
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
