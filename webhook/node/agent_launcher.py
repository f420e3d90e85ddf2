"""``gpushare node-agent`` put together: options, NVML, the node's and pods' APIs, the agent,
its status server, signals; or, with ``once``, one read-only round printed as JSON.

The command line (``webhook.cli``) only turns flags into ``NodeAgentOptions``; tests pass
their own NVML, NodeApi and PodApi in ``AgentClients``.
"""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from webhook.errors import GpushareError
from webhook.node.agent_metrics import NodeAgentMetrics
from webhook.node.errors import NodeSetupError
from webhook.node.events import configure as configure_events
from webhook.node.events import emit
from webhook.node.launcher import parse_listen
from webhook.node.node_agent import DEFAULT_AGENT_LISTEN, DEFAULT_INTERVAL_S, AgentPaths, NodeAgent
from webhook.node.node_api import NodeApi
from webhook.node.nvml import Nvml, PynvmlNvml
from webhook.node.pod_api import PodApi
from webhook.node.process_signals import run_until_signalled
from webhook.node.status_server import StatusServer

EXIT_OK = 0
EXIT_ERROR = 1


@dataclass(frozen=True)
class NodeAgentOptions:
    """What ``gpushare node-agent`` was asked to do."""

    node_name: str | None
    kubeconfig: Path | None = None
    interval_s: float = DEFAULT_INTERVAL_S
    # HOST:PORT for /healthz, /readyz and /metrics.
    listen: str = DEFAULT_AGENT_LISTEN
    paths: AgentPaths = field(default_factory=AgentPaths)
    # One read-only round, printed as JSON, then exit.
    once: bool = False


@dataclass(frozen=True)
class AgentClients:
    """Stand-ins for the real NVML and Kubernetes APIs (tests)."""

    nvml: Nvml | None = None
    node: NodeApi | None = None
    pods: PodApi | None = None


def run_node_agent(
    options: NodeAgentOptions, clients: AgentClients | None = None, out: IO[str] | None = None
) -> int:
    """Run the agent until SIGTERM or SIGINT (or one round with ``once``)."""
    configure_events()
    try:
        agent = _agent(options, clients or AgentClients())
    except (GpushareError, OSError) as exc:
        emit("startup_failed", " ".join(str(exc).split()), level=logging.ERROR)
        return EXIT_ERROR
    if options.once:
        result = agent.observe()
        json.dump(result.as_json(agent.node.node_name), out or sys.stdout, indent=2)
        (out or sys.stdout).write("\n")
        return EXIT_OK
    host, port = parse_listen(options.listen)
    server = StatusServer(host, port, agent.metrics, agent.health)
    return _serve(agent, server)


def _agent(options: NodeAgentOptions, clients: AgentClients) -> NodeAgent:
    if options.interval_s <= 0:
        raise NodeSetupError(f"--interval {options.interval_s:g} must be more than 0 seconds.")
    parse_listen(options.listen)
    if not options.node_name:
        raise NodeSetupError(
            "The node name is unknown: pass --node-name or set NODE_NAME (the DaemonSet sets "
            "it from spec.nodeName through the downward API)."
        )
    node, pods = clients.node, clients.pods
    if node is None or pods is None:
        # The Kubernetes client (the extra gpushare[cluster]) only now, when the agent starts.
        from webhook.node.kube_node_api import KubernetesNodeApi, connect_client
        from webhook.node.kube_pod_api import KubernetesPodApi

        api_client = connect_client(options.kubeconfig)
        node = node or KubernetesNodeApi(api_client, options.node_name)
        pods = pods or KubernetesPodApi(api_client, options.node_name)
    return NodeAgent(
        nvml=clients.nvml or PynvmlNvml(),
        node=node,
        pods=pods,
        paths=options.paths,
        metrics=NodeAgentMetrics(),
        interval_s=options.interval_s,
    )


def _serve(agent: NodeAgent, server: StatusServer) -> int:
    try:
        return run_until_signalled(server, agent.run)
    finally:
        agent.nvml.shutdown()
