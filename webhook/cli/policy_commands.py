"""``gpushare policy check`` and ``gpushare policy schema``: the policy authors' commands.

``check`` reads every path given as one set, as the webhook would load them from one
directory, and reports in three steps: what makes the set invalid (the loader's problems,
which every command that loads policies refuses with exit 2), what makes it unworkable
(errors: exit 2) and what has no effect (warnings: exit 0). One line per finding:
``file: yaml.path: severity: what is wrong (line N)``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from webhook.cli.command_tree import Commands
from webhook.cli.exit_codes import EXIT_OK, EXIT_USAGE
from webhook.core import (
    Policy,
    PolicySet,
    SetFinding,
    Severity,
    check_policy_set,
    document_schema,
    finding_lines,
    load_policy_texts,
    read_policy_files,
)
from webhook.errors import PolicyError
from webhook.node import pool_conflict_refs, pool_problems, pool_refs

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

Each line reads `file: yaml.path: error|warning: what to change (line N)`; then a summary
line on stdout."""


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
    check.set_defaults(func=run_policy_check)
    schema = policy_commands.add_parser(
        "schema",
        help="print the JSON Schema of policy documents",
        description="Print the JSON Schema (draft 2020-12) of GpuSharingPolicy and "
        "GpuSharingSettings documents, for editors and CI validators.",
    )
    schema.set_defaults(func=run_policy_schema)


def run_policy_check(args: argparse.Namespace) -> int:
    texts = _read(args.paths)
    policies = load_policy_texts(texts)  # PolicyError: the CLI prints it and exits 2
    findings = [*check_policy_set(policies), *device_plugin_findings(policies)]
    for line in finding_lines(findings, texts):
        print(line, file=sys.stderr)
    errors = sum(f.severity is Severity.ERROR for f in findings)
    warnings = len(findings) - errors
    names = ", ".join(p.name for p in policies.policies)
    count = len(policies.policies)
    checked = f"{count} {'policy' if count == 1 else 'policies'}: {names}"
    where = ", ".join(str(path) for path in args.paths)
    if errors:
        print(f"{where}: {errors} error(s), {warnings} warning(s) ({checked})")
        return EXIT_USAGE
    print(f"{where}: ok ({checked}{f'; {warnings} warning(s)' if warnings else ''})")
    return EXIT_OK


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
    """The node side's view of the pools: clashing device-plugin configs (errors) and pools
    whose config the device plugin cannot express (warnings)."""
    refs = pool_refs(policies)
    findings = [
        SetFinding(Severity.ERROR, ref.policy, _pool_at(ref.policy, ref.pool.name), problem)
        for ref, problem in pool_conflict_refs(refs, key=lambda r: r.pool.config_name)
    ]
    for ref in refs:
        for problem in pool_problems(ref):
            message = f"`gpushare device-plugin-config` cannot generate its config: {problem}"
            at = _pool_at(ref.policy, ref.pool.name)
            findings.append(SetFinding(Severity.WARNING, ref.policy, at, message))
    return findings


def _pool_at(policy: Policy, name: str) -> tuple[str | int, ...]:
    index = next(i for i, pool in enumerate(policy.pools) if pool.name == name)
    return ("spec", "pools", index)


def run_policy_schema(args: argparse.Namespace) -> int:
    print(json.dumps(document_schema(), indent=2))
    return EXIT_OK
