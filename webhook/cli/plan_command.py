"""``gpushare plan``: what a team's workloads need under each scheme, side by side.

Reads one input (manifests, a live cluster, or a CSV table), has ``webhook.plan`` decide
every workload under each scheme with the core and pack the admitted pods per pool, and
prints a table, JSON or HTML; ``--out DIR`` writes the pictures there.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from webhook.cli.cluster_client import require_cluster_client
from webhook.cli.command_tree import Arguments, Commands
from webhook.cli.exit_codes import EXIT_OK
from webhook.cli.node_files import read_nodes
from webhook.cli.options import (
    add_manifest_file_option,
    add_policies_option,
    add_recursive_option,
)
from webhook.core import PolicySet, default_policies_path, load_policies
from webhook.errors import GpushareError
from webhook.plan import (
    DEFAULT_GPUS_PER_NODE,
    PlanInput,
    SchemeOutcome,
    as_json,
    details,
    enforcement_json,
    enforcement_lines,
    page,
    plan,
    read_cluster,
    read_manifest_input,
    read_table,
    table,
    write_pictures,
)


def read_input(args: argparse.Namespace, policies: PolicySet) -> PlanInput:
    """The workloads of the one input the arguments name, the quotas on GPU shares it has
    (manifests' and a cluster's ResourceQuotas, manifests' Kueue ClusterQueues), and the
    nodes (``--nodes``, else a cluster's own)."""
    given = _read_workloads(args, policies)
    if args.nodes is not None:
        return dataclasses.replace(given, nodes=tuple(read_nodes(args.nodes)))
    return given


def _read_workloads(args: argparse.Namespace, policies: PolicySet) -> PlanInput:
    if args.csv:
        return PlanInput(read_table(args.csv, args.namespace))
    if args.cluster:
        require_cluster_client("gpushare plan --cluster")
        return read_cluster(
            str(args.kubeconfig) if args.kubeconfig else None,
            args.context,
            args.namespace,
            args.selector,
            policies.gpu_resource_names,
        )
    return read_manifest_input(
        args.file, recursive=args.recursive, namespace=args.namespace, policies=policies
    )


def _packing_scheme(results: Sequence[SchemeOutcome], name: str | None) -> SchemeOutcome:
    if name is None:
        return results[0]
    for result in results:
        if result.scheme.name == name:
            return result
    raise GpushareError(
        f"--packing-scheme {name!r} is not a scheme of this plan; the schemes are "
        f"{', '.join(r.scheme.name for r in results)}"
    )


def run_plan(args: argparse.Namespace) -> int:
    if args.gpus_per_node < 1:
        raise GpushareError(f"--gpus-per-node {args.gpus_per_node}: give 1 or more")
    policies = load_policies(args.policies or default_policies_path())
    given = read_input(args, policies)
    for note in dict.fromkeys([*(w.note for w in given.workloads if w.note), *given.notes]):
        print(f"note: {note}", file=sys.stderr)
    results = plan(
        given.workloads,
        policies,
        names=args.policy or (),
        gpus_per_node=args.gpus_per_node,
        quotas=given.quotas,
    )
    shown = _packing_scheme(results, args.packing_scheme)
    if args.out:
        for path in write_pictures(results, shown, args.out):
            print(f"wrote {path}", file=sys.stderr)
    nodes = given.nodes
    if args.output == "json":
        report = as_json(results)
        if nodes is not None:
            report["enforcingNodes"] = enforcement_json(policies, nodes)
        print(json.dumps(report, indent=2))
        return EXIT_OK
    enforcing = [] if nodes is None else enforcement_lines(policies, nodes)
    if args.output == "html":
        sys.stdout.write(page(results, shown))
        for line in enforcing:
            print(line, file=sys.stderr)
    else:
        print(table(results))
        print()
        print(details(results))
        if enforcing:
            print()
            print("\n".join(enforcing))
    return EXIT_OK


def _input_arguments(parser: Arguments) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    add_manifest_file_option(
        source,
        required=False,
        note=" (Pods and workloads, replicas count; ResourceQuotas and Kueue ClusterQueues "
        "on gpushare.io/milligpu are checked)",
    )
    source.add_argument(
        "--csv",
        metavar="FILE",
        help="a table with the columns name,fraction,memory,count[,namespace] (- for stdin)",
    )
    source.add_argument(
        "--cluster",
        action="store_true",
        help="the Pending and Running pods of the cluster the kubeconfig points at, "
        "checked against its ResourceQuotas on gpushare.io/milligpu",
    )
    add_recursive_option(parser)
    parser.add_argument(
        "--kubeconfig",
        type=Path,
        metavar="FILE",
        help="with --cluster: the kubeconfig (default: $KUBECONFIG, ~/.kube/config)",
    )
    parser.add_argument("--context", help="with --cluster: the kubeconfig context")
    parser.add_argument(
        "--nodes",
        metavar="FILE",
        help="the cluster's nodes (`kubectl get nodes -o yaml`, - for stdin): report which "
        "pools have a node enforcing the driver memory limit (gpushare.io/driver-memory-limit;"
        " with --cluster its own nodes are read)",
    )
    parser.add_argument("-l", "--selector", help="with --cluster: only pods with these labels")
    parser.add_argument(
        "-n",
        "--namespace",
        help="evaluate every workload in this namespace (with --cluster: read only it)",
    )


def add_plan_command(commands: Commands) -> None:
    parser = commands.add_parser(
        "plan",
        help="GPUs a workload mix needs under each policy, side by side",
        description=(
            "Decide every workload with the webhook's own core under each scheme (the "
            "policies as configured, then each policy applied to every workload), pack the "
            "admitted pods onto GPUs per pool by first-fit decreasing, and report side by "
            "side: GPUs and nodes needed (against the lower bound and one GPU per pod), "
            "compute and memory left idle, what is isolated, which pods cannot be "
            "served and why, and which quotas on GPU shares would not hold the workloads "
            "charged to them. Exit 0, or 2 for unreadable input or policies."
        ),
    )
    _input_arguments(parser)
    add_policies_option(parser)
    parser.add_argument(
        "--policy",
        action="append",
        metavar="NAME",
        help="compare only this policy (repeat for more; default: the set as "
        "configured, then every policy)",
    )
    parser.add_argument(
        "--gpus-per-node",
        type=int,
        default=DEFAULT_GPUS_PER_NODE,
        metavar="N",
        help="GPUs per node where a pool's gpusPerNode does not say "
        f"(default: {DEFAULT_GPUS_PER_NODE})",
    )
    parser.add_argument(
        "-o",
        "--output",
        choices=("table", "json", "html"),
        default="table",
        help="table (default), json for tools, or html: one page with the pictures inline",
    )
    parser.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help="write the pictures into DIR (made if missing): plan-chart.png/.svg, GPUs "
        "needed per scheme, and plan-packing.png/.svg, which pods share which GPU",
    )
    parser.add_argument(
        "--packing-scheme",
        metavar="NAME",
        help="the scheme the packing picture and HTML page draw (default: the first)",
    )
    parser.set_defaults(func=run_plan)
