"""``gpushare compile``: the CLI edge of the compiler (read policies, print YAML, say what is
left out); the compiler itself is pure (``webhook.compile``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from webhook.cli.command_tree import Commands
from webhook.cli.exit_codes import EXIT_OK, EXIT_USAGE
from webhook.cli.options import add_policies_option
from webhook.compile import (
    REINVOCATION_POLICIES,
    CompileRefusedError,
    compile_policies,
    notes,
)
from webhook.core import default_policies_path, load_policies

DESCRIPTION = """\
Compile the YAML policies into Kubernetes admission policies (admissionregistration.k8s.io/v1,
Kubernetes 1.36+): per policy a MutatingAdmissionPolicy doing the webhook's mutation, one
ValidatingAdmissionPolicy giving the denials, and their bindings. Apply the output with
kubectl apply -f and no webhook is in the pod path. What CEL cannot do as the webhook does is
refused (exit 2, one line per policy field saying why); what is only left out (admission
warnings) is listed on stderr.
"""


def run_compile(args: argparse.Namespace) -> int:
    policies = load_policies(args.policies or default_policies_path())
    try:
        documents = compile_policies(policies, args.reinvocation)
    except CompileRefusedError as error:
        # Every line prefixed (`main` prints a GpushareError behind one prefix).
        for line in str(error).splitlines():
            print(f"error: {line}", file=sys.stderr)
        return EXIT_USAGE
    text = yaml.safe_dump_all(documents, sort_keys=False, width=1 << 20)
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.write_text(text, encoding="utf-8")
    for note in notes(policies):
        print(f"note: {note}", file=sys.stderr)
    return EXIT_OK


def add_compile_command(commands: Commands) -> None:
    parser = commands.add_parser(
        "compile",
        help="compile the policies into Mutating/ValidatingAdmissionPolicies (no webhook)",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_policies_option(parser)
    parser.add_argument(
        "--out", metavar="FILE", type=Path, default=None, help="write here, not to stdout"
    )
    parser.add_argument(
        "--reinvocation",
        choices=REINVOCATION_POLICIES,
        default=REINVOCATION_POLICIES[0],
        help="the mutating policies' reinvocationPolicy (default: %(default)s). Kubernetes "
        "calls an IfNeeded policy again after its own change, which doubles its cost per "
        "pod; choose IfNeeded where later mutating webhooks change GPU pods' containers, "
        "annotations or node selection and gpushare should plan again after them",
    )
    parser.set_defaults(func=run_compile)
