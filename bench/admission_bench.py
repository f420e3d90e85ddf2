"""Admission throughput and latency of the real webhook against a do-nothing floor.

Run from the repository root (needs ``wrk``: ``apt-get install wrk``):

    .venv/bin/python bench/admission_bench.py            # about 2 minutes
    .venv/bin/python bench/admission_bench.py --duration 3 --rounds 1   # quick look

Starts, side by side, (a) the real service (``webhook.server.wsgi:app``: TLS, policies,
metrics, one JSON log line per admission) and (b) the floor (``bench/floor_app.py``: the same
Flask app class, gunicorn config and TLS listener, answering a constant ``allowed: true``
without parsing the pod). Both bind 127.0.0.1 on free ports. wrk drives each over persistent
TLS connections with realistic AdmissionReview bodies (annotated pods of several shapes) at
concurrency 1, 8 and 32, floor and service back to back within each round (order
alternating) so drift on a shared machine hits both alike. The table shows the median over
rounds of each figure, and the ratios are the median over rounds of each round's own
service/floor ratio: a slow spell of the machine then moves both sides of a ratio together
instead of one side of the table.

Targets (issue 3, on a 2-core machine): service requests/s >= 85% of the floor's and service
p99 <= 1.5x the floor's, at every concurrency. Exit status 0 when met, 1 when not.
"""

from __future__ import annotations

import argparse
import base64
import copy
import dataclasses
import http.client
import ipaddress
import json
import os
import re
import shutil
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.e2e_bench import NAMESPACE, bench_pod, gpushare_patch, policy_version  # noqa: E402
from bench.e2e_webhooks import noop_webhook, peer_webhook  # noqa: E402
from harness.processes import terminate  # noqa: E402
from webhook.install.certs import write_certificates  # noqa: E402
from webhook.server.settings import ServeSettings  # noqa: E402

SERVICE_APP = "webhook.server.wsgi:app"
FLOOR_APP = "bench.floor_app:app"
FLOOR_WSGI_APP = "bench.floor_app:wsgi_app"
TRANSPORT_ONLY_APP = "bench.transport_only_app:app"
GUNICORN_CONFIG = "python:webhook.server.gunicorn_conf"
CONCURRENCIES = (1, 8, 32)
THROUGHPUT_TARGET = 0.85
P99_TARGET = 1.5
STARTUP_DEADLINE_SECONDS = 30.0


def _container(name: str, image: str, **extra: Any) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": name,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "ports": [{"containerPort": 8080, "protocol": "TCP"}],
        "env": [
            {"name": "LOG_LEVEL", "value": "info"},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        ],
        "resources": {
            "requests": {"cpu": "2", "memory": "8Gi"},
            "limits": {"memory": "8Gi"},
        },
        "volumeMounts": [
            {"name": "data", "mountPath": "/data"},
            {
                "name": "kube-api-access",
                "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                "readOnly": True,
            },
        ],
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
    }
    container.update(extra)
    return container


def realistic_pods() -> list[dict[str, Any]]:
    """Annotated pods as the apiserver sends them: defaults filled in, a few containers."""
    base: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "trainer-7d9f8c6b5-",
            "namespace": "ml-team",
            "labels": {"app": "trainer", "pod-template-hash": "7d9f8c6b5", "team": "vision"},
            "annotations": {"gpu-fraction": "0.5"},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": "trainer-7d9f8c6b5",
                    "uid": "0f1d3c2e-8a44-4c1e-9d0b-8f1f2a3b4c5d",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "containers": [
                _container(
                    "trainer",
                    "nvcr.io/nvidia/pytorch:24.05-py3",
                    command=["python", "-m", "train", "--epochs", "10"],
                )
            ],
            "volumes": [
                {"name": "data", "persistentVolumeClaim": {"claimName": "datasets"}},
                {
                    "name": "kube-api-access",
                    "projected": {
                        "defaultMode": 420,
                        "sources": [
                            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                            {
                                "configMap": {
                                    "name": "kube-root-ca.crt",
                                    "items": [{"key": "ca.crt", "path": "ca.crt"}],
                                }
                            },
                        ],
                    },
                },
            ],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "securityContext": {},
            "schedulerName": "default-scheduler",
            "tolerations": [
                {
                    "key": "node.kubernetes.io/not-ready",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                }
            ],
            "priority": 0,
            "enableServiceLinks": True,
            "preemptionPolicy": "PreemptLowerPriority",
        },
    }
    quarter = copy.deepcopy(base)
    quarter["metadata"]["annotations"] = {"gpu-fraction": "0.25"}
    quarter["spec"]["containers"][0]["image"] = "tensorflow/tensorflow:2.16.1-gpu"
    with_sidecar = copy.deepcopy(base)
    with_sidecar["spec"]["initContainers"] = [
        _container("fetch-weights", "busybox:1.36", command=["sh", "-c", "cp -r /src /data"])
    ]
    with_sidecar["spec"]["containers"].append(
        _container("metrics-exporter", "prom/statsd-exporter:v0.26.0")
    )
    with_sidecar["metadata"]["annotations"]["gpu-fraction"] = "0.5"
    return [base, quarter, with_sidecar]


def admission_review(pod: dict[str, Any], index: int) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": f"7c3e2a51-5b6d-4f0e-9a8b-00000000{index:04d}",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": pod["metadata"]["namespace"],
            "operation": "CREATE",
            "userInfo": {
                "username": "system:serviceaccount:kube-system:replicaset-controller",
                "uid": "a1b2c3d4-0000-4000-8000-000000000001",
                "groups": ["system:serviceaccounts", "system:authenticated"],
            },
            "object": pod,
            "oldObject": None,
            "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }


def bodies() -> list[bytes]:
    return [
        json.dumps(admission_review(pod, index)).encode()
        for index, pod in enumerate(realistic_pods())
    ]


def wrk_script(payloads: list[bytes], path: str) -> str:
    entries = ",\n".join(f"[==[{payload.decode()}]==]" for payload in payloads)
    return f"""
local bodies = {{
{entries}
}}
local requests = {{}}
local next_index = 0
init = function(args)
  for i, body in ipairs(bodies) do
    requests[i] = wrk.format("POST", "{path}", {{["Content-Type"] = "application/json"}}, body)
  end
end
request = function()
  next_index = next_index % #requests + 1
  return requests[next_index]
end
"""


@dataclass(frozen=True)
class Measurement:
    requests_per_second: float
    p50_ms: float
    p99_ms: float
    errors: int
    cpu_us_per_request: float = 0.0


@dataclass
class Server:
    name: str
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path
    # A Go webhook serves from its own process; gunicorn from the workers it forks.
    serves_itself: bool = False

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def worker_cpu_seconds(self) -> float:
        """User+system CPU of the gunicorn workers (or the Go webhook) so far (Linux /proc;
        0 elsewhere)."""
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
        if not children.exists():
            return 0.0
        pids = [str(self.process.pid)] if self.serves_itself else children.read_text().split()
        ticks = 0
        for pid in pids:
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            ticks += int(fields[11]) + int(fields[12])  # utime, stime
        return ticks / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def start_server(
    name: str, app: str, settings: ServeSettings, work: Path, log_level: str, checkout: Path
) -> Server:
    """Start gunicorn serving ``app`` from ``checkout`` (its code first on the path)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("GPUSHARE_")}
    environ["PYTHONPATH"] = str(checkout)
    environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
    environ.update(settings.to_environ())
    environ["GPUSHARE_LOG_LEVEL"] = log_level
    log_path = work / f"{name}.log"
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "--config", GUNICORN_CONFIG, app],
            cwd=checkout,
            env=environ,
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    return Server(name, settings.port, process, log_path)


def wait_until(server: Server, ready: Callable[[], bool], what: str) -> None:
    """Poll ``ready`` (an OSError counts as not yet) until it holds; stop the bench if the
    server exits or STARTUP_DEADLINE_SECONDS pass first."""
    deadline = time.monotonic() + STARTUP_DEADLINE_SECONDS
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise SystemExit(f"{server.name} exited; see {server.log_path}")
        try:
            if ready():
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"{server.name} did not {what} within {STARTUP_DEADLINE_SECONDS}s")


def wait_healthy(server: Server, context: ssl.SSLContext) -> None:
    def healthy() -> bool:
        connection = http.client.HTTPSConnection(
            "127.0.0.1", server.port, context=context, timeout=2
        )
        connection.request("GET", "/healthz")
        status = connection.getresponse().status
        connection.close()
        return status == 200

    wait_until(server, healthy, "answer /healthz")


# The floors answer a constant, the no-op webhook allows unchanged.
ANSWER_WITHOUT_PATCH = ("floor", "other-floor", "noop")


def check_answers(server: Server, context: ssl.SSLContext, payloads: list[bytes]) -> None:
    """Fail loudly if the service does not really mutate (or the floor does not answer)."""
    connection = http.client.HTTPSConnection("127.0.0.1", server.port, context=context, timeout=5)
    for payload in payloads:
        connection.request(
            "POST", "/mutate", body=payload, headers={"Content-Type": "application/json"}
        )
        response = connection.getresponse()
        answer = json.loads(response.read())
        if response.status != 200 or not answer["response"]["allowed"]:
            raise SystemExit(f"{server.name} answered {response.status}: {answer}")
        if server.name not in ANSWER_WITHOUT_PATCH:
            patch = json.loads(base64.b64decode(answer["response"]["patch"]))
            if not patch:
                raise SystemExit(f"{server.name} answered without a patch; policies not applied?")
    connection.close()


_UNIT_MS = {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60_000.0}


def _duration_ms(text: str) -> float:
    match = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text)
    if not match:
        raise ValueError(f"unexpected wrk duration {text!r}")
    return float(match.group(1)) * _UNIT_MS[match.group(2)]


def _search(pattern: str, text: str) -> str:
    match = re.search(pattern, text, re.M)
    if not match:
        raise SystemExit(f"unexpected wrk output (no {pattern!r}):\n{text}")
    return match.group(1)


def parse_wrk(output: str) -> Measurement:
    errors = 0
    socket_errors = re.search(
        r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", output
    )
    if socket_errors:
        errors += sum(int(value) for value in socket_errors.groups())
    non_2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", output)
    if non_2xx:
        errors += int(non_2xx.group(1))
    return Measurement(
        requests_per_second=float(_search(r"Requests/sec:\s+([\d.]+)", output)),
        p50_ms=_duration_ms(_search(r"^\s+50%\s+(\S+)", output)),
        p99_ms=_duration_ms(_search(r"^\s+99%\s+(\S+)", output)),
        errors=errors,
    )


def run_wrk(server: Server, script: Path, connections: int, seconds: float) -> Measurement:
    command = [
        "wrk",
        "--threads",
        "1",
        "--connections",
        str(connections),
        "--duration",
        f"{seconds:g}s",
        "--timeout",
        "5s",
        "--latency",
        "--script",
        str(script),
        f"{server.url}/mutate",
    ]
    cpu_before = server.worker_cpu_seconds()
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=seconds + 30, check=False
    )
    cpu = server.worker_cpu_seconds() - cpu_before
    if result.returncode != 0:
        raise SystemExit(f"wrk failed: {result.stderr or result.stdout}")
    measurement = parse_wrk(result.stdout)
    requests = measurement.requests_per_second * seconds
    cpu_per_request = cpu / requests * 1e6 if requests else 0.0
    return dataclasses.replace(measurement, cpu_us_per_request=cpu_per_request)


def median_measurement(samples: list[Measurement]) -> Measurement:
    return Measurement(
        statistics.median(s.requests_per_second for s in samples),
        statistics.median(s.p50_ms for s in samples),
        statistics.median(s.p99_ms for s in samples),
        sum(s.errors for s in samples),
        statistics.median(s.cpu_us_per_request for s in samples),
    )


def paired_ratios(floor: list[Measurement], service: list[Measurement]) -> tuple[float, float]:
    """Median over rounds of each round's service/floor req/s and p99 ratios."""
    pairs = list(zip(floor, service, strict=True))
    return (
        statistics.median(s.requests_per_second / f.requests_per_second for f, s in pairs),
        statistics.median(s.p99_ms / f.p99_ms for f, s in pairs),
    )


def policies_of(checkout: Path, copy_to: Path, *, peers: bool) -> Path:
    """The policies a service of ``checkout`` reads: all of its policies/, or with
    ``peers`` its default policy alone, as e2e_bench.py's webhook has (the peer makes
    that policy's mutation of that bench's pod)."""
    if not peers:
        return checkout / "policies"
    copy_to.mkdir()
    shutil.copy(checkout / "policies/default.yaml", copy_to / "default.yaml")
    return copy_to


def peer_pod_body() -> bytes:
    """The AdmissionReview of e2e_bench.py's pod: the one pod the Go peer mutates."""
    pod = bench_pod("admission-bench")
    pod["metadata"]["namespace"] = NAMESPACE
    return json.dumps(admission_review(pod, 0)).encode()


def start_go_peers(work: Path, cert_dir: Path) -> list[Server]:
    """The Go controller-runtime peer (HTTP/1.1: wrk speaks nothing else) and the no-op Go
    webhook of e2e_bench.py, on the service's certificate, once each listens. The peer
    writes the version of the default policy the service reads (``policies_of``)."""
    version = policy_version(gpushare_patch(REPO / "policies/default.yaml"))
    started = [
        ("peer", peer_webhook(work, cert_dir, version, http1=True), "cr-webhook"),
        ("noop", noop_webhook(work, cert_dir), "noop-webhook"),
    ]
    servers = []
    for name, webhook, tool in started:
        server = Server(name, webhook.port, webhook.process, work / f"{tool}.log", True)
        wait_listening(server)
        servers.append(server)
    return servers


def wait_listening(server: Server) -> None:
    def listening() -> bool:
        socket.create_connection(("127.0.0.1", server.port), timeout=1).close()
        return True

    wait_until(server, listening, "listen")


def stop(server: Server) -> None:
    terminate(server.process, 30)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=4.0, help="seconds per wrk run")
    parser.add_argument("--rounds", type=int, default=5, help="floor/service alternations")
    parser.add_argument(
        "--floor",
        choices=("flask", "wsgi"),
        default="flask",
        help="flask: a Flask app answering a constant (the floor the targets name); wsgi: a "
        "bare WSGI callable, as the service is (the strict floor)",
    )
    parser.add_argument(
        "--compare-floors",
        action="store_true",
        help="also run the other floor in the same rounds and print what the Flask framework "
        "adds per request over a bare WSGI callable",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        metavar="CHECKOUT",
        help="also run the service of another checkout (e.g. a `git worktree` of main) in "
        "the same rounds, and print its CPU per request beside this one's",
    )
    parser.add_argument("--workers", type=int, help="gunicorn workers (default: as serve)")
    parser.add_argument("--threads", type=int, help="gunicorn threads per worker")
    parser.add_argument("--log-level", default="info", help="service log level")
    parser.add_argument("--concurrency", type=int, action="append", help="default 1, 8, 32")
    parser.add_argument(
        "--peers",
        action="store_true",
        help="time e2e_bench.py's pod alone, under its default policy alone, and also the Go "
        "controller-runtime peer making the same mutation (over HTTP/1.1, which wrk speaks) "
        "and the no-op Go webhook, in the same rounds",
    )
    parser.add_argument(
        "--attribute",
        action="store_true",
        help="also run the service with a precomputed core decision, to split the gap to "
        "the floor into transport and core",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if shutil.which("wrk") is None:
        print("wrk is not installed: apt-get install wrk", file=sys.stderr)
        return 2
    concurrencies = tuple(args.concurrency or CONCURRENCIES)
    floor_app = FLOOR_WSGI_APP if args.floor == "wsgi" else FLOOR_APP
    apps: list[tuple[str, str, Path]] = [("floor", floor_app, REPO), ("service", SERVICE_APP, REPO)]
    print(f"floor: {floor_app} ({args.floor})", flush=True)
    if args.attribute:
        apps.append(("transport", TRANSPORT_ONLY_APP, REPO))
    if args.baseline:
        apps.append(("baseline", SERVICE_APP, args.baseline.resolve()))
    if args.compare_floors:
        other = FLOOR_APP if args.floor == "wsgi" else FLOOR_WSGI_APP
        apps.append(("other-floor", other, REPO))

    work = Path(tempfile.mkdtemp(prefix="gpushare-bench-"))
    servers: list[Server] = []
    try:
        files = write_certificates(
            work / "certs", ["localhost"], [ipaddress.ip_address("127.0.0.1")]
        )
        context = ssl.create_default_context(cafile=str(files.ca_cert))
        tuning: dict[str, Any] = {}
        if args.workers:
            tuning["workers"] = args.workers
        if args.threads:
            tuning["threads"] = args.threads
        for name, app, checkout in apps:
            settings = ServeSettings(
                tls_cert=files.serving_cert,
                tls_key=files.serving_key,
                # Each checkout its own policies: an older service may not read newer fields.
                policies=policies_of(checkout, work / f"{name}-policies", peers=args.peers),
                port=free_port(),
                **tuning,
            )
            servers.append(start_server(name, app, settings, work, args.log_level, checkout))
        payloads = [peer_pod_body()] if args.peers else bodies()
        for server in servers:
            wait_healthy(server, context)
        if args.peers:
            servers += start_go_peers(work, files.serving_cert.parent)
        for server in servers:
            check_answers(server, context, payloads)
        script = work / "admission.lua"
        script.write_text(wrk_script(payloads, "/mutate"))
        reference = ServeSettings(files.serving_cert, files.serving_key, REPO / "policies")
        print(
            f"gunicorn_conf workers={tuning.get('workers', reference.workers)} "
            f"threads={tuning.get('threads', reference.threads)}, TLS, keep-alive; "
            f"wrk 1 thread; {args.rounds} rounds x {args.duration:g}s per cell; "
            f"bodies {[len(p) for p in payloads]} bytes; {os.cpu_count()} CPUs"
        )

        for server in servers:  # warm up: imports, first TLS handshakes, CPU caches
            run_wrk(server, script, 8, 1.0)
        samples: dict[tuple[str, int], list[Measurement]] = {}
        for round_index in range(args.rounds):
            for connections in concurrencies:
                # Alternate the order so slow drift on a shared machine hits all alike.
                order = servers if round_index % 2 == 0 else servers[::-1]
                for server in order:
                    measurement = run_wrk(server, script, connections, args.duration)
                    samples.setdefault((server.name, connections), []).append(measurement)
        return print_reports(samples, concurrencies, args)
    finally:
        for server in servers:
            stop(server)
        shutil.rmtree(work, ignore_errors=True)


def print_reports(
    samples: dict[tuple[str, int], list[Measurement]],
    concurrencies: tuple[int, ...],
    args: argparse.Namespace,
) -> int:
    """The floor/service table and its verdict (the exit status), then each comparison
    asked for."""
    code = report(samples, concurrencies, attribute=args.attribute)
    if args.baseline:
        report_baseline(samples, concurrencies, args.baseline)
    if args.peers:
        report_peers(samples, concurrencies)
    if args.compare_floors:
        flask_name = "floor" if args.floor == "flask" else "other-floor"
        wsgi_name = "other-floor" if args.floor == "flask" else "floor"
        report_floors(samples, concurrencies, flask_name, wsgi_name)
    return code


def report(
    samples: dict[tuple[str, int], list[Measurement]],
    concurrencies: tuple[int, ...],
    *,
    attribute: bool,
) -> int:
    header = (
        f"{'conc':>4} | {'floor req/s':>11} {'p50 ms':>7} {'p99 ms':>7} {'cpu us':>6} | "
        f"{'service req/s':>13} {'p50 ms':>7} {'p99 ms':>7} {'cpu us':>6} | "
        f"{'rps ratio':>9} {'p99 ratio':>9} | ok"
    )
    print(header)
    print("-" * len(header))
    all_met = True
    for connections in concurrencies:
        floor = median_measurement(samples[("floor", connections)])
        service = median_measurement(samples[("service", connections)])
        rps_ratio, p99_ratio = paired_ratios(
            samples[("floor", connections)], samples[("service", connections)]
        )
        met = rps_ratio >= THROUGHPUT_TARGET and p99_ratio <= P99_TARGET and not service.errors
        all_met = all_met and met
        print(
            f"{connections:>4} | {floor.requests_per_second:>11.0f} {floor.p50_ms:>7.2f} "
            f"{floor.p99_ms:>7.2f} {floor.cpu_us_per_request:>6.0f} | "
            f"{service.requests_per_second:>13.0f} {service.p50_ms:>7.2f} "
            f"{service.p99_ms:>7.2f} {service.cpu_us_per_request:>6.0f} | "
            f"{rps_ratio:>9.2f} {p99_ratio:>9.2f} | {'yes' if met else 'NO'}"
        )
        if floor.errors or service.errors:
            print(f"     errors: floor {floor.errors}, service {service.errors}")
    print(
        f"targets: service req/s >= {THROUGHPUT_TARGET:.0%} of floor, p99 <= {P99_TARGET}x "
        f"floor, no errors: {'met' if all_met else 'NOT met'}"
    )
    print("cpu us = gunicorn workers' CPU time per request (user+system), median over rounds")
    print("ratios = median over rounds of service/floor measured back to back in each round")
    if attribute:
        print("\nwhere the service's extra CPU per request goes (median over rounds):")
        for connections in concurrencies:
            floor = median_measurement(samples[("floor", connections)])
            service = median_measurement(samples[("service", connections)])
            transport = median_measurement(samples[("transport", connections)])
            transport_cost = transport.cpu_us_per_request - floor.cpu_us_per_request
            core_cost = service.cpu_us_per_request - transport.cpu_us_per_request
            print(
                f"{connections:>4} | transport (decode, encode, metrics, log) "
                f"{transport_cost:>5.0f} us | core (mutate) {core_cost:>5.0f} us | "
                f"transport-only req/s {transport.requests_per_second:.0f} "
                f"({transport.requests_per_second / floor.requests_per_second:.2f} of floor)"
            )
    return 0 if all_met else 1


def report_baseline(
    samples: dict[tuple[str, int], list[Measurement]], concurrencies: tuple[int, ...], where: Path
) -> None:
    """This checkout's service against another's, measured in the same rounds."""
    print(f"\nbaseline: the service of {where}, in the same rounds")
    print(f"{'conc':>4} | {'cpu us base':>11} {'cpu us now':>10} {'ratio':>6} | rps ratio now/base")
    for connections in concurrencies:
        base = samples[("baseline", connections)]
        now = samples[("service", connections)]
        cpu_ratio = statistics.median(
            n.cpu_us_per_request / b.cpu_us_per_request for b, n in zip(base, now, strict=True)
        )
        rps_ratio = statistics.median(
            n.requests_per_second / b.requests_per_second for b, n in zip(base, now, strict=True)
        )
        print(
            f"{connections:>4} | {median_measurement(base).cpu_us_per_request:>11.0f} "
            f"{median_measurement(now).cpu_us_per_request:>10.0f} {cpu_ratio:>6.2f} | "
            f"{rps_ratio:.2f}"
        )
    print("cpu ratio = median over rounds of now/base CPU per request")


def report_peers(
    samples: dict[tuple[str, int], list[Measurement]], concurrencies: tuple[int, ...]
) -> None:
    """The service beside the Go peer doing the same work, and the floors under both."""
    names = ("service", "peer", "floor", "noop")
    print("\npeers: e2e_bench.py's pod, in the same rounds (p50 ms / CPU us per request)")
    print(f"{'conc':>4} | " + " ".join(f"{n:>15}" for n in names) + " | service/peer p50  cpu")
    for connections in concurrencies:
        cells = {n: median_measurement(samples[(n, connections)]) for n in names}
        service, peer = samples[("service", connections)], samples[("peer", connections)]
        p50 = statistics.median(s.p50_ms / p.p50_ms for s, p in zip(service, peer, strict=True))
        cpu = statistics.median(
            s.cpu_us_per_request / p.cpu_us_per_request for s, p in zip(service, peer, strict=True)
        )
        figures = " ".join(
            f"{cells[n].p50_ms:>7.3f} / {cells[n].cpu_us_per_request:>5.0f}" for n in names
        )
        print(f"{connections:>4} | {figures} | {p50:>16.2f} {cpu:>4.2f}")
    print("ratios = median over rounds of service/peer measured in the same round")


def report_floors(
    samples: dict[tuple[str, int], list[Measurement]],
    concurrencies: tuple[int, ...],
    flask_name: str,
    wsgi_name: str,
) -> None:
    """What Flask adds per request over a bare WSGI callable, next to the service's CPU."""
    print("\nfloors: Flask app vs bare WSGI callable, in the same rounds")
    print(f"{'conc':>4} | {'flask cpu us':>12} {'wsgi cpu us':>11} {'flask adds':>10} | of service")
    for connections in concurrencies:
        flask = median_measurement(samples[(flask_name, connections)]).cpu_us_per_request
        wsgi = median_measurement(samples[(wsgi_name, connections)]).cpu_us_per_request
        service = median_measurement(samples[("service", connections)]).cpu_us_per_request
        print(
            f"{connections:>4} | {flask:>12.0f} {wsgi:>11.0f} {flask - wsgi:>10.0f} | "
            f"{(flask - wsgi) / service:.0%}"
        )


if __name__ == "__main__":
    sys.exit(main())
