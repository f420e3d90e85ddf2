"""``BodyBudget``: large bodies take turns; small ones never wait."""

from __future__ import annotations

import threading
import time

from webhook.server.body_budget import SMALL_BODY_BYTES, BodyBudget

LARGE = SMALL_BODY_BYTES * 10


def test_a_second_large_body_waits_for_the_first() -> None:
    budget = BodyBudget(LARGE)
    order: list[str] = []

    def second() -> None:
        with budget.hold(LARGE) as admitted:
            assert admitted
            order.append("second")

    with budget.hold(LARGE) as admitted:
        assert admitted
        waiter = threading.Thread(target=second)
        waiter.start()
        time.sleep(0.2)
        order.append("first done")
    waiter.join(5)
    assert order == ["first done", "second"]
    assert budget.in_flight == 0


def test_small_bodies_pass_a_full_budget() -> None:
    budget = BodyBudget(LARGE, wait_seconds=0.05)
    with budget.hold(LARGE), budget.hold(SMALL_BODY_BYTES) as admitted:
        assert admitted


def test_a_body_that_does_not_fit_in_time_is_turned_away() -> None:
    budget = BodyBudget(LARGE, wait_seconds=0.05)
    with budget.hold(LARGE), budget.hold(LARGE) as admitted:
        assert not admitted
    assert budget.in_flight == 0


def test_a_body_larger_than_the_budget_goes_alone() -> None:
    budget = BodyBudget(LARGE)
    with budget.hold(LARGE * 3) as admitted:
        assert admitted
        assert budget.in_flight == LARGE * 3
