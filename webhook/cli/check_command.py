"""``gpushare check-admission``: its flags and its report. The work is in
``webhook.install`` (``AdmissionCheck``: a server-side dry run of an annotated pod)."""

from __future__ import annotations

import argparse
import sys
import textwrap

from webhook.cli.cluster_client import require_cluster_client
from webhook.cli.command_tree import Commands
from webhook.cli.exit_codes import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from webhook.cli.options import add_kubeconfig_option
from webhook.install import (
    CHECK_IMAGE,
    DEFAULT_CHECK_NAMESPACE,
    DEFAULT_CHECK_TIMEOUT_SECONDS,
    AdmissionCheck,
    CertificateError,
    run_check,
)

PROG = "gpushare check-admission"


def add_check_command(subparsers: Commands) -> None:
    command = subparsers.add_parser(
        "check-admission",
        help="check that the apiserver reaches the webhook (a dry-run annotated pod)",
        description=textwrap.fill(
            "Ask the apiserver to create a pod annotated gpu-fraction: 0.5 as a server-side "
            "dry run (nothing is stored) and succeed only if it comes back mutated by "
            "gpushare (its gpushare.io/applied record). Run after every install or upgrade "
            "(the Helm chart's post-install hook and `helm test`; deploy/admission-check): a "
            "webhook the apiserver cannot reach (pods not ready, a NetworkPolicy without the "
            "apiserver's addresses, a wrong caBundle) fails it with the reason. Failed "
            "attempts are tried again every 5 s until --timeout. Needs `create` on pods in "
            "--namespace. Exit 0 passed, 1 failed, 2 usage.",
            width=88,
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    command.add_argument(
        "--namespace",
        default=DEFAULT_CHECK_NAMESPACE,
        help="where the dry-run pod is created: a namespace the webhook serves, not its own "
        f"(excluded) one (default {DEFAULT_CHECK_NAMESPACE})",
    )
    command.add_argument(
        "--timeout",
        type=int,
        default=DEFAULT_CHECK_TIMEOUT_SECONDS,
        help="seconds to keep trying while endpoints and caBundle settle "
        f"(default {DEFAULT_CHECK_TIMEOUT_SECONDS})",
    )
    command.add_argument(
        "--image",
        default=CHECK_IMAGE,
        help=f"the dry-run pod's image, never pulled (default {CHECK_IMAGE})",
    )
    add_kubeconfig_option(command)
    command.set_defaults(func=run_check_admission)


def run_check_admission(args: argparse.Namespace) -> int:
    if args.timeout < 0:
        print(f"{PROG}: --timeout must be 0 or more seconds.", file=sys.stderr)
        return EXIT_USAGE
    require_cluster_client(PROG)
    from webhook.install import connect_to_cluster

    try:
        api = connect_to_cluster(args.kubeconfig)
    except CertificateError as error:
        print(f"{PROG}: {error}", file=sys.stderr)
        return EXIT_FAILED
    check = AdmissionCheck(api, args.namespace, args.image)
    where = f"a dry-run pod annotated gpu-fraction 0.5 in namespace {args.namespace}"
    try:
        result = run_check(
            check.attempt,
            args.timeout,
            lambda line: print(f"{PROG}: {line}", file=sys.stderr, flush=True),
        )
    finally:
        api.close()  # type: ignore[no-untyped-call]
    if result.passed:
        print(f"{PROG}: passed: {where}: {result.message}")
        return EXIT_OK
    print(
        f"{PROG}: FAILED after {result.attempts} attempt(s) over up to {args.timeout} s: "
        f"{where}: {result.message}",
        file=sys.stderr,
    )
    return EXIT_FAILED
