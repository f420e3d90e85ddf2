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
from collections import deque
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


def _size_order(capacity: Vector, size: Vector) -> tuple[float, Vector]:
    """Largest share of a bin first, then the larger amounts."""
    largest_share = max(
        (amount / room for amount, room in zip(size, capacity, strict=True) if room),
        default=0.0,
    )
    return (-largest_share, tuple(-amount for amount in size))


def ffd_order(capacity: Vector, items: Sequence[Item]) -> list[Item]:
    """The items in the order FFD takes them; equal sizes sorted by label."""
    keys: dict[Vector, tuple[float, Vector]] = {}
    for item in items:
        if item.size not in keys:
            keys[item.size] = _size_order(capacity, item.size)
    return sorted(items, key=lambda item: (keys[item.size], item.label))


class _FreeTree:
    """Per-dimension largest free amount over each subtree of bins; grows by doubling.

    Free amounts only shrink once a bin is open, so an update stops climbing where a
    parent's maximum does not change.
    """

    def __init__(self, capacity: Vector) -> None:
        self.capacity = capacity
        self.zero = tuple(0 for _ in capacity)
        self.size = 1
        self.count = 0  # bins opened
        self.free: list[Vector] = [self.zero, self.zero]

    def _grow(self, needed: int) -> None:
        old_size, old = self.size, self.free
        while self.size < needed:
            self.size *= 2
        self.free = [self.zero] * (2 * self.size)
        self.free[self.size : self.size + old_size] = old[old_size : 2 * old_size]
        for node in range(self.size - 1, 0, -1):
            self.free[node] = self._max(node)

    def _max(self, node: int) -> Vector:
        left, right = self.free[2 * node], self.free[2 * node + 1]
        if len(left) == 1:
            return left if left[0] >= right[0] else right
        return tuple(map(max, left, right))

    def open_bins(self, free: Vector, count: int) -> int:
        """Open ``count`` bins with ``free`` left in each; the first one's number."""
        first = self.count
        if first + count > self.size:
            self._grow(first + count)
        self.count += count
        for leaf in range(first, first + count):
            self.set(leaf, free)
        return first

    def set(self, leaf: int, free: Vector) -> None:
        node = self.size + leaf
        self.free[node] = free
        node //= 2
        while node:
            updated = self._max(node)
            if updated == self.free[node]:
                return
            self.free[node] = updated
            node //= 2

    def leaf(self, leaf: int) -> Vector:
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
    (callers refuse those before packing, with the reason).

    Items of one size are packed as one run: FFD takes them one after the other (they sort
    next to each other, by label), each to the first bin where it fits, which is what
    placing the whole run bin by bin does; the labels are then dealt out in that order.
    """
    for item in items:
        if any(a > c for a, c in zip(item.size, capacity, strict=True)):
            raise ValueError(f"{item.label}: {item.size} does not fit a bin of {capacity}")
    ordered = ffd_order(capacity, items)
    runs: dict[Vector, deque[Item]] = {}
    for item in ordered:
        runs.setdefault(item.size, deque()).append(item)
    tree = _FreeTree(capacity)
    contents: list[list[tuple[str, int]]] = []
    for size, run in runs.items():
        for target, taken in _place_run(tree, size, sum(item.count for item in run)):
            while target >= len(contents):
                contents.append([])
            _deal(contents[target], run, taken)
    used = tuple(
        tuple(c - f for c, f in zip(capacity, tree.leaf(b), strict=True)) for b in range(tree.count)
    )
    return Packing(
        capacity,
        tuple(tuple(entries) for entries in contents),
        used,
        lower_bound(capacity, items),
    )


def _place_run(tree: _FreeTree, size: Vector, count: int) -> list[tuple[int, int]]:
    """Place ``count`` items of ``size``: (bin, how many) in order. Once no open bin has
    room, the rest fill new bins, as many to a bin as fit, opened together."""
    placed = []
    while count > 0:
        target = tree.first_fit(size)
        if target is None:
            per_bin = min(
                (c // a for c, a in zip(tree.capacity, size, strict=True) if a), default=count
            )
            full, rest = divmod(count, per_bin)
            if full:
                left = tuple(c - a * per_bin for c, a in zip(tree.capacity, size, strict=True))
                first = tree.open_bins(left, full)
                placed += [(first + n, per_bin) for n in range(full)]
            if rest:
                left = tuple(c - a * rest for c, a in zip(tree.capacity, size, strict=True))
                placed.append((tree.open_bins(left, 1), rest))
            return placed
        free = tree.leaf(target)
        fits = min((f // a for f, a in zip(free, size, strict=True) if a > 0), default=count)
        taken = min(count, fits)
        tree.set(target, tuple(f - a * taken for f, a in zip(free, size, strict=True)))
        placed.append((target, taken))
        count -= taken
    return placed


def _deal(entries: list[tuple[str, int]], run: deque[Item], taken: int) -> None:
    """Move ``taken`` items from the front of ``run`` (in order) into one bin's entries."""
    while taken > 0:
        item = run[0]
        moved = min(taken, item.count)
        entries.append((item.label, moved))
        taken -= moved
        if moved == item.count:
            run.popleft()
        else:
            run[0] = Item(item.label, item.size, item.count - moved)
