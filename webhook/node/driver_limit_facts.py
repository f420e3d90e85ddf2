"""What this node offers the driver-enforced memory limit, read from the node itself.

``read_facts`` gathers them: the driver version (NVML), the cgroup hierarchy (cgroup v2 has
``cgroup.controllers`` at the root of /sys/fs/cgroup; a v1 host mounts a tmpfs of
controllers there instead), the GPUs and the CDI specs on the node (``cdi_specs``), and the
node's labels (whether the MPS daemon serves: informational). Each reader turns its failure
into a fact ("NVML failed: ...") rather than an exception, so a node that cannot be read is
judged like one that lacks what is missing. The judgement is ``driver_limit_verdict``'s.

Paths are under ``host_root`` (``/`` in the DaemonSet, where /sys/fs/cgroup is the
container's own view of the same hierarchy) and the CDI directories, both configurable for
tests.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from webhook.constants import MPS_READY_LABEL
from webhook.errors import GpushareError
from webhook.node.cdi_specs import CdiSpec, read_specs
from webhook.node.nvml import GpuDevice, Nvml

CGROUP_V2_MARKER = Path("sys/fs/cgroup/cgroup.controllers")


@dataclass(frozen=True)
class NodeFacts:
    """One reading of the node."""

    # The driver's version ("615.43.02"), or None with ``driver_error`` saying why.
    driver_version: str | None
    driver_error: str | None
    cgroup_v2: bool
    # The node's GPUs (empty with ``gpu_error`` where NVML could not list them).
    gpus: tuple[GpuDevice, ...]
    gpu_error: str | None
    specs: tuple[CdiSpec, ...]
    # The MPS daemon's ready label is on the node; None where the labels could not be read.
    mps_ready: bool | None


def read_facts(
    nvml: Nvml,
    *,
    host_root: Path,
    cdi_dirs: tuple[Path, ...],
    labels: Mapping[str, str] | None,
) -> NodeFacts:
    """Read everything the verdict needs; never raises for what the node lacks."""
    driver_version, driver_error = _driver(nvml)
    gpus, gpu_error = _gpus(nvml)
    return NodeFacts(
        driver_version=driver_version,
        driver_error=driver_error,
        cgroup_v2=cgroup_v2(host_root),
        gpus=gpus,
        gpu_error=gpu_error,
        specs=read_specs(cdi_dirs),
        mps_ready=None if labels is None else labels.get(MPS_READY_LABEL) == "true",
    )


def cgroup_v2(host_root: Path) -> bool:
    """Whether /sys/fs/cgroup (under ``host_root``) is the unified cgroup v2 hierarchy."""
    return (host_root / CGROUP_V2_MARKER).is_file()


def _driver(nvml: Nvml) -> tuple[str | None, str | None]:
    try:
        return nvml.driver_version(), None
    except GpushareError as exc:
        return None, str(exc)


def _gpus(nvml: Nvml) -> tuple[tuple[GpuDevice, ...], str | None]:
    try:
        return tuple(nvml.devices()), None
    except GpushareError as exc:
        return (), str(exc)


def driver_branch(version: str | None) -> int | None:
    """The driver's branch, its major version ("615.43.02" -> 615); None if unreadable."""
    if not version:
        return None
    major = version.strip().partition(".")[0]
    return int(major) if major.isdigit() else None
