"""What the node agent reads of the node: CDI specs (the device plugin's with and without the
toolkit's memory-limit hook, one from ``nvidia-ctk cdi generate``), the owners of processes
from their cgroups, and the verdict the driver-limit label carries."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from agent_fakes import (
    GPU0,
    GPU1,
    container_id,
    memory_hook,
    pod_uid,
    systemd_cgroup,
    write_cgroup_v2,
    write_generated_spec,
    write_plugin_spec,
)
from fake_nvml import FakeNvml

from webhook.constants import MPS_READY_LABEL
from webhook.node.cdi_specs import (
    DEVICE_PLUGIN_KIND,
    MAX_SPEC_BYTES,
    hook_gpu_ids,
    read_spec,
    read_specs,
)
from webhook.node.driver_limit_facts import NodeFacts, driver_branch, read_facts
from webhook.node.driver_limit_verdict import verdict
from webhook.node.errors import NodeSetupError
from webhook.node.process_cgroups import parse_cgroup, read_owner

# -- CDI specs ---------------------------------------------------------------------------------


def test_the_device_plugins_spec_with_the_hook_covers_each_gpu(tmp_path: Path) -> None:
    path = write_plugin_spec(tmp_path, [GPU0, GPU1], hook=True)
    spec = read_spec(path)
    assert spec.kind == DEVICE_PLUGIN_KIND and spec.devices == 2 and spec.error is None
    assert spec.hook_gpu_ids == {GPU0.uuid, GPU1.uuid}


def test_a_spec_without_the_hook_covers_nothing(tmp_path: Path) -> None:
    spec = read_spec(write_plugin_spec(tmp_path, [GPU0], hook=False))
    assert spec.kind == DEVICE_PLUGIN_KIND and spec.hook_gpu_ids == frozenset()


def test_nvidia_ctk_generate_writes_yaml_of_its_own_kind(tmp_path: Path) -> None:
    write_generated_spec(tmp_path, [GPU0])
    (spec,) = read_specs([tmp_path / "missing", tmp_path])  # a missing directory is no error
    assert spec.error is None
    assert spec.kind == "nvidia.com/gpu" and spec.hook_gpu_ids == {GPU0.uuid}


def test_hooks_through_nvidia_ctk_and_spec_wide_edits_count(tmp_path: Path) -> None:
    assert hook_gpu_ids([memory_hook("GPU-a", ctk=True)["args"]]) == {"GPU-a"}
    assert hook_gpu_ids([["nvidia-cdi-hook", "apply-cuda-memory-limits", "--gpu-id=GPU-b"]]) == {
        "GPU-b"
    }
    assert hook_gpu_ids([["nvidia-cdi-hook", "update-ldcache", "--gpu-id", "GPU-c"]]) == set()
    spec = {
        "cdiVersion": "0.6.0",
        "kind": DEVICE_PLUGIN_KIND,
        "devices": [{"name": "all", "containerEdits": {}}],
        "containerEdits": {"hooks": [memory_hook(GPU1.uuid)]},
    }
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    assert read_spec(path).hook_gpu_ids == {GPU1.uuid}


def test_unreadable_specs_are_reported_not_fatal(tmp_path: Path) -> None:
    (tmp_path / "a-broken.json").write_text("{not json")
    (tmp_path / "b-list.yaml").write_text("- 1\n- 2\n")
    with (tmp_path / "c-huge.json").open("wb") as handle:
        handle.truncate(MAX_SPEC_BYTES + 1)
    (tmp_path / "notes.txt").write_text("not a spec")
    errors = [spec.error for spec in read_specs([tmp_path])]
    assert errors[0] is not None and errors[0].startswith("is not valid JSON")
    assert errors[1] == "is not a CDI spec (no mapping at the top)"
    assert errors[2] == f"is larger than {MAX_SPEC_BYTES} bytes, left unread"
    assert len(errors) == 3


# -- process owners ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "container"),
    [
        (f"0::{systemd_cgroup(7)}", container_id(7)),
        (f"0::{systemd_cgroup(7, qos='besteffort', runtime='crio')}/container", container_id(7)),
        # Guaranteed pods sit right under kubepods.slice.
        (
            f"0::/kubepods.slice/kubepods-pod{pod_uid(7).replace('-', '_')}.slice/"
            f"cri-containerd-{container_id(7)}.scope",
            container_id(7),
        ),
        (f"0::/kubepods/burstable/pod{pod_uid(7)}/{container_id(7)}", container_id(7)),
        (f"0::/kubepods/pod{pod_uid(7)}/crio-{container_id(7)}", container_id(7)),
        # Read from inside the agent's own cgroup namespace: relative to its cgroup.
        (
            f"0::/../../kubepods-burstable-pod{pod_uid(7).replace('-', '_')}.slice/"
            f"cri-containerd-{container_id(7)}.scope",
            container_id(7),
        ),
        # cgroup v1: the controllers' lines.
        (
            f"12:memory:/kubepods/burstable/pod{pod_uid(7)}/{container_id(7)}\n1:name=systemd:/",
            container_id(7),
        ),
        # The pod's own cgroup (a process of the pod outside every container).
        (f"0::/kubepods/burstable/pod{pod_uid(7)}", None),
        (f"0::/kubepods/burstable/pod{pod_uid(7)}/crio-conmon-{container_id(7)}", None),
    ],
)  # fmt: skip
def test_the_pod_and_container_of_a_cgroup(line: str, container: str | None) -> None:
    owner = parse_cgroup(line)
    assert owner.pod_uid == pod_uid(7)
    assert owner.container_id == container


def test_a_process_in_no_pod(tmp_path: Path) -> None:
    owner = parse_cgroup("0::/system.slice/ollama.service\n")
    assert (owner.pod_uid, owner.container_id, owner.cgroup) == (
        None,
        None,
        "/system.slice/ollama.service",
    )
    assert read_owner(tmp_path, 4242) is None  # gone: no /proc/4242


# -- the verdict -------------------------------------------------------------------------------


def facts(tmp_path: Path, *, hook: bool = True, driver: str = "615.43.02", v2: bool = True,
          labels: dict[str, str] | None = None) -> NodeFacts:  # fmt: skip
    host, cdi = tmp_path / "host", tmp_path / "cdi"
    host.mkdir(exist_ok=True)
    if v2:
        write_cgroup_v2(host)
    write_plugin_spec(cdi, [GPU0, GPU1], hook=hook)
    nvml = FakeNvml(gpus=[GPU0, GPU1], driver=driver)
    return read_facts(nvml, host_root=host, cdi_dirs=(cdi,), labels=labels or {})


def test_a_node_with_everything_enforces(tmp_path: Path) -> None:
    judged = verdict(facts(tmp_path, labels={MPS_READY_LABEL: "true"}))
    assert judged.enforced and judged.reason is None
    assert judged.facts == {
        "driverVersion": "615.43.02",
        "cgroup": "v2",
        "cdiKinds": [DEVICE_PLUGIN_KIND],
        "devicePluginCdi": True,
        "hookGpus": "2/2",
        "mpsReady": True,
    }
    assert judged.labels() == {"gpushare.io/driver-memory-limit": "true"}
    assert judged.annotations()["gpushare.io/driver-memory-limit-reason"] is None


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"driver": "580.95.05"}, "The NVIDIA driver is 580.95.05, older than branch R615"),
        ({"v2": False}, "The node runs cgroup v1"),
        ({"hook": False}, "has no apply-cuda-memory-limits hook for GPU(s) 0 (GPU-1111"),
    ],
)
def test_what_is_missing_is_the_reason(
    tmp_path: Path, change: dict[str, object], reason: str
) -> None:
    judged = verdict(facts(tmp_path, **change))  # type: ignore[arg-type]
    assert not judged.enforced
    assert judged.reason is not None and reason in judged.reason and judged.reason.endswith(".")
    assert judged.labels() == {"gpushare.io/driver-memory-limit": "false"}


def test_no_device_plugin_spec_names_what_is_there(tmp_path: Path) -> None:
    cdi = tmp_path / "cdi"
    write_generated_spec(cdi, [GPU0])
    write_cgroup_v2(tmp_path)
    judged = verdict(
        read_facts(FakeNvml(gpus=[GPU0]), host_root=tmp_path, cdi_dirs=(cdi,), labels=None)
    )
    assert judged.reason == (
        "The device plugin does not inject GPUs through CDI: no k8s.device-plugin.nvidia.com/gpu "
        "spec under the CDI directories (CDI kinds found: nvidia.com/gpu); set the device "
        "plugin's deviceListStrategy to cdi-cri (GPU Operator: cdi.enabled=true)."
    )
    assert judged.facts["mpsReady"] is None and judged.facts["hookGpus"] == "0/1"


def test_nvml_failures_are_facts(tmp_path: Path) -> None:
    class BrokenNvml(FakeNvml):
        def driver_version(self) -> str:
            raise NodeSetupError("NVML failed to report the driver version: Uninitialized.")

    write_cgroup_v2(tmp_path)
    judged = verdict(read_facts(BrokenNvml(), host_root=tmp_path, cdi_dirs=(), labels={}))
    assert judged.reason == (
        "The NVIDIA driver's version is unknown (NVML failed to report the driver version: "
        "Uninitialized): run the node agent with the NVIDIA runtime and "
        "NVIDIA_DRIVER_CAPABILITIES including utility."
    )
    assert driver_branch("615.43.02") == 615 and driver_branch("garbage") is None
