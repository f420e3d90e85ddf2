"""gpushare's monitoring objects against a real kube-apiserver with the Prometheus Operator's CRDs.

The CRDs (PodMonitor, ServiceMonitor, PrometheusRule) are the Prometheus Operator's own,
taken from its Go module by harness/tools/operator-crds/build.sh (pinned in modules.txt:
github.com/prometheus-operator/prometheus-operator v0.85.0) and installed server-side in a
control plane of this module's own (etcd and kube-apiserver, no scheduler). Then:

- the chart's monitoring objects (`helm template` with every `monitoring` toggle on, the MPS
  daemon too, a second release with its own names) and deploy/monitoring's (the real
  kustomize) are applied server-side with strict field validation: a field a CRD's schema
  does not know fails the apply instead of being pruned, and what is stored is what was
  applied;
- the kube-apiserver's own webhook metrics, which the gpushare-apiserver alerts read, are
  taken from this apiserver after a call that fails closed and one that fails open (two
  webhooks named *.gpushare.io calling a port nobody listens on): every selector of those
  alerts, metric name and label matchers together, selects a series the apiserver exports.
  Which alerts fire on such series is tests/promql/rules/apiserver.yaml's business
  (Prometheus's rule manager, from tests/test_monitoring.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import REPO
from operator_plane import kubectl

from harness.controlplane import ControlPlane
from harness.helm import run_helm, template_args
from harness.operator_crds import OperatorCrds
from tests.test_monitoring import alert_rules, parse_promql

PROJECT = "prometheus-operator"
FIELD_MANAGER = "gpushare-e2e-monitoring"
MONITORING_KINDS = {"PodMonitor", "PrometheusRule"}
CHART_MONITORING = (
    "monitoring.podMonitor.enabled=true",
    "monitoring.prometheusRule.enabled=true",
    "monitoring.dashboard.enabled=true",
    "monitoring.labels.release=kube-prometheus-stack",
    "mpsDaemon.enabled=true",
    "mpsDaemon.deviceConfigs={l4-mps}",
)


@pytest.fixture(scope="module")
def plane(
    harness_binary: Path, operator_crds: OperatorCrds, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    """A control plane of this module's own with the Prometheus Operator's CRDs only."""
    if PROJECT not in operator_crds.projects:
        pytest.fail(
            f"{operator_crds.root} has no {PROJECT} CRDs: it was built from an older "
            "modules.txt (GPUSHARE_OPERATOR_CRDS?); run harness/tools/operator-crds/build.sh "
            "and use the directory it prints",
            pytrace=False,
        )
    workdir = tmp_path_factory.mktemp("monitoring-plane")
    with ControlPlane(binary=harness_binary, workdir=workdir, with_scheduler=False) as cp:
        files = operator_crds.crd_files(PROJECT)
        args = [arg for path in files for arg in ("-f", str(path))]
        applied = kubectl(
            cp, "apply", "--server-side", f"--field-manager={FIELD_MANAGER}", "-o", "name", *args
        ).split()
        assert sorted(applied) == [
            "customresourcedefinition.apiextensions.k8s.io/podmonitors.monitoring.coreos.com",
            "customresourcedefinition.apiextensions.k8s.io/prometheusrules.monitoring.coreos.com",
            "customresourcedefinition.apiextensions.k8s.io/servicemonitors.monitoring.coreos.com",
        ]
        kubectl(cp, "wait", "--for=condition=Established", "--timeout=120s", *applied)
        yield cp


def documents(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def ensure_namespaces(plane: ControlPlane, docs: list[dict[str, Any]]) -> None:
    for name in sorted({d["metadata"]["namespace"] for d in docs}):
        plane.kubectl("create", "namespace", name, check=False)


def apply_strictly(plane: ControlPlane, docs: list[dict[str, Any]]) -> None:
    """Server-side apply with strict field validation; then every object reads back as
    applied (its metadata aside): nothing was pruned or defaulted away."""
    ensure_namespaces(plane, docs)
    result = plane.kubectl(
        "apply", "--server-side", "--validate=strict", f"--field-manager={FIELD_MANAGER}",
        "-o", "json", "-f", "-", input=yaml.safe_dump_all(docs), check=False, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "Warning" not in result.stderr, result.stderr
    items = printed_objects(result.stdout)
    assert [(i["kind"], i["metadata"]["name"]) for i in items] == [
        (d["kind"], d["metadata"]["name"]) for d in docs
    ]
    for document, item in zip(documents_as_json(docs), items, strict=True):
        for key in set(document) - {"metadata", "apiVersion", "kind"}:
            assert kept(document[key], item[key]), (document["kind"], key, item[key])
        assert item["metadata"].get("labels") == document["metadata"].get("labels")


def kept(applied: Any, stored: Any) -> bool:
    """Everything applied is stored, unchanged; the CRD's defaults may add fields (a
    relabeling's action: replace)."""
    if isinstance(applied, dict):
        return isinstance(stored, dict) and all(
            key in stored and kept(value, stored[key]) for key, value in applied.items()
        )
    if isinstance(applied, list):
        return (
            isinstance(stored, list)
            and len(stored) == len(applied)
            and all(kept(a, s) for a, s in zip(applied, stored, strict=True))
        )
    return bool(applied == stored)


def printed_objects(output: str) -> list[dict[str, Any]]:
    """What `kubectl apply -o json` printed: one JSON document after another, or a List."""
    decoder = json.JSONDecoder()
    items: list[dict[str, Any]] = []
    rest = output.lstrip()
    while rest:
        item, end = decoder.raw_decode(rest)
        items.extend(item["items"] if item.get("kind") == "List" else [item])
        rest = rest[end:].lstrip()
    return items


def documents_as_json(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """As the apiserver returns them (YAML's types through JSON)."""
    loaded: list[dict[str, Any]] = json.loads(json.dumps(docs))
    return loaded


def chart_monitoring(helm: Path, home: Path, release: str, namespace: str) -> list[dict[str, Any]]:
    result = run_helm(helm, *template_args(release, namespace, sets=CHART_MONITORING), home=home)
    assert result.returncode == 0, result.stderr
    return [
        d
        for d in documents(result.stdout)
        if d["kind"] in MONITORING_KINDS or d["metadata"]["name"].endswith("-dashboard")
    ]


# -- the objects ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("release", "namespace"), [("gpushare", "gpushare-system"), ("team-a", "gpu-ops")]
)
def test_the_charts_monitoring_objects_are_accepted_strictly(
    helm: Path, plane: ControlPlane, tmp_path: Path, release: str, namespace: str
) -> None:
    docs = chart_monitoring(helm, tmp_path, release, namespace)
    assert sorted(d["kind"] for d in docs) == [
        "ConfigMap",
        "PodMonitor",
        "PodMonitor",
        "PrometheusRule",
    ]
    apply_strictly(plane, docs)


def test_deploy_monitoring_is_accepted_strictly(plane: ControlPlane) -> None:
    docs = documents(plane.kubectl("kustomize", str(REPO / "deploy/monitoring")).stdout)
    # The webhook's and the MPS daemon's PodMonitors, and the node agent's (deploy/node-agent).
    assert sorted(d["kind"] for d in docs) == [
        "ConfigMap",
        "PodMonitor",
        "PodMonitor",
        "PodMonitor",
        "PrometheusRule",
    ]
    apply_strictly(plane, docs)


def test_a_field_the_crd_lacks_is_refused(plane: ControlPlane) -> None:
    """What makes the applies above strict: one misspelt field of a PodMonitor is refused,
    not pruned (honorLabels dropped silently would move the showback namespace label)."""
    docs = documents(plane.kubectl("kustomize", str(REPO / "deploy/monitoring")).stdout)
    (webhook,) = [d for d in docs if d["metadata"]["name"] == "gpushare-webhook"]
    endpoint = webhook["spec"]["podMetricsEndpoints"][0]
    endpoint["honourLabels"] = endpoint.pop("honorLabels")
    ensure_namespaces(plane, [webhook])
    result = plane.kubectl(
        "apply", "--server-side", "--validate=strict", f"--field-manager={FIELD_MANAGER}-typo",
        "-f", "-", input=json.dumps(webhook), check=False,
    )  # fmt: skip
    assert result.returncode != 0
    assert ".spec.podMetricsEndpoints[0].honourLabels: field not declared in schema" in (
        result.stderr
    )


# -- the apiserver's webhook metrics -------------------------------------------------------

UNREACHABLE = "https://127.0.0.1:1/mutate"


def failing_webhook(name: str, policy: str, label: str) -> dict[str, Any]:
    return {
        "name": name,
        "clientConfig": {"url": UNREACHABLE},
        "rules": [
            {
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "operations": ["CREATE"],
                "resources": ["configmaps"],
            }
        ],
        "namespaceSelector": {"matchLabels": {"e2e-monitoring": label}},
        "failurePolicy": policy,
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
        "timeoutSeconds": 2,
    }


@pytest.fixture(scope="module")
def apiserver_metrics(plane: ControlPlane) -> dict[str, list[dict[str, str]]]:
    """The apiserver's /metrics after one call that fails closed (the ConfigMap refused) and
    one that fails open (admitted): each sample's labels, by sample name."""
    configuration = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "e2e-monitoring"},
        "webhooks": [
            failing_webhook("failclosed.e2e.gpushare.io", "Fail", "fail-closed"),
            failing_webhook("failopen.e2e.gpushare.io", "Ignore", "fail-open"),
        ],
    }
    kubectl(plane, "apply", "-f", "-", input=json.dumps(configuration))
    for label in ("fail-closed", "fail-open"):
        namespace = f"e2e-{label}"
        kubectl(plane, "create", "namespace", namespace)
        kubectl(plane, "label", "namespace", namespace, f"e2e-monitoring={label}")
    refused = plane.kubectl(
        "create", "configmap", "probe", "-n", "e2e-fail-closed", check=False, timeout=60
    )
    assert refused.returncode != 0
    assert 'failed calling webhook "failclosed.e2e.gpushare.io"' in refused.stderr
    kubectl(plane, "create", "configmap", "probe", "-n", "e2e-fail-open")
    return samples_by_name(kubectl(plane, "get", "--raw", "/metrics"))


SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? \S+")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def samples_by_name(exposition: str) -> dict[str, list[dict[str, str]]]:
    """Each sample's labels, by its name as exposed (prometheus_client's parser would add
    _total to a counter named ..._count, as Prometheus does not)."""
    samples: dict[str, list[dict[str, str]]] = {}
    for line in exposition.splitlines():
        found = SAMPLE.match(line)
        if found:
            labels = dict(LABEL.findall(found.group(2) or ""))
            samples.setdefault(found.group(1), []).append(labels)
    return samples


def selects(matchers: list[dict[str, str]], labels: dict[str, str]) -> bool:
    """A PromQL label matcher's verdict (regexes anchored, as Prometheus anchors them; a
    missing label is the empty string)."""
    for matcher in matchers:
        value, wanted, operator = (
            labels.get(matcher["label"], ""),
            matcher["value"],
            matcher["type"],
        )
        if operator in ("=", "!="):
            verdict = value == wanted
        else:
            verdict = re.fullmatch(wanted, value) is not None
        if verdict != (operator in ("=", "=~")):
            return False
    return True


def test_the_apiserver_alerts_select_series_the_apiserver_exports(
    apiserver_metrics: dict[str, list[dict[str, str]]],
) -> None:
    rules = [r for r in alert_rules() if "apiserver_" in str(r["expr"])]
    assert {r["alert"] for r in rules} == {
        "GpushareWebhookCallsFailing",
        "GpushareWebhookFailingOpen",
        "GpushareWebhookLatencyHighAtApiserver",
    }
    parsed = parse_promql([str(r["expr"]) for r in rules])
    checked = set()
    for rule, expression in zip(rules, parsed, strict=True):
        for selector in expression["selectors"]:
            series = apiserver_metrics.get(selector["name"], [])
            assert series, f"{rule['alert']}: the apiserver exports no {selector['name']}"
            chosen = [labels for labels in series if selects(selector["matchers"], labels)]
            assert chosen, (rule["alert"], selector, series)
            checked.add(selector["name"])
    assert checked == {
        "apiserver_admission_webhook_rejection_count",
        "apiserver_admission_webhook_request_total",
        "apiserver_admission_webhook_fail_open_count",
        "apiserver_admission_webhook_admission_duration_seconds_bucket",
    }


def test_the_failed_calls_are_counted_as_the_alerts_read_them(
    apiserver_metrics: dict[str, list[dict[str, str]]],
) -> None:
    """k8s.io/apiserver's dispatchers: a failed call of a Fail webhook is a rejection with
    error_type calling_webhook_error (code 503 when no HTTP status came back); one of an
    Ignore webhook is a fail-open, not a rejection."""
    rejections = [
        labels
        for labels in apiserver_metrics["apiserver_admission_webhook_rejection_count"]
        if labels["name"].endswith(".e2e.gpushare.io")
    ]
    assert rejections == [
        {
            "name": "failclosed.e2e.gpushare.io",
            "type": "admit",
            "operation": "CREATE",
            "error_type": "calling_webhook_error",
            "rejection_code": "503",
        }
    ]
    fail_open = [
        labels
        for labels in apiserver_metrics["apiserver_admission_webhook_fail_open_count"]
        if labels["name"].endswith(".e2e.gpushare.io")
    ]
    assert fail_open == [{"name": "failopen.e2e.gpushare.io", "type": "admit"}]
    requests = {
        (labels["name"], labels["code"], labels["rejected"])
        for labels in apiserver_metrics["apiserver_admission_webhook_request_total"]
        if labels["name"].endswith(".e2e.gpushare.io")
    }
    assert requests == {
        ("failclosed.e2e.gpushare.io", "503", "true"),
        ("failopen.e2e.gpushare.io", "503", "false"),
    }
