"""The node side of gpushare: what runs on (or is generated for) the GPU nodes themselves.

``nvml`` discovers the node's GPUs, ``compute_mode`` switches them to EXCLUSIVE_PROCESS and
back, ``mps_control`` speaks to NVIDIA's MPS control daemon, ``supervisor`` keeps that daemon
healthy, ``readiness`` publishes its verdict on the Node (through ``node_api``),
``status_server`` serves /healthz and /metrics, ``events`` is the launcher's event log,
``pools`` finds the pools the policies describe, ``device_plugin_config`` turns them into
NVIDIA device plugin configs, and ``commands`` wires the ``mps-daemon`` and
``device-plugin-config`` subcommands into the CLI.
"""
