"""``gpushare mps-daemon`` and ``gpushare device-plugin-config``: the node side's commands.

``add_node_commands`` adds both to the CLI; each sets ``func(args) -> int``. Flags and
printing only: the launcher is ``webhook.node``'s ``run_launcher``, the device plugin
configs are built there too.
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
    DEFAULT_COMMAND_TIMEOUT_S,
    DEFAULT_CONFIGMAP_NAME,
    DEFAULT_CONTROL_BINARY,
    DEFAULT_KEY,
    DEFAULT_LISTEN,
    DEFAULT_NAMESPACE,
    DEFAULT_START_TIMEOUT_S,
    WHOLE_GPUS,
    DevicePluginConfigError,
    LauncherOptions,
    Nvml,
    SupervisorSettings,
    build_configs,
    config_map,
    guidance,
    helm_values,
    render,
    run_launcher,
)

NODE_NAME_VARIABLE = "NODE_NAME"


def add_node_commands(subparsers: Commands) -> None:
    """Add ``mps-daemon`` and ``device-plugin-config`` to the CLI's subparsers."""
    _add_mps_daemon(subparsers)
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
    parser.add_argument(
        "--node-name",
        default=os.environ.get(NODE_NAME_VARIABLE),
        help="this node's name (env NODE_NAME, set from spec.nodeName in the DaemonSet)",
    )
    add_kubeconfig_option(parser)
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
