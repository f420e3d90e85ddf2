"""``gpushare device-plugin-config``: the generated configs, checked by a Go parser that
follows NVIDIA's api/config/v1 (main.go here). The proxy refuses NVIDIA's module itself, so
upstream/main.go (its own parser) is a by-hand check: see docs/node-side-results.md."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from webhook.core.policy.enforcement import build_enforcement
from webhook.core.policy.loader import load_policies
from webhook.core.policy.model import Allocation, Mode, Policy, PolicySet, Pool
from webhook.node.device_plugin_config import (
    DEFAULT_KEY,
    build_configs,
    config_map,
    guidance,
    hook_problems,
)
from webhook.node.errors import DevicePluginConfigError
from webhook.node.pools import PoolRef

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
CACHE = Path(os.environ.get("GPUSHARE_DPCONFIG_CACHE", Path.home() / ".cache/gpushare-dpconfig"))
BUILD_TIMEOUT_S = 900

EXTRA_POLICIES = """\
apiVersion: gpushare.io/v1alpha1
kind: GpuSharingPolicy
metadata:
  name: plain-name
spec:
  match: {namespaces: ["batch"]}
  mode: time-slicing
  resourceName: nvidia.com/gpu
  wholeGpus: {max: 0}
  enforcement: {driverMemoryLimit: "off"}   # no driver limit: no CDI injection either
  pools:
    - name: t4-ts
      replicas: 3
      devicePluginConfig: t4-three-way
---
apiVersion: gpushare.io/v1alpha1
kind: GpuSharingPolicy
metadata:
  name: research
spec:
  match: {namespaces: ["research"]}
  mode: time-slicing
  resourceName: nvidia.com/gpu.shared
  pools:
    - name: ts-half   # the same pool as the default policy's: one config, not two
      replicas: 2
"""

CDI = ["cdi-annotations", "cdi-cri"]


def expect(
    strategy: str,
    replicas: int,
    advertised: str,
    *,
    rename: bool = True,
    fail_above_one: bool = True,
    cdi: bool = False,
) -> dict[str, Any]:
    return {
        "strategy": strategy,
        "replicas": replicas,
        "advertised": advertised,
        "renameByDefault": rename,
        "failRequestsGreaterThanOne": fail_above_one,
        "deviceListStrategy": CDI if cdi else None,
    }


# config name -> what NVIDIA's parser must read back from it. Pools of a policy that relies on
# the driver memory limit (inject, require) inject through CDI, where its hook runs; under the
# default (auto) and off the plugin passes devices as before (its default, envvar).
EXPECTED: dict[str, dict[str, Any]] = {
    "ts-half": expect("time-slicing", 2, "nvidia.com/gpu.shared"),
    "ts-quarter": expect("time-slicing", 4, "nvidia.com/gpu.shared"),
    "mps-2": expect("mps", 2, "nvidia.com/gpu.shared"),
    "mps-4": expect("mps", 4, "nvidia.com/gpu.shared"),
    "mps-8": expect("mps", 8, "nvidia.com/gpu.shared"),
    # mps-daemon: the device plugin time-slices and counts; count allocation takes several.
    "l4-mps": expect("time-slicing", 10, "nvidia.com/gpu.shared", fail_above_one=False),
    "t4-three-way": expect("time-slicing", 3, "nvidia.com/gpu", rename=False),
}  # fmt: skip


@pytest.fixture
def policy_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "policies"
    directory.mkdir()
    shutil.copy(REPO / "policies/default.yaml", directory)
    shutil.copy(REPO / "policies/examples/mps.yaml", directory)
    shutil.copy(REPO / "policies/examples/mps-daemon.yaml", directory)
    (directory / "extra.yaml").write_text(EXTRA_POLICIES)
    return directory


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "webhook.cli", "device-plugin-config", *args],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


@pytest.fixture
def generated(policy_dir: Path, tmp_path: Path) -> dict[str, Path]:
    """Run the CLI; write each config of the ConfigMap to its own file."""
    result = run_cli("--policies", str(policy_dir))
    assert result.returncode == 0, result.stderr
    configmap = yaml.safe_load(result.stdout)
    files = {}
    for name, text in configmap["data"].items():
        files[name] = tmp_path / f"{name}.yaml"
        files[name].write_text(text)
    return files


def go_binary(source: Path, name: str, *, resolve: bool = False) -> Path:
    """Build ``source`` (a Go module) once per content hash into the cache outside the repo.

    ``resolve``: the module has no go.sum (its main requirement could not be fetched when it
    was written), so build a copy after ``go mod tidy`` fetches and records it.
    """
    go = shutil.which("go") or "/usr/local/go/bin/go"
    digest = hashlib.sha256()
    version = subprocess.run([go, "version"], capture_output=True, text=True, check=True)
    digest.update(version.stdout.encode())
    for path in sorted(source.glob("*")):
        if path.is_file() and path.suffix in (".go", ".mod", ".sum"):
            digest.update(path.name.encode() + path.read_bytes())
    target = CACHE / digest.hexdigest()[:16] / name
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    workdir = source
    if resolve:
        workdir = target.parent / "src"
        shutil.rmtree(workdir, ignore_errors=True)
        shutil.copytree(source, workdir)
        go_run([go, "mod", "tidy"], workdir, {"GOFLAGS": "-mod=mod"})
    partial = target.with_suffix(".partial")
    go_run([go, "build", "-o", str(partial), "."], workdir, {})
    partial.replace(target)
    return target


def go_run(command: list[str], cwd: Path, env: dict[str, str]) -> None:
    result = subprocess.run(
        command, cwd=cwd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S,
        check=False, env={**os.environ, **env},
    )  # fmt: skip
    if result.returncode != 0:
        raise BuildFailedError(f"{' '.join(command)} failed:\n{result.stderr}")


class BuildFailedError(Exception):
    """A Go build failed; the message has the go command's output."""


def parse_with(binary: Path, files: list[Path]) -> tuple[int, dict[str, dict[str, Any]]]:
    result = subprocess.run(
        [str(binary), *map(str, files)], capture_output=True, text=True, timeout=60, check=False
    )
    parsed = [json.loads(line) for line in result.stdout.splitlines()]
    return result.returncode, {Path(p["file"]).stem: p for p in parsed}


def summary(parsed: dict[str, Any]) -> dict[str, Any]:
    (resource,) = parsed["resources"]
    assert resource["name"] == "nvidia.com/gpu" and resource["devices"] == "all"
    return {
        "strategy": parsed["strategy"],
        "replicas": resource["replicas"],
        "advertised": resource["advertised"],
        "renameByDefault": parsed["renameByDefault"],
        "failRequestsGreaterThanOne": parsed["failRequestsGreaterThanOne"],
        "deviceListStrategy": parsed.get("deviceListStrategy"),
    }


# -- the generated configs, read by a parser of NVIDIA's format -----------------------------


def test_structural_parser_reads_every_generated_config(generated: dict[str, Path]) -> None:
    assert sorted(generated) == sorted([DEFAULT_KEY, *EXPECTED])
    code, parsed = parse_with(go_binary(HERE, "dpconfig"), list(generated.values()))
    assert code == 0, parsed
    # Unlabelled GPU nodes: a valid config that shares nothing (whole GPUs).
    unlabelled = parsed.pop(DEFAULT_KEY)
    assert unlabelled["strategy"] == "none" and not unlabelled.get("resources"), unlabelled
    assert {name: summary(p) for name, p in parsed.items()} == EXPECTED


def test_structural_parser_rejects_what_nvidia_rejects(tmp_path: Path) -> None:
    bad = {
        "one-replica": "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
        "    - name: nvidia.com/gpu\n      replicas: 1\n",
        "wrong-version": "version: v2\n",
        "no-resources": "version: v1\nsharing:\n  mps:\n    renameByDefault: true\n",
        # k8s-device-plugin#1433: accepted (and ignored) by the package, refused here.
        "misplaced-rename": "version: v1\nflags:\n  renameByDefault: true\n",
        "bad-name": "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
        "    - name: nvidia.com/GPU_\n      replicas: 2\n",
        "bad-strategy": "version: v1\nflags:\n  plugin:\n    deviceListStrategy: [cdi]\n",
        "misplaced-strategy": "version: v1\nflags:\n  deviceListStrategy: cdi-cri\n",
    }
    files = []
    for name, text in bad.items():
        files.append(tmp_path / f"{name}.yaml")
        files[-1].write_text(text)
    code, parsed = parse_with(go_binary(HERE, "dpconfig"), files)
    assert code == 1
    assert "replicas must be >= 2" in parsed["one-replica"]["error"]
    assert "unknown version: v2" in parsed["wrong-version"]["error"]
    assert "no resources specified" in parsed["no-resources"]["error"]
    assert "unknown field(s) flags.renameByDefault" in parsed["misplaced-rename"]["error"]
    assert "incorrect format for resource name" in parsed["bad-name"]["error"]
    assert "invalid strategy: cdi" in parsed["bad-strategy"]["error"]
    assert "unknown field(s) flags.deviceListStrategy" in parsed["misplaced-strategy"]["error"]


def test_structural_parser_reads_one_strategy_or_a_list(tmp_path: Path) -> None:
    # api/config/v1/flags.go deviceListStrategyFlag.UnmarshalJSON: a string or a list.
    files = []
    for name, value in (("one", "cdi-cri"), ("two", "[envvar, cdi-cri]")):
        files.append(tmp_path / f"{name}.yaml")
        files[-1].write_text(f"version: v1\nflags:\n  plugin:\n    deviceListStrategy: {value}\n")
    code, parsed = parse_with(go_binary(HERE, "dpconfig"), files)
    assert code == 0, parsed
    assert parsed["one"]["deviceListStrategy"] == ["cdi-cri"]
    assert parsed["two"]["deviceListStrategy"] == ["envvar", "cdi-cri"]


# -- the generator ----------------------------------------------------------------------------


def test_configmap_and_guidance(policy_dir: Path) -> None:
    result = run_cli("--policies", str(policy_dir), "--name", "dp", "--namespace", "ops")
    configmap = yaml.safe_load(result.stdout)
    assert configmap["kind"] == "ConfigMap"
    assert configmap["metadata"]["name"] == "dp" and configmap["metadata"]["namespace"] == "ops"
    assert yaml.safe_load(configmap["data"]["l4-mps"]) == {
        "version": "v1",
        "sharing": {
            "timeSlicing": {
                "renameByDefault": True,
                "failRequestsGreaterThanOne": False,
                "resources": [{"name": "nvidia.com/gpu", "replicas": 10}],
            }
        },
    }
    assert (
        "kubectl label node -l nvidia.com/gpu.product=NVIDIA-L4 "
        "nvidia.com/device-plugin.config=l4-mps --overwrite"
    ) in result.stderr
    assert "nvidia.com/device-plugin.config=t4-three-way" in result.stderr
    assert "policy default, research" in result.stderr
    assert "deploy/mps-daemon) on their nodes: nvidia.com/device-plugin.config in [l4-mps]" in (
        result.stderr.replace("\n# ", " ")
    )


def test_output_file(policy_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "cm.yaml"
    result = run_cli("--policies", str(policy_dir), "--out", str(out))
    assert result.returncode == 0 and result.stdout == ""
    assert yaml.safe_load(out.read_text())["metadata"]["name"] == "gpushare-device-plugin-configs"


def test_conflicting_pool_definitions_are_refused(policy_dir: Path) -> None:
    (policy_dir / "clash.yaml").write_text(
        EXTRA_POLICIES.split("---\n")[1]
        .replace("name: research", "name: clash")
        .replace('["research"]', '["clash"]')
        .replace("replicas: 2", "replicas: 3")
    )
    result = run_cli("--policies", str(policy_dir))
    assert result.returncode == 2 and result.stdout == ""  # invalid policies, as everywhere
    assert "disagree on replicas" in result.stderr
    # clash.yaml loads first: both other definitions of ts-half are named against it.
    assert result.stderr.count("pool 'ts-half' of policy 'clash'") == 2
    assert "policy 'default'" in result.stderr and "policy 'research'" in result.stderr


def ref_set(*policies: Policy) -> PolicySet:
    return PolicySet(policies=policies)


def test_values_the_device_plugin_cannot_express_are_refused() -> None:
    custom = Policy("custom", "a.yaml", Mode.TIME_SLICING, (Pool("p1", 4),),
                    resource_name="example.com/gpu")  # fmt: skip
    single = Policy("single", "b.yaml", Mode.TIME_SLICING, (Pool("p2", 1),))
    mps_count = Policy("mpscount", "c.yaml", Mode.MPS, (Pool("p3", 4, gpus_per_node=1),),
                       allocation=Allocation.COUNT)  # fmt: skip
    with pytest.raises(DevicePluginConfigError) as raised:
        build_configs(ref_set(custom, single, mps_count))
    first, second, third = raised.value.problems
    assert "uses resource 'example.com/gpu'" in first
    assert "has replicas 1" in second
    assert "combines mode mps with allocation count" in third


def test_a_pool_name_shared_by_a_time_slicing_and_an_mps_policy_conflicts() -> None:
    a = Policy("a", "a.yaml", Mode.TIME_SLICING, (Pool("shared", 4),))
    b = Policy("b", "b.yaml", Mode.MPS, (Pool("shared", 4),))
    with pytest.raises(DevicePluginConfigError, match=r"disagree on mode \('mps' vs"):
        build_configs(ref_set(a, b))


def test_guidance_without_mps_daemon_pools_says_nothing_about_the_daemonset() -> None:
    configs = build_configs(ref_set(Policy("a", "a.yaml", Mode.TIME_SLICING, (Pool("x", 2),))))
    text = guidance(configs, name="cm", namespace="ns")
    assert "kubectl label node <node> nvidia.com/device-plugin.config=x --overwrite" in text
    assert "mps-daemon" not in text
    assert config_map(configs, name="cm", namespace="ns", sources=["a.yaml"])["data"] == {
        DEFAULT_KEY: "version: v1\n",
        "x": configs[0].render(),
    }


def test_generated_from_the_loaded_examples(policy_dir: Path) -> None:
    configs = build_configs(load_policies(policy_dir))
    assert {c.name: c.strategy for c in configs}["l4-mps"] == "time-slicing"


# -- unlabelled GPU nodes: the `default` key ----------------------------------------------


def config_manager_choice(
    keys: list[str], label: str, default_config: str, fallbacks: list[str]
) -> str | None:
    """Which key NVIDIA's config-manager gives a node (None: an empty config), as
    k8s-device-plugin cmd/config-manager/main.go updateConfigName decides; RuntimeError
    where it exits and the device plugin pod never starts."""
    if label:
        if label not in keys:
            raise RuntimeError(f"specified config {label} does not exist")
        return label
    if default_config:
        if default_config not in keys:
            raise RuntimeError(f"specified config {default_config} does not exist")
        return default_config
    for fallback in fallbacks:
        if fallback == "named" and "default" in keys:
            return "default"
        if fallback == "single" and len(keys) == 1:
            return keys[0]
        if fallback == "empty":
            return None
    raise RuntimeError("no config was set, no default was provided, and all fallbacks failed")


# The device plugin chart's config.fallbackStrategies default (values.yaml) and what the GPU
# Operator sets (controllers/object_controls.go: FALLBACK_STRATEGIES=empty).
DEVICE_PLUGIN_CHART_FALLBACKS = ["named", "single"]
GPU_OPERATOR_FALLBACKS = ["empty"]


def test_unlabelled_nodes_get_the_default_key_under_both_charts(policy_dir: Path) -> None:
    result = run_cli("--policies", str(policy_dir))
    configmap = yaml.safe_load(result.stdout)
    keys = list(configmap["data"])
    assert keys[0] == DEFAULT_KEY and len(keys) > 1
    assert configmap["data"][DEFAULT_KEY] == "version: v1\n"  # no sharing: whole GPUs
    assert configmap["metadata"]["annotations"]["gpushare.io/default-config"] == "whole-gpus"
    # Without the `default` key, the device plugin chart's defaults break unlabelled nodes.
    without = [key for key in keys if key != DEFAULT_KEY]
    with pytest.raises(RuntimeError, match="all fallbacks failed"):
        config_manager_choice(without, "", "", DEVICE_PLUGIN_CHART_FALLBACKS)
    # With it, and with the values the guidance prints (default: default), both agree.
    assert config_manager_choice(keys, "", "", DEVICE_PLUGIN_CHART_FALLBACKS) == DEFAULT_KEY
    assert config_manager_choice(keys, "", DEFAULT_KEY, GPU_OPERATOR_FALLBACKS) == DEFAULT_KEY
    assert config_manager_choice(keys, "ts-half", DEFAULT_KEY, GPU_OPERATOR_FALLBACKS) == "ts-half"
    assert (
        "--set devicePlugin.config.name=gpushare-device-plugin-configs "
        "--set devicePlugin.config.default=default"
    ) in result.stderr
    assert "--set config.name=gpushare-device-plugin-configs --set config.default=default" in (
        result.stderr
    )


def test_a_pool_config_as_the_default(policy_dir: Path) -> None:
    result = run_cli("--policies", str(policy_dir), "--default", "ts-quarter")
    assert result.returncode == 0, result.stderr
    data = yaml.safe_load(result.stdout)["data"]
    assert data[DEFAULT_KEY] == data["ts-quarter"]
    assert "'default' (a copy of config ts-quarter)" in result.stderr


def test_a_default_the_nodes_cannot_serve_is_refused(policy_dir: Path) -> None:
    unknown = run_cli("--policies", str(policy_dir), "--default", "a100-half")
    assert unknown.returncode == 2 and unknown.stdout == ""
    assert "--default 'a100-half' is neither whole-gpus nor a config of the policies' pools" in (
        unknown.stderr
    )
    daemon = run_cli("--policies", str(policy_dir), "--default", "l4-mps")
    assert daemon.returncode == 2 and daemon.stdout == ""
    assert "in mode mps-daemon, whose MPS DaemonSet runs only on nodes labelled" in daemon.stderr


def test_a_pool_config_named_default_must_be_meant(tmp_path: Path) -> None:
    first = EXTRA_POLICIES.split("---\n", maxsplit=1)[0]
    named = first.replace("PluginConfig: t4-three-way", "PluginConfig: default")
    assert named != first
    (tmp_path / "p.yaml").write_text(named)
    refused = run_cli("--policies", str(tmp_path / "p.yaml"))
    assert refused.returncode == 2
    assert "pass --default default to mean it" in refused.stderr
    meant = run_cli("--policies", str(tmp_path / "p.yaml"), "--default", "default")
    assert meant.returncode == 0, meant.stderr
    data = yaml.safe_load(meant.stdout)["data"]
    assert list(data) == [DEFAULT_KEY] and "replicas: 3" in data[DEFAULT_KEY]


def test_helm_values_format(policy_dir: Path) -> None:
    result = run_cli("--policies", str(policy_dir), "-o", "helm-values", "--name", "dp")
    values = yaml.safe_load(result.stdout)["devicePluginConfig"]
    configmap = yaml.safe_load(run_cli("--policies", str(policy_dir), "--name", "dp").stdout)
    assert values == {
        "enabled": True,
        "name": "dp",
        "namespace": "gpu-operator",
        "data": configmap["data"],
    }
    assert "    ts-half: |\n      version: v1\n" in result.stdout  # readable blocks


# -- the driver memory limit: CDI injection -------------------------------------------------


def limited(name: str, setting: str, pool: Pool, mode: Mode = Mode.TIME_SLICING) -> Policy:
    return Policy(name, f"{name}.yaml", mode, (pool,),
                  enforcement=build_enforcement({"driverMemoryLimit": setting}))  # fmt: skip


def test_only_configs_of_pools_that_write_the_limit_inject_through_cdi() -> None:
    configs = build_configs(
        ref_set(
            limited("a", "require", Pool("req", 2)),
            limited("b", "off", Pool("plain", 4)),
            limited("c", "inject", Pool("daemon", 4), Mode.MPS_DAEMON),
            # auto writes the limit where it can, without changing how devices are passed
            limited("d", "auto", Pool("auto", 8)),
            # other schemes write no driver limit, whatever the default says
        )
    )
    assert {c.name: c.injects_through_cdi for c in configs} == {
        "req": True, "plain": False, "daemon": True, "auto": False,
    }  # fmt: skip
    assert configs[0].document["flags"] == {"plugin": {"deviceListStrategy": CDI}}
    assert "flags" not in configs[1].document


def test_a_config_shared_with_a_limited_pool_injects_through_cdi_for_both() -> None:
    (config,) = build_configs(
        ref_set(limited("a", "off", Pool("shared", 2)), limited("b", "inject", Pool("shared", 2)))
    )
    assert config.injects_through_cdi


def test_guidance_names_the_cdi_configs_and_the_operator_value() -> None:
    configs = build_configs(
        ref_set(limited("a", "require", Pool("x", 2)), limited("b", "auto", Pool("y", 2)))
    )
    text = guidance(configs, name="cm", namespace="ns")
    assert "# Configs [x] inject GPUs through CDI" in text
    assert "set cdi.enabled=true" in text and "DEVICE_LIST_STRATEGY env outranks" in text
    plain = guidance(configs[1:], name="cm", namespace="ns")
    assert "CDI" not in plain


def test_pools_whose_pods_the_hook_cannot_cover() -> None:
    mig = Pool("mig", 2, node_selector={"nvidia.com/gpu.product": "A100-SXM4-40GB-MIG-1g.5gb"})
    (problem,) = hook_problems(PoolRef(limited("a", "auto", mig), mig))
    assert "selects MIG devices" in problem and "set driverMemoryLimit: off" in problem
    assert hook_problems(PoolRef(limited("b", "off", mig), mig)) == []
    one = Pool("one", 1)
    (problem,) = hook_problems(PoolRef(limited("c", "require", one), one))
    assert "has no generated device-plugin config" in problem
    assert "flags.plugin.deviceListStrategy [cdi-annotations, cdi-cri]" in problem
