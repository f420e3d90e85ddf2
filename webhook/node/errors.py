"""Errors of the node side: each one stops ``gpushare mps-daemon`` or
``gpushare device-plugin-config`` with one clear message and a non-zero exit, or, in
``gpushare node-agent``, is reported and retried at the next round.

They extend ``webhook.errors.GpushareError`` so the CLI reports them like every other
configuration error: a full sentence naming the bad value and the fix.
"""

from __future__ import annotations

from webhook.errors import GpushareError


class NodeSetupError(GpushareError):
    """The node cannot run the MPS daemon as configured (no NVML, no GPUs, wrong binary...)."""


class InvalidPoliciesError(NodeSetupError):
    """The policies do not load, or their pools clash: exit 2, as in every command that
    loads policies."""


class ComputeModePermissionError(GpushareError):
    """NVML refused to change a GPU's compute mode for lack of privileges."""


class MpsControlError(GpushareError):
    """A command to ``nvidia-cuda-mps-control`` failed, timed out or was answered with an error."""


class NodeApiError(GpushareError):
    """The Kubernetes API refused or failed a read or patch of this node."""


class DevicePluginConfigError(GpushareError):
    """The policies cannot be turned into device plugin configs (conflicts, unsupported values).

    ``problems`` holds one full sentence per problem.
    """

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


class PodApiError(GpushareError):
    """The Kubernetes API refused or failed the node agent's list of this node's pods, or an
    Event it raised on one."""
