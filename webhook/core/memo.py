"""``BoundedMemo``: the remembered results of one pure function, never more than a bound.

Admission repeats the same few computations for every pod of a policy (placement, a mode's
changes, the framework knobs, policy selection); remembering them keeps them off the hot
path. Keys come from requests, so a memo must stay bounded: when full it starts over, which
costs one recomputation per key and needs no bookkeeping on hits.

``PerObject``: such memos kept per policy set by the code that fills them, not by the set,
so the policy model knows nothing of planning or selection.
"""

from __future__ import annotations

import weakref
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


class PerObject(Generic[V]):
    """One value per live object (its owner), found by identity: made by ``make`` on first
    use and dropped when the owner is collected, so it lives exactly as long as what it was
    computed from without the owner holding it (or importing its type).

    Keyed by ``id(owner)`` rather than by the owner (a ``WeakKeyDictionary``) because equal
    owners must not share: a ``PolicySet`` compares by value, but the memos planning keeps
    for one hold ``id(policy)`` of its own policies. An id is reused only after its object
    is gone, and the entry goes first: the weakref callback runs before the memory is freed.
    """

    __slots__ = ("_make", "_values")

    def __init__(self, make: Callable[[], V]) -> None:
        self._make = make
        self._values: dict[int, V] = {}

    def of(self, owner: object) -> V:
        """The value kept for ``owner``, made now if it has none yet."""
        value = self._values.get(id(owner))
        if value is None:
            key = id(owner)
            value = self._values.setdefault(key, self._make())
            # Two threads may both get here for a new owner: they share the value setdefault
            # kept, and the second removal finds nothing.
            weakref.finalize(owner, self._values.pop, key, None).atexit = False
        return value

    def __len__(self) -> int:
        return len(self._values)
