"""Test-only entry point: ``gpushare node-agent`` as shipped against a real apiserver, with
only the GPUs faked.

    python tests/node/fake_gpu_cluster_agent.py GPUS.json REQUESTS.log node-agent \
        --kubeconfig KUBECONFIG [flags]

GPUS.json is a ``FakeNvml`` inventory (``fake_nvml.py``); the node and its pods are read and
written through the real ``KubernetesNodeApi`` and ``KubernetesPodApi`` the CLI builds from
``--kubeconfig``. Every HTTP request the Kubernetes client sends is appended to REQUESTS.log
as ``METHOD URL`` (one a line), so a test can compare what the agent did with what its RBAC
grants. The rest are the real CLI's arguments, parsed by its own parser and run by its own
entry point. tests/e2e/test_node_agent_cluster.py runs the agent this way;
``fake_gpu_node_agent.py`` is the variant with the API faked too.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

from fake_nvml import FakeNvml
from kubernetes.client import rest

from webhook.cli import build_parser
from webhook.cli.node_commands import run_node_agent_command
from webhook.node import AgentClients


def record_requests(log: Path) -> None:
    """Append ``METHOD URL`` to ``log`` for every request the Kubernetes client sends."""
    send = rest.RESTClientObject.request
    lock = threading.Lock()

    def request(self: rest.RESTClientObject, method: str, url: str, *args: Any, **kw: Any) -> Any:
        with lock, log.open("a") as handle:
            handle.write(f"{method} {url}\n")
        return send(self, method, url, *args, **kw)

    rest.RESTClientObject.request = request  # type: ignore[method-assign]


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[2] != "node-agent":
        print(f"usage: {Path(__file__).name} GPUS.json REQUESTS.log node-agent [flags]",
              file=sys.stderr)  # fmt: skip
        return 2
    inventory, requests, *cli_args = argv
    record_requests(Path(requests))
    args = build_parser().parse_args(cli_args)
    return run_node_agent_command(args, AgentClients(nvml=FakeNvml.from_file(Path(inventory))))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
