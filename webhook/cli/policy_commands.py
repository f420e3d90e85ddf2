"""``gpushare policy check`` and ``gpushare policy schema``: the policy authors' commands.

``check`` reads every path given as one set, as the webhook would load them from one
directory, and reports in three steps: what makes the set invalid (the loader's problems,
which every command that loads policies refuses with exit 2), what makes it unworkable
(errors: exit 2) and what has no effect (warnings: exit 0). One line per finding:
``file: yaml.path: severity: what is wrong (line N)``, then a summary line. A file that
holds Kubernetes manifests (a Deployment given by mistake) is one error line, pointing at
``gpushare mutate``, and is left out of the set.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from webhook.cli.command_tree import Commands
from webhook.cli.exit_codes import EXIT_OK, EXIT_USAGE
from webhook.cli.node_files import read_nodes
from webhook.constants import API_GROUP
from webhook.core import (
    Policy,
    PolicySet,
    SetFinding,
    Severity,
    api_group,
    check_policy_set,
    document_schema,
    enforcing_node_findings,
    finding_lines,
    load_policy_texts,
    read_policy_files,
    workload_kind,
)
from webhook.errors import ManifestError, PolicyError
from webhook.manifest import parse_documents
from webhook.node import hook_problems, pool_conflict_refs, pool_problems, pool_refs

CHECK_DESCRIPTION = """\
Check the policy files given as one set, as the webhook loads them from one directory
(a directory's *.yaml and *.yml files; paths given twice are read once).

Problems that make the set invalid (schema, values, rules of one policy, duplicate names,
two defaults of one priority, unknown fields with the closest known one) are refused by
every command that loads policies, with exit 2. Across the set, check also reports:

errors (exit 2):
  - two pools that define the same device-plugin config but disagree (mode, replicas,
    resourceName, allocation; for mps-daemon also gpuMemory and the daemon settings):
    `gpushare device-plugin-config` and `gpushare mps-daemon` refuse them too
  - a policy whose fraction.min is above every pool's slot (every ask is denied)
  - a policy (not default) all of whose namespaces are excluded from every policy
    (kube-system always; GpuSharingSettings excludeNamespaces)
  - a pool nodeSelector no GPU Feature Discovery label can match on the pool's nodes:
    nvidia.com/gpu.product without -SHARED where the pool shares nvidia.com/gpu under its
    own name (GFD appends -SHARED there) or with it where the resource is renamed to
    nvidia.com/gpu.shared; nvidia.com/gpu.replicas or nvidia.com/gpu.sharing-strategy
    other than the pool's; nvidia.com/gpu.memory that is not a whole number

warnings (printed, exit 0):
  - fractions within fraction.min..max that no pool's slot holds (denied at admission)
  - an excluded namespace named among others in match.namespaces (no effect)
  - a pool whose config `gpushare device-plugin-config` cannot generate (a resourceName
    other than nvidia.com/gpu or nvidia.com/gpu.shared)
  - a pool of a policy that writes the driver memory limit (enforcement.driverMemoryLimit
    other than off) whose pods the toolkit's hook cannot cover: MIG devices, or no
    generated config to inject its GPUs through CDI

with --nodes FILE (`kubectl get nodes -o yaml`), per pool of a policy that writes the
driver memory limit, the nodes matching its nodeSelector labelled
gpushare.io/driver-memory-limit=true by the node agent:
  - none, under driverMemoryLimit: require: error (its pods stay Pending)
  - none, or only some, under auto or inject: warning (its pods run there uncapped)

A file holding Kubernetes manifests (a Deployment, a Service) instead of policies is one
error line (check pods and workloads with `gpushare mutate -f FILE`) and is left out of the
set.

Each line reads `file: yaml.path: error|warning: what to change (line N)`; then a summary
line on stdout (on stderr when the set does not load, as every command refuses it)."""


def add_policy_commands(commands: Commands) -> None:
    """``gpushare policy`` with ``check`` and ``schema``."""
    command = commands.add_parser(
        "policy",
        help="check policies as a set, print their JSON Schema",
        description="Tools for policy authors: check a set of policy files, print the JSON "
        "Schema of policy documents for editors.",
    )
    policy_commands = command.add_subcommands(
        dest="policy_command", metavar="COMMAND", title="commands"
    )
    command.set_defaults(func=None, parser=command.parser)
    check = policy_commands.add_parser(
        "check",
        help="check policy files or directories as one set (exit 2 on errors)",
        description=CHECK_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    check.add_argument(
        "paths",
        nargs="+",
        type=Path,
        metavar="PATH",
        help="policy file or directory; all of them together are the set",
    )
    check.add_argument(
        "--nodes",
        metavar="FILE",
        help="the cluster's nodes (`kubectl get nodes -o yaml`, - for stdin): say which pools "
        "have no node enforcing the driver memory limit (gpushare.io/driver-memory-limit)",
    )
    check.set_defaults(func=run_policy_check)
    schema = policy_commands.add_parser(
        "schema",
        help="print the JSON Schema of policy documents",
        description="Print the JSON Schema (draft 2020-12) of GpuSharingPolicy and "
        "GpuSharingSettings documents, for editors and CI validators.",
    )
    schema.set_defaults(func=run_policy_schema)


def run_policy_check(args: argparse.Namespace) -> int:
    where = ", ".join(str(path) for path in args.paths)
    nodes = None if args.nodes is None else read_nodes(args.nodes)
    try:
        texts = _read(args.paths)
    except PolicyError as error:
        lines = _error_lines(error.problems, [str(path) for path in args.paths])
        return _refused(where, lines, _NOT_LOADED)
    manifests = _manifest_lines(texts)
    rest = [(name, text) for name, text in texts if name not in manifests]
    if not rest:
        return _refused(where, list(manifests.values()), "no policy file left to check")
    try:
        policies = load_policy_texts(rest)
    except PolicyError as error:
        lines = _error_lines(error.problems, [name for name, _ in rest])
        return _refused(where, [*manifests.values(), *lines], _NOT_LOADED)
    findings = [*check_policy_set(policies), *device_plugin_findings(policies)]
    if nodes is not None:
        findings += enforcing_node_findings(policies, nodes)
    for line in [*manifests.values(), *finding_lines(findings, rest)]:
        print(line, file=sys.stderr)
    errors = len(manifests) + sum(f.severity is Severity.ERROR for f in findings)
    warnings = sum(f.severity is not Severity.ERROR for f in findings)
    names = ", ".join(p.name for p in policies.policies)
    count = len(policies.policies)
    checked = f"{count} {'policy' if count == 1 else 'policies'}: {names}"
    if errors:
        print(f"{where}: {errors} error(s), {warnings} warning(s) ({checked})")
        return EXIT_USAGE
    print(f"{where}: ok ({checked}{f'; {warnings} warning(s)' if warnings else ''})")
    return EXIT_OK


def _refused(where: str, lines: list[str], why: str) -> int:
    """No set to check: the error lines and a summary, all on stderr (stdout stays empty, as
    in every command that refuses invalid policies)."""
    for line in lines:
        print(line, file=sys.stderr)
    print(f"{where}: {len(lines)} error(s), 0 warning(s) ({why})", file=sys.stderr)
    return EXIT_USAGE


def _error_lines(problems: list[str], names: list[str]) -> list[str]:
    """The loader's ``file: yaml.path: problem`` lines as ``file: yaml.path: error: problem``,
    the form of every finding of ``check``."""
    # Longest first: a file name that begins another one's; the joined names of `<files>`.
    sources = sorted({*names, ", ".join(names)}, key=len, reverse=True)
    lines = []
    for problem in problems:
        source = next((s for s in sources if s and problem.startswith(f"{s}: ")), None)
        head, rest = (
            (source, problem[len(source) + 2 :])
            if source is not None
            else problem.partition(": ")[::2]
        )
        path, separator, message = rest.partition(": ")
        lines.append(f"{head}: {path}: error: {message}" if separator else f"{head}: error: {rest}")
    return lines


def _manifest_lines(texts: list[tuple[str, str]]) -> dict[str, str]:
    """file -> its error line, for each file holding Kubernetes manifests rather than
    policies: the loader's schema lines about a Deployment say nothing useful."""
    found: dict[str, str] = {}
    for name, text in texts:
        try:
            documents = parse_documents(name, text)
        except ManifestError:
            continue  # not YAML: the loader says where
        manifests = [d for d in documents if _manifest_kind(d.content)]
        if not manifests:
            continue
        kinds = list(dict.fromkeys(_manifest_kind(d.content) for d in manifests))
        pods = any(_has_pods(d.content) for d in manifests)
        hint = f"check it with `gpushare mutate -f {name}`" if pods else _POLICY_FORM
        if len(manifests) == len(documents):
            what = (
                f"this is {_a(kinds[0])} manifest"
                if len(manifests) == 1
                else f"this holds Kubernetes manifests ({', '.join(kinds)})"
            )
            found[name] = f"{name}: <file>: error: {what}, not a gpushare policy file: {hint}"
        else:
            first = manifests[0]
            found[name] = (
                f"{name}: [document {first.index + 1}]: error: is "
                f"{_a(_manifest_kind(first.content))} manifest, not a gpushare policy: keep it "
                f"out of policy files ({hint}); nothing else in this file was checked "
                f"(line {first.line})"
            )
    return found


def _a(kind: str) -> str:
    return f"{'an' if kind[:1] in 'AEIOU' else 'a'} {kind}"


_NOT_LOADED = "the set does not load: the checks across policies run once these are fixed"
_POLICY_FORM = f"policies have apiVersion {API_GROUP}/v1alpha1 and kind GpuSharingPolicy"


def _manifest_kind(content: object) -> str:
    """The kind of a Kubernetes object that is not a gpushare document, else ''."""
    if not isinstance(content, dict):
        return ""
    kind = content.get("kind")
    if not isinstance(kind, str) or not kind or kind.startswith("GpuSharing"):
        return ""  # not an object, or a policy (perhaps misspelt): the loader's to say
    return "" if api_group(content.get("apiVersion")) == API_GROUP else kind


def _has_pods(content: Any) -> bool:
    """A Pod or a workload: what `gpushare mutate` has something to say about."""
    group = api_group(content.get("apiVersion"))
    kind = content.get("kind")
    return (kind == "Pod" and group == "") or workload_kind(group, kind) is not None


def _read(paths: list[Path]) -> list[tuple[str, str]]:
    """The texts of every file the paths mean, each file once; every unreadable path named."""
    texts: dict[Path, tuple[str, str]] = {}
    problems: list[str] = []
    for path in paths:
        try:
            for name, text in read_policy_files(path):
                texts.setdefault(Path(name).resolve(), (name, text))
        except PolicyError as error:
            problems += error.problems
    if problems:
        raise PolicyError(problems)
    return list(texts.values())


def device_plugin_findings(policies: PolicySet) -> list[SetFinding]:
    """The node side's view of the pools: clashing device-plugin configs (errors), pools
    whose config the device plugin cannot express and pools whose pods the driver memory
    limit's hook cannot cover (warnings)."""
    refs = pool_refs(policies)
    findings = [
        SetFinding(Severity.ERROR, ref.policy, _pool_at(ref.policy, ref.pool.name), problem)
        for ref, problem in pool_conflict_refs(refs, key=lambda r: r.pool.config_name)
    ]
    for ref in refs:
        at = _pool_at(ref.policy, ref.pool.name)
        for problem in pool_problems(ref):
            message = f"`gpushare device-plugin-config` cannot generate its config: {problem}"
            findings.append(SetFinding(Severity.WARNING, ref.policy, at, message))
        for problem in hook_problems(ref):
            findings.append(SetFinding(Severity.WARNING, ref.policy, at, problem))
    return findings


def _pool_at(policy: Policy, name: str) -> tuple[str | int, ...]:
    index = next(i for i, pool in enumerate(policy.pools) if pool.name == name)
    return ("spec", "pools", index)


def run_policy_schema(args: argparse.Namespace) -> int:
    print(json.dumps(document_schema(), indent=2))
    return EXIT_OK
