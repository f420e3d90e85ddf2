"""The policies a long-running process serves, reloaded when the files on disk change.

Each webhook worker (``webhook.server``) owns one ``PolicyStore`` and polls its policy path
from a daemon thread; ``gpushare dra-templates --watch`` refreshes one before each pass.
A poll reads the files the loader would read (the same non-recursive ``*.yaml``/``*.yml``
selection), hashes their contents and, only when the hash differs from the last one tried,
parses exactly the texts it hashed, so a file changing between hashing and parsing cannot
slip through unseen. Content hashing rather than mtimes also covers a ConfigMap mount's
``..data`` symlink swap and writes within one mtime tick.

A version that fails to load is refused: the last good ``PolicySet`` keeps serving, the
problems are logged, counted and kept for ``/readyz`` until a good version arrives. The same
bad version is reported once, not on every poll.

The last good version is also written to a file shared by the server's workers
(``last_good``, set by the gunicorn config through ``LAST_GOOD_VARIABLE``), so a worker that
starts while the files on disk are invalid (a replacement for one that crashed) serves what
its siblings serve instead of nothing.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

import orjson

from webhook.core import PolicySet, load_policy_texts, read_policy_files
from webhook.errors import PolicyError

log = logging.getLogger("gpushare.policies")

# Where the gunicorn config tells workers to keep the last good policy texts.
LAST_GOOD_VARIABLE = "GPUSHARE_LAST_GOOD_POLICIES"

PolicySources = list[tuple[str, str]]


class ReloadResult(StrEnum):
    UNCHANGED = "unchanged"
    LOADED = "loaded"
    REFUSED = "refused"


@dataclass(frozen=True)
class ReloadFailure:
    """Why the newest version on disk is not being served."""

    problems: tuple[str, ...]
    digest: str
    at: dt.datetime


@dataclass(frozen=True)
class PolicyStatus:
    """What ``/readyz`` reports about the policies."""

    path: Path
    loaded: bool
    policy_names: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()
    digest: str | None = None
    loaded_at: dt.datetime | None = None
    last_failure: ReloadFailure | None = None
    reloads_ok: int = 0
    reloads_failed: int = 0

    def as_dict(self) -> dict[str, object]:
        """What /readyz shows anyone who can reach the port: counts and times only.

        File paths, policy names, the digest and the problems of a refused reload go to the
        log (``policies refused``), not to an unauthenticated endpoint.
        """
        failure = self.last_failure
        return {
            "loaded": self.loaded,
            "count": len(self.policy_names),
            "loaded_at": self.loaded_at.isoformat() if self.loaded_at else None,
            "reloads_ok": self.reloads_ok,
            "reloads_failed": self.reloads_failed,
            "last_reload_failed_at": None if failure is None else failure.at.isoformat(),
        }


def digest_of(sources: PolicySources) -> str:
    hasher = hashlib.sha256()
    for name, text in sources:
        hasher.update(name.encode())
        hasher.update(b"\0")
        hasher.update(text.encode())
        hasher.update(b"\0")
    return hasher.hexdigest()


@dataclass
class _State:
    policies: PolicySet | None = None
    digest: str | None = None
    loaded_at: dt.datetime | None = None
    tried_digest: str | None = None
    last_failure: ReloadFailure | None = None
    reloads_ok: int = 0
    reloads_failed: int = 0
    initial_done: bool = False


ReloadObserver = Callable[[bool, PolicySet | None], None]


@dataclass
class PolicyStore:
    """The current ``PolicySet`` of one process, with reload bookkeeping.

    ``on_reload(ok, policies)`` is called after each reload attempt that follows the first
    load (metrics hook); it is not called for unchanged polls.
    """

    path: Path
    on_reload: ReloadObserver | None = None
    last_good: Path | None = None
    _state: _State = field(default_factory=_State, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _stop: threading.Event = field(default_factory=threading.Event, init=False, repr=False)
    _thread: threading.Thread | None = field(default=None, init=False, repr=False)

    @classmethod
    def loaded(
        cls,
        path: str | Path,
        on_reload: ReloadObserver | None = None,
        last_good: Path | None = None,
    ) -> PolicyStore:
        """A store that has tried its first load (which may have failed; see ``status``)."""
        store = cls(Path(path), on_reload, last_good)
        store.refresh()
        return store

    @property
    def policies(self) -> PolicySet | None:
        """The set to decide with, or None while no version has ever loaded."""
        return self._state.policies

    def refresh(self) -> ReloadResult:
        """Load the files if their content changed since the last attempt."""
        with self._lock:
            state = self._state
            first = not state.initial_done
            state.initial_done = True
            try:
                sources = read_policy_files(self.path)
            except PolicyError as error:
                return self._refuse(
                    error.problems, "unreadable:" + "\n".join(error.problems), first
                )
            digest = digest_of(sources)
            if digest == state.tried_digest:
                return ReloadResult.UNCHANGED
            try:
                policies = load_policy_texts(sources)
            except PolicyError as error:
                return self._refuse(error.problems, digest, first)
            state.policies, state.digest, state.tried_digest = policies, digest, digest
            state.loaded_at = dt.datetime.now(dt.UTC)
            state.last_failure = None
            self._keep_last_good(sources)
            if not first:
                state.reloads_ok += 1
            log.info(
                "policies loaded",
                extra={
                    "policies": [policy.name for policy in policies.policies],
                    "digest": digest[:12],
                    "path": str(self.path),
                },
            )
        if not first and self.on_reload is not None:
            self.on_reload(True, policies)
        return ReloadResult.LOADED

    def _refuse(self, problems: list[str], digest: str, first: bool) -> ReloadResult:
        # Called with the lock held.
        state = self._state
        if digest == state.tried_digest:
            return ReloadResult.UNCHANGED
        state.tried_digest = digest
        state.last_failure = ReloadFailure(tuple(problems), digest, dt.datetime.now(dt.UTC))
        if not first:
            state.reloads_failed += 1
        if state.policies is None:
            self._serve_last_good()
        serving = "the previous version keeps serving" if state.policies else "none loaded yet"
        log.error(
            f"policies refused; {serving}",
            extra={"problems": problems, "path": str(self.path)},
        )
        if not first and self.on_reload is not None:
            self.on_reload(False, state.policies)
        return ReloadResult.REFUSED

    def _keep_last_good(self, sources: PolicySources) -> None:
        # Called with the lock held. Written beside and renamed, so a reader never sees half.
        if self.last_good is None:
            return
        partial = self.last_good.with_name(f".{self.last_good.name}.{os.getpid()}")
        try:
            partial.write_bytes(orjson.dumps(sources))
            partial.replace(self.last_good)
        except OSError as error:
            log.warning("cannot keep the last good policies", extra={"error": str(error)})

    def _serve_last_good(self) -> None:
        # Called with the lock held, when nothing has loaded in this process yet.
        if self.last_good is None or not self.last_good.is_file():
            return
        try:
            sources = [
                (str(name), str(text)) for name, text in orjson.loads(self.last_good.read_bytes())
            ]
            policies = load_policy_texts(sources)
        except (OSError, ValueError, TypeError, PolicyError) as error:
            log.error("the last good policies do not load either", extra={"error": str(error)})
            return
        state = self._state
        state.policies, state.digest = policies, digest_of(sources)
        state.loaded_at = dt.datetime.now(dt.UTC)
        log.warning(
            "serving the last good policies of this server until the files are fixed",
            extra={"policies": [policy.name for policy in policies.policies]},
        )

    def status(self) -> PolicyStatus:
        with self._lock:
            state = self._state
            policies = state.policies
            return PolicyStatus(
                path=self.path,
                loaded=policies is not None,
                policy_names=tuple(p.name for p in policies.policies) if policies else (),
                sources=policies.sources if policies else (),
                digest=state.digest,
                loaded_at=state.loaded_at,
                last_failure=state.last_failure,
                reloads_ok=state.reloads_ok,
                reloads_failed=state.reloads_failed,
            )

    def start_polling(self, interval_seconds: float) -> None:
        """Poll for changes from a daemon thread until ``stop_polling``."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._poll, args=(interval_seconds,), name="gpushare-policy-poll", daemon=True
        )
        self._thread.start()

    def stop_polling(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def _poll(self, interval_seconds: float) -> None:
        while not self._stop.wait(interval_seconds):
            try:
                self.refresh()
            except Exception:
                # A poller that dies silently would freeze the policies forever; log and
                # keep polling instead.
                log.exception("policy poll failed")
