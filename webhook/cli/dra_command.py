"""``gpushare dra-templates``: the ``dra`` mode's ResourceClaimTemplates, printed or kept.

Printed (``--namespace NS``, repeatable): one YAML document per template, for GitOps
repositories or ``kubectl apply -f -``. Kept (``--apply``): server-side applied to the
cluster, in the given namespaces or every namespace, once, or for as long as the process
runs with ``--watch`` (the reconciler of ``webhook.dra``, polling the policy files like the
webhook does, through ``webhook.policy_store``, with its probes and metrics on ``--listen``).
Applying needs the Kubernetes client (``gpushare[cluster]``), imported only then; printing
does not. Parsing and wiring only; the work is in the modules called.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

import yaml

from webhook.cli.cluster_client import api_client, require_cluster_client
from webhook.cli.command_tree import Commands
from webhook.cli.exit_codes import EXIT_FAILED, EXIT_OK
from webhook.cli.options import add_kubeconfig_option, add_policies_option
from webhook.core import PolicySet, default_policies_path, load_policies, namespace_templates
from webhook.errors import GpushareError
from webhook.policy_store import PolicyStore

if TYPE_CHECKING:
    from webhook.dra import ReconcilerStatus, TemplateReconciler


def add_dra_command(subparsers: Commands) -> None:
    command = subparsers.add_parser(
        "dra-templates",
        help="print or apply the ResourceClaimTemplates the dra mode's pods name",
        description=(
            "A dra policy turns each share into a pod resource claim from a "
            "ResourceClaimTemplate named gpushare-<policy>-<size>, one per share size the "
            "policy allows, in every namespace the policy may govern. Without --apply, "
            "print them for the namespaces given with --namespace. With --apply, "
            "server-side apply them (and delete gpushare's templates no policy wants) in "
            "those namespaces, or in all namespaces; with --watch, keep doing so as "
            "namespaces appear (all namespaces) or every few seconds (the --namespace list, "
            "which needs no access to other namespaces or to the namespace list) and as "
            "the policy files change, until SIGTERM."
        ),
    )
    add_policies_option(command)
    command.add_argument(
        "-n",
        "--namespace",
        metavar="NS[,NS...]",
        help="the namespaces to make templates for, comma-separated (required without "
        "--apply; with it, default: every namespace)",
    )
    command.add_argument(
        "--apply",
        action="store_true",
        help="apply to the cluster instead of printing (all namespaces unless --namespace)",
    )
    command.add_argument(
        "--watch",
        action="store_true",
        help="with --apply: keep reconciling until SIGTERM (the in-cluster Deployment)",
    )
    command.add_argument(
        "--listen",
        metavar="HOST:PORT",
        help="with --watch: serve /healthz, /readyz and /metrics here (the Deployment: "
        "0.0.0.0:9402; default: not served)",
    )
    add_kubeconfig_option(command, when="with --apply: ")
    command.add_argument(
        "--resync",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="with --watch: a full pass this often, repairing templates changed by hand "
        "(default: 600)",
    )
    command.set_defaults(func=run_dra_templates, parser=command.parser)


def run_dra_templates(args: argparse.Namespace) -> int:
    namespaces = [n for n in (args.namespace or "").split(",") if n]
    if args.watch and not args.apply:
        args.parser.error("--watch needs --apply")
    if args.listen is not None and not args.watch:
        args.parser.error("--listen needs --watch")
    if not args.apply and not namespaces:
        args.parser.error("name the namespaces with --namespace NS, or use --apply")
    if args.resync <= 0:
        args.parser.error(f"--resync {args.resync:g}: give a positive number of seconds")
    path = args.policies or default_policies_path()
    if not args.apply:
        _print_templates(load_policies(path), namespaces)
        return EXIT_OK
    require_cluster_client("gpushare dra-templates --apply")
    from webhook.dra import ReconcilerStatus, TemplateApi, TemplateReconciler, parse_listen

    listen = None
    if args.listen is not None:
        try:
            listen = parse_listen(args.listen)
        except ValueError as exc:
            args.parser.error(f"--listen {exc}")
    status = ReconcilerStatus()
    reconciler = TemplateReconciler(
        TemplateApi(api_client(args.kubeconfig, "dra-templates")),
        namespace_templates,
        namespaces=tuple(dict.fromkeys(namespaces)) or None,
        progress=status.tick,
    )
    if args.watch:
        return _watch(reconciler, path, args.resync, status, listen)
    return _once(reconciler, load_policies(path))


def _once(reconciler: TemplateReconciler, policies: PolicySet) -> int:
    """One pass, what it did printed."""
    result = reconciler.reconcile_all(policies)[1]
    for line in result.applied:
        print(f"applied {line}")
    for line in result.deleted:
        print(f"deleted {line}")
    for line in result.errors:
        print(f"error: {line}", file=sys.stderr)
    print(result.summary(), file=sys.stderr)
    return EXIT_FAILED if result.errors else EXIT_OK


def _print_templates(policies: PolicySet, namespaces: list[str]) -> None:
    documents = []
    for namespace in dict.fromkeys(namespaces):
        templates = namespace_templates(policies, namespace)
        if not templates:
            print(f"# no dra policy may govern namespace {namespace!r}", file=sys.stderr)
        documents += templates
    if documents:
        sys.stdout.write(yaml.safe_dump_all(documents, sort_keys=False, width=4096))


def _watch(
    reconciler: TemplateReconciler,
    path: Path,
    resync_s: float,
    status: ReconcilerStatus,
    listen: tuple[str, int] | None,
) -> int:
    """Reconcile until SIGTERM, serving the probes and metrics on ``listen`` meanwhile."""
    from webhook.dra import StatusServer, run

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    store = PolicyStore.loaded(path)
    stop = threading.Event()
    try:
        server = StatusServer(*listen, status) if listen is not None else None
    except OSError as exc:
        raise GpushareError(f"cannot serve the probes on {listen}: {exc}") from exc

    def request_stop(signum: int, _frame: FrameType | None) -> None:
        logging.getLogger("gpushare.dra").info("%s: stopping", signal.Signals(signum).name)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, request_stop)

    def current() -> PolicySet | None:
        store.refresh()
        return store.policies

    if server is not None:
        server.start()
        host, port = server.address
        logging.getLogger("gpushare.dra").info(
            "serving /healthz, /readyz and /metrics on %s:%d", host, port
        )
    try:
        run(reconciler, current, stop, resync_s=resync_s, status=status)
    finally:
        if server is not None:
            server.stop()
    return EXIT_OK
