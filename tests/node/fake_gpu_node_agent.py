"""Test-only entry point: ``gpushare node-agent`` as shipped, with fake GPUs, pods and node.

    python tests/node/fake_gpu_node_agent.py GPUS.json PODS.json node-agent [flags]

GPUS.json is a ``FakeNvml`` inventory (``fake_nvml.py``: GPUs, driver version, processes);
PODS.json a list of Pod objects (``FakePodApi.from_file``); the node is a
``RecordingNodeApi`` in memory. The rest are the real CLI's arguments, parsed by its own
parser and run by its own entry point; /proc, /sys/fs/cgroup and the CDI specs are read from
the directories the flags name. tests/test_monitoring.py scrapes the agent this way.
"""

from __future__ import annotations

import sys
from pathlib import Path

from agent_fakes import FakePodApi
from fake_nvml import FakeNvml
from node_fakes import RecordingNodeApi

from webhook.cli import build_parser
from webhook.cli.node_commands import run_node_agent_command
from webhook.node import AgentClients


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[2] != "node-agent":
        print(f"usage: {Path(__file__).name} GPUS.json PODS.json node-agent [flags]",
              file=sys.stderr)  # fmt: skip
        return 2
    inventory, pods, *cli_args = argv
    args = build_parser().parse_args(cli_args)
    clients = AgentClients(
        nvml=FakeNvml.from_file(Path(inventory)),
        node=RecordingNodeApi(args.node_name or "gpu-node-1"),
        pods=FakePodApi.from_file(Path(pods)),
    )
    return run_node_agent_command(args, clients)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
