"""The ``gpushare`` command: offline policy tools here, server and node commands plugged in.

Exit codes (a contract other tools rely on): 0 admitted (mutated or untouched), 3 denied
(any document; one reason per line on stderr), 2 usage errors, unreadable or invalid input
or invalid policies.

``mutate`` and ``explain`` read what people keep in git (``manifest.py``): Pods and workloads
with a pod template, multi-document files, directories and stdin; every document keeps its
place, and every line about one starts with its ``Kind/namespace/name`` (``offline.py``).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from webhook.all_modes import SchemeView, check_all_modes, print_explain, print_mutate
from webhook.core import (
    Denied,
    Planned,
    PolicySet,
    Untouched,
    default_policies_path,
    load_policies,
)
from webhook.errors import GpushareError, ManifestError, PolicyError
from webhook.manifest import MANIFEST_SUFFIXES, read_manifests
from webhook.offline import DENIED, Checked, check_documents, report
from webhook.plan import add_plan_command
from webhook.policy_check import add_policy_commands

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_DENIED = 3
# 128 + SIGPIPE, what a shell reports for a tool its reader stopped reading.
EXIT_BROKEN_PIPE = 141


def _policies_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--policies",
        metavar="PATH",
        type=Path,
        default=None,
        help="policy file or directory (default: $GPUSHARE_POLICIES, ./policies, "
        "the checkout's policies/, /etc/gpushare/policies)",
    )


def _manifest_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-f",
        "--file",
        required=True,
        action="append",
        metavar="PATH",
        help=f"manifest file, directory (its {', '.join(MANIFEST_SUFFIXES)} files, sorted by "
        "name) or - for stdin; repeat for more",
    )
    parser.add_argument(
        "-R",
        "--recursive",
        action="store_true",
        help="also read the subdirectories of directories given with -f (hidden ones and "
        "links to directories are skipped)",
    )
    _policies_argument(parser)
    parser.add_argument(
        "-n",
        "--namespace",
        help="evaluate every document in this namespace (default: each document's own, "
        "else default)",
    )


def _all_modes_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--all-modes",
        action="store_true",
        help="try every policy of --policies alone, for every namespace, and show what the "
        "pod gets, what is isolated and what must run on the nodes under each scheme (exit "
        "3 only when a document is denied under all of them)",
    )


def _check(args: argparse.Namespace, *, explain: bool = False) -> list[Checked]:
    documents = read_manifests(args.file, recursive=args.recursive)
    policies: PolicySet = load_policies(args.policies or default_policies_path())
    return check_documents(documents, policies, args.namespace, explain=explain)


def _print_verdicts(checked: Sequence[Checked]) -> int:
    """Warnings and denials on stderr, each line prefixed with its document's label."""
    for item in checked:
        for warning in item.warnings:
            print(f"{item.label}: warning: {warning}", file=sys.stderr)
        for reason in item.reasons if item.verdict == DENIED else ():
            print(f"{item.label}: denied: {reason}", file=sys.stderr)
    return EXIT_DENIED if any(item.verdict == DENIED for item in checked) else EXIT_OK


def _all_modes(args: argparse.Namespace, *, explain: bool) -> list[SchemeView]:
    documents = read_manifests(args.file, recursive=args.recursive)
    policies: PolicySet = load_policies(args.policies or default_policies_path())
    return check_all_modes(documents, policies, args.namespace, explain=explain)


def _cmd_mutate(args: argparse.Namespace) -> int:
    if args.all_modes:
        if args.output == "patch":
            raise ManifestError("--all-modes prints every scheme: use -o yaml or -o json.")
        return print_mutate(_all_modes(args, explain=False), args.output)
    checked = _check(args)
    if args.output == "patch" and len(checked) != 1:
        raise ManifestError(
            f"-o patch prints one JSON Patch, but the input holds {len(checked)} documents: "
            "pass one, or use -o json (a report with each document's patch)."
        )
    code = _print_verdicts(checked)
    if args.output == "json":
        print(json.dumps(report(checked, "MutateReport", with_result=True), indent=2))
        return code
    if args.output == "patch":
        if code == EXIT_OK:
            print(json.dumps(checked[0].patch, indent=2))
        return code
    admitted = [item.result for item in checked if item.verdict != DENIED]
    if len(admitted) == 1 and len(checked) == 1:
        print(yaml.safe_dump(admitted[0], sort_keys=False), end="")
    elif admitted:
        print(yaml.safe_dump_all(admitted, sort_keys=False), end="")
    return code


def _explain_lines(item: Checked) -> list[str]:
    """What ``explain`` says about one document, after its label."""
    if item.decision is None:
        return [f"decision: untouched ({item.note})"]
    lines = [f"namespace: {item.namespace}"]
    if item.template is not None:
        lines.append(f"pod template: {item.template}, evaluated as the pods it creates")
    decision = item.decision
    if isinstance(decision, Untouched):
        lines.append(f"decision: untouched ({decision.reason})")
    elif isinstance(decision, Denied):
        lines.append(f"decision: denied by policy {decision.policy!r}")
        lines += [f"  - {reason}" for reason in decision.reasons]
    elif isinstance(decision, Planned):
        lines.append("decision: mutated")
        lines += decision.explanation
        record = json.dumps(dict(decision.record), sort_keys=True)
        lines.append(f"recorded in annotation: {record}")
        lines.append(
            f"patch: {len(item.patch)} operation(s)"
            + (" (already mutated: nothing to change)" if not item.patch else "")
        )
    lines += [f"warning: {warning}" for warning in item.warnings]
    return lines


def _cmd_explain(args: argparse.Namespace) -> int:
    if args.all_modes:
        return print_explain(_all_modes(args, explain=True), args.output)
    checked = _check(args, explain=True)
    if args.output == "json":
        print(json.dumps(report(checked, "ExplainReport", with_result=False), indent=2))
    else:
        for number, item in enumerate(checked):
            if number:
                print()
            print(f"{item.label} ({item.document.source}:{item.document.line})")
            for line in _explain_lines(item):
                print(line)
    return EXIT_DENIED if any(item.verdict == DENIED for item in checked) else EXIT_OK


def _add_manifest_commands(commands: Any) -> None:
    """``mutate`` and ``explain``: the offline verdicts on manifests."""
    mutate_parser = commands.add_parser(
        "mutate",
        help="print manifests as the webhook would admit their pods",
        description=(
            "Put each document through gpushare as the cluster would and print it as "
            "admitted, in input order. A Pod is printed as the mutating webhook patches it. "
            "A workload (Deployment, StatefulSet, DaemonSet, ReplicaSet, "
            "ReplicationController, Job, CronJob, PodTemplate) is printed with its pod "
            "template as each of its pods will be admitted: the webhook itself never "
            "changes templates, it patches the pods when they are created. Other documents "
            "pass through unchanged; denied documents are left out of the output. Exit 0 "
            "when every document is admitted, 3 when any is denied (reasons on stderr, "
            "prefixed with Kind/namespace/name), 2 for unreadable input or policies."
        ),
    )
    _manifest_arguments(mutate_parser)
    mutate_parser.add_argument(
        "-o",
        "--output",
        choices=("yaml", "json", "patch"),
        default="yaml",
        help="yaml: the documents as admitted; json: a report for CI with each document's "
        "verdict, reasons, warnings, JSON Patch and result; patch: the JSON Patch of the one "
        "document given (default: yaml)",
    )
    _all_modes_argument(mutate_parser)
    mutate_parser.set_defaults(func=_cmd_mutate)

    explain_parser = commands.add_parser(
        "explain",
        help="say which policy applies to each document and why",
        description=(
            "For each document: which policy matched and why, and how each value was "
            "computed. Workloads are explained through the pods their template creates. "
            "Exit 3 when any document would be denied."
        ),
    )
    _manifest_arguments(explain_parser)
    explain_parser.add_argument(
        "-o",
        "--output",
        choices=("text", "json"),
        default="text",
        help="text, or json: a report with each document's verdict and explanation",
    )
    _all_modes_argument(explain_parser)
    explain_parser.set_defaults(func=_cmd_explain)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpushare",
        description=(
            "Turn a gpu-fraction or gpu-memory annotation into what the cluster's GPU sharing "
            "needs: the admission webhook (serve), its installation (certs, webhook-config), "
            "the node side (device-plugin-config, mps-daemon) and offline tools for manifests "
            "and policies (mutate, explain, policy), and what a workload mix needs under each "
            "scheme (plan). `gpushare COMMAND --help` for each."
        ),
        epilog="Exit codes: 0 ok, 2 usage errors and invalid input or policies, 3 a document "
        "denied (mutate, explain), 1 other failures.",
    )
    parser.add_argument("--version", action="version", version=f"gpushare {package_version()}")
    parser.set_defaults(func=None, parser=parser)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")

    _add_manifest_commands(commands)
    add_policy_commands(commands)
    add_plan_command(commands)
    _add_plugged_commands(commands)
    return parser


def package_version() -> str:
    """The installed distribution's version (pyproject.toml), as pip reports it."""
    try:
        return importlib.metadata.version("gpushare")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed: pip install -e .)"


def _add_plugged_commands(commands: Any) -> None:
    """Commands that live with their edges (server, node, DRA templates, compile), imported
    only when the CLI is built."""
    from webhook.compile.command import add_compile_command
    from webhook.dra.commands import add_dra_commands
    from webhook.node.commands import add_node_commands
    from webhook.server.commands import add_server_commands

    add_server_commands(commands)
    add_node_commands(commands)
    add_dra_commands(commands)
    add_compile_command(commands)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.func is None:  # `gpushare` or `gpushare policy` alone: its help, a usage error
        args.parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        code: int = args.func(args)
    except (ManifestError, PolicyError) as error:
        print(str(error), file=sys.stderr)
        return EXIT_USAGE
    except GpushareError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        # The reader went away (`gpushare compile | head`): stop quietly, as other Unix
        # tools do. Point stdout at devnull so the interpreter's final flush cannot fail
        # again (Python docs, "Note on SIGPIPE").
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    return code


if __name__ == "__main__":
    sys.exit(main())
