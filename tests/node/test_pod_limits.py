"""What the audit reads of a pod: its applied record, its containers' IDs and literal env, and
the limits and share they amount to."""

from __future__ import annotations

import pytest
from agent_fakes import MIB, as_pod, container_id, pod_json, shared_record

from webhook.node.pod_api import node_pod
from webhook.node.pod_limits import (
    container_limits,
    gpu_container,
    has_share,
    mps_limit_bytes,
    share_bytes,
)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("0=40960M", 40960 * MIB),
        ("4G", 4096 * MIB),
        ("0=1G,1=512MB", 1024 * MIB),  # several devices: the largest
        ("0=1.5G", 1536 * MIB),
        ("GPU-1234=2048m", 2048 * MIB),  # a UUID instead of an ordinal
        ("", None),
        ("0=lots", None),
        (None, None),
    ],
)
def test_the_mps_pinned_limit(value: str | None, expected: int | None) -> None:
    assert mps_limit_bytes(value) == expected


def test_the_share_is_the_fraction_of_the_gpu_or_the_memory_asked() -> None:
    gpu = 81920 * MIB
    assert share_bytes({"fraction": "0.25"}, gpu) == 20480 * MIB
    assert share_bytes({"memory": "4096Mi"}, gpu) == 4096 * MIB
    assert share_bytes({"fraction": "half"}, gpu) is None
    assert share_bytes({}, gpu) is None


def test_a_pod_as_the_api_returns_it() -> None:
    raw = pod_json("p", 3, env={"NVIDIA_GPU_MEMORY_LIMIT": "8192"}, applied=shared_record("0.1"))
    raw["spec"]["containers"][0]["env"].append(
        {"name": "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "valueFrom": {"configMapKeyRef": {}}}
    )
    raw["spec"]["containers"].append({"name": "sidecar", "image": "busybox"})
    pod = as_pod(raw)
    main = pod.container("main")
    assert main is not None and main.container_id == container_id(3)
    assert dict(main.env) == {"NVIDIA_GPU_MEMORY_LIMIT": "8192"}  # valueFrom is no number
    assert pod.container("sidecar") is not None
    assert pod.container("sidecar").container_id is None  # type: ignore[union-attr]
    assert has_share(pod)
    # A process in a container the status does not list yet: the record's container.
    assert gpu_container(pod, "f" * 64) is main
    limits = container_limits(pod, main, 81920 * MIB)
    assert (limits.driver_bytes, limits.mps_bytes, limits.share_bytes) == (
        8192 * MIB,
        None,
        8192 * MIB,
    )
    assert limits.tightest_bytes == 8192 * MIB


def test_what_is_not_a_share() -> None:
    assert not has_share(as_pod(pod_json("plain", 1)))
    whole = {"container": "main", "gpus": 1, "mode": "whole-gpu", "policy": "default"}
    assert not has_share(as_pod(pod_json("whole", 2, applied=whole)))
    broken = pod_json("broken", 3)
    broken["metadata"]["annotations"]["gpushare.io/applied"] = "{not json"
    assert as_pod(broken).applied is None
    assert node_pod({"metadata": {"name": "no-uid"}}) is None
