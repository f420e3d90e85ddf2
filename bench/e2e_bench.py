"""End-to-end cost of the webhook: pod creates through a real kube-apiserver, with and without.

Run from the repository root (builds or reuses the Go harness, like the e2e tests):

    .venv/bin/python bench/e2e_bench.py                       # about 2 minutes
    .venv/bin/python bench/e2e_bench.py --count 100 --rounds 1   # quick look

Starts the e2e control plane of harness/controlplane.py (etcd + kube-apiserver; no
scheduler, so nothing but the creates loads the machine) and `gpushare serve` with
certificates from `gpushare certs` and the bundled policies, exactly as the e2e fixtures do.
Then, side by side in one run, it creates the same annotated pod (gpu-fraction "0.5",
a realistic training container) over and over:

- **with**: gpushare registered as `gpushare webhook-config --url ... --policies ...`
  prints it (mutating + validating webhook; each create calls both);
- **without**: no webhook configuration at all (the annotation is then just an annotation).

Each client thread keeps one TLS connection to the apiserver (client-certificate auth) and
POSTs raw JSON, so the Python client's model code is not part of the figure. Concurrency 1
and 8; modes alternate within every round (the starting mode alternates between rounds) so
drift on a shared machine hits both alike. The table gives creates/s and p50/p99 create
latency over all rounds, then the overhead ratio p50(with) / p50(without); the target is at
most 1.15. To say where the time goes it also prints, per create with the webhook, the
apiserver's own view of each webhook call (apiserver_admission_webhook_admission_duration_
seconds) next to the time spent inside the gpushare app (gpushare_admission_duration_
seconds), and how many TCP connections the apiserver holds to the webhook.

Bounded: --count creates per cell, --rounds rounds, and --max-seconds for the whole run
(what was measured until then is still reported). Exit status 0 when the target is met at
every concurrency, 1 when not, 2 when a create failed.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kubernetes import client as k8s  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from harness.api import ensure_namespace  # noqa: E402
from harness.binary import HarnessBuildError, build_binary  # noqa: E402
from harness.controlplane import ControlPlane  # noqa: E402
from harness.processes import LOOPBACK  # noqa: E402
from harness.registration import GpushareWebhook  # noqa: E402
from harness.webhookserver import WebhookServer  # noqa: E402
from webhook.constants import APPLIED_ANNOTATION  # noqa: E402

NAMESPACE = "bench"
PROBE_NAMESPACE = "bench-probe"
TARGET_RATIO = 1.15
WARMUP_CREATES = 20
REQUEST_TIMEOUT_S = 30.0
MODES = ("without", "with")


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


# -- load ------------------------------------------------------------------------------------


@dataclass
class Cell:
    """One measured batch: a mode at a concurrency in one round."""

    mode: str
    concurrency: int
    latencies: list[float] = field(default_factory=list)
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)
    mutated: int = 0

    @property
    def rate(self) -> float:
        return len(self.latencies) / self.seconds if self.seconds else 0.0


class Creator:
    """POSTs pods over one persistent TLS connection (client-certificate auth)."""

    def __init__(self, plane: ControlPlane) -> None:
        port = int(plane.server.rsplit(":", 1)[1])
        self.connection = http.client.HTTPSConnection(
            LOOPBACK, port, context=plane.ssl_context(), timeout=REQUEST_TIMEOUT_S
        )
        self.path = f"/api/v1/namespaces/{NAMESPACE}/pods"

    def create(self, body: bytes) -> tuple[int, bytes]:
        self.connection.request(
            "POST",
            self.path,
            body=body,
            headers={"Content-Type": "application/json", "Accept": "application/json"},
        )
        response = self.connection.getresponse()
        return response.status, response.read()

    def close(self) -> None:
        self.connection.close()


def run_cell(plane: ControlPlane, cell: Cell, count: int, deadline: float) -> None:
    """`count` creates spread over `cell.concurrency` threads, after a short warm-up."""
    creators = [Creator(plane) for _ in range(cell.concurrency)]
    prefix = f"{cell.mode}-c{cell.concurrency}-{uuid.uuid4().hex[:6]}"
    lock = threading.Lock()
    next_index = [0]

    def take(limit: int) -> int | None:
        with lock:
            if next_index[0] >= limit or time.monotonic() > deadline:
                return None
            next_index[0] += 1
            return next_index[0]

    def worker(creator: Creator, limit: int, record: bool) -> None:
        phase = "m" if record else "w"
        while (index := take(limit)) is not None:
            body = json.dumps(bench_pod(f"{prefix}-{phase}{index}")).encode()
            started = time.perf_counter()
            try:
                status, data = creator.create(body)
            except (OSError, http.client.HTTPException) as exc:
                with lock:
                    cell.errors.append(repr(exc))
                continue
            elapsed = time.perf_counter() - started
            with lock:
                if status != 201:
                    cell.errors.append(f"{status}: {data[:300]!r}")
                elif record:
                    cell.latencies.append(elapsed)
                    if APPLIED_ANNOTATION.encode() in data:
                        cell.mutated += 1

    def run(limit: int, record: bool) -> float:
        threads = [threading.Thread(target=worker, args=(c, limit, record)) for c in creators]
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return time.perf_counter() - started

    try:
        run(WARMUP_CREATES, record=False)
        next_index[0] = 0
        cell.seconds = run(count, record=True)
    finally:
        for creator in creators:
            creator.close()


# -- metrics -------------------------------------------------------------------------------


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


# -- report ----------------------------------------------------------------------------------


def percentile(values: Sequence[float], fraction: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))
    return ordered[index]


def report(cells: list[Cell], concurrencies: Sequence[int]) -> tuple[bool, list[str]]:
    lines = [
        f"{'conc':>4}  {'mode':<8} {'creates':>7} {'creates/s':>9} {'p50 ms':>8} "
        f"{'p99 ms':>8} {'mutated':>7} {'errors':>6}"
    ]
    met = True
    ratios = []
    for concurrency in concurrencies:
        p50: dict[str, float] = {}
        for mode in MODES:
            group = [c for c in cells if c.mode == mode and c.concurrency == concurrency]
            latencies = [x for c in group for x in c.latencies]
            rates = [c.rate for c in group if c.latencies]
            p50[mode] = percentile(latencies, 0.5) * 1000
            lines.append(
                f"{concurrency:>4}  {mode:<8} {len(latencies):>7} "
                f"{statistics.median(rates) if rates else float('nan'):>9.1f} "
                f"{p50[mode]:>8.2f} {percentile(latencies, 0.99) * 1000:>8.2f} "
                f"{sum(c.mutated for c in group):>7} {sum(len(c.errors) for c in group):>6}"
            )
        ratio = p50["with"] / p50["without"] if p50["without"] else float("nan")
        ratios.append(
            f"concurrency {concurrency}: p50 with / without = {ratio:.3f} "
            f"(+{(p50['with'] - p50['without']):.2f} ms; target <= {TARGET_RATIO})"
        )
        met = met and ratio <= TARGET_RATIO
    return met, [*lines, "", *ratios]


@dataclass
class Run:
    """Everything one benchmark run measured."""

    cells: list[Cell] = field(default_factory=list)
    spent: dict[str, float] = field(default_factory=dict)  # webhook totals over 'with' cells
    creates_with: int = 0
    connections_held: int = 0

    @property
    def failed(self) -> bool:
        return any(cell.errors for cell in self.cells)


def measure(
    plane: ControlPlane,
    server: WebhookServer,
    concurrencies: Sequence[int],
    rounds: int,
    count: int,
    deadline: float,
) -> Run:
    core = k8s.CoreV1Api(plane.api)
    for name in (NAMESPACE, PROBE_NAMESPACE):
        ensure_namespace(core, name)
    webhook = GpushareWebhook(server, plane.api, PROBE_NAMESPACE)
    switch: dict[str, Callable[[], None]] = {
        "with": webhook.register,
        "without": webhook.unregister,
    }
    run = Run()
    for round_index in range(rounds):
        for mode in MODES if round_index % 2 == 0 else MODES[::-1]:
            switch[mode]()
            for concurrency in concurrencies:
                if time.monotonic() > deadline:
                    return run
                cell = Cell(mode, concurrency)
                start = webhook_totals(plane, server)
                run_cell(plane, cell, count, deadline)
                if mode == "with":
                    run.creates_with += len(cell.latencies) + WARMUP_CREATES
                    for key, value in webhook_totals(plane, server).items():
                        run.spent[key] = run.spent.get(key, 0.0) + value - start.get(key, 0.0)
                    run.connections_held = connections_to(server.port)
                run.cells.append(cell)
                print(
                    f"round {round_index + 1} {mode:<7} c={concurrency}: "
                    f"{len(cell.latencies)} creates, {cell.rate:.1f}/s, "
                    f"p50 {percentile(cell.latencies, 0.5) * 1000:.2f} ms",
                    flush=True,
                )
                if cell.errors:
                    print(f"  errors: {cell.errors[:3]}", file=sys.stderr)
                core.delete_collection_namespaced_pod(NAMESPACE, grace_period_seconds=0)
    return run


def print_attribution(run: Run) -> None:
    print(f"where the time goes with the webhook (per call, over {run.creates_with} creates):")
    for name, endpoint in (("mutate.gpushare.io", "mutate"), ("validate.gpushare.io", "validate")):
        seconds = run.spent.get(f"{WEBHOOK_SUM}|{name}", 0.0)
        calls = run.spent.get(f"{WEBHOOK_COUNT}|{name}", 0.0)
        app_seconds = run.spent.get(f"{APP_SUM}|{endpoint}", 0.0)
        app_calls = run.spent.get(f"{APP_COUNT}|{endpoint}", 0.0)
        if calls and app_calls:
            print(
                f"  {name:<21} apiserver's call {seconds / calls * 1000:6.2f} ms"
                f" | inside gpushare {app_seconds / app_calls * 1000:6.3f} ms"
                f" | calls {int(calls)}"
            )
    print(f"  TCP connections from the apiserver to the webhook: {run.connections_held}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--count", type=int, default=300, help="measured creates per cell")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of both modes")
    parser.add_argument("--concurrency", type=int, action="append", help="default 1 and 8")
    parser.add_argument("--max-seconds", type=float, default=600.0, help="bound on the run")
    parser.add_argument("--workers", type=int, help="gunicorn workers (default: as serve)")
    parser.add_argument("--threads", type=int, help="gunicorn threads (default: as serve)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args(argv)
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
            try:
                run = measure(plane, server, concurrencies, args.rounds, args.count, deadline)
            finally:
                server.stop()
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
