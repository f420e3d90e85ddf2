"""Memory and file descriptors stay inside the Deployment's limits, at the body cap and over time.

deploy/base/deployment.yaml runs 2 workers x 4 threads under a 384 MiB memory limit. The
figures these tests print are the ones docs/reliability.md reports.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.long_runs import scaled
from webhook.server.settings import DEFAULT_MAX_BODY_BYTES

from .support import RunningServer, annotated_pod, review, running_server

pytestmark = pytest.mark.server

DEPLOYMENT_MEMORY_LIMIT = 384 * 1024 * 1024


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _server_rss(server: RunningServer) -> int:
    pids = [server.process.pid, *server.worker_pids()]
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):  # a worker that just exited
            total += _rss(pid)
    return total


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with running_server(
        tmp_path_factory.mktemp("bounds"), "--workers", "2", "--threads", "4"
    ) as running:
        yield running


def _max_size_review() -> bytes:
    """An annotated pod just under the body cap, made of many small values (the costliest
    shape to decode: about 20 bytes of memory per byte of body)."""
    pod = annotated_pod()
    entry = len(json.dumps({"name": "V000000", "value": "x" * 8})) + 2
    count = (DEFAULT_MAX_BODY_BYTES - 4096) // entry
    pod["spec"]["containers"][0]["env"] = [
        {"name": f"V{index:06}", "value": "x" * 8} for index in range(count)
    ]
    body = json.dumps(review(pod)).encode()
    assert DEFAULT_MAX_BODY_BYTES - 64 * 1024 < len(body) <= DEFAULT_MAX_BODY_BYTES
    return body


def test_concurrent_maximum_bodies_stay_under_the_memory_limit(server: RunningServer) -> None:
    body = _max_size_review()
    peak = _server_rss(server)
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, _server_rss(server))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        with ThreadPoolExecutor(8) as pool:
            statuses = list(
                pool.map(lambda _: server.request("POST", "/mutate", body)[0], range(16))
            )
    finally:
        stop.set()
        sampler.join()
    print(f"\n16 bodies of {len(body)} bytes, 8 at a time: peak RSS {peak / 2**20:.0f} MiB")
    assert statuses == [200] * 16
    assert server.process.poll() is None
    assert peak < DEPLOYMENT_MEMORY_LIMIT, f"peak {peak / 2**20:.0f} MiB"


def test_memory_and_descriptors_stay_flat_over_a_long_run(server: RunningServer) -> None:
    payload = json.dumps(review(annotated_pod())).encode()

    def burst(count: int) -> None:
        with ThreadPoolExecutor(8) as pool:
            statuses = set(
                pool.map(lambda _: server.request("POST", "/mutate", payload)[0], range(count))
            )
        assert statuses == {200}

    burst(400)  # warm: caches, memos and allocator arenas reach their working size
    workers = server.worker_pids()
    rss_before = sum(_rss(pid) for pid in workers)
    fds_before = sum(_fds(pid) for pid in workers)
    requests = scaled(2000, 50_000)
    burst(requests)
    time.sleep(0.5)  # let closed connections leave the workers
    assert server.worker_pids() == workers, "a worker restarted"
    rss_after = sum(_rss(pid) for pid in workers)
    fds_after = sum(_fds(pid) for pid in workers)
    print(
        f"\n{requests} requests: worker RSS {rss_before / 2**20:.1f} -> "
        f"{rss_after / 2**20:.1f} MiB, descriptors {fds_before} -> {fds_after}"
    )
    assert fds_after <= fds_before + 2
    assert rss_after - rss_before < 8 * 2**20
