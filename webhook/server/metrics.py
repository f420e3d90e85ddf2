"""Prometheus metrics of the webhook, correct under several gunicorn worker processes.

Under gunicorn, ``PROMETHEUS_MULTIPROC_DIR`` is set before anything imports
``prometheus_client`` (see ``gunicorn_conf``); every worker then writes its values to mmap'ed
files there and ``/metrics`` merges all workers' files, whichever worker answers the scrape.
Without that variable (WSGI test client, a single process) the same metrics live in memory.

Each ``AdmissionMetrics`` has its own registry so several apps can exist in one process
(tests) without "Duplicated timeseries" errors; in multiprocess mode the registry only
matters for naming, since values go to the shared files.
"""

from __future__ import annotations

import os
import struct
import time

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client import multiprocess as prometheus_multiprocess

from webhook.server.review import Outcome

MULTIPROC_DIR_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"
ENDPOINTS = ("mutate", "validate")
OUTCOMES = tuple(str(outcome) for outcome in Outcome)
SCRAPE_ATTEMPTS = 3
# Admission answers usually take well under a millisecond; the apiserver's timeout is
# seconds. Buckets cover both ends.
LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
)
EXPOSITION_CONTENT_TYPE = CONTENT_TYPE_LATEST
# The showback counter's label sets: namespaces are bounded by the cluster and policies by
# the policy files, but a worker keeps no more than this many (namespace, policy) series;
# shares admitted in namespaces past it count under OTHER_NAMESPACE (no namespace name can
# start with "_"), so a cluster with more namespaces than this still sums correctly.
MAX_SHARE_SERIES = 2000
OTHER_NAMESPACE = "_other"


def multiprocess_enabled() -> bool:
    return bool(os.environ.get(MULTIPROC_DIR_VARIABLE))


class AdmissionMetrics:
    """The webhook's metrics and how to expose them."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "gpushare_admission_requests",
            "Admission requests answered, by endpoint and outcome "
            "(allowed, patched, denied, skipped, rejected, error).",
            ["endpoint", "outcome"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "gpushare_admission_duration_seconds",
            "Time from reading an admission request to having its answer, by endpoint.",
            ["endpoint"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.policy_reloads = Counter(
            "gpushare_policy_reloads",
            "Policy reloads after a change on disk, by result (ok, failed). Each worker "
            "process reloads on its own, so one change counts once per worker.",
            ["result"],
            registry=self.registry,
        )
        # Like Prometheus's own prometheus_config_last_reload_successful: the counter above
        # moves once per refused version, this stays 0 for as long as the files stay bad.
        # It and the policy count are created when first set, not here: a multiprocess gauge
        # writes 0 for its worker when created, and "livemin" over the workers would report
        # a worker still starting as a failed reload with no policies.
        self._livemin: dict[str, Gauge] = {}
        self.certificate_expiry = Gauge(
            "gpushare_certificate_expiry_timestamp_seconds",
            "Unix time at which the serving certificate expires.",
            registry=self.registry,
            multiprocess_mode="livemostrecent",
        )
        self.admitted_milli_gpus = Counter(
            "gpushare_admitted_milligpus",
            "GPU shares admitted, in thousandths of a GPU, by the pod's namespace and its "
            "policy: each pod the mutating webhook patched under a policy with "
            "quota.shareResource or quota.showbackLabels adds its applied record's milliGpus. "
            "Dry runs are not counted.",
            ["namespace", "policy"],
            registry=self.registry,
        )
        self._share_series: dict[tuple[str, str], Counter] = {}
        # Pre-create the label sets a dashboard expects to see at zero.
        for result in ("ok", "failed"):
            self.policy_reloads.labels(result=result)
        # ``labels()`` costs more than the increment itself, so children are looked up once;
        # creating them all now also creates this worker's metric files before any scrape.
        latency = {endpoint: self.latency.labels(endpoint=endpoint) for endpoint in ENDPOINTS}
        self._admission_series: dict[tuple[str, str], tuple[Counter, Histogram]] = {
            (endpoint, outcome): (
                self.requests.labels(endpoint=endpoint, outcome=outcome),
                latency[endpoint],
            )
            for endpoint in ENDPOINTS
            for outcome in OUTCOMES
        }

    def observe_admission(self, endpoint: str, outcome: str, seconds: float) -> None:
        series = self._admission_series.get((endpoint, outcome))
        if series is None:
            series = self._admission_series[(endpoint, outcome)] = (
                self.requests.labels(endpoint=endpoint, outcome=outcome),
                self.latency.labels(endpoint=endpoint),
            )
        counter, histogram = series
        counter.inc()
        histogram.observe(seconds)

    def observe_admitted_share(self, namespace: str, policy: str, milli_gpus: int) -> None:
        """Add a patched pod's share to its namespace's counter (see MAX_SHARE_SERIES)."""
        key = (namespace, policy)
        series = self._share_series.get(key)
        if series is None:
            if len(self._share_series) >= MAX_SHARE_SERIES:
                key = (OTHER_NAMESPACE, policy)
                series = self._share_series.get(key)
            if series is None:
                series = self._share_series[key] = self.admitted_milli_gpus.labels(
                    namespace=key[0], policy=key[1]
                )
        series.inc(milli_gpus)

    def observe_policy_reload(self, ok: bool, policies: int | None) -> None:
        self.policy_reloads.labels(result="ok" if ok else "failed").inc()
        self.set_policy_reload_successful(ok)
        if policies is not None:
            self.set_policies_loaded(policies)

    def set_policy_reload_successful(self, ok: bool) -> None:
        self._set_livemin(
            "gpushare_policy_last_reload_successful",
            "1 while the policy files on disk are the ones being served; 0 while their "
            "newest version was refused (the last good one serves). Lowest over live workers.",
            1 if ok else 0,
        )

    def set_policies_loaded(self, count: int) -> None:
        self._set_livemin(
            "gpushare_policies_loaded",
            "Number of policies being served (lowest over live workers).",
            count,
        )

    def _set_livemin(self, name: str, documentation: str, value: float) -> None:
        """Set a gauge aggregated as the lowest over live workers, created on first use."""
        gauge = self._livemin.get(name)
        if gauge is None:
            gauge = self._livemin[name] = Gauge(
                name, documentation, registry=self.registry, multiprocess_mode="livemin"
            )
        gauge.set(value)

    def set_certificate_expiry(self, not_after_unix: float) -> None:
        self.certificate_expiry.set(not_after_unix)

    def exposition(self) -> bytes:
        """The text to answer a scrape with: all workers' values in multiprocess mode."""
        if not multiprocess_enabled():
            return generate_latest(self.registry)
        for _ in range(SCRAPE_ATTEMPTS - 1):
            try:
                return _all_workers_exposition()
            except struct.error:
                # A worker creating its metric file leaves it empty for a moment, and the
                # collector fails on an empty file; a moment later it is initialised.
                time.sleep(0.01)
        return _all_workers_exposition()


def _all_workers_exposition() -> bytes:
    registry = CollectorRegistry()
    prometheus_multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    return generate_latest(registry)


def mark_worker_dead(pid: int) -> None:
    """Drop a dead worker's live gauges (gunicorn ``child_exit`` hook)."""
    if multiprocess_enabled():
        prometheus_multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]
