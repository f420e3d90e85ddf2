"""``gpushare certs`` and ``gpushare webhook-config``: what installs the webhook.

``add_install_commands`` adds both to the CLI; each sets ``func(args) -> int``. Parsing and
printing only: the work is in ``webhook.install`` (certificates, in files or in the cluster,
and the webhook configurations with the safety-net policy).
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path

import yaml

from webhook.cli.cluster_client import require_cluster_client
from webhook.cli.command_tree import Arguments, Commands
from webhook.cli.exit_codes import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from webhook.cli.options import (
    add_certificate_name_options,
    add_kubeconfig_option,
    add_policies_option,
    positive_int,
)
from webhook.core import default_policies_path, kinds_read, load_policies
from webhook.errors import GpushareError, PolicyError
from webhook.install import (
    DEFAULT_SHARED_RESOURCES,
    DEFAULT_TIMEOUT_SECONDS,
    DEFAULT_VALIDATION_ACTIONS,
    FAILURE_POLICIES,
    VALIDATING_WEBHOOK_CHOICES,
    VALIDATION_ACTIONS,
    CertificateError,
    ServiceTarget,
    UrlTarget,
    WebhookSettings,
    admission_configurations,
    parse_ip_addresses,
    quota_objects,
    render_yaml,
    service_dns_names,
    webhook_entries,
    write_certificates,
)

SERVICE_HELP = "the webhook's Service name"
SERVICE_NAMESPACE_HELP = "the Service's namespace"


def add_install_commands(subparsers: Commands) -> None:
    _add_certs(subparsers)
    _add_webhook_config(subparsers)


def _add_certs(subparsers: Commands) -> None:
    parser = subparsers.add_parser(
        "certs",
        help="create a CA and the webhook's serving certificate",
        description=(
            "Write ca.crt, tls.crt and tls.key (Secret-compatible names) and ca.key to --out. "
            "ECDSA P-256; SANs S, S.N and S.N.svc plus --ip and --dns."
        ),
    )
    parser.add_argument("--service", required=True, help=SERVICE_HELP)
    parser.add_argument("--namespace", required=True, help=SERVICE_NAMESPACE_HELP)
    parser.add_argument("--out", type=Path, help="directory to write to (or --in-cluster)")
    add_certificate_name_options(parser, "the serving certificate")
    parser.add_argument(
        "--renew", action="store_true", help="reuse the CA in --out; issue a new serving cert"
    )
    parser.add_argument("--days", type=positive_int, default=365, help="serving cert lifetime")
    _add_in_cluster_arguments(parser)
    parser.set_defaults(func=run_certs)


def _add_in_cluster_arguments(parser: Arguments) -> None:
    """The Helm chart's certgen Jobs and renewal CronJob (webhook.install.cluster_certs)."""
    cluster = parser.add_argument_group(
        "in the cluster (the Helm chart's certgen Jobs and renewal CronJob)",
        "Keep the certificate in a kubernetes.io/tls Secret instead of files: create it, "
        "keep it while valid, renew it near expiry, and write its CA into the caBundle of "
        "the webhook configurations. Idempotent; run it on every install and upgrade, and "
        "on a schedule (the CronJob) so that it renews without either.",
    )
    cluster.add_argument(
        "--in-cluster", action="store_true", help="write the Secret through the Kubernetes API"
    )
    cluster.add_argument("--secret", metavar="NAME", help="the TLS Secret, in --namespace")
    cluster.add_argument(
        "--webhook-configuration",
        metavar="NAME",
        help="patch caBundle of the Mutating/ValidatingWebhookConfiguration of this name",
    )
    cluster.add_argument(
        "--missing-ok",
        action="store_true",
        help="no configuration of that name yet is fine (before the chart installs them)",
    )
    cluster.add_argument(
        "--renew-only",
        action="store_true",
        help="renew an existing Secret, never create one (the chart's renewal CronJob)",
    )
    cluster.add_argument(
        "--renew-before-days",
        type=positive_int,
        default=30,
        help="renew when the certificate or its CA expires within this many days (default 30)",
    )
    add_kubeconfig_option(cluster)


def run_certs(args: argparse.Namespace) -> int:
    if args.in_cluster:
        return run_cluster_certs(args)
    if args.out is None:
        print(
            "gpushare certs: pass --out DIR to write files, or --in-cluster --secret NAME.",
            file=sys.stderr,
        )
        return EXIT_USAGE
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
    return EXIT_OK


def run_cluster_certs(args: argparse.Namespace) -> int:
    """``certs --in-cluster``: the Secret and caBundle through the API (cluster_certs)."""
    if not args.secret or args.out is not None or args.ip:
        print(
            "gpushare certs: --in-cluster needs --secret NAME and takes neither --out nor --ip "
            "(the apiserver calls the Service by name).",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if args.renew_before_days >= args.days:
        print(
            f"gpushare certs: --renew-before-days {args.renew_before_days} must be below "
            f"--days {args.days}, or every run would renew.",
            file=sys.stderr,
        )
        return EXIT_USAGE
    require_cluster_client("gpushare certs --in-cluster")
    from webhook.install import CertSettings, ClusterCertificates, connect_to_cluster

    names = list(dict.fromkeys([*service_dns_names(args.service, args.namespace), *args.dns]))
    settings = CertSettings(
        namespace=args.namespace,
        service=args.service,
        secret_name=args.secret,
        dns_names=tuple(names),
        webhook_configuration=args.webhook_configuration,
        valid_days=args.days,
        renew_before=dt.timedelta(days=args.renew_before_days),
        missing_ok=args.missing_ok,
        renew_only=args.renew_only,
    )
    try:
        api = connect_to_cluster(args.kubeconfig)
        try:
            outcome = ClusterCertificates(api, settings).run()
        finally:
            api.close()  # type: ignore[no-untyped-call]
    except CertificateError as error:
        print(f"gpushare certs: {error}", file=sys.stderr)
        return EXIT_FAILED
    for line in outcome.lines:
        print(line)
    return EXIT_OK


def _add_webhook_config(subparsers: Commands) -> None:
    """The flags of `webhook-config`; long because it is one add_argument per flag."""
    parser = subparsers.add_parser(
        "webhook-config",
        help="print the webhook configurations and the safety-net policy YAML",
        description=(
            "Print, for `kubectl apply -f -` (admissionregistration.k8s.io/v1): the "
            "MutatingWebhookConfiguration; the ValidatingAdmissionPolicy and binding that "
            "re-check pods inside the apiserver after mutation (the safety net, CEL, built "
            "from --policies: regenerate after editing them); and the "
            "ValidatingWebhookConfiguration for workload templates (and pods with "
            "--validating-webhook pods). With --quotas, the quota objects the policies "
            "declare follow."
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
    target.add_argument("--service", help=f"{SERVICE_HELP} (needs --namespace)")
    parser.add_argument("--namespace", help=f"{SERVICE_NAMESPACE_HELP} (excluded from the webhook)")
    parser.add_argument("--port", type=positive_int, default=443, help="the Service's port")
    parser.add_argument(
        "--failure-policy",
        choices=FAILURE_POLICIES,
        default="Fail",
        help="what the apiserver does with an annotated pod while the webhook cannot answer: "
        "Fail refuses it; Ignore admits it as written, unmutated and so without a GPU (the "
        "safety-net policy printed with it lets it through, but still refuses a share asked "
        "for by hand; the pod validating webhook, if it answers, refuses it) (default Fail)",
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
    add_policies_option(
        parser,
        role="the policies the webhook serves: their shared resources and excluded namespaces "
        "go into the configurations, their facts into the safety-net policy; ",
    )
    parser.add_argument(
        "--validating-webhook",
        choices=VALIDATING_WEBHOOK_CHOICES,
        default="workloads",
        help="what the validating webhook checks: workloads (pod templates of Deployments, "
        "Jobs, ...; failurePolicy Ignore), pods (those and every pod, for the checks CEL "
        "cannot make: a second webhook call per pod), none (default: workloads)",
    )
    parser.add_argument(
        "--workload-webhooks",
        action="store_true",
        help="print only the template webhooks of the policies' own workload kinds "
        "(GpuSharingSettings workloadKinds), as the Helm chart's "
        "webhook.extraWorkloadWebhooks value",
    )
    parser.add_argument(
        "--safety-net-policy",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="print the ValidatingAdmissionPolicy and binding (default: yes; "
        "--no-safety-net-policy needs --validating-webhook pods)",
    )
    parser.add_argument(
        "--validation-action",
        action="append",
        choices=VALIDATION_ACTIONS,
        default=[],
        metavar="ACTION",
        help="the binding's validationActions, repeatable: Deny, or Warn and Audit to try the "
        f"policy out first (default: {', '.join(DEFAULT_VALIDATION_ACTIONS)})",
    )
    parser.add_argument(
        "--quotas",
        action="store_true",
        help="also print, after the configurations, the objects the policies' quota sections "
        "declare: a ResourceQuota per quota.namespaces entry; for quota.kueue a ResourceFlavor, "
        "the ClusterQueue and its LocalQueues (kueue.x-k8s.io/v1beta2; docs/quotas.md)",
    )
    parser.add_argument("--name", default="gpushare", help="name of every admission object printed")
    parser.set_defaults(func=run_webhook_config)


def run_webhook_config(args: argparse.Namespace) -> int:
    if args.service and not args.namespace:
        print("gpushare webhook-config: --service needs --namespace.", file=sys.stderr)
        return EXIT_USAGE
    if args.quotas and args.workload_webhooks:
        print("gpushare webhook-config: --workload-webhooks prints no --quotas.", file=sys.stderr)
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
        validating_webhook=args.validating_webhook,
        safety_net_policy=args.safety_net_policy,
        validation_actions=tuple(args.validation_action) or DEFAULT_VALIDATION_ACTIONS,
        workload_kinds=kinds_read(policies),
    )
    if args.workload_webhooks:
        own = webhook_entries(policies.workload_kinds)
        sys.stdout.write(yaml.safe_dump({"extraWorkloadWebhooks": own}, sort_keys=False))
        return EXIT_OK
    try:
        documents = admission_configurations(settings, policies)
        quotas = quota_objects(policies, settings.labels) if args.quotas else []
    except GpushareError as error:
        print(f"gpushare webhook-config: {error}", file=sys.stderr)
        return EXIT_USAGE
    if args.quotas and not quotas:
        print("gpushare webhook-config: the policies declare no quotas.", file=sys.stderr)
    sys.stdout.write(render_yaml([*documents, *quotas]))
    return EXIT_OK
