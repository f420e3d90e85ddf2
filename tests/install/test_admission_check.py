"""`gpushare check-admission`'s decisions without a cluster: the pod it sends, when it tries
again, and what each answer of the apiserver means. The real apiserver:
tests/e2e/test_post_install_check.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

from webhook.constants import APPLIED_ANNOTATION, FRACTION_ANNOTATION
from webhook.install import AdmissionCheck, run_check
from webhook.install.admission_check import Attempt, check_pod


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_the_pod_is_annotated_and_fits_the_restricted_standard() -> None:
    pod = check_pod()
    assert pod["metadata"]["annotations"] == {FRACTION_ANNOTATION: "0.5"}
    assert pod["metadata"]["generateName"] == "gpushare-admission-check-"
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    (container,) = pod["spec"]["containers"]
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["securityContext"]["allowPrivilegeEscalation"] is False


def test_failed_attempts_are_tried_again_until_one_passes() -> None:
    answers = iter([Attempt(False, "not yet"), Attempt(False, "still not"), Attempt(True, "ok")])
    clock, reported = FakeClock(), []
    result = run_check(
        lambda: next(answers), 60, reported.append, interval=5, clock=clock, sleep=clock.sleep
    )
    assert (result.passed, result.attempts, result.message) == (True, 3, "ok")
    assert reported == ["attempt 1: not yet", "attempt 2: still not"]
    assert clock.slept == [5, 5]


def test_the_timeout_bounds_the_attempts_and_the_last_reason_is_the_message() -> None:
    clock, reported = FakeClock(), []
    result = run_check(
        lambda: Attempt(False, f"refused at {clock.now:.0f}"), 12, reported.append,
        interval=5, clock=clock, sleep=clock.sleep,
    )  # fmt: skip
    assert (result.passed, result.attempts, result.message) == (False, 3, "refused at 10")
    # --timeout 0: one attempt.
    once = run_check(lambda: Attempt(False, "no"), 0, reported.append, clock=FakeClock())
    assert once.attempts == 1


def test_an_answer_waiting_cannot_change_ends_the_check_at_once() -> None:
    clock = FakeClock()
    result = run_check(
        lambda: Attempt(False, "forbidden", final=True), 60, lambda _: None,
        clock=clock, sleep=clock.sleep,
    )  # fmt: skip
    assert result.attempts == 1 and clock.slept == []


class FakeResponse:
    def __init__(self, status: int, body: dict[str, Any]) -> None:
        self.status = status
        self.body = json.dumps(body).encode()

    def read(self) -> bytes:
        return self.body


class FakeApi:
    """What AdmissionCheck uses of an ApiClient: param_serialize and call_api."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        self.response = FakeResponse(status, body)
        self.sent: dict[str, Any] = {}

    def param_serialize(self, method: str, path: str, **kwargs: Any) -> tuple[Any, ...]:
        self.sent = {"method": method, "path": path, **kwargs}
        return (method, path)

    def call_api(self, *args: Any, **kwargs: Any) -> FakeResponse:
        return self.response


def attempt(status: int, body: dict[str, Any]) -> tuple[Attempt, dict[str, Any]]:
    api = FakeApi(status, body)
    result = AdmissionCheck(api, "team-a").attempt()  # type: ignore[arg-type]
    return result, api.sent


def test_a_pod_back_with_the_record_passes_and_is_a_dry_run() -> None:
    record = '{"policy":"default"}'
    result, sent = attempt(201, {"metadata": {"annotations": {APPLIED_ANNOTATION: record}}})
    assert result.passed and record in result.reason
    assert sent["method"] == "POST" and sent["query_params"] == [("dryRun", "All")]
    assert sent["path_params"] == {"namespace": "team-a"}


@pytest.mark.parametrize(
    ("status", "message", "says", "final"),
    [
        (201, None, "admitted without gpushare's record", False),
        (500, 'failed calling webhook "mutate.gpushare.io": connection refused',
         "could not get an answer from gpushare's webhook", False),
        (403, "... was never mutated by gpushare: the mutating webhook was unreachable",
         "could not get an answer from gpushare's webhook", False),
        (403, 'admission webhook "mutate.gpushare.io" denied the request: no policy', "HTTP 403",
         False),
        (403, 'pods is forbidden: User "x" cannot create resource "pods"', "HTTP 403", True),
        (404, 'namespaces "team-a" not found', "HTTP 404", True),
        (401, "Unauthorized", "HTTP 401", True),
        (422, "denied: 0.5 is over the policy's bound", "HTTP 422", False),
    ],
)  # fmt: skip
def test_what_each_answer_means(status: int, message: str | None, says: str, final: bool) -> None:
    body: dict[str, Any] = {"metadata": {}} if message is None else {"message": message}
    result, _ = attempt(status, body)
    assert not result.passed
    assert says in result.reason
    assert result.final is final
