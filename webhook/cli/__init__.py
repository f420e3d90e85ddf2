"""The ``gpushare`` command line: argument parsing and printing around the other packages.

Layout: docs/architecture.md.
"""

from webhook.cli.command_tree import Command
from webhook.cli.exit_codes import EXIT_BROKEN_PIPE, EXIT_DENIED, EXIT_FAILED, EXIT_OK, EXIT_USAGE
from webhook.cli.gpushare import build_command_tree, build_parser, main

__all__ = [
    "EXIT_BROKEN_PIPE",
    "EXIT_DENIED",
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_USAGE",
    "Command",
    "build_command_tree",
    "build_parser",
    "main",
]
