"""Keeps the ``dra`` mode's ResourceClaimTemplates in every namespace whose pods may need them.

A pass over one namespace lists the templates gpushare manages there (label
``app.kubernetes.io/managed-by: gpushare``), server-side applies each desired template whose
digest annotation differs (field manager ``gpushare-dra-templates``, forced: gpushare owns
these objects) and deletes managed templates no policy wants any more. Nothing else in the
namespace is read or touched. The desired set comes from the pure core, the same functions
the webhook names templates with, so a pod is never sent to a template this would not make.

``run`` does one pass over every namespace, then watches namespaces (bounded watches, so the
policy files are polled between them) and passes over a namespace when it appears, over all
when the policies change, and over all again every ``resync_s`` to repair drift (a template
deleted by hand). Failures are logged and retried on the next pass with a bounded backoff;
one namespace failing never stops the others. Given a fixed list of namespaces instead
(``TemplateReconciler.namespaces``: where every dra policy names its namespaces exactly), it
passes over those only and never lists or watches namespaces. It reports every pass and its
progress to a ``ReconcilerStatus`` (status.py: the probes and metrics).

Every call has a timeout, every list is paged and bounded, and the watch is closed after
``watch_s``. RBAC (deploy/dra-templates, the chart's dra-reconciler.yaml): namespaces
get/list/watch and resourceclaimtemplates get/list/create/patch/delete in every namespace;
with a fixed list, resourceclaimtemplates in those namespaces only (a Role in each), nothing
else.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client as k8s
from kubernetes import watch as k8s_watch
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from webhook.core import PolicySet
from webhook.dra.status import FULL, NAMESPACE, ReconcilerStatus

log = logging.getLogger("gpushare.dra")

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "gpushare"
DIGEST_ANNOTATION = "gpushare.io/template-digest"
FIELD_MANAGER = "gpushare-dra-templates"
APPLY_PATCH = "application/apply-patch+yaml"
TEMPLATES_PATH = "/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaimtemplates"
# Bounds: a page of a list, the pages of one list, and any one response body.
PAGE_SIZE = 500
MAX_PAGES = 40
MAX_RESPONSE_BYTES = 16 * 1024 * 1024
# The longest wait between retries of a failing pass.
MAX_BACKOFF_S = 300.0

DesiredTemplates = Callable[[PolicySet, str], list[dict[str, Any]]]


class TemplateApiError(Exception):
    """A call to the Kubernetes API failed; the message names the call and the cause, and
    ``status`` is the HTTP status where the apiserver answered."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def template_digest(manifest: Mapping[str, Any]) -> str:
    """A digest of what gpushare wants a template to be (labels, annotations, spec)."""
    wanted = {
        "labels": manifest.get("metadata", {}).get("labels", {}),
        "annotations": {
            k: v
            for k, v in manifest.get("metadata", {}).get("annotations", {}).items()
            if k != DIGEST_ANNOTATION
        },
        "spec": manifest.get("spec"),
    }
    text = json.dumps(wanted, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def with_digest(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """``manifest`` with its digest annotation set (a copy)."""
    copy = json.loads(json.dumps(manifest))
    metadata = copy.setdefault("metadata", {})
    metadata.setdefault("annotations", {})[DIGEST_ANNOTATION] = template_digest(manifest)
    return dict(copy)


class TemplateApi:
    """The few calls the reconciler makes, as raw JSON over a kubernetes ApiClient.

    Raw rather than the generated ResourceV1Api: its models check dict bodies against
    themselves and drop fields newer than the client (consumable capacity).
    """

    def __init__(self, api_client: k8s.ApiClient, *, timeout_s: float = 15.0) -> None:
        self._api = api_client
        self._core = k8s.CoreV1Api(api_client)
        self._timeout_s = timeout_s

    def _call(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, str]] | None = None,
        body: Mapping[str, Any] | None = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        what = f"{method} {path}"
        try:
            call = self._api.param_serialize(
                method,
                path,
                query_params=query or [],
                header_params=headers,
                body=dict(body) if body is not None else None,
                auth_settings=["BearerToken"],
            )
            response = self._api.call_api(*call, _request_timeout=self._timeout_s)
            data: bytes = response.read()  # type: ignore[no-untyped-call]
        except (HTTPError, OSError) as exc:
            raise TemplateApiError(f"{what}: {type(exc).__name__}: {exc}") from exc
        if len(data) > MAX_RESPONSE_BYTES:
            raise TemplateApiError(f"{what}: answer of {len(data)} bytes is over the bound")
        if not 200 <= response.status <= 299:
            message = f"{what}: HTTP {response.status}: {_status_message(data)}"
            raise TemplateApiError(message, response.status)
        try:
            result = json.loads(data) if data else {}
        except ValueError as exc:
            raise TemplateApiError(f"{what}: the answer is not JSON: {exc}") from exc
        if not isinstance(result, dict):
            raise TemplateApiError(f"{what}: the answer is not a JSON object")
        return result

    def _list(self, path: str, query: list[tuple[str, str]]) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        token = ""
        for _ in range(MAX_PAGES):
            page = [*query, ("limit", str(PAGE_SIZE))]
            if token:
                page.append(("continue", token))
            answer = self._call("GET", path, query=page)
            items += answer.get("items") or []
            token = (answer.get("metadata") or {}).get("continue") or ""
            if not token:
                return items
        raise TemplateApiError(f"GET {path}: more than {PAGE_SIZE * MAX_PAGES} items")

    def namespaces(self) -> list[str]:
        """Names of the namespaces that are not being deleted."""
        return [
            item["metadata"]["name"]
            for item in self._list("/api/v1/namespaces", [])
            if (item.get("status") or {}).get("phase") != "Terminating"
        ]

    def managed_templates(self, namespace: str) -> dict[str, dict[str, Any]]:
        """gpushare's templates in ``namespace``, by name."""
        path = TEMPLATES_PATH.format(namespace=namespace)
        selector = [("labelSelector", f"{MANAGED_BY_LABEL}={MANAGED_BY}")]
        return {t["metadata"]["name"]: t for t in self._list(path, selector)}

    def apply(self, namespace: str, manifest: Mapping[str, Any]) -> None:
        name = manifest["metadata"]["name"]
        self._call(
            "PATCH",
            f"{TEMPLATES_PATH.format(namespace=namespace)}/{name}",
            query=[("fieldManager", FIELD_MANAGER), ("force", "true")],
            body=manifest,
            content_type=APPLY_PATCH,
        )

    def delete(self, namespace: str, name: str) -> None:
        try:
            self._call("DELETE", f"{TEMPLATES_PATH.format(namespace=namespace)}/{name}")
        except TemplateApiError as exc:
            if exc.status != 404:  # already gone is what we wanted
                raise

    def watch_namespaces(self, timeout_s: int) -> Iterator[tuple[str, str]]:
        """(event type, namespace name) until the server ends the watch after ``timeout_s``."""
        watcher = k8s_watch.Watch()  # type: ignore[no-untyped-call]
        try:
            for event in watcher.stream(  # type: ignore[no-untyped-call]
                self._core.list_namespace,
                timeout_seconds=timeout_s,
                _request_timeout=timeout_s + self._timeout_s,
            ):
                item = event["object"]
                yield event["type"], item.metadata.name
        except (ApiException, HTTPError, OSError) as exc:
            raise TemplateApiError(f"watch namespaces: {type(exc).__name__}: {exc}") from exc
        finally:
            watcher.stop()  # type: ignore[no-untyped-call]


def _status_message(data: bytes) -> str:
    try:
        return str(json.loads(data).get("message", ""))[:300]
    except (ValueError, AttributeError):
        return data[:300].decode(errors="replace")


@dataclass
class PassResult:
    """What one pass did; ``errors`` has one line per failed namespace or call. ``created``
    are those of ``applied`` that did not exist before."""

    applied: list[str] = field(default_factory=list)
    created: list[str] = field(default_factory=list)
    unchanged: int = 0
    deleted: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def add(self, other: PassResult) -> None:
        self.applied += other.applied
        self.created += other.created
        self.unchanged += other.unchanged
        self.deleted += other.deleted
        self.errors += other.errors

    def summary(self) -> str:
        return (
            f"{len(self.applied)} applied, {self.unchanged} unchanged, "
            f"{len(self.deleted)} deleted, {len(self.errors)} errors"
        )


def _nothing() -> None:
    pass


@dataclass
class TemplateReconciler:
    """Makes each namespace's managed templates what ``desired`` says: in ``namespaces``
    when given (no namespace is listed or watched then), else in every namespace.
    ``progress`` is called after every template written (the liveness probe's tick)."""

    api: TemplateApi
    desired: DesiredTemplates
    namespaces: tuple[str, ...] | None = None
    progress: Callable[[], None] = _nothing

    def reconcile_namespace(self, policies: PolicySet, namespace: str) -> PassResult:
        result = PassResult()
        try:
            wanted = {
                t["metadata"]["name"]: with_digest(t) for t in self.desired(policies, namespace)
            }
            existing = self.api.managed_templates(namespace)
            for name, manifest in wanted.items():
                digest = manifest["metadata"]["annotations"][DIGEST_ANNOTATION]
                current = existing.get(name, {}).get("metadata", {}).get("annotations") or {}
                if current.get(DIGEST_ANNOTATION) == digest:
                    result.unchanged += 1
                    continue
                self.api.apply(namespace, manifest)
                result.applied.append(f"{namespace}/{name}")
                if name not in existing:
                    result.created.append(f"{namespace}/{name}")
                self.progress()
            for name in sorted(set(existing) - set(wanted)):
                self.api.delete(namespace, name)
                result.deleted.append(f"{namespace}/{name}")
                self.progress()
        except TemplateApiError as exc:
            result.errors.append(f"namespace {namespace}: {exc}")
        return result

    def reconcile_all(self, policies: PolicySet) -> tuple[set[str], PassResult]:
        """Pass over every namespace (or ``namespaces``); the names passed over without
        error, and the result."""
        result = PassResult()
        done: set[str] = set()
        try:
            namespaces = (
                list(self.namespaces) if self.namespaces is not None else self.api.namespaces()
            )
        except TemplateApiError as exc:
            result.errors.append(str(exc))
            return done, result
        for namespace in namespaces:
            self.progress()
            one = self.reconcile_namespace(policies, namespace)
            result.add(one)
            if not one.errors:
                done.add(namespace)
        return done, result


def _report(what: str, result: PassResult) -> None:
    for line in result.errors:
        log.warning("dra templates: %s", line)
    if result.applied or result.deleted or result.errors:
        log.info("dra templates: %s: %s", what, result.summary())


def run(
    reconciler: TemplateReconciler,
    current_policies: Callable[[], PolicySet | None],
    stop: threading.Event,
    *,
    watch_s: int = 30,
    resync_s: float = 600.0,
    clock: Callable[[], float] = time.monotonic,
    status: ReconcilerStatus | None = None,
) -> None:
    """Reconcile until ``stop`` is set: see the module docstring.

    ``current_policies`` returns the set to reconcile with (a PolicyStore refreshes it);
    None while no valid set was ever loaded, in which case nothing is touched. A watch
    opens with an ADDED event for every namespace there is: those already reconciled under
    the current policies are skipped, so only new namespaces cost a pass. With fixed
    ``reconciler.namespaces`` there is no watch: the policy files are polled every
    ``watch_s`` instead. ``status`` gets every pass and every sign of progress.
    """
    report = status or ReconcilerStatus()
    backoff = 1.0
    last: PolicySet | None = None
    seen: set[str] = set()
    next_resync = 0.0

    def wait() -> None:
        nonlocal backoff
        report.tick()
        stop.wait(backoff)
        backoff = min(backoff * 2, MAX_BACKOFF_S)

    while not stop.is_set():
        report.tick()
        policies = current_policies()
        report.policies(policies is not None)
        if policies is None:
            log.warning("dra templates: no valid policies loaded yet; nothing reconciled")
            wait()
            continue
        if policies is not last or clock() >= next_resync:
            namespaces, result = reconciler.reconcile_all(policies)
            report.record(FULL, result)
            _report("full pass", result)
            if result.errors:
                wait()
                continue
            backoff, last, seen, next_resync = 1.0, policies, namespaces, clock() + resync_s
        if reconciler.namespaces is not None:
            stop.wait(watch_s)
            continue
        try:
            _follow_namespaces(reconciler, policies, seen, current_policies, stop, watch_s, report)
        except TemplateApiError as exc:
            log.warning("dra templates: %s", exc)
            wait()


def _follow_namespaces(
    reconciler: TemplateReconciler,
    policies: PolicySet,
    seen: set[str],
    current_policies: Callable[[], PolicySet | None],
    stop: threading.Event,
    watch_s: int,
    status: ReconcilerStatus,
) -> None:
    """One bounded namespace watch: a pass over each namespace not ``seen`` that appears,
    until the watch ends, ``stop`` is set or the policies change."""
    for kind, namespace in reconciler.api.watch_namespaces(watch_s):
        status.tick()
        if stop.is_set() or current_policies() is not policies:
            return
        if kind == "DELETED":
            seen.discard(namespace)
        elif kind == "ADDED" and namespace not in seen:
            result = reconciler.reconcile_namespace(policies, namespace)
            status.record(NAMESPACE, result)
            _report(f"namespace {namespace}", result)
            if not result.errors:
                seen.add(namespace)
