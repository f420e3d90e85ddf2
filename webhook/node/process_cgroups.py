"""Which pod and container a process belongs to, read from its cgroup.

``/proc/<pid>/cgroup`` holds, on a cgroup v2 host, one line ``0::<path>``. The kubelet names
the pod's cgroup and the container runtime the container's under it
(kubernetes ``pkg/kubelet/cm/cgroup_manager_linux.go``: ``escapeSystemdCgroupName`` turns
"-" into "_"; ``CgroupName.ToSystemd`` / ``ToCgroupfs``):

- systemd driver: ``/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid with
  _>.slice/cri-containerd-<id>.scope`` (containerd), ``.../crio-<id>.scope`` (CRI-O, whose
  process may sit one level deeper, in ``crio-<id>.scope/container``), guaranteed pods
  straight under ``kubepods.slice`` as ``kubepods-pod<uid>.slice``;
- cgroupfs driver: ``/kubepods/burstable/pod<uid>/<id>`` (containerd), ``.../crio-<id>``.

Read from inside a container with its own cgroup namespace (the default on cgroup v2), the
path is relative to the reader's cgroup and starts with ``/..``; the pod and container parts
at its end are the same, which is all this reads. On a cgroup v1 host the controllers'
lines carry the same paths; the first one that names a pod is used. A process outside every
pod (a host service, a user's shell) has a path without a pod part.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

DEFAULT_PROC_ROOT = Path("/proc")
# A cgroup file is a few lines; more than this is not one.
MAX_CGROUP_BYTES = 64 * 1024

_UID = r"[0-9a-fA-F]{8}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{12}"
_POD_PART = re.compile(rf"^(?:kubepods-(?:[a-z]+-)?)?pod({_UID})(?:\.slice)?$")
_CONTAINER_PART = re.compile(
    r"^(?:cri-containerd-|crio-|docker-|cri-dockerd-)?([0-9a-f]{64})(?:\.scope)?$"
)


@dataclass(frozen=True)
class ProcessOwner:
    """The pod (its UID, dashes restored) and container (its runtime ID) of a process; both
    None for a process in no pod, ``container_id`` None where the path stops at the pod."""

    pod_uid: str | None
    container_id: str | None
    cgroup: str


def read_owner(proc_root: Path, pid: int) -> ProcessOwner | None:
    """The owner of ``pid``; None where the process is gone or its cgroup unreadable."""
    try:
        with (proc_root / str(pid) / "cgroup").open("rb") as handle:
            text = handle.read(MAX_CGROUP_BYTES).decode(errors="replace")
    except OSError:
        return None
    return parse_cgroup(text)


def parse_cgroup(text: str) -> ProcessOwner:
    """The owner a ``/proc/<pid>/cgroup`` text names: the unified line, else the first
    controller line that names a pod."""
    paths = [line.split(":", 2)[2] for line in text.splitlines() if line.count(":") >= 2]
    unified = [line[3:] for line in text.splitlines() if line.startswith("0::")]
    for path in [*unified, *paths]:
        owner = owner_of_path(path)
        if owner.pod_uid is not None:
            return owner
    return ProcessOwner(None, None, unified[0] if unified else (paths[0] if paths else ""))


def owner_of_path(path: str) -> ProcessOwner:
    """The pod and container parts of one cgroup path."""
    parts = [part for part in path.split("/") if part]
    for position, part in enumerate(parts):
        pod = _POD_PART.match(part)
        if pod is None:
            continue
        uid = pod.group(1).replace("_", "-").lower()
        for leaf in parts[position + 1 :]:
            container = _CONTAINER_PART.match(leaf)
            if container is not None:
                return ProcessOwner(uid, container.group(1), path)
        return ProcessOwner(uid, None, path)
    return ProcessOwner(None, None, path)
