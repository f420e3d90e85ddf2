"""deploy/mps-daemon: the DaemonSet asks for what the launcher needs and no more, and agrees
with the policy it ships. (tests/e2e/test_node_labelling.py applies it to a real apiserver.)"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import yaml

from webhook.cli import Command
from webhook.cli.node_commands import add_node_commands
from webhook.constants import (
    DEVICE_PLUGIN_CONFIG_LABEL,
)
from webhook.core.policy.loader import load_policies
from webhook.core.policy.model import Mode

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy/mps-daemon"


def documents(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]


def daemonset() -> dict[str, Any]:
    (ds,) = documents("daemonset.yaml")
    return ds


def test_the_shipped_policy_is_the_example() -> None:
    shipped = (DEPLOY / "policies/mps-daemon.yaml").read_bytes()
    assert shipped == (REPO / "policies/examples/mps-daemon.yaml").read_bytes()


def test_kustomization_lists_every_manifest() -> None:
    (kustomization,) = documents("kustomization.yaml")
    assert kustomization["resources"] == ["namespace.yaml", "rbac.yaml", "daemonset.yaml"]
    (generator,) = kustomization["configMapGenerator"]
    assert generator["files"] == ["policies/mps-daemon.yaml"]
    volume = next(v for v in daemonset()["spec"]["template"]["spec"]["volumes"]
                  if "configMap" in v)  # fmt: skip
    assert volume["configMap"]["name"] == generator["name"]


def test_rbac_is_get_and_patch_on_nodes_only() -> None:
    service_account, role, binding = documents("rbac.yaml")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    (subject,) = binding["subjects"]
    assert subject["name"] == service_account["metadata"]["name"]
    spec = daemonset()["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == service_account["metadata"]["name"]


def test_privileges_are_the_documented_ones() -> None:
    spec = daemonset()["spec"]["template"]["spec"]
    assert spec["hostIPC"] is True and spec["hostPID"] is True
    assert "hostNetwork" not in spec
    (container,) = spec["containers"]
    security = container["securityContext"]
    assert "privileged" not in security
    assert security["capabilities"] == {"add": ["SYS_ADMIN"]}
    host_paths = [v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v]
    assert host_paths == ["/run/gpushare/mps"]
    (namespace,) = documents("namespace.yaml")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"


def test_daemonset_serves_the_policys_mps_daemon_pools_and_mounts_its_directories() -> None:
    policies = load_policies(DEPLOY / "policies")
    daemon_policies = [p for p in policies.policies if p.mode is Mode.MPS_DAEMON]
    assert daemon_policies
    spec = daemonset()["spec"]["template"]["spec"]
    (term,) = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    (expression,) = term["matchExpressions"]
    assert expression["key"] == DEVICE_PLUGIN_CONFIG_LABEL
    assert sorted(expression["values"]) == sorted(
        pool.config_name for p in daemon_policies for pool in p.pools
    )
    (container,) = spec["containers"]
    mount = next(m["mountPath"] for m in container["volumeMounts"] if m["name"] == "mps")
    for policy in daemon_policies:
        for directory in (policy.mps_daemon.pipe_directory, policy.mps_daemon.log_directory):
            assert directory.startswith(mount + "/")


def test_container_arguments_parse_and_probes_use_the_listen_port() -> None:
    (container,) = daemonset()["spec"]["template"]["spec"]["containers"]
    root = Command(argparse.ArgumentParser(prog="gpushare"))
    add_node_commands(root.add_subcommands(dest="command"))
    args = root.parser.parse_args([*container["command"][1:], *container["args"]])
    assert args.command == "mps-daemon"
    assert str(args.policies) == container["volumeMounts"][1]["mountPath"]
    port = int(args.listen.rpartition(":")[2])
    assert container["ports"] == [{"name": "metrics", "containerPort": port}]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
