"""The node side of gpushare: what runs on (or is generated for) the GPU nodes themselves:
the MPS daemon launcher, the node agent (driver-limit label and GPU process audit) and the
NVIDIA device plugin configs of the policies' pools.

This is the package's face: other packages import only the names below. Layout:
docs/architecture.md.
"""

from webhook.node.agent_launcher import AgentClients, NodeAgentOptions, run_node_agent
from webhook.node.cdi_specs import DEFAULT_CDI_DIRS
from webhook.node.device_plugin_config import (
    DEFAULT_CONFIGMAP_NAME,
    DEFAULT_KEY,
    DEFAULT_NAMESPACE,
    WHOLE_GPUS,
    build_configs,
    config_map,
    guidance,
    helm_values,
    hook_problems,
    pool_problems,
    render,
)
from webhook.node.errors import DevicePluginConfigError
from webhook.node.launcher import (
    DEFAULT_COMMAND_TIMEOUT_S,
    DEFAULT_LISTEN,
    DEFAULT_START_TIMEOUT_S,
    LauncherOptions,
    run_launcher,
)
from webhook.node.mps_control import DEFAULT_CONTROL_BINARY
from webhook.node.node_agent import DEFAULT_AGENT_LISTEN, DEFAULT_INTERVAL_S, AgentPaths
from webhook.node.nvml import Nvml
from webhook.node.pools import pool_conflict_refs, pool_refs
from webhook.node.process_cgroups import DEFAULT_PROC_ROOT
from webhook.node.supervisor import SupervisorSettings

__all__ = [
    "DEFAULT_AGENT_LISTEN",
    "DEFAULT_CDI_DIRS",
    "DEFAULT_COMMAND_TIMEOUT_S",
    "DEFAULT_CONFIGMAP_NAME",
    "DEFAULT_CONTROL_BINARY",
    "DEFAULT_INTERVAL_S",
    "DEFAULT_KEY",
    "DEFAULT_LISTEN",
    "DEFAULT_NAMESPACE",
    "DEFAULT_PROC_ROOT",
    "DEFAULT_START_TIMEOUT_S",
    "WHOLE_GPUS",
    "AgentClients",
    "AgentPaths",
    "DevicePluginConfigError",
    "LauncherOptions",
    "NodeAgentOptions",
    "Nvml",
    "SupervisorSettings",
    "build_configs",
    "config_map",
    "guidance",
    "helm_values",
    "hook_problems",
    "pool_conflict_refs",
    "pool_problems",
    "pool_refs",
    "render",
    "run_launcher",
    "run_node_agent",
]
