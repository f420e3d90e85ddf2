"""Test-only entry point: ``gpushare mps-daemon`` as shipped, with fake GPUs instead of NVML.

    python tests/node/fake_gpu_launcher.py GPUS.json mps-daemon --policies ... [flags]

The first argument is a ``FakeNvml`` inventory file (see ``fake_nvml.py``); the rest are the
real CLI's arguments, parsed by its own parser and run by its own ``run_mps_daemon``, so
only the GPU discovery is faked. tests/node/test_mps_daemon_command.py and
tests/e2e/test_node_labelling.py start the launcher this way on machines without GPUs; the
shipped CLI has no way to fake GPUs.
"""

from __future__ import annotations

import sys
from pathlib import Path

from fake_nvml import FakeNvml

from webhook.cli import build_parser
from webhook.cli.node_commands import run_mps_daemon


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[1] != "mps-daemon":
        print(f"usage: {Path(__file__).name} GPUS.json mps-daemon [flags]", file=sys.stderr)
        return 2
    inventory, *cli_args = argv
    args = build_parser().parse_args(cli_args)
    return run_mps_daemon(args, nvml=FakeNvml.from_file(Path(inventory)))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
