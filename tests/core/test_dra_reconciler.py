"""The template reconciler's decisions over a fake API: what it applies, skips, deletes, and
how it keeps going when calls fail. tests/e2e/test_dra.py runs it against a real apiserver.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from typing import Any

from tests.core.support import policies_from, policy_doc
from webhook.core import PolicySet, namespace_templates
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
