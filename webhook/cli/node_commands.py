"""``gpushare mps-daemon``, ``gpushare node-agent`` and ``gpushare device-plugin-config``: the
node side's commands.

``add_node_commands`` adds them to the CLI; each sets ``func(args) -> int``. Flags and
printing only: the launcher is ``webhook.node``'s ``run_launcher``, the agent its
``run_node_agent``, the device plugin configs are built there too.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from webhook.cli.cluster_client import require_cluster_client
from webhook.cli.command_tree import Arguments, Commands
from webhook.cli.exit_codes import EXIT_OK, EXIT_USAGE
from webhook.cli.options import (
    add_kubeconfig_option,
    add_policies_option,
)
from webhook.constants import DEVICE_PLUGIN_CONFIG_LABEL
from webhook.core import default_policies_path, load_policies
from webhook.errors import PolicyError
from webhook.node import (
    DEFAULT_AGENT_LISTEN,
    DEFAULT_CDI_DIRS,
    DEFAULT_COMMAND_TIMEOUT_S,
    DEFAULT_CONFIGMAP_NAME,
    DEFAULT_CONTROL_BINARY,
    DEFAULT_INTERVAL_S,
    DEFAULT_KEY,
    DEFAULT_LISTEN,
    DEFAULT_NAMESPACE,
    DEFAULT_PROC_ROOT,
    DEFAULT_START_TIMEOUT_S,
    WHOLE_GPUS,
    AgentClients,
    AgentPaths,
    DevicePluginConfigError,
    LauncherOptions,
    NodeAgentOptions,
    Nvml,
    SupervisorSettings,
    build_configs,
    config_map,
    guidance,
    helm_values,
    render,
    run_launcher,
    run_node_agent,
)

NODE_NAME_VARIABLE = "NODE_NAME"


def add_node_commands(subparsers: Commands) -> None:
    """Add ``mps-daemon``, ``node-agent`` and ``device-plugin-config`` to the CLI."""
    _add_mps_daemon(subparsers)
    _add_node_agent(subparsers)
    _add_device_plugin_config(subparsers)


# -- mps-daemon -----------------------------------------------------------------------------


def _add_mps_daemon(subparsers: Commands) -> None:
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


def _add_daemon_setup_flags(parser: Arguments) -> None:
    """What to serve, where, and how to reach the node and the daemon."""
    add_policies_option(parser, role="the policies the webhook loads: ", search=False)
    parser.add_argument(
        "--pool",
        help="pool name this node serves (default: the pool whose device-plugin config the "
        f"node's {DEVICE_PLUGIN_CONFIG_LABEL} label names)",
    )
    _add_node_options(parser)
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


def _add_daemon_timing_flags(parser: Arguments) -> None:
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
        default=DEFAULT_COMMAND_TIMEOUT_S,
        help="seconds to wait for an answer from the control daemon",
    )
    parser.add_argument(
        "--start-timeout",
        type=float,
        default=DEFAULT_START_TIMEOUT_S,
        help="seconds to wait for the control daemon to come up",
    )


def run_mps_daemon(args: argparse.Namespace, nvml: Nvml | None = None) -> int:
    """Entry point of ``gpushare mps-daemon``; ``nvml`` replaces the real NVML in tests."""
    require_cluster_client("gpushare mps-daemon")
    options = LauncherOptions(
        policies=args.policies,
        node_name=args.node_name,
        pool=args.pool,
        kubeconfig=args.kubeconfig,
        mps_control=args.mps_control,
        listen=args.listen,
        supervisor=SupervisorSettings(
            check_interval_s=args.check_interval,
            backoff_initial_s=args.backoff_initial,
            backoff_max_s=args.backoff_max,
        ),
        command_timeout_s=args.command_timeout,
        start_timeout_s=args.start_timeout,
    )
    return run_launcher(options, nvml)


# -- node-agent -----------------------------------------------------------------------------


def _add_node_agent(subparsers: Commands) -> None:
    parser = subparsers.add_parser(
        "node-agent",
        help="label the node for the driver memory limit and audit its GPU processes "
        "(the node agent's DaemonSet)",
        description=(
            "Every interval: label the node gpushare.io/driver-memory-limit=true or false "
            "(driver R615+, cgroup v2, the toolkit's apply-cuda-memory-limits hook in the "
            "device plugin's CDI spec), find every process on the GPUs and the pod it belongs "
            "to, and report uncapped, over-share and unattributed ones as metrics, pod "
            "Events and log lines. --once reads one round, prints it as JSON and changes "
            "nothing."
        ),
    )
    _add_node_options(parser)
    parser.add_argument(
        "--interval",
        type=float,
        default=DEFAULT_INTERVAL_S,
        metavar="SECONDS",
        help=f"seconds between rounds (default: {DEFAULT_INTERVAL_S:g})",
    )
    parser.add_argument(
        "--listen",
        default=DEFAULT_AGENT_LISTEN,
        help=f"HOST:PORT for /healthz, /readyz and /metrics (default {DEFAULT_AGENT_LISTEN})",
    )
    _add_node_agent_paths(parser)
    parser.add_argument(
        "--once",
        action="store_true",
        help="one round, printed as JSON (facts, processes, findings); no label, no Event",
    )
    parser.set_defaults(func=run_node_agent_command)


def _add_node_agent_paths(parser: Arguments) -> None:
    """Where the node is read: the defaults are the DaemonSet's (tests point them elsewhere)."""
    parser.add_argument(
        "--host-root",
        type=Path,
        default=Path("/"),
        metavar="DIR",
        help="root under which sys/fs/cgroup is read (default: /)",
    )
    parser.add_argument(
        "--proc-root",
        type=Path,
        default=DEFAULT_PROC_ROOT,
        metavar="DIR",
        help=f"the processes' /proc, with hostPID (default: {DEFAULT_PROC_ROOT})",
    )
    parser.add_argument(
        "--cdi-dir",
        type=Path,
        action="append",
        metavar="DIR",
        help="a directory of CDI specs, repeatable (default: "
        f"{' and '.join(str(d) for d in DEFAULT_CDI_DIRS)})",
    )


def run_node_agent_command(args: argparse.Namespace, clients: AgentClients | None = None) -> int:
    """Entry point of ``gpushare node-agent``; ``clients`` replace NVML and the API in tests."""
    if clients is None or clients.node is None or clients.pods is None:
        require_cluster_client("gpushare node-agent")
    options = NodeAgentOptions(
        node_name=args.node_name,
        kubeconfig=args.kubeconfig,
        interval_s=args.interval,
        listen=args.listen,
        paths=AgentPaths(
            host_root=args.host_root,
            proc_root=args.proc_root,
            cdi_dirs=tuple(args.cdi_dir) if args.cdi_dir else DEFAULT_CDI_DIRS,
        ),
        once=args.once,
    )
    return run_node_agent(options, clients)


# -- device-plugin-config -------------------------------------------------------------------


def _add_device_plugin_config(subparsers: Commands) -> None:
    parser = subparsers.add_parser(
        "device-plugin-config",
        help="generate the NVIDIA device plugin configs of the policies' pools as a ConfigMap",
        description=(
            "Print one ConfigMap holding a device plugin config per pool, for the GPU "
            "Operator's devicePlugin.config; guidance on labelling nodes goes to stderr."
        ),
    )
    add_policies_option(parser)
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
        return EXIT_USAGE
    if not configs:
        print("gpushare device-plugin-config: the policies define no pool.", file=sys.stderr)
        return EXIT_USAGE
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
        return EXIT_USAGE
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
    return EXIT_OK


def _add_node_options(parser: Arguments) -> None:
    """The Node a daemon works on and how it reaches the API: both node commands take them."""
    parser.add_argument(
        "--node-name",
        default=os.environ.get(NODE_NAME_VARIABLE),
        help="this node's name (env NODE_NAME, set from spec.nodeName in the DaemonSet)",
    )
    add_kubeconfig_option(parser)
