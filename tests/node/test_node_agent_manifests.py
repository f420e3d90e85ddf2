"""deploy/node-agent: the DaemonSet asks for what the agent needs and no more, and its
arguments are ones the agent's own parser reads."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import yaml

from webhook.cli import Command
from webhook.cli.node_commands import add_node_commands
from webhook.node.cdi_specs import DEFAULT_CDI_DIRS

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy/node-agent"


def documents(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]


def pod_spec() -> dict[str, Any]:
    (daemonset,) = documents("daemonset.yaml")
    spec: dict[str, Any] = daemonset["spec"]["template"]["spec"]
    return spec


def test_kustomization_lists_every_manifest() -> None:
    (kustomization,) = documents("kustomization.yaml")
    assert kustomization["resources"] == ["namespace.yaml", "rbac.yaml", "daemonset.yaml"]
    (namespace,) = documents("namespace.yaml")
    assert kustomization["namespace"] == namespace["metadata"]["name"]
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"


def test_rbac_is_what_the_agent_calls() -> None:
    service_account, role, binding = documents("rbac.yaml")
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
    ]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    (subject,) = binding["subjects"]
    assert subject["name"] == service_account["metadata"]["name"]
    assert pod_spec()["serviceAccountName"] == service_account["metadata"]["name"]


def test_host_pid_and_read_only_cdi_directories_and_nothing_more() -> None:
    spec = pod_spec()
    assert spec["hostPID"] is True
    assert "hostIPC" not in spec and "hostNetwork" not in spec
    assert spec["securityContext"]["runAsNonRoot"] is True
    (container,) = spec["containers"]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    host_paths = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"]}
    assert sorted(host_paths.values()) == sorted(str(d) for d in DEFAULT_CDI_DIRS)
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert set(mounts) == set(host_paths)
    for name, mount in mounts.items():
        assert mount["readOnly"] is True
        assert mount["mountPath"] == "/host" + host_paths[name]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec[
        "tolerations"
    ]


def test_container_arguments_parse_and_probes_use_the_listen_port() -> None:
    (container,) = pod_spec()["containers"]
    root = Command(argparse.ArgumentParser(prog="gpushare"))
    add_node_commands(root.add_subcommands(dest="command"))
    args = root.parser.parse_args([*container["command"][1:], *container["args"]])
    assert args.command == "node-agent" and not args.once
    mounts = [m["mountPath"] for m in container["volumeMounts"]]
    assert [str(d) for d in args.cdi_dir] == mounts
    port = int(args.listen.rpartition(":")[2])
    assert container["ports"] == [{"name": "metrics", "containerPort": port}]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["NVIDIA_DRIVER_CAPABILITIES"]["value"] == "utility"
