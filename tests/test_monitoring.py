"""The dashboard and the alerts in deploy/monitoring use only metrics the service exports.

The servers run for real and are scraped: ``gpushare serve`` (gunicorn, two workers, over
TLS, as tests/server starts it; scraped on its plain-HTTP metrics port, ``--metrics-port``,
which must serve every worker's counts and stay answering while clients hold connections)
and ``gpushare mps-daemon`` with fake GPUs and the stand-in MPS control program (as
tests/node runs it), its apiserver unreachable, which only keeps the node unlabelled;
``gpushare node-agent`` on a fake node (its NVML, pods and Node faked,
tests/node/fake_gpu_node_agent.py); the webhook first admits one pod under a policy that
counts shares. Every metric name in every dashboard target and every alert expression must be a
sample name of one of those scrapes (or, for the showback panels, one of the
kube-state-metrics series named below), and ``rate``/``increase`` must only see counters and
histogram series. The structure of the PrometheusRule and of
the Grafana dashboard is checked as Prometheus Operator and Grafana read them.

The expressions are read by Prometheus's own PromQL parser (tests/promql, a small Go
program on github.com/prometheus/prometheus/promql/parser, built once into
~/.cache/gpushare-promql): each must parse as a Prometheus server would parse it, and the
names checked are the parser's vector selectors, so nothing in a label matcher, a string,
a ``by`` list or a function name is mistaken for a metric. PyPI has no PromQL parser.
The same program runs the alerts' unit tests, tests/promql/rules/*.yaml in promtool's
``test rules`` format (recorded series, evaluation times, expected alerts), on Prometheus's
own rule manager: each must pass, every alert must fire in one of them, and a healthy set
must fire none.
Series names of histograms are checked as the scrape shows them (``_bucket``, ``_sum``,
``_count``), read with prometheus_client's own exposition parser.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from werkzeug.test import Client

from tests.node.agent_fakes import fake_node_files
from tests.node.node_fakes import A100, fake_gpus_file, mps_daemon_policy, write_fake_control
from tests.server.support import (
    BUNDLED_POLICIES,
    RunningServer,
    annotated_pod,
    free_port,
    review,
    running_server,
    share_counting_policies,
    wait_until,
)
from webhook.constants import SHARE_RESOURCE
from webhook.policy_store import PolicyStore
from webhook.server.app import create_app
from webhook.server.async_worker import METRICS_MAX_CONNECTIONS
from webhook.server.metrics import AdmissionMetrics

REPO = Path(__file__).resolve().parents[1]
MONITORING = REPO / "deploy" / "monitoring"
RULES = MONITORING / "prometheusrule.yaml"
DASHBOARD = MONITORING / "gpushare-dashboard.json"
RUNBOOKS = REPO / "docs" / "monitoring.md"
FAKE_GPU_LAUNCHER = REPO / "tests" / "node" / "fake_gpu_launcher.py"
FAKE_NODE_AGENT = REPO / "tests" / "node" / "fake_gpu_node_agent.py"

# -- PromQL, read by Prometheus's own parser ---------------------------------------------------

PROMQL_SOURCE = REPO / "tests" / "promql"
PROMQL_CACHE = Path(os.environ.get("GPUSHARE_PROMQL_CACHE", Path.home() / ".cache/gpushare-promql"))
BUILD_TIMEOUT_S = 900  # a cold module cache downloads Prometheus's parser and its imports
# Grafana's built-in intervals, replaced before parsing as Grafana does before querying.
GRAFANA_INTERVALS = re.compile(r"\$__(rate_interval|interval|range)\b")


def promql_binary() -> Path:
    """tests/promql built once per content hash, outside the repository."""
    go = shutil.which("go") or "/usr/local/go/bin/go"
    if not Path(go).exists():
        pytest.skip("Go is not installed: tests/promql (Prometheus's PromQL parser) needs it")
    version = subprocess.run([go, "version"], capture_output=True, check=True).stdout
    digest = hashlib.sha256(version)
    for path in sorted(PROMQL_SOURCE.iterdir()):
        if path.is_file():  # the Go files, go.mod, go.sum (rules/ holds test data)
            digest.update(path.name.encode() + path.read_bytes())
    target = PROMQL_CACHE / digest.hexdigest()[:16] / "promql"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(".partial")
        built = subprocess.run(
            [go, "build", "-o", str(partial), "."], cwd=PROMQL_SOURCE, capture_output=True,
            text=True, timeout=BUILD_TIMEOUT_S, check=False,
        )  # fmt: skip
        assert built.returncode == 0, f"go build tests/promql failed:\n{built.stderr}"
        partial.replace(target)
    return target


def parse_promql(expressions: list[str]) -> list[dict[str, Any]]:
    """Each expression's metric names, functions over its ranges, or its parse error."""
    queries = [GRAFANA_INTERVALS.sub("5m", expression) for expression in expressions]
    result = subprocess.run(
        [str(promql_binary())], input=json.dumps(queries), capture_output=True, text=True,
        timeout=60, check=True,
    )  # fmt: skip
    parsed: list[dict[str, Any]] = json.loads(result.stdout)
    return parsed


def test_the_parser_reads_names_as_prometheus_does() -> None:
    cases = {
        'sum by (le) (rate(x_bucket{a="b{c}"}[5m]))': ["x_bucket"],
        'count(m{l=~"sum(rate(fake_total[5m]))"}) - time() < 14 * 86400': ["m"],
        '{__name__="only_matchers"} offset 1d / on (ns) group_left (pod) b': [
            "b",
            "only_matchers",
        ],
        "max_over_time(g[1h:5m]) > bool 2": ["g"],
    }
    parsed = parse_promql([*cases, "sum(rate(x[5m])"])
    assert [p.get("error") for p in parsed[:-1]] == [None] * len(cases)
    assert [p["names"] for p in parsed[:-1]] == list(cases.values())
    assert parsed[0]["rangedBy"] == {"x_bucket": ["rate"]}
    assert "unclosed left parenthesis" in parsed[-1]["error"]


# -- What the files use ---------------------------------------------------------------------


def alert_rules() -> list[dict[str, Any]]:
    rule = yaml.safe_load(RULES.read_text())
    return [r for group in rule["spec"]["groups"] for r in group["rules"]]


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def dashboard_panels() -> list[dict[str, Any]]:
    panels = []
    for panel in dashboard()["panels"]:
        panels.append(panel)
        panels.extend(panel.get("panels", []))  # a collapsed row keeps its panels inside
    return [panel for panel in panels if panel["type"] != "row"]


def expressions() -> list[tuple[str, str]]:
    """(where, PromQL) for every alert and every dashboard target."""
    found = [(f"alert {rule['alert']}", str(rule["expr"])) for rule in alert_rules()]
    for panel in dashboard_panels():
        for target in panel["targets"]:
            found.append((f"panel {panel['title']!r} {target['refId']}", target["expr"]))
    return found


# -- The real servers' exports ---------------------------------------------------------------


def sample_types(exposition: str) -> dict[str, str]:
    """Each sample name of a scrape (``x_total``, ``h_bucket``...) and its family's type."""
    return {
        sample.name: family.type
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
    }


@pytest.fixture(scope="module")
def webhook_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """The webhook (two workers) with its plain-HTTP metrics port, after admitting one pod
    under a policy that counts shares (the showback counter has no series before it counts
    one)."""
    directory = tmp_path_factory.mktemp("webhook")
    policies = share_counting_policies(directory / "policies")
    metrics_port = free_port()
    with running_server(
        directory, "--policies", str(policies), "--metrics-port", str(metrics_port)
    ) as server:
        server.extra["metrics_port"] = metrics_port
        status, _ = server.json("POST", "/mutate", review(annotated_pod("0.5")))
        assert status == 200
        yield server


@pytest.fixture(scope="module")
def webhook_exposition(webhook_server: RunningServer) -> str:
    """The webhook's scrape as Prometheus takes it: from the metrics port."""
    return http_get(f"http://127.0.0.1:{webhook_server.extra['metrics_port']}/metrics")


def listening(process: subprocess.Popen[bytes], stderr: Path) -> str | None:
    """The address a gpushare node daemon logged it listens on (its "listening" line), or
    None before that line; the daemon must still be running."""
    assert process.poll() is None, stderr.read_text()
    for line in stderr.read_text().splitlines():
        if line.startswith("{") and json.loads(line).get("event") == "listening":
            return str(json.loads(line)["address"])
    return None


@pytest.fixture(scope="module")
def mps_exposition(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    directory = tmp_path_factory.mktemp("mps")
    (directory / "pipe").mkdir()
    policy = mps_daemon_policy(directory, pipe=directory / "pipe", log=directory / "log")
    kubeconfig = directory / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\n"
        'clusters: [{name: none, cluster: {server: "https://127.0.0.1:1"}}]\n'
        "users: [{name: none, user: {token: none}}]\n"
        "contexts: [{name: none, context: {cluster: none, user: none}}]\n"
        "current-context: none\n"
    )
    stderr = directory / "stderr"
    with stderr.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, str(FAKE_GPU_LAUNCHER), str(fake_gpus_file(directory, [A100])),
             "mps-daemon", "--policies", str(policy), "--pool", "a100-mps",
             "--node-name", "gpu-node-1", "--kubeconfig", str(kubeconfig),
             "--mps-control", str(write_fake_control(directory)), "--listen", "127.0.0.1:0"],
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=log,
        )  # fmt: skip
    try:
        assert wait_until(lambda: listening(process, stderr) is not None, timeout=30), (
            stderr.read_text()
        )
        address = listening(process, stderr)
        # The metrics of a started daemon: wait until the supervisor has seen it up.
        body = ""

        def daemon_up() -> bool:
            nonlocal body
            body = http_get(f"http://{address}/metrics")
            return "gpushare_mps_daemon_up 1.0" in body.splitlines()

        assert wait_until(daemon_up, timeout=30), stderr.read_text()
        yield body
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.fixture(scope="module")
def node_agent_exposition(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``gpushare node-agent`` with a fake node (tests/node/agent_fakes.py): one GPU with a
    capped pod's process, an uncapped one over its share, and a host process; scraped once
    its first round is in the metrics."""
    directory = tmp_path_factory.mktemp("node-agent")
    inventory, pods, flags = fake_node_files(directory)
    stderr = directory / "stderr"
    with stderr.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, str(FAKE_NODE_AGENT), str(inventory), str(pods), "node-agent",
             "--node-name", "gpu-node-1", "--listen", "127.0.0.1:0", *flags],
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=log,
        )  # fmt: skip
    try:
        assert wait_until(lambda: listening(process, stderr) is not None, timeout=30), (
            stderr.read_text()
        )
        body = ""

        def audited() -> bool:
            nonlocal body
            body = http_get(f"http://{listening(process, stderr)}/metrics")
            return "gpushare_node_gpu_processes 3.0" in body.splitlines()

        assert wait_until(audited, timeout=30), stderr.read_text()
        yield body
    finally:
        process.terminate()
        process.wait(timeout=30)


def http_get(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=5) as response:
        return str(response.read().decode())


# What the showback panels read of kube-state-metrics, which a cluster runs on its own (the
# kube-prometheus stack does): names and types as its docs list them
# (github.com/kubernetes/kube-state-metrics, docs/metrics/workload/pod-metrics.md and
# docs/metrics/policy/resourcequota-metrics.md). A pod's extended resource is its label
# resource with every character outside [a-zA-Z0-9_] made "_" (SanitizeLabelName in its
# internal/store/utils.go); a ResourceQuota's resource label is the quota's own name.
KUBE_STATE_METRICS = {
    "kube_pod_container_resource_requests": "gauge",
    "kube_pod_status_phase": "gauge",
    "kube_resourcequota": "gauge",
    # GpushareMpsDaemonMetricsAbsent: the MPS DaemonSet's pods by node (pod-metrics.md).
    "kube_pod_info": "gauge",
}
# The kube-apiserver's own metrics of its webhook calls, which the gpushare-apiserver alerts
# read: k8s.io/apiserver v0.37.2 pkg/admission/metrics/metrics.go (its CounterVecs take no
# _total suffix: the names are as written there). tests/e2e/test_monitoring_objects.py reads
# them, with the labels the alerts match on, off the harness's real kube-apiserver.
APISERVER_METRICS = {
    "apiserver_admission_webhook_request_total": "counter",
    "apiserver_admission_webhook_rejection_count": "counter",
    "apiserver_admission_webhook_fail_open_count": "counter",
    **{
        f"apiserver_admission_webhook_admission_duration_seconds{suffix}": "histogram"
        for suffix in ("_bucket", "_sum", "_count")
    },
}
KSM_SHARE_RESOURCE = re.sub(r"[^a-zA-Z0-9_]", "_", SHARE_RESOURCE)
QUOTA_SHARE_RESOURCE = f"requests.{SHARE_RESOURCE}"


@pytest.fixture(scope="module")
def exported(
    webhook_exposition: str, mps_exposition: str, node_agent_exposition: str
) -> dict[str, str]:
    return (
        sample_types(webhook_exposition)
        | sample_types(mps_exposition)
        | sample_types(node_agent_exposition)
        | KUBE_STATE_METRICS
        | APISERVER_METRICS
    )


@pytest.fixture(scope="module")
def parsed() -> dict[str, dict[str, Any]]:
    """Every expression's parse, by where it comes from."""
    found = expressions()
    return dict(
        zip([where for where, _ in found], parse_promql([e for _, e in found]), strict=True)
    )


def test_every_expression_parses(parsed: dict[str, dict[str, Any]]) -> None:
    errors = {where: p["error"] for where, p in parsed.items() if p.get("error")}
    assert errors == {}
    # Each one selects at least one metric, so the check below sees all of them.
    assert [where for where, p in parsed.items() if not p["names"]] == []


@pytest.mark.server
def test_every_metric_the_dashboard_and_alerts_use_is_exported(
    parsed: dict[str, dict[str, Any]], exported: dict[str, str]
) -> None:
    used = {where: p["names"] for where, p in parsed.items()}
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] == "query":  # Grafana's label_values(METRIC, LABEL), not PromQL
            metric = re.fullmatch(r"label_values\((\w+),\s*\w+\)", variable["definition"])
            assert metric, variable["definition"]
            used[f"variable {variable['name']}"] = [metric.group(1)]
    missing = [
        f"{where}: {name}"
        for where, names in used.items()
        for name in names
        if name not in exported
    ]
    assert missing == [], (
        f"not exported by the webhook, the MPS daemon or the node agent: {missing}"
    )


RATE_FUNCTIONS = {"rate", "irate", "increase", "resets"}


@pytest.mark.server
def test_rates_are_taken_of_counters_and_histograms_only(
    parsed: dict[str, dict[str, Any]], exported: dict[str, str]
) -> None:
    wrong = [
        f"{where}: {function}({name}) of a {exported.get(name)}"
        for where, p in parsed.items()
        for name, functions in p["rangedBy"].items()
        for function in functions
        if function in RATE_FUNCTIONS and exported.get(name) not in ("counter", "histogram")
    ]
    assert wrong == []


@pytest.mark.server
def test_the_live_values_the_alerts_read(webhook_exposition: str, mps_exposition: str) -> None:
    values = {
        sample.name: sample.value
        for family in text_string_to_metric_families(webhook_exposition + mps_exposition)
        for sample in family.samples
        if not sample.labels
    }
    # The serving certificate `gpushare serve` made is valid for a year, not "expired".
    assert values["gpushare_certificate_expiry_timestamp_seconds"] > time.time() + 300 * 86400
    assert values["gpushare_policy_last_reload_successful"] == 1.0
    assert values["gpushare_policies_loaded"] >= 1.0
    assert values["gpushare_mps_daemon_up"] == 1.0
    assert values["gpushare_mps_gpus"] == 1.0
    # The apiserver is unreachable, so the node is never labelled ready.
    assert values["gpushare_mps_node_ready"] == 0.0


@pytest.mark.server
def test_the_node_agents_live_values(node_agent_exposition: str) -> None:
    """The fake node's planted process: uncapped and over its share; the host process in no
    pod, on a GPU a shared pod uses; the hook in the plugin's spec, so the limit enforced."""
    values = {
        sample.name: sample.value
        for family in text_string_to_metric_families(node_agent_exposition)
        for sample in family.samples
        if not sample.labels
    }
    assert values["gpushare_node_gpu_processes_uncapped"] == 1.0
    assert values["gpushare_node_gpu_processes_over_share"] == 1.0
    assert values["gpushare_node_gpu_processes_unattributed"] == 1.0
    assert values["gpushare_node_driver_memory_limit_enforced"] == 1.0
    assert values["gpushare_node_audit_last_success_timestamp_seconds"] > time.time() - 300


@pytest.mark.server
def test_the_webhook_counts_admitted_shares_across_its_workers(webhook_exposition: str) -> None:
    (sample,) = [
        sample
        for family in text_string_to_metric_families(webhook_exposition)
        for sample in family.samples
        if sample.name == "gpushare_admitted_milligpus_total"
    ]
    assert sample.labels == {"namespace": "ml", "policy": "default"}
    assert sample.value == 500.0


# -- The metrics port: plain HTTP, /metrics alone -----------------------------------------------

METRICS_PORT_ADMISSIONS = 24
METRICS_PORT_SCRAPES = 8


def admissions_counted(exposition: str) -> float:
    return sum(
        sample.value
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
        if sample.name == "gpushare_admission_requests_total"
        and sample.labels["endpoint"] == "mutate"
    )


@pytest.mark.server
def test_the_metrics_port_serves_the_counts_of_every_worker(
    webhook_server: RunningServer, webhook_exposition: str
) -> None:
    """Admissions on connections of their own, which the kernel hands to either worker's
    listener (reuse_port): every scrape of the metrics port, on a connection of its own and
    so answered by either worker, counts all of them, as /metrics on the admission port does.
    A scrape of one worker's counts would fall short: all 24 going to one of the two workers
    has a chance of 2 in 2**24."""
    url = f"http://127.0.0.1:{webhook_server.extra['metrics_port']}/metrics"
    before = admissions_counted(http_get(url))
    assert before == admissions_counted(webhook_exposition) >= 1
    for _ in range(METRICS_PORT_ADMISSIONS):
        status, _ = webhook_server.json(
            "POST", "/mutate", review(annotated_pod("0.5"), namespace="merged")
        )
        assert status == 200
    expected = before + METRICS_PORT_ADMISSIONS
    assert [admissions_counted(http_get(url)) for _ in range(METRICS_PORT_SCRAPES)] == [
        expected
    ] * METRICS_PORT_SCRAPES
    status, body = webhook_server.request("GET", "/metrics")  # kept on the admission port
    assert status == 200 and admissions_counted(body.decode()) == expected


@pytest.mark.server
def test_the_metrics_port_answers_while_clients_hold_connections(
    webhook_server: RunningServer,
) -> None:
    """Clients that connect and send nothing, or half a request, more of them than both
    workers' metrics connections together: a scrape is still answered at once (the oldest
    held connection makes room), and so is the admission port."""
    port = webhook_server.extra["metrics_port"]
    held: list[socket.socket] = []
    try:
        for index in range(2 * METRICS_MAX_CONNECTIONS + 8):
            connection = socket.create_connection(("127.0.0.1", port), timeout=5)
            held.append(connection)
            if index % 2:
                connection.sendall(b"GET /metrics HTTP/1.1\r\nHost: scraper\r\n")
        started = time.monotonic()
        body = http_get(f"http://127.0.0.1:{port}/metrics")
        assert time.monotonic() - started < 2.0
        assert admissions_counted(body) >= 1
        assert webhook_server.request("GET", "/readyz")[0] == 200
    finally:
        for connection in held:
            connection.close()


@pytest.mark.server
def test_the_metrics_port_serves_nothing_but_metrics(webhook_server: RunningServer) -> None:
    """No admission or status path over plain HTTP: the apiserver's port stays the TLS one."""
    port = webhook_server.extra["metrics_port"]
    for method, path in (("POST", "/mutate"), ("POST", "/validate"), ("GET", "/readyz")):
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        try:
            body = json.dumps(review(annotated_pod("0.5"))).encode()
            connection.request(method, path, body=body if method == "POST" else None)
            response = connection.getresponse()
            answer = json.loads(response.read())
        finally:
            connection.close()
        assert response.status == 404, (method, path)
        assert "serves /metrics only on this port" in answer["response"]["status"]["message"]


# -- The showback panels ---------------------------------------------------------------------

SHOWBACK_PANELS = {
    "GPU shares admitted per namespace": {"gpushare_admitted_milligpus_total"},
    "GPU shares held per namespace": {
        "kube_pod_container_resource_requests",
        "kube_pod_status_phase",
    },
    "GPU share quota used vs hard": {"kube_resourcequota"},
}


def test_the_showback_panels_read_the_share_resource_as_kube_state_metrics_names_it(
    parsed: dict[str, dict[str, Any]],
) -> None:
    panels = {panel["title"]: panel for panel in dashboard_panels()}
    for title, metrics in SHOWBACK_PANELS.items():
        targets = panels[title]["targets"]
        for target in targets:
            where = f"panel {title!r} {target['refId']}"
            assert set(parsed[where]["names"]) == metrics, where
            # By the pods' namespace; GPUs' worth of thousandths, or a ratio of two.
            assert "by (namespace)" in target["expr"], where
            assert "/ 1000" in target["expr"] or "/ clamp_min(" in target["expr"], where
    held = panels["GPU shares held per namespace"]["targets"][0]["expr"]
    assert f'resource="{KSM_SHARE_RESOURCE}"' in held
    assert KSM_SHARE_RESOURCE == "gpushare_io_milligpu"
    for target in panels["GPU share quota used vs hard"]["targets"]:
        assert f'resource="{QUOTA_SHARE_RESOURCE}"' in target["expr"]
    # Only the showback panels read kube-state-metrics; the webhook's namespace variable is
    # not theirs to filter by (their namespace is the pods').
    for panel in dashboard_panels():
        names = {
            n
            for t in panel["targets"]
            for n in parsed[f"panel {panel['title']!r} {t['refId']}"]["names"]
        }
        if names & set(KUBE_STATE_METRICS):
            assert panel["title"] in SHOWBACK_PANELS, panel["title"]
        if panel["title"] in SHOWBACK_PANELS:
            assert all("$namespace" not in t["expr"] for t in panel["targets"]), panel["title"]


def test_the_webhook_scrape_keeps_the_pods_namespace() -> None:
    """The showback counter's namespace label is the admitted pod's: Prometheus would move
    it to exported_namespace under the PodMonitor's own namespace label without honorLabels."""
    webhook, _, node_agent = yaml.safe_load_all((MONITORING / "podmonitors.yaml").read_text())
    assert webhook["metadata"]["name"] == "gpushare-webhook"
    (endpoint,) = webhook["spec"]["podMetricsEndpoints"]
    assert endpoint["honorLabels"] is True
    # Likewise the node agent's per-process series: the GPU process's namespace and pod.
    assert node_agent["metadata"]["name"] == "gpushare-node-agent"
    (endpoint,) = node_agent["spec"]["podMetricsEndpoints"]
    assert endpoint["honorLabels"] is True


# -- The policy reload gauge --------------------------------------------------------------


def gauge(client: Client, name: str) -> float:
    text = client.get("/metrics").get_data(as_text=True)
    (value,) = [float(line.split()[1]) for line in text.splitlines() if line.startswith(name + " ")]
    return value


def test_last_reload_successful_stays_zero_while_the_files_are_bad(tmp_path: Path) -> None:
    policies = tmp_path / "policies"
    policies.mkdir()
    good = (BUNDLED_POLICIES / "default.yaml").read_text()
    (policies / "default.yaml").write_text(good)
    metrics = AdmissionMetrics()
    store = PolicyStore.loaded(
        policies,
        on_reload=lambda ok, loaded: metrics.observe_policy_reload(
            ok, len(loaded.policies) if loaded else None
        ),
    )
    client = Client(create_app(store, metrics=metrics))
    name = "gpushare_policy_last_reload_successful"
    assert gauge(client, name) == 1.0
    (policies / "default.yaml").write_text("apiVersion: [\n")
    store.refresh()
    assert gauge(client, name) == 0.0
    # The counter moves once per refused version; the gauge stays down until a fix.
    store.refresh()
    assert gauge(client, name) == 0.0
    assert gauge(client, 'gpushare_policy_reloads_total{result="failed"}') == 1.0
    (policies / "default.yaml").write_text(good + "\n# fixed\n")
    store.refresh()
    assert gauge(client, name) == 1.0


def test_a_first_load_that_failed_reads_as_an_unsuccessful_reload(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("apiVersion: [\n")
    metrics = AdmissionMetrics()
    client = Client(create_app(PolicyStore.loaded(tmp_path), metrics=metrics))
    assert gauge(client, "gpushare_policy_last_reload_successful") == 0.0
    assert gauge(client, "gpushare_policies_loaded") == 0.0


# -- The PrometheusRule ----------------------------------------------------------------------

DURATION = re.compile(r"^([0-9]+(ms|s|m|h|d|w|y))+$")
# Where the alerts' runbook_url point (the chart's monitoring.prometheusRule.runbookBaseURL).
RUNBOOK_BASE = "https://github.com/gpushare/gpushare/blob/main/docs/monitoring.md"
SEVERITIES = {"critical", "warning", "info"}


def anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    return {
        re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        for line in markdown.splitlines()
        if line.startswith("#")
    }


def test_the_prometheusrule_is_well_formed() -> None:
    rule = yaml.safe_load(RULES.read_text())
    assert rule["apiVersion"] == "monitoring.coreos.com/v1" and rule["kind"] == "PrometheusRule"
    assert rule["metadata"]["name"]
    groups = rule["spec"]["groups"]
    assert len({group["name"] for group in groups}) == len(groups)
    known_anchors = anchors(RUNBOOKS.read_text())
    for group in groups:
        assert set(group) <= {"name", "rules", "interval", "limit"}, group["name"]
        for alert in group["rules"]:
            name = alert.get("alert")
            assert name and re.fullmatch(r"Gpushare[A-Z][A-Za-z]+", name), alert
            assert set(alert) <= {"alert", "expr", "for", "labels", "annotations"}, name
            expression = str(alert["expr"])
            for opening, closing in ("()", "{}", "[]"):
                assert expression.count(opening) == expression.count(closing), name
            assert "for" not in alert or DURATION.match(alert["for"]), name
            assert alert["labels"]["severity"] in SEVERITIES, name
            annotations = alert["annotations"]
            assert {"summary", "description", "runbook", "runbook_url"} <= set(annotations)
            assert all(str(text).strip() for text in annotations.values()), name
            # The runbook names its section of docs/monitoring.md, and that section exists.
            anchor = re.search(r"docs/monitoring\.md#([\w-]+)", annotations["runbook"])
            assert anchor and anchor.group(1) in known_anchors, (name, anchor)
            # runbook_url, as Alertmanager's receivers link it: the same section.
            assert annotations["runbook_url"] == f"{RUNBOOK_BASE}#{anchor.group(1)}", name
            assert anchor.group(1) == name.lower(), name


ISSUE_TOPICS = {
    "admissions by outcome": "gpushare_admission_requests_total",
    "latency percentiles": "gpushare_admission_duration_seconds_bucket",
    "policy reload failures": "gpushare_policy_last_reload_successful",
    "certificate expiry": "gpushare_certificate_expiry_timestamp_seconds",
    "MPS daemon up": "gpushare_mps_daemon_up",
    "MPS node readiness": "gpushare_mps_node_ready",
    "uncapped GPU processes": "gpushare_node_gpu_processes_uncapped",
    "GPU processes over their share": "gpushare_node_gpu_processes_over_share",
}


@pytest.mark.parametrize("topic", sorted(ISSUE_TOPICS))
def test_each_topic_has_an_alert_and_a_panel(topic: str, parsed: dict[str, dict[str, Any]]) -> None:
    metric = ISSUE_TOPICS[topic]
    users = [where for where, p in parsed.items() if metric in p["names"]]
    alerts = [where for where in users if where.startswith("alert ")]
    panels = [where for where in users if where.startswith("panel ")]
    assert alerts and panels, (topic, users)


# -- The dashboard ---------------------------------------------------------------------------


def test_the_dashboard_is_well_formed() -> None:
    board = dashboard()
    assert board["uid"] == "gpushare" and board["title"]
    assert isinstance(board["schemaVersion"], int)
    variables = {v["name"]: v for v in board["templating"]["list"]}
    # The data source is a variable, so the dashboard imports into any Grafana.
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    source = {"type": "prometheus", "uid": "${datasource}"}
    for variable in variables.values():
        if variable["type"] == "query":
            assert variable["datasource"] == source, variable["name"]
            assert variable["query"]["query"] == variable["definition"], variable["name"]

    panels = dashboard_panels()
    ids = [panel["id"] for panel in board["panels"]]
    assert len(set(ids)) == len(ids)
    used_variables = set()
    cells: set[tuple[int, int]] = set()
    for panel in board["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["w"] > 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        covered = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not covered & cells, f"{panel['title']!r} overlaps another panel"
        cells |= covered
    for panel in panels:
        title = panel["title"]
        assert panel["datasource"] == source, title
        assert panel.get("description"), title
        targets = panel["targets"]
        assert targets, f"panel {title!r} has no targets"
        assert len({t["refId"] for t in targets}) == len(targets), title
        for target in targets:
            assert target["datasource"] == source, title
            assert target["expr"].strip(), title
            used_variables |= set(re.findall(r"\$(?!__)(\w+)", target["expr"]))
    assert used_variables <= set(variables), used_variables - set(variables)


def test_the_kustomization_lists_the_files_here() -> None:
    kustomization = yaml.safe_load((MONITORING / "kustomization.yaml").read_text())
    for resource in kustomization["resources"]:
        assert (MONITORING / resource).is_file(), resource
    (generator,) = kustomization["configMapGenerator"]
    assert generator["files"] == [DASHBOARD.name]
    # The label Grafana's dashboard sidecar (kube-prometheus-stack) looks for.
    assert generator["options"]["labels"] == {"grafana_dashboard": "1"}
    for document in yaml.safe_load_all((MONITORING / "podmonitors.yaml").read_text()):
        assert document["kind"] == "PodMonitor"
        (endpoint,) = document["spec"]["podMetricsEndpoints"]
        assert endpoint["path"] == "/metrics"


# -- The alerts evaluated by Prometheus's rule manager ------------------------------------------

RULE_TESTS = PROMQL_SOURCE / "rules"


@pytest.fixture(scope="module")
def rule_test_results() -> list[dict[str, Any]]:
    """tests/promql/rules/*.yaml (promtool's `test rules` format: recorded series, eval times,
    expected alerts) run by `promql test-rules` on Prometheus's own rule manager."""
    files = sorted(str(path) for path in RULE_TESTS.glob("*.yaml"))
    assert files, f"no rule tests in {RULE_TESTS}"
    result = subprocess.run(
        [str(promql_binary()), "test-rules", *files], capture_output=True, text=True,
        timeout=120, check=True,
    )  # fmt: skip
    results: list[dict[str, Any]] = json.loads(result.stdout)
    return results


def test_the_alert_rule_tests_pass(rule_test_results: list[dict[str, Any]]) -> None:
    failures = {
        f"{Path(result['file']).name}: {test['name']}": test["errors"]
        for result in rule_test_results
        for test in result["tests"]
        if test["errors"]
    }
    assert [r["error"] for r in rule_test_results if r.get("error")] == []
    assert failures == {}


def test_every_alert_has_a_test_that_fires_it(rule_test_results: list[dict[str, Any]]) -> None:
    fired = {name for r in rule_test_results for test in r["tests"] for name in test["fired"]}
    assert {rule["alert"] for rule in alert_rules()} - fired == set()


def test_a_healthy_cluster_fires_no_alert(rule_test_results: list[dict[str, Any]]) -> None:
    """At no evaluation of two healthy hours, not only at the eval times the file checks."""
    (healthy,) = [r for r in rule_test_results if Path(r["file"]).name == "healthy.yaml"]
    assert [(test["name"], test["fired"]) for test in healthy["tests"]] == [
        ("a healthy cluster fires nothing", [])
    ]


def test_the_rule_tests_read_the_repository_rules() -> None:
    for path in sorted(RULE_TESTS.glob("*.yaml")):
        unit = yaml.safe_load(path.read_text())
        assert [(path.parent / f).resolve() for f in unit["rule_files"]] == [RULES], path


def test_a_failing_expectation_fails(tmp_path: Path) -> None:
    """The runner compares: an alert expected but not firing, and unknown keys, are errors."""
    unit = {
        "rule_files": [str(RULES)],
        "tests": [
            {
                "name": "wrong",
                "interval": "1m",
                "input_series": [{"series": 'gpushare_policies_loaded{pod="a"}', "values": "1x20"}],
                "alert_rule_test": [
                    {
                        "eval_time": "15m",
                        "alertname": "GpushareWebhookMetricsAbsent",
                        "exp_alerts": [{"exp_labels": {"severity": "critical"}}],
                    }
                ],
            }
        ],
    }
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text(yaml.safe_dump(unit))
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text(yaml.safe_dump({**unit, "tests": [{**unit["tests"][0], "typo": 1}]}))
    result = subprocess.run(
        [str(promql_binary()), "test-rules", str(wrong), str(unknown)], capture_output=True,
        text=True, timeout=60, check=True,
    )  # fmt: skip
    first, second = json.loads(result.stdout)
    (test,) = first["tests"]
    assert "expected but not firing" in test["errors"][0]
    assert "field typo not found" in second["error"]
