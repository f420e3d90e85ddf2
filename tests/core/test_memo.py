"""BoundedMemo: computed once per key, never more entries than its bound. PerObject: one
value per live owner, by identity, gone with its owner."""

from __future__ import annotations

import gc
from dataclasses import dataclass

from webhook.core.memo import BoundedMemo, PerObject


def test_a_value_is_computed_once_per_key() -> None:
    calls: list[int] = []

    def square(n: int) -> int:
        calls.append(n)
        return n * n

    memo: BoundedMemo[int, int] = BoundedMemo()
    assert [memo.get_or_compute(n, square, n) for n in (2, 3, 2, 3)] == [4, 9, 4, 9]
    assert calls == [2, 3]


def test_the_memo_starts_over_when_full() -> None:
    memo: BoundedMemo[int, str] = BoundedMemo(limit=3)
    for n in range(10):
        memo.get_or_compute(n, str, n)
        assert len(memo) <= 3
    assert memo.get_or_compute(9, lambda: "recomputed") == "9"


def test_values_keep_refuses_are_computed_every_time() -> None:
    calls: list[int] = []

    def check(n: int) -> int | str:
        calls.append(n)
        return n if n > 0 else "refused"

    memo: BoundedMemo[int, int | str] = BoundedMemo(keep=lambda v: isinstance(v, int))
    for n in (1, 1, -1, -1):
        memo.get_or_compute(n, check, n)
    assert calls == [1, -1, -1]
    assert len(memo) == 1


@dataclass(frozen=True)
class Owner:
    """Compares by value, as a PolicySet does."""

    name: str


def test_each_owner_has_its_own_value_even_when_equal() -> None:
    kept: PerObject[list[str]] = PerObject(list)
    first, second = Owner("a"), Owner("a")
    kept.of(first).append("first's")
    assert kept.of(first) == ["first's"]
    assert kept.of(second) == []
    assert len(kept) == 2


def test_a_value_goes_with_its_owner() -> None:
    kept: PerObject[list[str]] = PerObject(list)
    owner = Owner("a")
    kept.of(owner).append("x")
    del owner
    gc.collect()
    assert len(kept) == 0
