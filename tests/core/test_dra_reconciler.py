"""The template reconciler's decisions over a fake API: what it applies, skips, deletes, and
how it keeps going when calls fail; with a fixed list of namespaces (namespaced RBAC); what
it reports to its probes and metrics, and the small HTTP server that serves them.
tests/e2e/test_dra.py runs it against a real apiserver.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from tests.core.support import policies_from, policy_doc
from webhook.core import PolicySet, namespace_templates
from webhook.dra import ReconcilerStatus, StatusServer, parse_listen
from webhook.dra.reconciler import (
    DIGEST_ANNOTATION,
    TemplateApiError,
    TemplateReconciler,
    run,
    template_digest,
    with_digest,
)


def policies(granularity: str = "40Gi") -> PolicySet:
    return policies_from(
        policy_doc(
            "gpus",
            match={"namespaces": ["ml-*"]},
            mode="dra",
            gpuMemory="80Gi",
            fraction={"min": 0.5, "max": 1},
            dra={"granularity": granularity},
        )
    )


class FakeApi:
    """Namespaces and their managed templates in memory; ``failing`` namespaces raise."""

    def __init__(self, namespaces: list[str], failing: frozenset[str] = frozenset()) -> None:
        self.store: dict[str, dict[str, dict[str, Any]]] = {n: {} for n in namespaces}
        self.failing = failing
        self.calls: list[str] = []
        self.watch_events: list[tuple[str, str]] = []
        self.stop_after_watch: threading.Event | None = None

    def namespaces(self) -> list[str]:
        return list(self.store)

    def managed_templates(self, namespace: str) -> dict[str, dict[str, Any]]:
        if namespace in self.failing:
            raise TemplateApiError(f"GET {namespace}: HTTP 500: boom")
        return dict(self.store[namespace])

    def apply(self, namespace: str, manifest: Mapping[str, Any]) -> None:
        self.calls.append(f"apply {namespace}/{manifest['metadata']['name']}")
        self.store[namespace][manifest["metadata"]["name"]] = dict(manifest)

    def delete(self, namespace: str, name: str) -> None:
        self.calls.append(f"delete {namespace}/{name}")
        del self.store[namespace][name]

    def watch_namespaces(self, timeout_s: int) -> Iterator[tuple[str, str]]:
        for kind, name in self.watch_events:
            if kind == "ADDED":
                self.store.setdefault(name, {})
            yield kind, name
        self.watch_events = []
        if self.stop_after_watch is not None:
            self.stop_after_watch.set()


def reconciler(api: FakeApi) -> TemplateReconciler:
    return TemplateReconciler(api, namespace_templates)  # type: ignore[arg-type]


def test_the_digest_covers_what_gpushare_sets_and_ignores_itself() -> None:
    (template, *_) = namespace_templates(policies(), "ml-a")
    stamped = with_digest(template)
    assert stamped["metadata"]["annotations"][DIGEST_ANNOTATION] == template_digest(template)
    assert template_digest(stamped) == template_digest(template)
    changed = with_digest(template)
    changed["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = "other"
    assert template_digest(changed) != template_digest(template)
    assert "metadata" in template and DIGEST_ANNOTATION not in template["metadata"]["annotations"]


def test_a_pass_applies_what_is_missing_skips_what_matches_and_deletes_the_rest() -> None:
    api = FakeApi(["ml-a", "web"])
    first = reconciler(api).reconcile_namespace(policies(), "ml-a")
    assert first.applied == ["ml-a/gpushare-gpus-40gi", "ml-a/gpushare-gpus-80gi"]
    api.calls.clear()
    assert reconciler(api).reconcile_namespace(policies(), "ml-a").unchanged == 2
    assert api.calls == []
    # 20Gi steps: 40Gi and 80Gi stay as they are (same spec), 60Gi is new, nothing goes.
    finer = reconciler(api).reconcile_namespace(policies("20Gi"), "ml-a")
    assert (finer.applied, finer.unchanged, finer.deleted) == (["ml-a/gpushare-gpus-60gi"], 2, [])
    coarser = reconciler(api).reconcile_namespace(policies("80Gi"), "ml-a")
    assert coarser.deleted == ["ml-a/gpushare-gpus-40gi", "ml-a/gpushare-gpus-60gi"]
    assert set(api.store["ml-a"]) == {"gpushare-gpus-80gi"}
    assert reconciler(api).reconcile_namespace(policies(), "web").applied == []


def test_one_failing_namespace_does_not_stop_the_others() -> None:
    api = FakeApi(["ml-a", "ml-broken", "ml-c"], failing=frozenset({"ml-broken"}))
    done, result = reconciler(api).reconcile_all(policies())
    assert done == {"ml-a", "ml-c"}
    assert result.errors == ["namespace ml-broken: GET ml-broken: HTTP 500: boom"]
    assert len(result.applied) == 4
    assert result.summary() == "4 applied, 0 unchanged, 0 deleted, 1 errors"


def test_run_passes_over_new_namespaces_only_and_stops() -> None:
    api = FakeApi(["ml-a"])
    stop = threading.Event()
    api.stop_after_watch = stop
    # The watch opens with every namespace (ml-a, already done) and then a new one.
    api.watch_events = [("ADDED", "ml-a"), ("ADDED", "ml-new"), ("ADDED", "web")]
    current = policies()
    run(reconciler(api), lambda: current, stop, watch_s=1)
    assert api.calls == [
        "apply ml-a/gpushare-gpus-40gi",
        "apply ml-a/gpushare-gpus-80gi",
        "apply ml-new/gpushare-gpus-40gi",
        "apply ml-new/gpushare-gpus-80gi",
    ]


def test_run_touches_nothing_without_valid_policies() -> None:
    api = FakeApi(["ml-a"])
    stop = threading.Event()
    seen = []

    def none_yet() -> PolicySet | None:
        seen.append(1)
        if len(seen) >= 2:
            stop.set()
        return None

    run(reconciler(api), none_yet, stop, watch_s=1)
    assert api.calls == []


# -- a fixed list of namespaces (namespaced RBAC) --------------------------------------------


class NoListingApi(FakeApi):
    """A FakeApi whose ServiceAccount may neither list nor watch namespaces (Roles only)."""

    def namespaces(self) -> list[str]:
        raise AssertionError("a reconciler with fixed namespaces listed them")

    def watch_namespaces(self, timeout_s: int) -> Iterator[tuple[str, str]]:
        raise AssertionError("a reconciler with fixed namespaces watched them")


def test_fixed_namespaces_are_passed_over_alone_and_never_listed_or_watched() -> None:
    api = NoListingApi(["ml-a", "ml-b", "ml-c"])
    fixed = TemplateReconciler(api, namespace_templates, namespaces=("ml-a", "ml-b"))  # type: ignore[arg-type]
    done, result = fixed.reconcile_all(policies())
    assert done == {"ml-a", "ml-b"} and api.store["ml-c"] == {}
    assert result.created == result.applied and len(result.applied) == 4
    stop = threading.Event()
    waits: list[float] = []

    def one_wait(seconds: float | None = None) -> bool:  # the loop's idle wait, then stop
        waits.append(seconds or 0.0)
        stop.set()
        return True

    stop.wait = one_wait  # type: ignore[method-assign]
    status = ReconcilerStatus()
    run(fixed, policies, stop, watch_s=7, status=status)
    assert waits == [7]  # the policy files are polled every watch_s instead of a watch
    assert status.ready() == (
        True,
        {"policies_loaded": True, "full_passes": 1, "last_full_pass_errors": 0},
    )


def test_created_and_updated_are_told_apart() -> None:
    api = FakeApi(["ml-a"])
    assert reconciler(api).reconcile_namespace(policies(), "ml-a").created == [
        "ml-a/gpushare-gpus-40gi",
        "ml-a/gpushare-gpus-80gi",
    ]
    # A template edited by hand: applied again, not created.
    api.store["ml-a"]["gpushare-gpus-40gi"]["metadata"]["annotations"][DIGEST_ANNOTATION] = "x"
    again = reconciler(api).reconcile_namespace(policies(), "ml-a")
    assert (again.applied, again.created) == (["ml-a/gpushare-gpus-40gi"], [])


# -- probes and metrics ------------------------------------------------------------------------


def sample(status: ReconcilerStatus, name: str, **labels: str) -> float:
    value = status.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def test_run_reports_every_pass_to_the_metrics() -> None:
    api = FakeApi(["ml-a", "ml-broken"], failing=frozenset({"ml-broken"}))
    stop = threading.Event()
    stop.wait = lambda seconds=None: (stop.set(), True)[1]  # type: ignore[method-assign]
    status = ReconcilerStatus()
    current = policies()
    # The first full pass fails in ml-broken: the loop waits its backoff (and stops there).
    run(reconciler(api), lambda: current, stop, watch_s=1, status=status)
    assert sample(status, "gpushare_dra_reconciles_total", scope="full", outcome="error") == 1
    assert sample(status, "gpushare_dra_reconcile_errors_total") == 1
    assert sample(status, "gpushare_dra_templates_created_total") == 2
    assert sample(status, "gpushare_dra_policies_loaded") == 1
    assert sample(status, "gpushare_dra_last_full_pass_success_timestamp_seconds") == 0
    assert status.ready()[0] is False  # the last full pass had an error

    # A clean pass over the same namespaces, then one new namespace from the watch.
    api.failing = frozenset()
    api.stop_after_watch = stop = threading.Event()
    api.watch_events = [("ADDED", "ml-new")]
    api.store["ml-a"]["gpushare-gpus-80gi"]["metadata"]["annotations"][DIGEST_ANNOTATION] = "x"
    run(reconciler(api), lambda: current, stop, watch_s=1, status=status)
    assert sample(status, "gpushare_dra_reconciles_total", scope="full", outcome="ok") == 1
    assert sample(status, "gpushare_dra_reconciles_total", scope="namespace", outcome="ok") == 1
    # 2 + ml-broken's 2 + ml-new's 2 created; ml-a's edited one updated.
    assert sample(status, "gpushare_dra_templates_created_total") == 6
    assert sample(status, "gpushare_dra_templates_updated_total") == 1
    assert sample(status, "gpushare_dra_last_full_pass_success_timestamp_seconds") > 0
    assert status.ready()[0] is True


def test_policies_never_loaded_are_not_ready_and_deletions_are_counted() -> None:
    status = ReconcilerStatus()
    stop = threading.Event()

    def none_yet() -> PolicySet | None:
        stop.set()
        return None

    run(reconciler(FakeApi(["ml-a"])), none_yet, stop, watch_s=1, status=status)
    assert status.ready() == (
        False,
        {"policies_loaded": False, "full_passes": 0, "last_full_pass_errors": None},
    )
    api = FakeApi(["ml-a"])
    reconciler(api).reconcile_namespace(policies(), "ml-a")
    status.record("full", reconciler(api).reconcile_namespace(policies("80Gi"), "ml-a"))
    assert sample(status, "gpushare_dra_templates_deleted_total") == 1


def test_liveness_fails_only_when_the_loop_stops_making_progress() -> None:
    now = [1000.0]
    status = ReconcilerStatus(stale_after_s=60, clock=lambda: now[0])
    assert status.alive() == (True, {"seconds_since_progress": 0.0})
    now[0] += 61
    assert status.alive()[0] is False
    # Any progress (a template written: the reconciler's progress hook) makes it live again.
    api = FakeApi(["ml-a"])
    TemplateReconciler(api, namespace_templates, progress=status.tick).reconcile_namespace(  # type: ignore[arg-type]
        policies(), "ml-a"
    )
    assert status.alive() == (True, {"seconds_since_progress": 0.0})


def http_get(port: int, path: str) -> tuple[int, str, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.headers["Content-Type"], response.read()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.headers["Content-Type"], error.read()


def test_the_status_server_answers_the_probes_and_the_metrics() -> None:
    status = ReconcilerStatus()
    server = StatusServer("127.0.0.1", 0, status)
    server.start()
    try:
        port = server.address[1]
        code, kind, body = http_get(port, "/healthz")
        assert (code, kind, json.loads(body)["ok"]) == (200, "application/json", True)
        code, _, body = http_get(port, "/readyz")
        assert code == 503 and json.loads(body) == {
            "ok": False,
            "policies_loaded": False,
            "full_passes": 0,
            "last_full_pass_errors": None,
        }
        status.policies(True)
        status.record("full", reconciler(FakeApi(["ml-a"])).reconcile_all(policies())[1])
        assert http_get(port, "/readyz")[0] == 200
        code, kind, body = http_get(port, "/metrics")
        assert code == 200 and kind.startswith("text/plain")
        assert b"gpushare_dra_templates_created_total 2.0" in body
        assert b'gpushare_dra_reconciles_total{outcome="ok",scope="full"} 1.0' in body
        assert http_get(port, "/nothing")[0] == 404
    finally:
        server.stop()


def test_listen_addresses() -> None:
    assert parse_listen("0.0.0.0:9402") == ("0.0.0.0", 9402)
    assert parse_listen(":9402") == ("0.0.0.0", 9402)
    assert parse_listen("[::]:9402") == ("::", 9402)
    for bad in ("9402", "host:", "host:http", "host:70000"):
        with pytest.raises(ValueError, match="is not HOST:PORT"):
            parse_listen(bad)
