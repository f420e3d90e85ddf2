"""The node-side subcommands of the ``gpushare`` CLI: ``mps-daemon`` and ``device-plugin-config``.

``add_node_commands(subparsers)`` adds both; each sets ``func(args) -> int``. This module only
parses flags, wires the pieces together and turns errors into one clear message and a
non-zero exit; the work happens in the modules it calls.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from webhook.constants import DEVICE_PLUGIN_CONFIG_LABEL
from webhook.core import Allocation, default_policies_path, load_policies
from webhook.errors import GpushareError, PolicyError
from webhook.node import events
from webhook.node.device_plugin_config import (
    DEFAULT_CONFIGMAP_NAME,
    DEFAULT_KEY,
    DEFAULT_NAMESPACE,
    WHOLE_GPUS,
    build_configs,
    config_map,
    guidance,
    helm_values,
    render,
)
from webhook.node.errors import DevicePluginConfigError, InvalidPoliciesError, NodeSetupError
from webhook.node.events import emit
from webhook.node.mps_control import (
    DEFAULT_CONTROL_BINARY,
    MpsControl,
    daemon_defaults,
    resolve_binary,
)
from webhook.node.node_api import KubernetesNodeApi, NodeApi
from webhook.node.nvml import GpuDevice, Nvml, PynvmlNvml, discover_gpus
from webhook.node.pools import PoolRef, find_daemon_pool
from webhook.node.status_server import LauncherMetrics, StatusServer
from webhook.node.supervisor import MpsSupervisor, SupervisorSettings

DEFAULT_LISTEN = "0.0.0.0:9400"
EXIT_ERROR = 1
# Invalid policies, as in every gpushare command that loads them.
EXIT_INVALID_POLICIES = 2
# A --default the policies' pools cannot serve: a usage error, same code.
EXIT_USAGE_DEFAULT = 2


def add_node_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``mps-daemon`` and ``device-plugin-config`` to the CLI's subparsers."""
    _add_mps_daemon(subparsers)
    _add_device_plugin_config(subparsers)


# -- mps-daemon -----------------------------------------------------------------------------


def _add_mps_daemon(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "mps-daemon",
        help="run and supervise the node's MPS control daemon (the mps-daemon mode's DaemonSet)",
        description=(
            "Discover the node's GPUs through NVML, start nvidia-cuda-mps-control with the "
            "limits of the node's pool, keep it healthy, and label the node while it serves."
        ),
    )
    _add_daemon_setup_flags(parser)
    _add_daemon_timing_flags(parser)
    parser.set_defaults(func=run_mps_daemon)


def _add_daemon_setup_flags(parser: argparse.ArgumentParser) -> None:
    """What to serve, where, and how to reach the node and the daemon."""
    parser.add_argument(
        "--policies",
        type=Path,
        metavar="PATH",
        default=_env_path("GPUSHARE_POLICIES"),
        required=_env_path("GPUSHARE_POLICIES") is None,
        help="policy file or directory, the same the webhook loads (env GPUSHARE_POLICIES)",
    )
    parser.add_argument(
        "--pool",
        help="pool name this node serves (default: the pool whose device-plugin config the "
        f"node's {DEVICE_PLUGIN_CONFIG_LABEL} label names)",
    )
    parser.add_argument(
        "--node-name",
        default=os.environ.get("NODE_NAME"),
        help="this node's name (env NODE_NAME, set from spec.nodeName in the DaemonSet)",
    )
    parser.add_argument(
        "--kubeconfig", type=Path, help="kubeconfig (default: the in-cluster ServiceAccount)"
    )
    parser.add_argument(
        "--mps-control",
        default=DEFAULT_CONTROL_BINARY,
        help=f"path or name of the MPS control program (default {DEFAULT_CONTROL_BINARY})",
    )
    parser.add_argument(
        "--listen",
        default=DEFAULT_LISTEN,
        help=f"HOST:PORT for /healthz, /readyz and /metrics (default {DEFAULT_LISTEN})",
    )


def _add_daemon_timing_flags(parser: argparse.ArgumentParser) -> None:
    """Health checks, restart backoff and how long to wait for the control program."""
    defaults = SupervisorSettings()
    parser.add_argument(
        "--check-interval",
        type=float,
        default=defaults.check_interval_s,
        help="seconds between health checks",
    )
    parser.add_argument(
        "--backoff-initial",
        type=float,
        default=defaults.backoff_initial_s,
        help="first restart delay in seconds (doubles per failure)",
    )
    parser.add_argument(
        "--backoff-max",
        type=float,
        default=defaults.backoff_max_s,
        help="longest restart delay in seconds",
    )
    parser.add_argument(
        "--command-timeout",
        type=float,
        default=10.0,
        help="seconds to wait for an answer from the control daemon",
    )
    parser.add_argument(
        "--start-timeout",
        type=float,
        default=30.0,
        help="seconds to wait for the control daemon to come up",
    )


def _env_path(name: str) -> Path | None:
    value = os.environ.get(name)
    return Path(value) if value else None


def parse_listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise NodeSetupError(f"--listen {text!r} is not HOST:PORT (e.g. 0.0.0.0:9400).")
    return host.strip("[]") or "0.0.0.0", int(port)


def run_mps_daemon(args: argparse.Namespace, nvml: Nvml | None = None) -> int:
    """Entry point of ``gpushare mps-daemon``; ``nvml`` replaces the real NVML in tests."""
    events.configure()
    stop = threading.Event()
    try:
        supervisor, server = _prepare(args, nvml or PynvmlNvml())
    except (GpushareError, OSError) as exc:
        emit("startup_failed", _one_line(exc), level=logging.ERROR)
        return EXIT_INVALID_POLICIES if isinstance(exc, InvalidPoliciesError) else EXIT_ERROR

    def request_stop(signum: int, frame: FrameType | None) -> None:
        del frame
        emit("signal", f"Received {signal.Signals(signum).name}; shutting down.")
        stop.set()

    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    server.start()
    address = f"{server.address[0]}:{server.address[1]}"
    emit("listening", f"Serving /healthz, /readyz and /metrics on {address}.", address=address)
    try:
        return supervisor.run(stop)
    except GpushareError as exc:
        emit("startup_failed", _one_line(exc), level=logging.ERROR)
        return EXIT_ERROR
    finally:
        server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def _prepare(args: argparse.Namespace, nvml: Nvml) -> tuple[MpsSupervisor, StatusServer]:
    """Everything the launcher needs, checked in the order that fails cheapest first."""
    host, port = parse_listen(args.listen)
    try:
        policies = load_policies(args.policies)
    except PolicyError as exc:
        raise InvalidPoliciesError(f"The policies in {args.policies} are invalid: {exc}") from exc
    if not args.node_name:
        raise NodeSetupError(
            "The node name is unknown: pass --node-name or set NODE_NAME (the DaemonSet sets "
            "it from spec.nodeName through the downward API)."
        )
    ref = None
    if args.pool is not None:
        ref = find_daemon_pool(policies, pool_name=args.pool, node_config_label=None)
    binary = resolve_binary(args.mps_control)
    gpus = discover_gpus(nvml)
    node: NodeApi = KubernetesNodeApi.connect(args.node_name, args.kubeconfig)
    if ref is None:
        label = node.read_labels().get(DEVICE_PLUGIN_CONFIG_LABEL)
        ref = find_daemon_pool(policies, pool_name=None, node_config_label=label)
    _check_node_fits_pool(ref, gpus)
    metrics = LauncherMetrics()
    supervisor = _supervisor(args, ref, binary, nvml, gpus, node, metrics)
    server = StatusServer(host, port, metrics, supervisor.health)
    emit(
        "configured",
        f"Serving pool {ref.pool.name} of policy {ref.policy.name} on node {args.node_name}.",
        pool=ref.pool.name,
        policy=ref.policy.name,
        gpus=[f"{g.index}:{g.name}:{g.memory_mib}MiB" for g in gpus],
        pipe_directory=ref.policy.mps_daemon.pipe_directory,
    )
    return supervisor, server


def _supervisor(
    args: argparse.Namespace,
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
        command_timeout_s=args.command_timeout,
        start_timeout_s=args.start_timeout,
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
        settings=SupervisorSettings(
            check_interval_s=args.check_interval,
            backoff_initial_s=args.backoff_initial,
            backoff_max_s=args.backoff_max,
        ),
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


# -- device-plugin-config -------------------------------------------------------------------


def _add_device_plugin_config(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
) -> None:
    parser = subparsers.add_parser(
        "device-plugin-config",
        help="generate the NVIDIA device plugin configs of the policies' pools as a ConfigMap",
        description=(
            "Print one ConfigMap holding a device plugin config per pool, for the GPU "
            "Operator's devicePlugin.config; guidance on labelling nodes goes to stderr."
        ),
    )
    parser.add_argument(
        "--policies",
        type=Path,
        metavar="PATH",
        help="policy file or directory (default: $GPUSHARE_POLICIES, ./policies, the "
        "checkout's policies/, /etc/gpushare/policies)",
    )
    parser.add_argument(
        "--name",
        default=DEFAULT_CONFIGMAP_NAME,
        help=f"ConfigMap name (default {DEFAULT_CONFIGMAP_NAME})",
    )
    parser.add_argument(
        "--namespace",
        default=DEFAULT_NAMESPACE,
        help=f"ConfigMap namespace (default {DEFAULT_NAMESPACE})",
    )
    parser.add_argument(
        "--out", type=Path, metavar="FILE", help="write the ConfigMap here instead of stdout"
    )
    parser.add_argument(
        "--default",
        metavar="CONFIG",
        default=WHOLE_GPUS,
        help=f"what GPU nodes without the {DEVICE_PLUGIN_CONFIG_LABEL} label get, as the "
        f"ConfigMap's {DEFAULT_KEY!r} key: {WHOLE_GPUS} (default: no sharing) or one pool's "
        "config name",
    )
    parser.add_argument(
        "-o",
        "--output",
        choices=("configmap", "helm-values"),
        default="configmap",
        help="configmap (kubectl apply), or helm-values: devicePluginConfig values for "
        "gpushare's Helm chart (helm install -f)",
    )
    parser.set_defaults(func=run_device_plugin_config)


def run_device_plugin_config(args: argparse.Namespace) -> int:
    """Entry point of ``gpushare device-plugin-config``."""
    try:
        policies = load_policies(args.policies or default_policies_path())
        configs = build_configs(policies)
    except (PolicyError, DevicePluginConfigError) as exc:
        print(f"gpushare device-plugin-config: {len(exc.problems)} problem(s):", file=sys.stderr)
        for problem in exc.problems:
            print(f"  {problem}", file=sys.stderr)
        return EXIT_INVALID_POLICIES
    if not configs:
        print("gpushare device-plugin-config: the policies define no pool.", file=sys.stderr)
        return EXIT_INVALID_POLICIES
    try:
        document = config_map(
            configs,
            name=args.name,
            namespace=args.namespace,
            sources=policies.sources,
            default=args.default,
        )
    except DevicePluginConfigError as exc:
        print(f"gpushare device-plugin-config: {exc.problems[0]}", file=sys.stderr)
        return EXIT_USAGE_DEFAULT
    if args.output == "helm-values":
        document = helm_values(document)
    text = render(document)
    if args.out is not None:
        args.out.write_text(text)
    else:
        sys.stdout.write(text)
    sys.stderr.write(
        guidance(configs, name=args.name, namespace=args.namespace, default=args.default)
    )
    return 0
