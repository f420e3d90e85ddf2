"""The chart's node agent (values `nodeAgent.*`), rendered by the real Helm: off by default;
on, deploy/node-agent's objects with the release's names and the values' port, interval,
node selector and tolerations, its NetworkPolicies with `networkPolicy.enabled`; bad values
refused by the schema."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.helm import run_helm, template_args

REPO = Path(__file__).resolve().parents[1]
KUSTOMIZE = REPO / "deploy/node-agent"
ON = ("nodeAgent.enabled=true",)
pytestmark = pytest.mark.timeout(300, func_only=True)


@pytest.fixture(scope="module")
def helm_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("helm-home")


def render(helm: Path, home: Path, *sets: str, release: str = "gpushare") -> list[dict[str, Any]]:
    result = run_helm(helm, *template_args(release, "gpushare-system", (), sets), home=home)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def kustomized(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((KUSTOMIZE / name).read_text()) if d]


def agent_objects(docs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {
        (d["kind"], d["metadata"]["name"]): d
        for d in docs
        if "node-agent" in d["metadata"]["name"] or d["metadata"]["name"] == "gpushare-node"
    }


def test_off_by_default(helm: Path, helm_home: Path) -> None:
    assert agent_objects(render(helm, helm_home)) == {}


def test_on_it_renders_deploy_node_agents_objects(helm: Path, helm_home: Path) -> None:
    found = agent_objects(render(helm, helm_home, *ON))
    assert set(found) == {
        ("Namespace", "gpushare-node"),
        ("ServiceAccount", "gpushare-node-agent"),
        ("ClusterRole", "gpushare-node-agent"),
        ("ClusterRoleBinding", "gpushare-node-agent"),
        ("DaemonSet", "gpushare-node-agent"),
    }
    (namespace,) = kustomized("namespace.yaml")
    chart_labels = found[("Namespace", "gpushare-node")]["metadata"]["labels"]
    assert namespace["metadata"]["labels"].items() <= chart_labels.items()
    _, role, _ = kustomized("rbac.yaml")
    assert found[("ClusterRole", "gpushare-node-agent")]["rules"] == role["rules"]
    (daemonset,) = kustomized("daemonset.yaml")
    chart = found[("DaemonSet", "gpushare-node-agent")]["spec"]["template"]["spec"]
    spec = daemonset["spec"]["template"]["spec"]
    for key in ("hostPID", "nodeSelector", "tolerations", "securityContext", "volumes"):
        assert chart[key] == spec[key], key
    (chart_container,) = chart["containers"]
    (container,) = spec["containers"]
    for key in ("command", "args", "env", "securityContext", "ports", "volumeMounts"):
        assert chart_container[key] == container[key], key
    assert chart_container["image"].startswith("ghcr.io/gpushare/gpushare-cluster")


def test_values_name_the_port_interval_and_namespace(helm: Path, helm_home: Path) -> None:
    sets = (*ON, "nodeAgent.listenPort=9501", "nodeAgent.intervalSeconds=30",
            "nodeAgent.namespace=team-a-node", "nodeAgent.runtimeClassName=")  # fmt: skip
    found = agent_objects(render(helm, helm_home, *sets, release="team-a"))
    daemonset = found[("DaemonSet", "team-a-gpushare-node-agent")]
    assert daemonset["metadata"]["namespace"] == "team-a-node"
    spec = daemonset["spec"]["template"]["spec"]
    assert "runtimeClassName" not in spec
    (container,) = spec["containers"]
    assert "--listen=0.0.0.0:9501" in container["args"]
    assert "--interval=30" in container["args"]
    assert container["ports"] == [{"name": "metrics", "containerPort": 9501}]
    binding = found[("ClusterRoleBinding", "team-a-gpushare-node-agent")]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "team-a-gpushare-node-agent", "namespace": "team-a-node"}
    ]


def test_network_policies_follow_the_webhooks(helm: Path, helm_home: Path) -> None:
    sets = (*ON, "networkPolicy.enabled=true", "networkPolicy.apiserverCIDRs={10.0.0.0/28}")
    docs = render(helm, helm_home, *sets)
    policies = {
        d["metadata"]["name"]: d
        for d in docs
        if d["kind"] == "NetworkPolicy" and d["metadata"]["namespace"] == "gpushare-node"
    }
    assert set(policies) == {
        "gpushare-node-agent-default-deny",
        "gpushare-node-agent-to-apiserver",
    }
    (egress,) = policies["gpushare-node-agent-to-apiserver"]["spec"]["egress"]
    assert egress["to"] == [{"ipBlock": {"cidr": "10.0.0.0/28"}}]
    # Without the apiserver's addresses the agent could reach nothing: refused (the schema).
    result = run_helm(
        helm, *template_args(sets=(*ON, "networkPolicy.enabled=true")), home=helm_home
    )
    assert result.returncode == 1 and "/networkPolicy/apiserverCIDRs" in result.stderr
    # With Prometheus' pods named, they may scrape the agent's port.
    peer = "networkPolicy.metricsFrom[0].podSelector.matchLabels.app=prometheus"
    docs = render(helm, helm_home, *sets, peer)
    (metrics,) = [d for d in docs if d["metadata"]["name"] == "gpushare-node-agent-metrics"]
    assert metrics["spec"]["ingress"][0]["ports"] == [{"protocol": "TCP", "port": 9401}]


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (("nodeAgent.intervalSeconds=1",), "at '/nodeAgent/intervalSeconds'"),
        (("nodeAgent.listenPort=0",), "at '/nodeAgent/listenPort'"),
        (("nodeAgent.namespace=Node",), "at '/nodeAgent/namespace'"),
        (("nodeAgent.hostNetwork=true",), "additional properties 'hostNetwork'"),
    ],
)
def test_bad_values_are_refused_by_the_schema(
    helm: Path, helm_home: Path, sets: tuple[str, ...], message: str
) -> None:
    result = run_helm(helm, *template_args(sets=sets), home=helm_home)
    assert result.returncode == 1
    assert "values don't meet the specifications of the schema" in result.stderr
    assert message in result.stderr
