"""The MPS daemon launcher (``gpushare mps-daemon``) put together: policies, pool, GPUs,
node, control daemon, supervisor and status server, checked in the order that fails cheapest
first, then run until SIGTERM.

Errors become one clear event line and an exit code; the work happens in the modules it
calls. The command line (``webhook.cli``) only turns flags into ``LauncherOptions``.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path

from webhook.constants import DEVICE_PLUGIN_CONFIG_LABEL
from webhook.core import Allocation, load_policies
from webhook.errors import GpushareError, PolicyError
from webhook.node.errors import InvalidPoliciesError, NodeSetupError
from webhook.node.events import configure as configure_events
from webhook.node.events import emit
from webhook.node.mps_control import (
    DEFAULT_CONTROL_BINARY,
    MpsControl,
    daemon_defaults,
    resolve_binary,
)
from webhook.node.node_api import NodeApi
from webhook.node.nvml import GpuDevice, Nvml, PynvmlNvml, discover_gpus
from webhook.node.pools import PoolRef, find_daemon_pool
from webhook.node.process_signals import run_until_signalled
from webhook.node.status_server import LauncherMetrics, StatusServer
from webhook.node.supervisor import MpsSupervisor, SupervisorSettings

DEFAULT_LISTEN = "0.0.0.0:9400"
DEFAULT_COMMAND_TIMEOUT_S = 10.0
DEFAULT_START_TIMEOUT_S = 30.0
EXIT_ERROR = 1
# Invalid policies, as in every gpushare command that loads them.
EXIT_INVALID_POLICIES = 2


@dataclass(frozen=True)
class LauncherOptions:
    """What ``gpushare mps-daemon`` was asked to do."""

    # The policy file or directory, the same the webhook loads.
    policies: Path
    # This node's name (the DaemonSet sets it from spec.nodeName).
    node_name: str | None
    # The pool this node serves; None: the one the node's device-plugin config label names.
    pool: str | None = None
    # None: the in-cluster ServiceAccount.
    kubeconfig: Path | None = None
    mps_control: str = DEFAULT_CONTROL_BINARY
    # HOST:PORT for /healthz, /readyz and /metrics.
    listen: str = DEFAULT_LISTEN
    supervisor: SupervisorSettings = field(default_factory=SupervisorSettings)
    command_timeout_s: float = DEFAULT_COMMAND_TIMEOUT_S
    start_timeout_s: float = DEFAULT_START_TIMEOUT_S


def parse_listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise NodeSetupError(f"--listen {text!r} is not HOST:PORT (e.g. 0.0.0.0:9400).")
    return host.strip("[]") or "0.0.0.0", int(port)


def run_launcher(options: LauncherOptions, nvml: Nvml | None = None) -> int:
    """Run the launcher until SIGTERM or SIGINT; ``nvml`` replaces the real NVML in tests."""
    configure_events()
    try:
        supervisor, server = _prepare(options, nvml or PynvmlNvml())
    except (GpushareError, OSError) as exc:
        emit("startup_failed", _one_line(exc), level=logging.ERROR)
        return EXIT_INVALID_POLICIES if isinstance(exc, InvalidPoliciesError) else EXIT_ERROR

    def supervise(stop: threading.Event) -> int:
        try:
            return supervisor.run(stop)
        except GpushareError as exc:
            emit("startup_failed", _one_line(exc), level=logging.ERROR)
            return EXIT_ERROR

    return run_until_signalled(server, supervise)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def _prepare(options: LauncherOptions, nvml: Nvml) -> tuple[MpsSupervisor, StatusServer]:
    """Everything the launcher needs, checked in the order that fails cheapest first."""
    host, port = parse_listen(options.listen)
    try:
        policies = load_policies(options.policies)
    except PolicyError as exc:
        raise InvalidPoliciesError(
            f"The policies in {options.policies} are invalid: {exc}"
        ) from exc
    if not options.node_name:
        raise NodeSetupError(
            "The node name is unknown: pass --node-name or set NODE_NAME (the DaemonSet sets "
            "it from spec.nodeName through the downward API)."
        )
    ref = None
    if options.pool is not None:
        ref = find_daemon_pool(policies, pool_name=options.pool, node_config_label=None)
    binary = resolve_binary(options.mps_control)
    gpus = discover_gpus(nvml)
    # The Kubernetes client (the extra gpushare[cluster]) only now, when the launcher starts.
    from webhook.node.kube_node_api import KubernetesNodeApi

    node: NodeApi = KubernetesNodeApi.connect(options.node_name, options.kubeconfig)
    if ref is None:
        label = node.read_labels().get(DEVICE_PLUGIN_CONFIG_LABEL)
        ref = find_daemon_pool(policies, pool_name=None, node_config_label=label)
    _check_node_fits_pool(ref, gpus)
    metrics = LauncherMetrics()
    supervisor = _supervisor(options, ref, binary, nvml, gpus, node, metrics)
    server = StatusServer(host, port, metrics, supervisor.health)
    emit(
        "configured",
        f"Serving pool {ref.pool.name} of policy {ref.policy.name} on node {options.node_name}.",
        pool=ref.pool.name,
        policy=ref.policy.name,
        gpus=[f"{g.index}:{g.name}:{g.memory_mib}MiB" for g in gpus],
        pipe_directory=ref.policy.mps_daemon.pipe_directory,
    )
    return supervisor, server


def _supervisor(
    options: LauncherOptions,
    ref: PoolRef,
    binary: str,
    nvml: Nvml,
    gpus: tuple[GpuDevice, ...],
    node: NodeApi,
    metrics: LauncherMetrics,
) -> MpsSupervisor:
    daemon_settings = ref.policy.mps_daemon
    control = MpsControl(
        binary,
        Path(daemon_settings.pipe_directory),
        Path(daemon_settings.log_directory),
        command_timeout_s=options.command_timeout_s,
        start_timeout_s=options.start_timeout_s,
    )
    return MpsSupervisor(
        control=control,
        nvml=nvml,
        gpus=gpus,
        defaults=daemon_defaults(ref, gpus),
        node=node,
        ready_label=daemon_settings.ready_label,
        pool_name=ref.pool.name,
        set_exclusive=daemon_settings.set_exclusive_process,
        settings=options.supervisor,
        metrics=metrics,
    )


def _check_node_fits_pool(ref: PoolRef, gpus: tuple[GpuDevice, ...]) -> None:
    pool = ref.pool
    if ref.policy.allocation is Allocation.COUNT and len(gpus) != 1:
        raise NodeSetupError(
            f"{ref.where} uses allocation count, which is only safe on one-GPU nodes, but "
            f"this node has {len(gpus)} GPUs: move the node to a replica-class pool."
        )
    if pool.gpus_per_node is not None and pool.gpus_per_node != len(gpus):
        emit(
            "pool_mismatch",
            f"{ref.where} declares gpusPerNode {pool.gpus_per_node}, this node has {len(gpus)}.",
            level=logging.WARNING,
        )
    declared = pool.gpu_memory_mib
    if declared is not None and any(g.memory_mib != declared for g in gpus):
        # The webhook sizes client limits from the declared memory; the daemon's defaults
        # come from the real memory, and the lower of the two wins in MPS.
        emit(
            "pool_mismatch",
            f"{ref.where} declares gpuMemory {declared} MiB; NVML reports "
            f"{sorted({g.memory_mib for g in gpus})} MiB. Client limits follow the policy, "
            "daemon defaults the hardware; the tighter one applies.",
            level=logging.WARNING,
        )
