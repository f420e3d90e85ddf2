"""The ``gpushare`` command: one parser with a subcommand per tool, and ``main``.

Each subcommand is added by a module of its own in this package; ``main`` turns the errors
every command may raise into their exit codes (``exit_codes``).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import sys
from collections.abc import Sequence

from webhook.cli.check_command import add_check_command
from webhook.cli.command_tree import Command
from webhook.cli.compile_command import add_compile_command
from webhook.cli.dra_command import add_dra_command
from webhook.cli.exit_codes import EXIT_BROKEN_PIPE, EXIT_USAGE
from webhook.cli.install_commands import add_install_commands
from webhook.cli.manifest_commands import add_manifest_commands
from webhook.cli.node_commands import add_node_commands
from webhook.cli.plan_command import add_plan_command
from webhook.cli.policy_commands import add_policy_commands
from webhook.cli.serve_command import add_serve_command
from webhook.cli.share_capacity_command import add_share_capacity_command
from webhook.errors import GpushareError, ManifestError, PolicyError


def build_command_tree() -> Command:
    """The ``gpushare`` command with every subcommand, each with the arguments it was given
    (``Command.walk`` visits them all; ``build_parser`` is the root's parser)."""
    parser = argparse.ArgumentParser(
        prog="gpushare",
        description=(
            "Turn a gpu-fraction or gpu-memory annotation into what the cluster's GPU sharing "
            "needs: the admission webhook (serve), its installation (certs, webhook-config, "
            "check-admission), "
            "the node side (device-plugin-config, mps-daemon, node-agent) and offline tools for "
            "manifests and policies (mutate, explain, policy), and what a workload mix needs "
            "under each scheme (plan). `gpushare COMMAND --help` for each."
        ),
        epilog="Exit codes: 0 ok, 2 usage errors and invalid input or policies, 3 a document "
        "denied (mutate, explain), 1 other failures.",
    )
    command = Command(parser)
    command.add_argument("--version", action="version", version=f"gpushare {package_version()}")
    command.set_defaults(func=None, parser=parser)
    commands = command.add_subcommands(dest="command", metavar="COMMAND", title="commands")

    add_manifest_commands(commands)
    add_policy_commands(commands)
    add_plan_command(commands)
    add_serve_command(commands)
    add_install_commands(commands)
    add_check_command(commands)
    add_node_commands(commands)
    add_dra_command(commands)
    add_share_capacity_command(commands)
    add_compile_command(commands)
    return command


def build_parser() -> argparse.ArgumentParser:
    return build_command_tree().parser


def package_version() -> str:
    """The installed distribution's version (pyproject.toml), as pip reports it."""
    try:
        return importlib.metadata.version("gpushare")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed: pip install -e .)"


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
