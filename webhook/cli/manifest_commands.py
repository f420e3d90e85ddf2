"""``gpushare mutate`` and ``gpushare explain``: the offline verdicts on manifests.

They read what people keep in git (``webhook.manifest``): Pods and workloads with a pod
template, multi-document files, directories and stdin; every document keeps its place, and
every line about one starts with its ``Kind/namespace/name`` (``webhook.offline``). Exit 0
when every document is admitted, 3 when any is denied.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

import yaml

from webhook.all_modes import SchemeView, check_all_modes, print_explain, print_mutate
from webhook.cli.command_tree import Arguments, Commands
from webhook.cli.exit_codes import EXIT_DENIED, EXIT_OK
from webhook.cli.options import (
    add_manifest_file_option,
    add_policies_option,
    add_recursive_option,
)
from webhook.core import (
    Decision,
    Denied,
    Planned,
    PolicySet,
    Untouched,
    default_policies_path,
    load_policies,
)
from webhook.errors import ManifestError
from webhook.manifest import read_manifests
from webhook.offline import DENIED, Checked, check_documents, document_group, report


def _manifest_arguments(parser: Arguments) -> None:
    add_manifest_file_option(parser, required=True)
    add_recursive_option(parser)
    add_policies_option(parser)
    parser.add_argument(
        "-n",
        "--namespace",
        help="evaluate every document in this namespace (default: each document's own, "
        "else default)",
    )


def _all_modes_argument(parser: Arguments) -> None:
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
    patched = _patch_document(checked) if args.output == "patch" else None
    code = _print_verdicts(checked)
    if args.output == "json":
        print(json.dumps(report(checked, "MutateReport", with_result=True), indent=2))
        return code
    if patched is not None:
        if patched.verdict != DENIED:
            print(json.dumps(patched.patch, indent=2))
        return code
    admitted = [item.result for item in checked if item.verdict != DENIED]
    if len(admitted) == 1 and len(checked) == 1:
        print(yaml.safe_dump(admitted[0], sort_keys=False), end="")
    elif admitted:
        print(yaml.safe_dump_all(admitted, sort_keys=False), end="")
    return code


def _patch_document(checked: Sequence[Checked]) -> Checked:
    """The one document ``-o patch`` prints the patch of: the input's only document, or its
    only one with a pod (a Pod, or a workload with a pod template) among Namespaces,
    Services and the like; ``ManifestError`` naming them when there are more, or none."""
    if len(checked) == 1:
        return checked[0]
    with_pods = [item for item in checked if _has_pod(item)]
    if len(with_pods) == 1:
        return with_pods[0]
    use = "use -o json (a report with each document's patch)"
    if not with_pods:
        raise ManifestError(
            f"-o patch prints the JSON Patch of a Pod or workload, but none of the input's "
            f"{len(checked)} documents has a pod: pass one, or {use}."
        )
    named = ", ".join(
        f"{item.label} ({item.document.source}:{item.document.line})" for item in with_pods
    )
    raise ManifestError(
        f"-o patch prints one JSON Patch, but the input holds {len(with_pods)} documents with "
        f"a pod: {named}: pass one of them, or {use}."
    )


def _has_pod(item: Checked) -> bool:
    """A Pod, or a workload whose pod template was checked; a Service, a Namespace or a
    workload without a template has nothing to patch."""
    content = item.document.content
    is_pod = isinstance(content, dict) and item.kind == "Pod" and document_group(content) == ""
    return is_pod or item.template is not None


def _explain_lines(item: Checked) -> list[str]:
    """What ``explain`` says about one document, after its label."""
    if item.decision is None:
        return [f"decision: untouched ({item.note})"]
    lines = [f"namespace: {item.namespace}"]
    if len(item.templates) > 1:
        for part in item.templates:
            role = f" ({part.role})" if part.role else ""
            lines.append(f"pod template: {part.where}{role}, evaluated as the pods it creates")
            lines += [f"  {line}" for line in _decision_lines(part.decision, part.operations)]
        lines += [f"warning: {warning}" for warning in item.warnings]
        return lines
    if item.template is not None:
        role = f" ({item.templates[0].role})" if item.templates and item.templates[0].role else ""
        lines.append(f"pod template: {item.template}{role}, evaluated as the pods it creates")
    lines += _decision_lines(item.decision, len(item.patch))
    lines += [f"warning: {warning}" for warning in item.warnings]
    return lines


def _decision_lines(decision: Decision | None, operations: int) -> list[str]:
    """What ``explain`` says about one decision."""
    lines: list[str] = []
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
            f"patch: {operations} operation(s)"
            + (" (already mutated: nothing to change)" if not operations else "")
        )
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


def add_manifest_commands(commands: Commands) -> None:
    """``mutate`` and ``explain``: the offline verdicts on manifests."""
    mutate_parser = commands.add_parser(
        "mutate",
        help="print manifests as the webhook would admit their pods",
        description=(
            "Put each document through gpushare as the cluster would and print it as "
            "admitted, in input order. A Pod is printed as the mutating webhook patches it. "
            "A workload (Deployment, Job, CronJob, ..., and the operators' kinds: RayCluster, "
            "PyTorchJob, LeaderWorkerSet, JobSet, InferenceService, Workflow, ...; "
            "docs/workloads.md) is printed with its pod templates as each of its pods will "
            "be admitted: the webhook itself never "
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
        "document given, or of the one Pod or workload among other documents (a Namespace, "
        "a Service) (default: yaml)",
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
