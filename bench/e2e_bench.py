"""End-to-end cost of admission: pod creates through a real kube-apiserver, seven ways.

Run from the repository root (builds or reuses the Go harness and the two Go webhooks):

    .venv/bin/python bench/e2e_bench.py                          # a few minutes
    .venv/bin/python bench/e2e_bench.py --count 100 --burst-count 300 --rounds 1   # quick look

Starts the e2e control plane of harness/controlplane.py (etcd + kube-apiserver; no
scheduler, so nothing but the creates loads the machine), `gpushare serve` with certificates
from `gpushare certs` and the bundled policies, a no-op Go webhook
(harness/tools/noop-webhook: allowed, no patch) and a Go controller-runtime peer
(harness/tools/cr-webhook, bench/e2e_webhooks.py). Every mode below is put in force once,
each limited to the pods of a namespace of its own (bench-none, bench-noop, ...), and the
same annotated pod (gpu-fraction "0.5", a realistic training container) is created over and
over in each namespace. At concurrency 1 the modes take turns create by create, so
consecutive creates of all modes meet the same machine and drift on a shared machine cancels
out of every comparison; at concurrency 8 each mode runs a batch of its own (interleaved,
every mode would run under the others' load), in an order shuffled afresh each round
(seeded: --seed), so that no mode always follows the same one:

- **none**: no admission configuration at all (the annotation is just an annotation);
- **noop**: the no-op webhook registered as a mutating webhook for pods: the floor any
  webhook pays (the apiserver encodes the review, the TLS round trip, decoding);
- **peer**: the controller-runtime webhook registered as the only mutating webhook: the
  mutation gpushare's default policy makes of this pod, hard-coded, with controller-runtime's
  defaults (a peer doing the same work);
- **reference**: a MutatingAdmissionPolicy applying the webhook's own patch of this pod as
  constant ops, no variables or conditions: the floor of any admission policy doing this
  mutation, which the compiled policies cannot go below;
- **webhook**: gpushare's mutating webhook alone (the shipped registration without the
  safety-net ValidatingAdmissionPolicy);
- **shipped**: gpushare as `gpushare webhook-config --url ... --policies ...` prints it by
  default;
- **compiled**: what `gpushare compile` prints for the same policies (admission policies in
  the apiserver, no webhook).

Before measuring, a dry-run create of the bench pod in each mutating mode's namespace must
come back, field by field, as it does under gpushare's webhook alone (server-set metadata
aside; the peer writes the same gpushare.io/applied annotation): the run stops with the
differing fields otherwise.

Each client thread keeps one TLS connection to the apiserver (client-certificate auth) and
POSTs raw JSON. Concurrency 1 and 8. The table gives creates/s, p50/p99 latency and the
apiserver process's CPU per create (/proc: on a shared machine a steadier view of what runs
inside the apiserver, where compiled policies run; per mode only at concurrency 8) per mode,
then what each mode adds over **none** at p50 and p99, in ms and as a multiple of what the
no-op webhook adds. Targets (issue 11): shipped <= 3.0x no-op; compiled <= 1.25x no-op at
concurrency 1 and <= 0.6x shipped at concurrency 1 and 8 (p50). Targets (issue 29, against
peers doing the same work, pooled over rounds and in the median round): webhook <= 1.0x
peer, shipped <= 1.1x peer, compiled <= 1.1x reference (p50 added, concurrency 1 and 8), and
the apiserver's CPU per create under shipped <= 1.1x under peer (concurrency 8). The
apiserver's own view of each webhook call
(apiserver_admission_webhook_admission_duration_seconds) is printed beside the time inside
the gpushare app.

Bounded: --count turns at concurrency 1 and --burst-count creates per batch above it (a
batch of a second or more: shorter ones moved with the apiserver's garbage collection and
etcd's housekeeping, from one batch of the same mode to the next), --rounds rounds, and
--max-seconds for the whole run
(what was measured until then is still reported). Loopback only. Exit status 0 when every
target is met, 1 when not, 2 when a create failed.

For finding where the time goes (bench/README.md): --profile DIR writes the apiserver's CPU
profile of each batch above concurrency 1, and --peer-http1 has the peer offer HTTP/1.1
only (as kubebuilder's scaffold sets controller-runtime up) instead of HTTP/2.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import http.client
import json
import os
import random
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import yaml  # noqa: E402
from kubernetes import client as k8s  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from bench.e2e_report import MODES, Cell, percentile, report  # noqa: E402
from bench.e2e_webhooks import (  # noqa: E402
    ALONE_NAME,
    NOOP_NAME,
    PEER_NAME,
    GoWebhook,
    noop_webhook,
    peer_webhook,
    stored_differences,
    webhook_alone,
)
from harness.api import create_pod, ensure_namespace  # noqa: E402
from harness.binary import HarnessBuildError, build_binary  # noqa: E402
from harness.cli import gpushare  # noqa: E402
from harness.controlplane import ControlPlane  # noqa: E402
from harness.processes import LOOPBACK  # noqa: E402
from harness.registration import MUTATING_WEBHOOK, GpushareWebhook  # noqa: E402
from harness.webhookserver import WebhookServer  # noqa: E402
from webhook.compile import compile_policies  # noqa: E402
from webhook.compile.pod_cel import match_constraints  # noqa: E402
from webhook.constants import APPLIED_ANNOTATION  # noqa: E402
from webhook.core import load_policies  # noqa: E402

NAMESPACE = "bench"
PROBE_NAMESPACE = "bench-probe"
NAMESPACE_LABEL = "kubernetes.io/metadata.name"
WARMUP_CREATES = 20
REQUEST_TIMEOUT_S = 30.0
# Every mode is in force at once, each for the pods of its own namespace only, so a create
# picks its mode by its namespace and nothing is switched between measurements.
MODE_NAMESPACES = {mode: f"{NAMESPACE}-{mode}" for mode in MODES}
REFERENCE_NAME = "reference.bench.gpushare.io"
# The modes whose configuration mutates the bench pod: each must store the pod that
# gpushare's mutating webhook alone stores ("webhook").
MUTATING_MODES = ("peer", "reference", "webhook", "shipped", "compiled")
# Seeds the order of the modes' batches, drawn afresh each round (``measure``).
ORDER_SEED = 29


def bench_pod(name: str) -> dict[str, Any]:
    """An annotated training pod, as a Deployment would produce it (before defaulting)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {"app": "trainer", "pod-template-hash": "7d9f8c6b5"},
            "annotations": {"gpu-fraction": "0.5"},
        },
        "spec": {
            "containers": [
                {
                    "name": "trainer",
                    "image": "tensorflow/tensorflow:2.17.0-gpu",
                    "command": ["python", "-m", "train", "--epochs", "10"],
                    "env": [{"name": "LOG_LEVEL", "value": "info"}],
                    "resources": {
                        "requests": {"cpu": "2", "memory": "8Gi"},
                        "limits": {"memory": "8Gi"},
                    },
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                }
            ],
            "volumes": [{"name": "data", "emptyDir": {}}],
        },
    }


def constant_ops(patch: list[dict[str, Any]]) -> str:
    """JSON Patch ops as a CEL list of constant JSONPatch values (JSON is CEL here)."""
    ops = []
    for op in patch:
        fields = [f"op: {json.dumps(op['op'])}", f"path: {json.dumps(op['path'])}"]
        if "value" in op:
            fields.append(f"value: {json.dumps(op['value'])}")
        ops.append("JSONPatch{" + ", ".join(fields) + "}")
    return "[" + ", ".join(ops) + "]"


def mutating_policy(name: str, expression: str) -> dict[str, Any]:
    """A MutatingAdmissionPolicy for pod creates applying one JSONPatch ``expression``."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "matchConstraints": match_constraints(),
            "failurePolicy": "Fail",
            "reinvocationPolicy": "Never",
            "mutations": [{"patchType": "JSONPatch", "jsonPatch": {"expression": expression}}],
        },
    }


def gpushare_patch(policies: Path) -> list[dict[str, Any]]:
    """The JSON Patch gpushare's webhook makes of the bench pod (`gpushare mutate`)."""
    with tempfile.TemporaryDirectory(prefix="gpushare-reference-") as name:
        pod_file = Path(name) / "pod.json"
        pod_file.write_text(json.dumps(bench_pod("reference")))
        command = ["mutate", "-f", str(pod_file), "-n", NAMESPACE, "--policies", str(policies)]
        patch: list[dict[str, Any]] = json.loads(gpushare(*command, "-o", "patch").stdout)
    return patch


def policy_version(patch: list[dict[str, Any]]) -> str:
    """The policy version in the gpushare.io/applied annotation ``patch`` writes: the one
    thing of the mutation the peer (which hard-codes the rest) is told."""
    path = "/metadata/annotations/" + APPLIED_ANNOTATION.replace("~", "~0").replace("/", "~1")
    for op in patch:
        if op["path"] == path:
            return str(json.loads(op["value"])["policyVersion"])
        if op["path"] == "/metadata/annotations":
            return str(json.loads(op["value"][APPLIED_ANNOTATION])["policyVersion"])
    raise ValueError(f"gpushare's patch of the bench pod writes no {APPLIED_ANNOTATION}")


def reference_documents(patch: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The hand-written limit for a policy: the webhook's own ``patch`` of the bench pod as
    constant ops (no variables, no conditions), bound to the bench namespace only."""
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingAdmissionPolicyBinding",
        "metadata": {"name": REFERENCE_NAME},
        "spec": {
            "policyName": REFERENCE_NAME,
            "matchResources": {
                "namespaceSelector": {
                    "matchLabels": {NAMESPACE_LABEL: MODE_NAMESPACES["reference"]},
                }
            },
        },
    }
    return [mutating_policy(REFERENCE_NAME, constant_ops(patch)), binding]


# -- load ------------------------------------------------------------------------------------


class Creator:
    """POSTs pods over one persistent TLS connection (client-certificate auth)."""

    def __init__(self, plane: ControlPlane) -> None:
        port = int(plane.server.rsplit(":", 1)[1])
        self.connection = http.client.HTTPSConnection(
            LOOPBACK, port, context=plane.ssl_context(), timeout=REQUEST_TIMEOUT_S
        )

    def create(self, namespace: str, body: bytes) -> tuple[int, bytes]:
        self.connection.request(
            "POST",
            f"/api/v1/namespaces/{namespace}/pods",
            body=body,
            headers={"Content-Type": "application/json", "Accept": "application/json"},
        )
        response = self.connection.getresponse()
        return response.status, response.read()

    def close(self) -> None:
        self.connection.close()


def _record(cell: Cell, status: int, data: bytes, elapsed: float, lock: threading.Lock) -> None:
    with lock:
        if status != 201:
            cell.errors.append(f"{status}: {data[:300]!r}")
        else:
            cell.latencies.append(elapsed)
            if APPLIED_ANNOTATION.encode() in data:
                cell.mutated += 1


def _timed_create(creator: Creator, namespace: str, name: str) -> tuple[int, bytes, float]:
    body = json.dumps(bench_pod(name)).encode()
    started = time.perf_counter()
    status, data = creator.create(namespace, body)
    return status, data, time.perf_counter() - started


def run_cell(
    plane: ControlPlane,
    cell: Cell,
    count: int,
    deadline: float,
    profile: Path | None = None,
) -> None:
    """`count` creates in the cell's mode spread over `cell.concurrency` threads, after a
    short warm-up, and the apiserver's CPU over them; with ``profile``, the apiserver's CPU
    profile of the first PROFILE_SECONDS of the measured creates is written there."""
    creators = [Creator(plane) for _ in range(cell.concurrency)]
    namespace = MODE_NAMESPACES[cell.mode]
    prefix = f"{cell.mode}-c{cell.concurrency}-{uuid.uuid4().hex[:6]}"
    lock = threading.Lock()
    next_index = [0]
    warm = Cell(cell.mode, cell.concurrency)

    def take(limit: int) -> int | None:
        with lock:
            if next_index[0] >= limit or time.monotonic() > deadline:
                return None
            next_index[0] += 1
            return next_index[0]

    def worker(creator: Creator, limit: int, into: Cell) -> None:
        phase = "m" if into is cell else "w"
        while (index := take(limit)) is not None:
            try:
                status, data, elapsed = _timed_create(
                    creator, namespace, f"{prefix}-{phase}{index}"
                )
            except (OSError, http.client.HTTPException) as exc:
                with lock:
                    cell.errors.append(repr(exc))
                continue
            _record(into, status, data, elapsed, lock)

    def run(limit: int, into: Cell) -> float:
        threads = [threading.Thread(target=worker, args=(c, limit, into)) for c in creators]
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return time.perf_counter() - started

    try:
        run(WARMUP_CREATES, warm)
        cell.errors += warm.errors
        next_index[0] = 0
        profiler = None
        if profile is not None:
            profiler = threading.Thread(target=apiserver_profile, args=(plane, profile))
            profiler.start()
        heap_before = go_heap_totals(plane)
        before = process_cpu(apiserver_pid(plane))
        cell.seconds = run(count, cell)
        cell.apiserver_cpu = process_cpu(apiserver_pid(plane)) - before
        heap_after = go_heap_totals(plane)
        cell.allocated_bytes = heap_after[ALLOCATED] - heap_before[ALLOCATED]
        cell.gc_cycles = round(heap_after[GC_CYCLES] - heap_before[GC_CYCLES])
        if profiler is not None:
            profiler.join()
    finally:
        for creator in creators:
            creator.close()


# The Go runtime's own counters in the apiserver's /metrics.
ALLOCATED = "go_memstats_alloc_bytes_total"
GC_CYCLES = "go_gc_duration_seconds_count"


def go_heap_totals(plane: ControlPlane) -> dict[str, float]:
    """Bytes the apiserver has allocated so far, and its garbage collections. Read around
    each batch at concurrency 8: a collection marks the whole live heap (hundreds of MiB
    by then, most of a second of CPU) and comes about once per batch, so whether one fell
    in a batch moves that batch's CPU per create; the report shows where they fell. A
    collection forced before each batch (tried) does not even that out: each batch then
    pays for one only when its own allocation passes the heap's headroom, which every
    batch of a mode allocating 354 KiB per create did and almost no batch of one
    allocating 309 KiB did, where in a running apiserver they pay in proportion."""
    values = scrape(apiserver_metrics(plane), {ALLOCATED, GC_CYCLES})
    return {name: value for (name, _), value in values.items()}


# Short enough to end inside a batch of 1,500 creates at concurrency 8 (about 3 s here).
PROFILE_SECONDS = 2


def apiserver_profile(plane: ControlPlane, into: Path) -> None:
    """The kube-apiserver's CPU profile over the next PROFILE_SECONDS (its /debug/pprof,
    on by default), written to ``into`` for `go tool pprof`."""
    port = int(plane.server.rsplit(":", 1)[1])
    connection = http.client.HTTPSConnection(
        LOOPBACK, port, context=plane.ssl_context(), timeout=PROFILE_SECONDS + 30
    )
    try:
        connection.request("GET", f"/debug/pprof/profile?seconds={PROFILE_SECONDS}")
        response = connection.getresponse()
        data = response.read()
        if response.status == 200:
            into.write_bytes(data)
        else:
            print(f"  profile: {response.status} {data[:200]!r}", file=sys.stderr)
    finally:
        connection.close()


def run_interleaved(
    plane: ControlPlane, cells: Sequence[Cell], count: int, deadline: float
) -> None:
    """Concurrency 1, one create of each cell's mode in turn, `count` turns after a short
    warm-up: consecutive creates of all modes see the same machine, so drift on a shared
    machine (which moves a whole batch of one mode by up to a millisecond) cancels out of
    every comparison. The apiserver's CPU cannot be told apart per mode here."""
    creator = Creator(plane)
    prefix = uuid.uuid4().hex[:6]
    lock = threading.Lock()
    warm = [Cell(c.mode, 1) for c in cells]
    try:
        for turn in range(-WARMUP_CREATES, count):
            if time.monotonic() > deadline:
                break
            for index, cell in enumerate(cells):
                into = cell if turn >= 0 else warm[index]
                name = f"{cell.mode}-i{prefix}-{turn + WARMUP_CREATES}"
                try:
                    status, data, elapsed = _timed_create(creator, MODE_NAMESPACES[cell.mode], name)
                except (OSError, http.client.HTTPException) as exc:
                    cell.errors.append(repr(exc))
                    continue
                _record(into, status, data, elapsed, lock)
    finally:
        creator.close()
    for cell, warmed in zip(cells, warm, strict=True):
        cell.errors += warmed.errors
        cell.seconds = sum(cell.latencies)  # its own creates' time: the rate of its turns
        cell.apiserver_cpu = float("nan")


# -- metrics -------------------------------------------------------------------------------


def apiserver_pid(plane: ControlPlane) -> int:
    return next(c.process.pid for c in plane.components if c.name == "kube-apiserver")


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (/proc/<pid>/stat fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def scrape(text: str, names: set[str]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    values: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in names:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                values[key] = values.get(key, 0.0) + sample.value
    return values


def apiserver_metrics(plane: ControlPlane) -> str:
    text: str = (
        plane.api.call_api(  # type: ignore[no-untyped-call]
            "GET", f"{plane.server}/metrics", {"Accept": "text/plain"}
        )
        .read()
        .decode()
    )
    return text


POLICY_CHECKS = "apiserver_mutating_admission_policy_check_total"


def policy_checks(plane: ControlPlane, policies: set[str]) -> float:
    """Evaluations so far of the MutatingAdmissionPolicies ``policies`` (every outcome)."""
    values = scrape(apiserver_metrics(plane), {POLICY_CHECKS})
    return sum(v for (_, labels), v in values.items() if dict(labels).get("policy") in policies)


WEBHOOK_SUM = "apiserver_admission_webhook_admission_duration_seconds_sum"
WEBHOOK_COUNT = "apiserver_admission_webhook_admission_duration_seconds_count"
APP_SUM = "gpushare_admission_duration_seconds_sum"
APP_COUNT = "gpushare_admission_duration_seconds_count"


def webhook_totals(plane: ControlPlane, server: WebhookServer) -> dict[str, float]:
    """Current totals: per webhook (apiserver's view) and per endpoint (inside the app)."""
    totals: dict[str, float] = {}
    for (name, labels), value in scrape(
        apiserver_metrics(plane), {WEBHOOK_SUM, WEBHOOK_COUNT}
    ).items():
        webhook = dict(labels).get("name", "")
        totals[f"{name}|{webhook}"] = totals.get(f"{name}|{webhook}", 0.0) + value
    status, body = server.get("/metrics")
    if status == 200:
        for (name, labels), value in scrape(body.decode(), {APP_SUM, APP_COUNT}).items():
            endpoint = dict(labels).get("endpoint", "")
            totals[f"{name}|{endpoint}"] = totals.get(f"{name}|{endpoint}", 0.0) + value
    return totals


def connections_to(port: int) -> int:
    """Established TCP connections to 127.0.0.1:`port` (from /proc/net/tcp)."""
    wanted = f"0100007F:{port:04X}"
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        # local address of the server side, state 01 = ESTABLISHED
        if fields[1] == wanted and fields[3] == "01":
            count += 1
    return count


@dataclass
class Run:
    """Everything one benchmark run measured."""

    cells: list[Cell] = field(default_factory=list)
    # Webhook totals (apiserver's view per webhook, the app's per endpoint) over the run.
    spent: dict[str, float] = field(default_factory=dict)
    # TCP connections from the apiserver to each webhook process, after its last batch.
    connections: dict[str, int] = field(default_factory=dict)
    # MutatingAdmissionPolicy evaluations over the compiled cells' creates.
    compiled_checks: float = 0.0
    compiled_creates: int = 0

    @property
    def failed(self) -> bool:
        return any(cell.errors for cell in self.cells)


@dataclass
class Peers:
    """The Go webhooks beside gpushare, and gpushare's patch of the bench pod."""

    noop: GoWebhook
    peer: GoWebhook
    patch: list[dict[str, Any]]


def kubectl_apply(plane: ControlPlane, documents: Sequence[dict[str, Any]]) -> None:
    plane.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(documents))


def kubectl_delete(plane: ControlPlane, documents: Sequence[dict[str, Any]]) -> None:
    plane.kubectl("delete", "--ignore-not-found", "-f", "-", input=yaml.safe_dump_all(documents))


def scoped(documents: Sequence[dict[str, Any]], namespace: str) -> list[dict[str, Any]]:
    """The admission configurations, each limited to the pods of ``namespace`` (bindings
    follow their policies' match constraints)."""
    only = {"key": NAMESPACE_LABEL, "operator": "In", "values": [namespace]}
    result = []
    for document in copy.deepcopy(list(documents)):
        if document["kind"].endswith("WebhookConfiguration"):
            selectors = [w.setdefault("namespaceSelector", {}) for w in document["webhooks"]]
        elif document["kind"].endswith("AdmissionPolicy"):
            selectors = [document["spec"]["matchConstraints"].setdefault("namespaceSelector", {})]
        else:
            selectors = []
        for selector in selectors:
            selector.setdefault("matchExpressions", []).append(only)
        result.append(document)
    return result


def all_in_force(plane: ControlPlane, server: WebhookServer, peers: Peers) -> set[str]:
    """Every mode's configuration, each for its own namespace, checked to store the same pod
    in every mutating mode; returns the compiled MutatingAdmissionPolicies' names (whose
    evaluations are counted)."""
    webhook = GpushareWebhook(server, plane.api, PROBE_NAMESPACE)
    compiled = compile_policies(load_policies(server.policies))
    documents = {
        "noop": [peers.noop.configuration()],
        "peer": [peers.peer.configuration()],
        "reference": reference_documents(peers.patch),
        "webhook": webhook_alone(webhook.documents),
        "shipped": webhook.documents,
        "compiled": compiled,
    }
    for mode, mode_documents in documents.items():
        kubectl_apply(plane, scoped(mode_documents, MODE_NAMESPACES[mode]))
    # Policies come into force about once a second: wait until a dry run of the bench pod
    # comes back mutated in every mutating mode's namespace and unmutated in the others.
    until = time.monotonic() + 60.0
    for mode, namespace in MODE_NAMESPACES.items():
        expected = mode in MUTATING_MODES
        while True:
            pod = bench_pod(f"probe-{uuid.uuid4().hex[:8]}")
            answer = create_pod(plane.api, namespace, pod, dry_run=True).pod
            if (APPLIED_ANNOTATION in answer["metadata"].get("annotations", {})) == expected:
                break
            if time.monotonic() > until:
                raise SystemExit(f"mode {mode} did not come into force in {namespace}")
            time.sleep(0.2)
    time.sleep(1.0)  # the no-op webhook cannot be seen; a webhook is in force well within 1 s
    check_same_pod(plane)
    return {d["metadata"]["name"] for d in compiled if d["kind"] == "MutatingAdmissionPolicy"}


def check_same_pod(plane: ControlPlane) -> None:
    """A dry-run create of the bench pod (one name) in each mutating mode's namespace must
    store, field by field, the pod gpushare's mutating webhook alone stores; stop the run
    with the differing fields otherwise.

    The reference policy alone may order the tolerations otherwise: its constant ops are
    gpushare's patch of the pod as sent (`add /spec/tolerations`), and the apiserver's
    DefaultTolerationSeconds tolerations end up after gpushare's rather than before them."""
    name = f"same-{uuid.uuid4().hex[:8]}"
    stored = {
        mode: create_pod(plane.api, MODE_NAMESPACES[mode], bench_pod(name), dry_run=True).pod
        for mode in MUTATING_MODES
    }
    problems = [
        f"  {mode}: {difference}"
        for mode in MUTATING_MODES
        if mode != "webhook"
        for difference in stored_differences(
            stored["webhook"], stored[mode], mode, any_toleration_order=mode == "reference"
        )
    ]
    if problems:
        raise SystemExit(
            "the apiserver stores another pod than under gpushare's webhook alone:\n"
            + "\n".join(problems)
        )
    print(f"same pod stored under {', '.join(MUTATING_MODES)} (checked field by field)")


def measure(
    plane: ControlPlane,
    server: WebhookServer,
    peers: Peers,
    concurrencies: Sequence[int],
    rounds: int,
    count: int,
    burst_count: int,
    deadline: float,
    profiles: Path | None = None,
    seed: int = ORDER_SEED,
) -> Run:
    """Every round: ``count`` concurrency-1 turns, then one batch of ``burst_count``
    creates per mode at each higher concurrency, the modes in an order drawn afresh each
    round from ``seed``."""
    core = k8s.CoreV1Api(plane.api)
    for name in (PROBE_NAMESPACE, *MODE_NAMESPACES.values()):
        ensure_namespace(core, name)
    compiled_policies = all_in_force(plane, server, peers)
    run = Run()
    ports = {"noop": peers.noop.port, "peer": peers.peer.port, "shipped": server.port}

    def measured(round_index: int, cells: Sequence[Cell], body: Callable[[], None]) -> None:
        start = webhook_totals(plane, server)
        checks_before = policy_checks(plane, compiled_policies)
        body()
        for key, value in webhook_totals(plane, server).items():
            run.spent[key] = run.spent.get(key, 0.0) + value - start.get(key, 0.0)
        for cell in cells:
            if cell.mode in ports:
                run.connections[cell.mode] = connections_to(ports[cell.mode])
            if cell.mode == "compiled":
                run.compiled_creates += len(cell.latencies) + WARMUP_CREATES
                run.compiled_checks += policy_checks(plane, compiled_policies) - checks_before
            print(
                f"round {round_index + 1} {cell.mode:<9} c={cell.concurrency}: "
                f"{len(cell.latencies)} creates, p50 "
                f"{percentile(cell.latencies, 0.5) * 1000:.2f} ms",
                flush=True,
            )
            if cell.errors:
                print(f"  errors: {cell.errors[:3]}", file=sys.stderr)
            core.delete_collection_namespaced_pod(
                MODE_NAMESPACES[cell.mode], grace_period_seconds=0
            )
        run.cells.extend(cells)

    # A batch meets what the one before it left (garbage to collect, etcd's compaction): a
    # fixed rotation would put each mode after the same one every round.
    shuffled = random.Random(seed)
    for round_index in range(rounds):
        order = tuple(shuffled.sample(MODES, k=len(MODES)))
        for concurrency in concurrencies:
            if time.monotonic() > deadline:
                return run
            if concurrency == 1:
                turns = [Cell(mode, 1, round_index=round_index) for mode in order]
                measured(
                    round_index, turns, partial(run_interleaved, plane, turns, count, deadline)
                )
                continue
            # Above 1, one mode at a time: interleaved, every mode would run under the
            # others' load. A burst leaves garbage for the apiserver to collect, so each
            # round's concurrency-1 turns come before its bursts.
            for mode in order:
                cell = Cell(mode, concurrency, round_index=round_index)
                profile = None
                if profiles is not None:
                    profile = profiles / f"{mode}-c{concurrency}-r{round_index + 1}.pprof"
                measured(
                    round_index,
                    [cell],
                    partial(run_cell, plane, cell, burst_count, deadline, profile),
                )
    return run


# The webhook each mode calls, by its name in the apiserver's metrics.
WEBHOOK_NAMES = {
    "noop": NOOP_NAME,
    "peer": PEER_NAME,
    "webhook": ALONE_NAME,
    "shipped": MUTATING_WEBHOOK,
}


def print_attribution(run: Run) -> None:
    print("where the time goes (each webhook call as the apiserver times it, over the run):")
    for mode, name in WEBHOOK_NAMES.items():
        seconds = run.spent.get(f"{WEBHOOK_SUM}|{name}", 0.0)
        calls = run.spent.get(f"{WEBHOOK_COUNT}|{name}", 0.0)
        if calls:
            print(f"  {mode:<9} {name:<32} {seconds / calls * 1000:6.2f} ms | calls {int(calls)}")
    # Modes webhook and shipped call the same server, endpoint "mutate". The default
    # configuration registers only the mutating webhook for pods; the safety net is a
    # ValidatingAdmissionPolicy run inside the apiserver (no call to count), and the pod
    # validating webhook is opt-in (webhook_config.WebhookSettings.validating_webhook "pods").
    app_seconds = run.spent.get(f"{APP_SUM}|mutate", 0.0)
    app_calls = run.spent.get(f"{APP_COUNT}|mutate", 0.0)
    if app_calls:
        print(
            f"  inside gpushare (webhook and shipped) {app_seconds / app_calls * 1000:6.3f} ms"
            f" | calls {int(app_calls)}"
        )
    held = ", ".join(f"{mode} {count}" for mode, count in run.connections.items())
    print(f"  TCP connections from the apiserver to each webhook: {held}")
    print("  the safety net: a ValidatingAdmissionPolicy in the apiserver, no webhook call")
    if run.compiled_creates:
        print(
            "compiled: MutatingAdmissionPolicy evaluations per create "
            f"{run.compiled_checks / run.compiled_creates:.2f} "
            "(apiserver_mutating_admission_policy_check_total; reinvocationPolicy Never)"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--count", type=int, default=300, help="measured turns per round at concurrency 1"
    )
    parser.add_argument(
        "--burst-count",
        type=int,
        default=1500,
        help="measured creates per mode and round above concurrency 1",
    )
    parser.add_argument("--rounds", type=int, default=4, help="rounds of all seven modes")
    parser.add_argument(
        "--seed",
        type=int,
        default=ORDER_SEED,
        help="seeds each round's order of the modes' batches",
    )
    parser.add_argument("--concurrency", type=int, action="append", help="default 1 and 8")
    parser.add_argument("--max-seconds", type=float, default=600.0, help="bound on the run")
    parser.add_argument("--workers", type=int, help="gunicorn workers (default: as serve)")
    parser.add_argument("--threads", type=int, help="gunicorn threads (default: as serve)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="write the apiserver's CPU profile of each batch above concurrency 1 to DIR",
    )
    parser.add_argument(
        "--peer-http1",
        action="store_true",
        help="the peer offers HTTP/1.1 only (kubebuilder's scaffold) instead of "
        "controller-runtime's default HTTP/2",
    )
    args = parser.parse_args(argv)
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
    concurrencies: list[int] = args.concurrency or [1, 8]
    deadline = time.monotonic() + args.max_seconds

    try:
        binary = build_binary()
    except HarnessBuildError as exc:
        print(exc, file=sys.stderr)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="gpushare-e2e-bench-"))
    policies = workdir / "policies"
    policies.mkdir()
    shutil.copy(REPO / "policies/default.yaml", policies / "default.yaml")
    print(f"machine: {os.cpu_count()} CPUs; work dir {workdir}")

    try:
        with ControlPlane(binary=binary, workdir=workdir / "plane", with_scheduler=False) as plane:
            server = WebhookServer.start(
                workdir / "webhook", policies, workers=args.workers, threads=args.threads
            )
            with contextlib.ExitStack() as stack:
                stack.callback(server.stop)
                patch = gpushare_patch(policies)
                noop = noop_webhook(workdir, server.cert_dir)
                stack.callback(noop.stop)
                peer = peer_webhook(
                    workdir, server.cert_dir, policy_version(patch), args.peer_http1
                )
                stack.callback(peer.stop)
                run = measure(
                    plane,
                    server,
                    Peers(noop, peer, patch),
                    concurrencies,
                    args.rounds,
                    args.count,
                    args.burst_count,
                    deadline,
                    args.profile,
                    args.seed,
                )
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)

    met, lines = report(run.cells, concurrencies)
    print()
    print("\n".join(lines))
    print()
    print_attribution(run)
    if run.failed:
        return 2
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
