"""The chart's monitoring toggles (values `monitoring.*`), rendered by the real Helm.

Each part is off by default. On, the chart renders deploy/monitoring's objects with the
release's names: the PodMonitors select the release's pods (its selector labels, in the
release's and the MPS daemon's namespaces), the PrometheusRule is deploy/monitoring's rule
file with the release's MPS DaemonSet in GpushareMpsDaemonMetricsAbsent (and the MPS
daemon's group only with mpsDaemon.enabled), the dashboard ConfigMap holds the dashboard
file unchanged under the Grafana sidecar's label. The rule file and the dashboard exist once:
the chart's files/monitoring/ copies are held equal to deploy/monitoring's here (Helm reads
no file outside the chart, and kustomize none outside deploy/monitoring). The objects'
acceptance by the Prometheus Operator's CRDs is tests/e2e/test_monitoring_objects.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.helm import CHART, run_helm, template_args

REPO = Path(__file__).resolve().parents[1]
MONITORING = REPO / "deploy/monitoring"
CHART_FILES = CHART / "files/monitoring"
RUNBOOKS = "https://github.com/gpushare/gpushare/blob/main/docs/monitoring.md"
MONITORING_KINDS = {"PodMonitor", "PrometheusRule"}
ALL_ON = (
    "monitoring.podMonitor.enabled=true",
    "monitoring.prometheusRule.enabled=true",
    "monitoring.dashboard.enabled=true",
)
MPS_ON = ("mpsDaemon.enabled=true", "mpsDaemon.deviceConfigs={l4-mps}")
NODE_AGENT_ON = ("nodeAgent.enabled=true",)
# A cold Helm build in the fixture takes minutes (scripts/test builds it beforehand).
pytestmark = pytest.mark.timeout(300, func_only=True)


@pytest.fixture(scope="module")
def helm_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("helm-home")


def render(
    helm: Path,
    home: Path,
    *sets: str,
    release: str = "gpushare",
    namespace: str = "gpushare-system",
    values: tuple[Path, ...] = (),
) -> list[dict[str, Any]]:
    result = run_helm(helm, *template_args(release, namespace, values, sets), home=home)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def failed(helm: Path, home: Path, *sets: str) -> str:
    result = run_helm(helm, *template_args(sets=sets), home=home)
    assert result.returncode == 1 and result.stdout == "", result.stdout
    return result.stderr


def monitoring_objects(docs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    found = {
        (d["kind"], d["metadata"]["name"]): d
        for d in docs
        if d["kind"] in MONITORING_KINDS or d["metadata"]["name"].endswith("-dashboard")
    }
    return found


def kustomize_documents(name: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all((MONITORING / name).read_text()) if doc]


# -- one source of truth ------------------------------------------------------------------


@pytest.mark.parametrize("name", ["gpushare-dashboard.json", "prometheusrule.yaml"])
def test_the_charts_monitoring_files_are_deploy_monitorings(name: str) -> None:
    copy = CHART_FILES / name
    assert not copy.is_symlink()
    assert copy.read_bytes() == (MONITORING / name).read_bytes(), (
        f"deploy/helm/gpushare/files/monitoring/{name} differs from deploy/monitoring/{name}: "
        "edit deploy/monitoring's and copy it"
    )


# -- off by default, on with the release's names -----------------------------------------


def test_nothing_of_monitoring_by_default(helm: Path, helm_home: Path) -> None:
    docs = render(helm, helm_home, *MPS_ON)
    assert monitoring_objects(docs) == {}


def test_the_default_release_renders_deploy_monitorings_objects(
    helm: Path, helm_home: Path
) -> None:
    """Release gpushare in gpushare-system: the kustomization's names, so the same objects
    but for Helm's own labels and the release in the selectors."""
    docs = render(helm, helm_home, *ALL_ON, *MPS_ON, *NODE_AGENT_ON)
    found = monitoring_objects(docs)
    assert set(found) == {
        ("PodMonitor", "gpushare"),
        ("PodMonitor", "gpushare-mps-daemon"),
        ("PodMonitor", "gpushare-node-agent"),
        ("PrometheusRule", "gpushare"),
        ("ConfigMap", "gpushare-dashboard"),
    }
    webhook, mps, node_agent = kustomize_documents("podmonitors.yaml")
    chart_webhook = found[("PodMonitor", "gpushare")]
    assert chart_webhook["metadata"]["namespace"] == "gpushare-system"
    assert chart_webhook["spec"]["podMetricsEndpoints"] == webhook["spec"]["podMetricsEndpoints"]
    assert chart_webhook["spec"]["selector"]["matchLabels"] == {
        **webhook["spec"]["selector"]["matchLabels"],
        "app.kubernetes.io/instance": "gpushare",
    }
    chart_mps = found[("PodMonitor", "gpushare-mps-daemon")]
    assert chart_mps["metadata"]["namespace"] == mps["metadata"]["namespace"] == "gpushare-mps"
    assert chart_mps["spec"]["podMetricsEndpoints"] == mps["spec"]["podMetricsEndpoints"]
    assert chart_mps["spec"]["selector"]["matchLabels"] == {
        **mps["spec"]["selector"]["matchLabels"],
        "app.kubernetes.io/instance": "gpushare",
    }
    chart_agent = found[("PodMonitor", "gpushare-node-agent")]
    assert chart_agent["metadata"]["namespace"] == node_agent["metadata"]["namespace"]
    assert chart_agent["spec"]["podMetricsEndpoints"] == node_agent["spec"]["podMetricsEndpoints"]
    assert chart_agent["spec"]["selector"]["matchLabels"] == {
        **node_agent["spec"]["selector"]["matchLabels"],
        "app.kubernetes.io/instance": "gpushare",
    }
    # The rules: deploy/monitoring's, every group (the MPS daemon and node agent are on).
    (rule,) = kustomize_documents("prometheusrule.yaml")
    assert found[("PrometheusRule", "gpushare")]["spec"] == rule["spec"]
    # The dashboard: the file itself, under the sidecar's label.
    dashboard = found[("ConfigMap", "gpushare-dashboard")]
    assert dashboard["data"] == {
        "gpushare-dashboard.json": (MONITORING / "gpushare-dashboard.json").read_text()
    }
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    # The pods they select are the chart's own.
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert chart_webhook["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    ports = deployment["spec"]["template"]["spec"]["containers"][0]["ports"]
    assert "metrics" in [port["name"] for port in ports]
    daemonsets = {d["metadata"]["name"]: d for d in docs if d["kind"] == "DaemonSet"}
    for monitor, daemonset in (
        (chart_mps, daemonsets["gpushare-mps-daemon"]),
        (chart_agent, daemonsets["gpushare-node-agent"]),
    ):
        pod_labels = daemonset["spec"]["template"]["metadata"]["labels"]
        assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()


def test_another_release_names_everything_after_itself(helm: Path, helm_home: Path) -> None:
    sets = (
        *ALL_ON,
        *MPS_ON,
        *NODE_AGENT_ON,
        "mpsDaemon.namespace=team-a-mps",
        "monitoring.labels.release=kube-prometheus-stack",
        "monitoring.prometheusRule.runbookBaseURL=https://wiki.example.com/gpushare/monitoring/",
        "monitoring.dashboard.label=dashboards",
        "monitoring.dashboard.labelValue=gpu",
        "monitoring.dashboard.namespace=grafana",
        "monitoring.dashboard.annotations.grafana_folder=GPU",
    )
    docs = render(helm, helm_home, *sets, release="team-a", namespace="gpu-ops")
    found = monitoring_objects(docs)
    assert set(found) == {
        ("PodMonitor", "team-a-gpushare"),
        ("PodMonitor", "team-a-gpushare-mps-daemon"),
        ("PodMonitor", "team-a-gpushare-node-agent"),
        ("PrometheusRule", "team-a-gpushare"),
        ("ConfigMap", "team-a-gpushare-dashboard"),
    }
    namespaces = {key: doc["metadata"]["namespace"] for key, doc in found.items()}
    assert namespaces == {
        ("PodMonitor", "team-a-gpushare"): "gpu-ops",
        ("PodMonitor", "team-a-gpushare-mps-daemon"): "team-a-mps",
        ("PodMonitor", "team-a-gpushare-node-agent"): "gpushare-node",
        ("PrometheusRule", "team-a-gpushare"): "gpu-ops",
        ("ConfigMap", "team-a-gpushare-dashboard"): "grafana",
    }
    for key, doc in found.items():
        assert doc["metadata"]["labels"]["release"] == "kube-prometheus-stack", key
        assert doc["metadata"]["labels"]["app.kubernetes.io/instance"] == "team-a", key
    for name in ("team-a-gpushare", "team-a-gpushare-mps-daemon", "team-a-gpushare-node-agent"):
        selector = found[("PodMonitor", name)]["spec"]["selector"]["matchLabels"]
        assert selector["app.kubernetes.io/instance"] == "team-a"
    dashboard = found[("ConfigMap", "team-a-gpushare-dashboard")]["metadata"]
    assert dashboard["labels"]["dashboards"] == "gpu"
    assert "grafana_dashboard" not in dashboard["labels"]
    assert dashboard["annotations"] == {"grafana_folder": "GPU"}

    rules = found[("PrometheusRule", "team-a-gpushare")]["spec"]["groups"]
    alerts = {r["alert"]: r for group in rules for r in group["rules"]}
    absent = alerts["GpushareMpsDaemonMetricsAbsent"]["expr"]
    assert 'created_by_name="team-a-gpushare-mps-daemon"' in absent
    (rule,) = kustomize_documents("prometheusrule.yaml")
    source = json.dumps(rule["spec"], sort_keys=True)
    # Only the DaemonSet's name and the runbook links differ from the file.
    rendered = json.dumps({"groups": rules}, sort_keys=True)
    rendered = rendered.replace("team-a-gpushare-mps-daemon", "gpushare-mps-daemon")
    rendered = rendered.replace("https://wiki.example.com/gpushare/monitoring", RUNBOOKS)
    assert rendered == source
    for alert in alerts.values():
        url = alert["annotations"]["runbook_url"]
        assert url.startswith("https://wiki.example.com/gpushare/monitoring#"), url


def test_without_the_mps_daemon_no_mps_monitor_or_alerts(helm: Path, helm_home: Path) -> None:
    found = monitoring_objects(render(helm, helm_home, *ALL_ON))
    assert ("PodMonitor", "gpushare-mps-daemon") not in found
    assert ("PodMonitor", "gpushare-node-agent") not in found
    groups = [g["name"] for g in found[("PrometheusRule", "gpushare")]["spec"]["groups"]]
    (rule,) = kustomize_documents("prometheusrule.yaml")
    assert groups == [
        g["name"]
        for g in rule["spec"]["groups"]
        if g["name"] not in ("gpushare-mps-daemon", "gpushare-node-agent")
    ]
    assert groups == ["gpushare-webhook", "gpushare-apiserver"]
    # The node agent alone: its monitor and its alerts, not the MPS daemon's.
    found = monitoring_objects(render(helm, helm_home, *ALL_ON, *NODE_AGENT_ON))
    assert ("PodMonitor", "gpushare-node-agent") in found
    assert ("PodMonitor", "gpushare-mps-daemon") not in found
    groups = [g["name"] for g in found[("PrometheusRule", "gpushare")]["spec"]["groups"]]
    assert groups == ["gpushare-webhook", "gpushare-apiserver", "gpushare-node-agent"]


# -- NetworkPolicy: Prometheus let in, or the install refused ------------------------------

PROMETHEUS_PEER = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
}


def test_the_mps_daemons_port_opens_to_the_metrics_peers(
    helm: Path, helm_home: Path, tmp_path: Path
) -> None:
    """networkPolicy.metricsFrom admits Prometheus to the MPS daemons' port as to the
    webhook's: the same policy as deploy/mps-daemon's, which admits the namespace
    monitoring's Prometheus pods."""
    values = tmp_path / "np.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                "networkPolicy": {
                    "enabled": True,
                    "apiserverCIDRs": ["10.0.0.0/28"],
                    "metricsFrom": [PROMETHEUS_PEER],
                },
                "mpsDaemon": {"enabled": True, "deviceConfigs": ["l4-mps"]},
                "monitoring": {"podMonitor": {"enabled": True}},
            }
        )
    )
    docs = render(helm, helm_home, values=(values,))
    policies = {d["metadata"]["name"]: d for d in docs if d["kind"] == "NetworkPolicy"}
    chart = policies["gpushare-mps-daemon-metrics"]
    assert chart["metadata"]["namespace"] == "gpushare-mps"
    kustomized = [
        doc
        for doc in yaml.safe_load_all(
            (REPO / "deploy/mps-daemon/network-policy/networkpolicy.yaml").read_text()
        )
        if doc["metadata"]["name"] == "gpushare-mps-daemon-metrics"
    ]
    assert [chart["spec"]] == [doc["spec"] for doc in kustomized]
    assert chart["spec"]["ingress"][0]["ports"] == [{"protocol": "TCP", "port": 9400}]
    # Without peers, no such policy: the deny-all keeps 9400 closed.
    without = render(helm, helm_home, *MPS_ON, "networkPolicy.enabled=true",
                     "networkPolicy.apiserverCIDRs={10.0.0.0/28}")  # fmt: skip
    assert "gpushare-mps-daemon-metrics" not in [d["metadata"]["name"] for d in without]


def test_scrapes_the_network_policies_would_refuse_are_refused_at_install(
    helm: Path, helm_home: Path
) -> None:
    message = failed(
        helm,
        helm_home,
        "monitoring.podMonitor.enabled=true",
        "networkPolicy.enabled=true",
        "networkPolicy.apiserverCIDRs={10.0.0.0/28}",
    )
    assert "needs networkPolicy.metricsFrom" in message
    message = failed(helm, helm_home, "monitoring.podMonitor.enabled=true", "metricsPort=0")
    assert "set metricsPort" in message


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (("monitoring.podMonitor.interval=soon",), "at '/monitoring/podMonitor/interval'"),
        (
            ("monitoring.prometheusRule.runbookBaseURL=docs/monitoring.md#x",),
            "at '/monitoring/prometheusRule/runbookBaseURL'",
        ),
        (("monitoring.dashboard.namespace=Grafana",), "at '/monitoring/dashboard/namespace'"),
        (("monitoring.serviceMonitor.enabled=true",), "additional properties 'serviceMonitor'"),
    ],
)
def test_bad_monitoring_values_are_refused_by_the_schema(
    helm: Path, helm_home: Path, sets: tuple[str, ...], message: str
) -> None:
    stderr = failed(helm, helm_home, *sets)
    assert "values don't meet the specifications of the schema" in stderr
    assert message in stderr


def test_helm_lint_strict_with_everything_on(helm: Path, helm_home: Path) -> None:
    args = ["lint", "--strict", str(CHART), "--namespace", "gpushare-system"]
    for item in (*ALL_ON, *MPS_ON, "monitoring.labels.release=kps"):
        args += ["--set", item]
    result = run_helm(helm, *args, home=helm_home)
    assert result.returncode == 0, (result.stdout, result.stderr)


def test_deploy_monitorings_podmonitors_scrape_ports_deploy_exposes() -> None:
    """deploy/monitoring against what deploy/base and deploy/mps-daemon run: each PodMonitor
    selects those pods and names a container port they expose, in their namespace."""
    workloads = {
        "gpushare-webhook": (REPO / "deploy/base/deployment.yaml", "gpushare-system"),
        "gpushare-mps-daemon": (REPO / "deploy/mps-daemon/daemonset.yaml", "gpushare-mps"),
        "gpushare-node-agent": (REPO / "deploy/node-agent/daemonset.yaml", "gpushare-node"),
    }
    monitors = kustomize_documents("podmonitors.yaml")
    assert sorted(m["metadata"]["name"] for m in monitors) == sorted(workloads)
    for monitor in monitors:
        path, namespace = workloads[monitor["metadata"]["name"]]
        (workload,) = [d for d in yaml.safe_load_all(path.read_text()) if d]
        template = workload["spec"]["template"]
        assert monitor["metadata"]["namespace"] == namespace
        labels = template["metadata"]["labels"]
        assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
        ports = {p["name"] for c in template["spec"]["containers"] for p in c.get("ports", [])}
        (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
        assert endpoint["port"] in ports, (monitor["metadata"]["name"], ports)
        assert "scheme" not in endpoint and "tlsConfig" not in endpoint  # plain HTTP
