"""Packing pods onto bins (GPUs, or nodes for whole GPUs): first-fit decreasing, and the
lower bound it is measured against.

A bin has an integer capacity per dimension (slots of a GPU; MiB of its memory; vcuda cores
and memory units; whole GPUs of a node); an item asks an integer amount of each. Items are
taken largest first (by their largest share of a bin, then by the amounts themselves) and
each goes to the lowest-numbered open bin where every dimension still fits, else to a new
bin: first-fit decreasing (FFD).

What the answer is worth:
- Items of one size (every pod of a replica-class pool takes one slot): FFD fills bins one
  after the other, ceil(n / per_bin) bins, which is optimal and is what any scheduler
  reaches, in any order, since every fit is the same.
- One dimension, several sizes: FFD <= 11/9 OPT + 6/9 (Dósa, "The tight bound of first
  fit decreasing bin-packing algorithm is FFD(I) <= 11/9 OPT(I) + 6/9", ESCAPE 2007), and
  OPT >= the lower bound ceil(sum / capacity), which every result reports beside it.
- Several dimensions (memory and cores): no such constant; the lower bound
  max over dimensions of ceil(sum_d / capacity_d) is reported beside the result.

Cost: identical items are placed in runs (the first bin where one fits takes as many as
fit, which is exactly what placing them one by one would do), and the first bin that fits
is found in a segment tree holding each dimension's largest free amount per subtree, so a
pool of n items of k sizes costs about (bins + k) log(bins).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

Vector = tuple[int, ...]


@dataclass(frozen=True)
class Item:
    """``count`` identical items asking ``size``; ``label`` says whose they are."""

    label: str
    size: Vector
    count: int = 1


@dataclass(frozen=True)
class Packing:
    """Which items went where: ``bins[b]`` lists (label, count) in placement order."""

    capacity: Vector
    bins: tuple[tuple[tuple[str, int], ...], ...]
    used: tuple[Vector, ...]  # per bin, the amount taken in each dimension
    lower_bound: int

    @property
    def bin_count(self) -> int:
        return len(self.bins)


def lower_bound(capacity: Vector, items: Sequence[Item]) -> int:
    """No packing uses fewer bins: max over dimensions of ceil(total asked / capacity)."""
    bound = 0
    for dim, room in enumerate(capacity):
        total = sum(item.size[dim] * item.count for item in items)
        bound = max(bound, math.ceil(total / room)) if room > 0 else bound
    return bound


def _order(capacity: Vector, item: Item) -> tuple[float, Vector, str]:
    largest_share = max(
        (amount / room for amount, room in zip(item.size, capacity, strict=True) if room),
        default=0.0,
    )
    return (-largest_share, tuple(-amount for amount in item.size), item.label)


class _FreeTree:
    """Per-dimension largest free amount over each subtree of bins; grows by doubling."""

    def __init__(self, capacity: Vector) -> None:
        self.capacity = capacity
        self.size = 1
        self.count = 0  # bins opened
        self.free: list[list[int]] = [[0] * len(capacity) for _ in range(2)]

    def _grow(self) -> None:
        old_size, old = self.size, self.free
        self.size *= 2
        self.free = [[0] * len(self.capacity) for _ in range(2 * self.size)]
        for leaf in range(old_size):
            self.free[self.size + leaf] = old[old_size + leaf]
        for node in range(self.size - 1, 0, -1):
            self._pull(node)

    def _pull(self, node: int) -> None:
        left, right = self.free[2 * node], self.free[2 * node + 1]
        self.free[node] = [max(a, b) for a, b in zip(left, right, strict=True)]

    def open_bin(self) -> int:
        if self.count == self.size:
            self._grow()
        self.set(self.count, list(self.capacity))
        self.count += 1
        return self.count - 1

    def set(self, leaf: int, free: list[int]) -> None:
        node = self.size + leaf
        self.free[node] = free
        node //= 2
        while node:
            self._pull(node)
            node //= 2

    def leaf(self, leaf: int) -> list[int]:
        return self.free[self.size + leaf]

    def first_fit(self, size: Vector) -> int | None:
        """The lowest-numbered open bin with room for ``size`` in every dimension."""
        return self._search(1, size)

    def _search(self, node: int, size: Vector) -> int | None:
        # The subtree maxima are necessary, not sufficient, with several dimensions: a
        # subtree may pass on each dimension through different bins, hence the backtracking.
        if any(free < amount for free, amount in zip(self.free[node], size, strict=True)):
            return None
        if node >= self.size:
            leaf = node - self.size
            return leaf if leaf < self.count else None
        found = self._search(2 * node, size)
        return found if found is not None else self._search(2 * node + 1, size)


def first_fit_decreasing(capacity: Vector, items: Sequence[Item]) -> Packing:
    """Pack ``items`` into bins of ``capacity``; an item larger than a bin raises ValueError
    (callers refuse those before packing, with the reason)."""
    for item in items:
        if any(a > c for a, c in zip(item.size, capacity, strict=True)):
            raise ValueError(f"{item.label}: {item.size} does not fit a bin of {capacity}")
    tree = _FreeTree(capacity)
    contents: list[list[tuple[str, int]]] = []
    for item in sorted(items, key=lambda i: _order(capacity, i)):
        left = item.count
        while left > 0:
            target = tree.first_fit(item.size)
            if target is None:
                target = tree.open_bin()
                contents.append([])
            free = tree.leaf(target)
            fits = min(
                (f // a for f, a in zip(free, item.size, strict=True) if a > 0), default=left
            )
            taken = min(left, fits)
            tree.set(target, [f - a * taken for f, a in zip(free, item.size, strict=True)])
            contents[target].append((item.label, taken))
            left -= taken
    used = tuple(
        tuple(c - f for c, f in zip(capacity, tree.leaf(b), strict=True)) for b in range(tree.count)
    )
    return Packing(
        capacity,
        tuple(tuple(entries) for entries in contents),
        used,
        lower_bound(capacity, items),
    )
