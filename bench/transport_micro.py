"""Per-request CPU of the webhook's server layer, timed in-process without TLS or gunicorn.

    .venv/bin/python bench/transport_micro.py            # whole-request and per-piece us
    .venv/bin/python bench/transport_micro.py --rounds 7 --loops 3000

Calls the WSGI apps directly with the benchmark's realistic AdmissionReview bodies, in
Prometheus multiprocess mode (as under gunicorn) and with the admission log going to a file:

- ``flask floor``: ``bench/floor_app.py`` (Flask reads the body, answers a constant);
- ``wsgi floor``: the same without Flask, a bare WSGI function;
- ``transport``: the real app with the core's ``mutate`` replaced by a precomputed outcome
  (as ``admission_bench.py --attribute`` runs it over TLS). ``transport - wsgi floor`` is
  the server layer's own work per request; ``transport - flask floor`` is what the bench's
  "transport" column shows, which also counts whatever the app saves or adds in web
  framework overhead compared with the floor;
- the pieces of that layer timed one by one (decode, pod check, encode, metrics, log).

Each figure is the minimum over rounds of the mean CPU time (``process_time``) per call, in
microseconds, rounds of all candidates interleaved: the least disturbed estimate on a
shared machine.
"""

from __future__ import annotations

import argparse
import io
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
_METRICS_DIR = tempfile.mkdtemp(prefix="gpushare-micro-metrics-")
os.environ["PROMETHEUS_MULTIPROC_DIR"] = _METRICS_DIR  # before prometheus_client loads


def timed(function: Callable[[], object], loops: int, rounds: int) -> float:
    return interleaved([function], loops, rounds)[0]


def interleaved(functions: list[Callable[[], object]], loops: int, rounds: int) -> list[float]:
    """Per-call microseconds of each function: min over rounds, the functions taking turns."""
    best = [float("inf")] * len(functions)
    for _ in range(rounds):
        for index, function in enumerate(functions):
            started = time.process_time_ns()
            for _ in range(loops):
                function()
            elapsed = (time.process_time_ns() - started) / loops / 1000
            best[index] = min(best[index], elapsed)
    return best


def wsgi_floor(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
    """The floor without Flask: read the body, answer a constant."""
    environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
    body = b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{}}'
    start_response(
        "200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
    )
    return [body]


def wsgi_call(app: Any, body: bytes) -> Callable[[], object]:
    length = str(len(body))

    def start_response(status: str, headers: list[tuple[str, str]]) -> None:
        pass

    def call() -> object:
        environ = {
            "REQUEST_METHOD": "POST",
            "PATH_INFO": "/mutate",
            "SCRIPT_NAME": "",
            "QUERY_STRING": "",
            "SERVER_NAME": "127.0.0.1",
            "SERVER_PORT": "8443",
            "SERVER_PROTOCOL": "HTTP/1.1",
            "REMOTE_ADDR": "127.0.0.1",
            "CONTENT_TYPE": "application/json",
            "CONTENT_LENGTH": length,
            "HTTP_HOST": "127.0.0.1:8443",
            "wsgi.url_scheme": "https",
            "wsgi.input": io.BytesIO(body),
            "wsgi.errors": sys.stderr,
            "wsgi.multithread": True,
            "wsgi.multiprocess": True,
            "wsgi.run_once": False,
        }
        result = app(environ, start_response)
        data = b"".join(result)
        close = getattr(result, "close", None)
        if close is not None:
            close()
        return data

    return call


def whole_requests(apps: list[Any], payloads: list[bytes], loops: int, rounds: int) -> None:
    whole = [0.0] * len(apps)
    for body in payloads:
        calls = [wsgi_call(app, body) for app in apps]
        for index, value in enumerate(interleaved(calls, loops, rounds)):
            whole[index] += value / len(payloads)
    flask_floor, bare_floor, transport = whole
    print(f"flask floor         {flask_floor:7.1f} us/request")
    print(f"wsgi floor          {bare_floor:7.1f} us/request")
    print(f"transport           {transport:7.1f} us/request (core replaced by a constant)")
    print(f"transport - wsgi    {transport - bare_floor:7.1f} us  (the server layer's own work)")
    print(f"transport - flask   {transport - flask_floor:7.1f} us  (the bench's transport column)")


def pieces(
    payloads: list[bytes], outcome: Any, metrics: Any, admission_log: Any, store: Any
) -> list[tuple[str, list[Callable[[], object]]]]:
    import orjson

    from webhook.server.admission import AdmissionHandler, Answer, Endpoint
    from webhook.server.app import _log_admission
    from webhook.server.pod_shape import pod_shape_problem
    from webhook.server.request_body import read_body
    from webhook.server.review import decode_review, patched

    handler = AdmissionHandler(Endpoint.MUTATE, store)
    requests = [decode_review(body) for body in payloads]
    uid = requests[0].uid
    answer = Answer(patched(uid, outcome.patch, outcome.warnings), requests[0], outcome.policy)

    def read(body: bytes) -> Callable[[], object]:
        length = str(len(body))
        return lambda: read_body(
            {"wsgi.input": io.BytesIO(body), "CONTENT_LENGTH": length}, 1 << 23
        )

    return [
        ("body read", [read(body) for body in payloads]),
        ("decode (orjson + envelope)", [partial(decode_review, body) for body in payloads]),
        ("  of which orjson.loads", [partial(orjson.loads, body) for body in payloads]),
        ("pod field check", [partial(pod_shape_problem, r.object or {}) for r in requests]),
        ("response encoding", [partial(patched, uid, outcome.patch, outcome.warnings)]),
        ("metrics", [partial(metrics.observe_admission, "mutate", "patched", 0.000321)]),
        ("log line", [partial(_log_admission, admission_log, Endpoint.MUTATE, answer, 0.000321)]),
        ("handler.answer (all but HTTP)", [partial(handler.answer, body) for body in payloads]),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--loops", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)

    from bench.admission_bench import bodies, realistic_pods
    from bench.floor_app import create_floor_app
    from webhook.core.policy import load_policies
    from webhook.core.verdict import mutate
    from webhook.server import admission
    from webhook.server.app import create_app
    from webhook.server.json_logs import AdmissionLog
    from webhook.server.metrics import AdmissionMetrics
    from webhook.server.policy_store import PolicyStore

    outcome = mutate(realistic_pods()[0], "ml-team", load_policies(REPO / "policies"))
    admission.CORE_DECISIONS[admission.Endpoint.MUTATE] = lambda pod, ns, p: outcome
    logging.getLogger("gpushare.admission").setLevel(logging.INFO)
    store = PolicyStore.loaded(REPO / "policies")
    metrics = AdmissionMetrics()
    payloads = bodies()
    loops, rounds = args.loops, args.rounds
    print(f"bodies {[len(p) for p in payloads]} bytes; {loops} loops x {rounds} rounds, min")
    with tempfile.TemporaryFile(prefix="gpushare-micro-", suffix=".log") as log_file:
        admission_log = AdmissionLog(log_file)
        service = create_app(store, metrics=metrics, admission_log=admission_log)
        whole_requests([create_floor_app(), wsgi_floor, service], payloads, loops, rounds)
        timed_pieces = pieces(payloads, outcome, metrics, admission_log, store)
        flat = [function for _, functions in timed_pieces for function in functions]
        results = iter(interleaved(flat, loops, rounds))
        for name, functions in timed_pieces:
            values = [next(results) for _ in functions]
            print(f"{name:<32} {sum(values) / len(values):6.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
