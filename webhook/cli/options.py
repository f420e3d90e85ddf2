"""The options several ``gpushare`` commands share, each defined once with its help.

A command adds a shared option by calling its function here rather than writing its own
``add_argument``, so the flag, its type and the help that describes it cannot drift apart
between commands. Options of one command alone stay with that command.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from webhook.cli.command_tree import Arguments
from webhook.manifest import MANIFEST_SUFFIXES

POLICIES_VARIABLE = "GPUSHARE_POLICIES"
POLICIES_HELP = (
    "policy file or directory (default: $GPUSHARE_POLICIES, ./policies, the checkout's "
    "policies/, /etc/gpushare/policies)"
)
IN_CLUSTER_KUBECONFIG_HELP = "kubeconfig (default: the in-cluster ServiceAccount)"


def add_policies_option(
    parser: Arguments, *, role: str = "", search: bool = True
) -> argparse.Action:
    """``--policies PATH``, the policy files a command loads.

    ``role`` says what the command does with them, before the common help. With ``search``
    (most commands) a missing flag is None and the command loads ``default_policies_path()``,
    which looks where the help says. Without it (``mps-daemon``, whose DaemonSet must name
    the files the webhook loads) only ``$GPUSHARE_POLICIES`` stands in for the flag, and one
    of the two is required. Returns the action (``serve`` lists its settings' flags).
    """
    if search:
        action: argparse.Action = parser.add_argument(
            "--policies", metavar="PATH", type=Path, default=None, help=role + POLICIES_HELP
        )
        return action
    from_environment = os.environ.get(POLICIES_VARIABLE)
    action = parser.add_argument(
        "--policies",
        metavar="PATH",
        type=Path,
        default=Path(from_environment) if from_environment else None,
        required=not from_environment,
        help=f"{role}policy file or directory (default: ${POLICIES_VARIABLE}; one of the two "
        "is required)",
    )
    return action


def add_kubeconfig_option(parser: Arguments, *, when: str = "") -> None:
    """``--kubeconfig FILE`` for a command that runs in the cluster under its own
    ServiceAccount (certgen Jobs, the MPS daemon, the DRA template reconciler); ``when`` says
    which of the command's modes use it."""
    parser.add_argument(
        "--kubeconfig",
        type=Path,
        metavar="FILE",
        default=None,
        help=f"{when}{IN_CLUSTER_KUBECONFIG_HELP}",
    )


def add_manifest_file_option(target: Arguments, *, required: bool, note: str = "") -> None:
    """``-f/--file PATH``, repeatable: manifests as ``webhook.manifest.read_manifests`` reads
    them (``note`` adds what the command makes of them)."""
    target.add_argument(
        "-f",
        "--file",
        required=required,
        action="append",
        metavar="PATH",
        help=f"manifest file, directory (its {', '.join(MANIFEST_SUFFIXES)} files, sorted by "
        f"name) or - for stdin{note}; repeat for more",
    )


def add_recursive_option(parser: Arguments) -> None:
    """``-R/--recursive``, with ``-f``: the subdirectories too."""
    parser.add_argument(
        "-R",
        "--recursive",
        action="store_true",
        help="also read the subdirectories of directories given with -f (hidden ones and "
        "links to directories are skipped)",
    )


def add_certificate_name_options(target: Arguments, certificate: str) -> None:
    """``--ip`` and ``--dns``, repeatable: names a certificate carries besides its own
    (``certificate`` says which one)."""
    target.add_argument(
        "--ip",
        action="append",
        default=[],
        help=f"extra IP address {certificate} names (repeatable)",
    )
    target.add_argument(
        "--dns",
        action="append",
        default=[],
        help=f"extra DNS name {certificate} names (repeatable)",
    )


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive integer")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is not 0 or a positive integer")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number")
    return value
