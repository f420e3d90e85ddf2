"""``python -m webhook.server serve|certs|webhook-config``: the server commands without the CLI.

The ``gpushare`` console script (``webhook.cli``) offers the same commands; this entry point
exists so the service runs from a checkout whatever else the CLI grows.
"""

from __future__ import annotations

import argparse
import sys

from webhook.server.commands import add_server_commands


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m webhook.server",
        description="The server commands of gpushare (serve, certs, webhook-config) without "
        "the rest of the CLI.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_server_commands(subparsers)
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
