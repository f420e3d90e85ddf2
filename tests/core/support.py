"""Shared helpers for the core tests: paths, policy and pod builders, Kubernetes checks."""

from __future__ import annotations

import copy
import functools
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import kubernetes_validate
import kubernetes_validate.utils
import yaml

from webhook.core.policy.loader import load_policies, load_policy_texts
from webhook.core.policy.model import API_VERSION, POLICY_KIND, PolicySet

# kubernetes_validate.validate() re-reads the version's 5 MB _definitions.json on every call
# (about 12 ms); the schema files never change, so read each once. validate() looks the
# function up in its module at call time, so this keeps using the library's own validation.
kubernetes_validate.utils.schema_contents = functools.cache(  # type: ignore[method-assign]
    kubernetes_validate.utils.schema_contents
)

REPO_ROOT = Path(__file__).resolve().parents[2]
POLICIES_DIR = REPO_ROOT / "policies"
MPS_EXAMPLE = POLICIES_DIR / "examples" / "mps.yaml"
MPS_DAEMON_EXAMPLE = POLICIES_DIR / "examples" / "mps-daemon.yaml"
CORPUS_DIR = REPO_ROOT / "tests" / "corpus"

# The Kubernetes version whose schemas mutated pods must satisfy (kubernetes-validate ships
# 1.37; 1.34 is the oldest minor still supported upstream when this was written).
KUBERNETES_VERSIONS = ("1.34", kubernetes_validate.utils.latest_version())

# Extended resources gpushare writes; Kubernetes requires requests == limits as integers.
GPU_RESOURCE_PREFIXES = ("nvidia.com/gpu",)


def load_bundled() -> PolicySet:
    return load_policies(POLICIES_DIR)


def load_all_examples() -> PolicySet:
    """default.yaml + both examples as one set (as a cluster that copied them would run)."""
    files = [POLICIES_DIR / "default.yaml", MPS_EXAMPLE, MPS_DAEMON_EXAMPLE]
    return load_policy_texts((str(f), f.read_text(encoding="utf-8")) for f in files)


def policy_doc(name: str, **spec: Any) -> dict[str, Any]:
    """A GpuSharingPolicy document; ``spec`` keys are the YAML field names."""
    return {
        "apiVersion": API_VERSION,
        "kind": POLICY_KIND,
        "metadata": {"name": name},
        "spec": spec,
    }


def policies_from(*documents: Mapping[str, Any], source: str = "test.yaml") -> PolicySet:
    text = yaml.safe_dump_all([dict(d) for d in documents], sort_keys=False)
    return load_policy_texts([(source, text)])


def simple_policy(name: str = "p", **overrides: Any) -> dict[str, Any]:
    """A default time-slicing policy with 1/2 and 1/4 pools, overridable field by field."""
    spec: dict[str, Any] = {
        "default": True,
        "mode": "time-slicing",
        "pools": [{"name": "half", "replicas": 2}, {"name": "quarter", "replicas": 4}],
    }
    spec.update(overrides)
    return policy_doc(name, **spec)


def make_pod(
    annotations: Mapping[str, str] | None = None,
    containers: Sequence[Mapping[str, Any]] | None = None,
    namespace: str | None = None,
    **spec: Any,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "pod"}
    if namespace is not None:
        metadata["namespace"] = namespace
    if annotations is not None:
        metadata["annotations"] = dict(annotations)
    body: dict[str, Any] = {
        "containers": [dict(c) for c in containers]
        if containers is not None
        else [{"name": "app", "image": "python:3.12"}]
    }
    body.update(spec)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": body}


def env_of(pod: Mapping[str, Any], index: int = 0) -> list[dict[str, Any]]:
    return list(pod["spec"]["containers"][index].get("env") or [])


def env_values(pod: Mapping[str, Any], index: int = 0) -> dict[str, Any]:
    """name → value of a container's env (last one wins, as in the kubelet)."""
    return {e["name"]: e.get("value") for e in env_of(pod, index)}


def assert_schema_valid(pod: Mapping[str, Any]) -> None:
    """The pod satisfies the Kubernetes schemas of every version in KUBERNETES_VERSIONS."""
    for version in KUBERNETES_VERSIONS:
        kubernetes_validate.validate(copy.deepcopy(dict(pod)), version, strict=True)


def assert_valid_kubernetes_pod(pod: Mapping[str, Any]) -> None:
    """The schemas, plus the rules for extended resources as gpushare writes them.

    Kubernetes accepts ``nvidia.com/gpu: 1`` (a number) from users; what gpushare writes must
    be integer strings with requests == limits.
    """
    assert_schema_valid(pod)
    spec = pod["spec"]
    for container in [*(spec.get("containers") or ()), *(spec.get("initContainers") or ())]:
        resources = container.get("resources") or {}
        limits = resources.get("limits") or {}
        requests = resources.get("requests") or {}
        for name in {*limits, *requests}:
            if not name.startswith(GPU_RESOURCE_PREFIXES):
                continue
            assert name in limits, f"{name} in requests but not in limits"
            value = limits[name]
            assert isinstance(value, str) and value.isdigit() and int(value) > 0, value
            assert requests.get(name, value) == value, f"{name}: requests != limits"


def cli_environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "GPUSHARE_POLICIES"}
    env["PYTHONWARNINGS"] = "error"
    return env


def run_cli(
    *args: str, stdin: str | None = None, cwd: Path = REPO_ROOT
) -> subprocess.CompletedProcess[str]:
    """``gpushare ARGS`` in a fresh interpreter, as a CI pipeline would call it."""
    return subprocess.run(
        [sys.executable, "-m", "webhook.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=cwd,
        env=cli_environment(),
        timeout=60,
        check=False,
    )


# -- workloads: the oracle the template tests compare the core with -----------------------


def pod_template(workload: Mapping[str, Any], kind: Any) -> Any:
    """What sits at the kind's first template path (None where any step is missing)."""
    value: Any = workload
    for key in kind.path:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def controller_pod(template: Mapping[str, Any], namespace: str, owner: str) -> dict[str, Any]:
    """The pod a Kubernetes controller creates from a PodTemplateSpec: its metadata and spec,
    in the workload's namespace, named from the workload (``<owner>-`` plus a suffix)."""
    metadata = dict(template.get("metadata") or {})
    metadata.pop("name", None)
    metadata["namespace"] = namespace
    if owner:
        metadata["generateName"] = f"{owner}-"
    spec = template.get("spec")
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": spec if spec is not None else {},
    }
