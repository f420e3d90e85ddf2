"""The ``gpushare`` command: offline policy tools here, server and node commands plugged in.

Exit codes (a contract other tools rely on): 0 admitted (mutated or untouched), 3 denied
(one reason per line on stderr), 2 usage errors, unreadable input or invalid policies.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from webhook.core import (
    Denied,
    Planned,
    Untouched,
    Verdict,
    default_policies_path,
    document_schema,
    load_policies,
    mutate,
    mutated_pod,
)
from webhook.errors import GpushareError, ManifestError, PolicyError
from webhook.manifest import read_pod

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_DENIED = 3


def _policies_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--policies",
        metavar="PATH",
        type=Path,
        default=None,
        help="policy file or directory (default: $GPUSHARE_POLICIES, ./policies, "
        "the checkout's policies/, /etc/gpushare/policies)",
    )


def _load(args: argparse.Namespace) -> tuple[dict[str, Any], str, Any]:
    pod = read_pod(args.file)
    policies = load_policies(args.policies or default_policies_path())
    namespace = args.namespace or (pod.get("metadata") or {}).get("namespace") or "default"
    return pod, namespace, policies


def _report(outcome: Verdict) -> int:
    for warning in outcome.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if not outcome.allowed:
        for reason in outcome.reasons:
            print(f"denied: {reason}", file=sys.stderr)
        return EXIT_DENIED
    return EXIT_OK


def _cmd_mutate(args: argparse.Namespace) -> int:
    pod, namespace, policies = _load(args)
    outcome = mutate(pod, namespace, policies)
    code = _report(outcome)
    if code != EXIT_OK:
        return code
    if args.output == "patch":
        print(json.dumps(outcome.patch, indent=2))
        return EXIT_OK
    assert outcome.decision is not None
    result = mutated_pod(pod, outcome.decision)
    if args.output == "json":
        print(json.dumps(result, indent=2))
    else:
        print(yaml.safe_dump(result, sort_keys=False), end="")
    return EXIT_OK


def _cmd_explain(args: argparse.Namespace) -> int:
    pod, namespace, policies = _load(args)
    outcome = mutate(pod, namespace, policies, explain=True)
    decision = outcome.decision
    print(f"namespace: {namespace}")
    if isinstance(decision, Untouched):
        print(f"decision: untouched ({decision.reason})")
    elif isinstance(decision, Denied):
        print(f"decision: denied by policy {decision.policy!r}")
        for reason in decision.reasons:
            print(f"  - {reason}")
    elif isinstance(decision, Planned):
        print("decision: mutated")
        for line in decision.explanation:
            print(line)
        print(f"recorded in annotation: {json.dumps(dict(decision.record), sort_keys=True)}")
        print(
            f"patch: {len(outcome.patch)} operation(s)"
            + (" (already mutated: nothing to change)" if not outcome.patch else "")
        )
    for warning in outcome.warnings:
        print(f"warning: {warning}")
    return EXIT_OK if outcome.allowed else EXIT_DENIED


def _cmd_policy_check(args: argparse.Namespace) -> int:
    failed = False
    for path in args.paths:
        try:
            policy_set = load_policies(path)
        except PolicyError as error:
            failed = True
            for problem in error.problems:
                print(problem, file=sys.stderr)
            continue
        names = ", ".join(p.name for p in policy_set.policies)
        count = len(policy_set.policies)
        print(f"{path}: ok ({count} {'policy' if count == 1 else 'policies'}: {names})")
    return EXIT_USAGE if failed else EXIT_OK


def _cmd_policy_schema(args: argparse.Namespace) -> int:
    print(json.dumps(document_schema(), indent=2))
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpushare",
        description="Turn a gpu-fraction annotation into what the cluster's GPU sharing needs.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    mutate_parser = commands.add_parser("mutate", help="print a Pod as the webhook would admit it")
    mutate_parser.add_argument(
        "-f", "--file", required=True, help="Pod manifest (YAML/JSON), - for stdin"
    )
    _policies_argument(mutate_parser)
    mutate_parser.add_argument(
        "--namespace", "-n", help="namespace (default: the Pod's, else default)"
    )
    mutate_parser.add_argument("-o", "--output", choices=("yaml", "json", "patch"), default="yaml")
    mutate_parser.set_defaults(func=_cmd_mutate)

    explain_parser = commands.add_parser("explain", help="say which policy applies and why")
    explain_parser.add_argument("-f", "--file", required=True, help="Pod manifest, - for stdin")
    _policies_argument(explain_parser)
    explain_parser.add_argument("--namespace", "-n")
    explain_parser.set_defaults(func=_cmd_explain)

    policy_parser = commands.add_parser("policy", help="check policies, print their JSON Schema")
    policy_commands = policy_parser.add_subparsers(dest="policy_command", required=True)
    check_parser = policy_commands.add_parser("check", help="validate policy files or folders")
    check_parser.add_argument("paths", nargs="+", type=Path, metavar="PATH")
    check_parser.set_defaults(func=_cmd_policy_check)
    schema_parser = policy_commands.add_parser("schema", help="print the JSON Schema")
    schema_parser.set_defaults(func=_cmd_policy_schema)

    _add_plugged_commands(commands)
    return parser


def _add_plugged_commands(commands: Any) -> None:
    """Server and node commands live with their edges, imported only when the CLI is built."""
    from webhook.node.commands import add_node_commands
    from webhook.server.commands import add_server_commands

    add_server_commands(commands)
    add_node_commands(commands)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
    except (ManifestError, PolicyError) as error:
        print(str(error), file=sys.stderr)
        return EXIT_USAGE
    except GpushareError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    return code


if __name__ == "__main__":
    sys.exit(main())
