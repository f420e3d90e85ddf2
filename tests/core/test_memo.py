"""BoundedMemo: computed once per key, never more entries than its bound."""

from __future__ import annotations

from webhook.core.memo import BoundedMemo


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
