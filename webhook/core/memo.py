"""``BoundedMemo``: the remembered results of one pure function, never more than a bound.

Admission repeats the same few computations for every pod of a policy (placement, a mode's
changes, the framework knobs, policy selection); remembering them keeps them off the hot
path. Keys come from requests, so a memo must stay bounded: when full it starts over, which
costs one recomputation per key and needs no bookkeeping on hits.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Generic, TypeVar, TypeVarTuple

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
Args = TypeVarTuple("Args")

DEFAULT_LIMIT = 4096


class BoundedMemo(Generic[K, V]):
    """Values by key, each computed once; cleared when it holds ``limit`` entries.

    ``keep`` decides which values are remembered (the rest are computed every time). None
    is never remembered: a function that may return None is recomputed for it.
    """

    __slots__ = ("_keep", "_values", "limit")

    def __init__(self, limit: int = DEFAULT_LIMIT, keep: Callable[[V], bool] | None = None) -> None:
        self.limit = limit
        self._keep = keep
        self._values: dict[K, V] = {}

    def get_or_compute(self, key: K, compute: Callable[[*Args], V], *args: *Args) -> V:
        """The value remembered for ``key``, else ``compute(*args)`` (a function of the key)."""
        value = self._values.get(key)
        if value is None:
            value = compute(*args)
            if self._keep is None or self._keep(value):
                if len(self._values) >= self.limit:
                    self._values.clear()
                self._values[key] = value
        return value

    def __len__(self) -> int:
        return len(self._values)
