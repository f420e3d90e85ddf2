"""e2e_bench.py's measurements and report: the batches (`Cell`), the table of modes, what
each adds over no admission, and the verdicts on the targets of issue 11 (against the no-op
webhook) and of issue 29 (against peers doing the same work: the Go controller-runtime
webhook, the hand-written reference policy). No apiserver needed: tests/test_e2e_bench.py
runs it on made-up cells.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

# Table order: the floors and each peer before what it is compared with.
MODES = ("none", "noop", "peer", "reference", "webhook", "shipped", "compiled")
# Targets of issue 11, on what each mode adds over "none" at p50.
SHIPPED_OVER_NOOP = 3.0
COMPILED_OVER_NOOP_C1 = 1.25
COMPILED_OVER_SHIPPED = 0.6
# Targets of issue 29, at every concurrency, pooled over rounds and in the median round:
# (mode, its peer, the most it may add as a multiple of what the peer adds at p50).
PEER_TARGETS = (("webhook", "peer", 1.0), ("shipped", "peer", 1.1), ("compiled", "reference", 1.1))
# And the apiserver's CPU per create (only above concurrency 1, where a mode runs alone).
CPU_TARGET = ("shipped", "peer", 1.1)


@dataclass
class Cell:
    """One measured batch: a mode at a concurrency in one round."""

    mode: str
    concurrency: int
    latencies: list[float] = field(default_factory=list)
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)
    mutated: int = 0
    round_index: int = 0
    # CPU seconds the apiserver process spent over the measured creates.
    apiserver_cpu: float = 0.0
    # What the apiserver allocated over them, and the garbage collections it ran (batches
    # above concurrency 1 only).
    allocated_bytes: float = float("nan")
    gc_cycles: int = 0

    @property
    def rate(self) -> float:
        return len(self.latencies) / self.seconds if self.seconds else 0.0


def percentile(values: Sequence[float], fraction: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))
    return ordered[index]


def added(cells: list[Cell], concurrency: int, fraction: float) -> dict[str, float]:
    """Latency (ms) each mode adds over "none" at percentile ``fraction``."""
    value = {}
    for mode in MODES:
        group = [
            x for c in cells if c.mode == mode and c.concurrency == concurrency for x in c.latencies
        ]
        value[mode] = percentile(group, fraction) * 1000
    return {mode: value[mode] - value["none"] for mode in MODES if mode != "none"}


def cpu_per_create(group: Sequence[Cell]) -> float:
    creates = sum(len(c.latencies) for c in group)
    return sum(c.apiserver_cpu for c in group) / creates * 1000 if creates else float("nan")


def heap_line(cells: Sequence[Cell], concurrency: int) -> str:
    """What each mode's batches at ``concurrency`` cost the apiserver's heap: KiB allocated
    per create and garbage collections per 1,000 creates (a collection's CPU is in the CPU
    column of the batch it fell in)."""
    parts = []
    for mode in MODES:
        group = [
            c
            for c in cells
            if c.mode == mode and c.concurrency == concurrency and not math.isnan(c.allocated_bytes)
        ]
        creates = sum(len(c.latencies) for c in group)
        allocated = sum(c.allocated_bytes for c in group)
        if not creates:
            continue
        cycles = sum(c.gc_cycles for c in group) / creates * 1000
        parts.append(f"{mode} {allocated / creates / 1024:.0f} KiB, {cycles:.1f} GCs")
    heading = f"  c={concurrency} apiserver heap per create, GCs per 1,000 creates: "
    return heading + "; ".join(parts)


def _cpu_text(value: float) -> str:
    # At concurrency 1 the modes take turns create by create: no CPU figure per mode.
    return "(interleaved)" if math.isnan(value) else f"{value:.3f}"


def times(value: float, floor: float) -> float:
    return value / floor if floor > 0 else float("nan")


def _times_text(value: float, floor: float) -> str:
    ratio = times(value, floor)
    return "n/a" if math.isnan(ratio) else f"{ratio:.2f}x"


def round_added(cells: Sequence[Cell], concurrency: int) -> list[dict[str, float]]:
    """Per round, from that round's cells alone (back to back, so slow drift of the machine
    from round to round cancels): the p50 (ms) each mode adds over "none"."""
    rounds = []
    for index in sorted({c.round_index for c in cells if c.concurrency == concurrency}):
        p50 = {
            c.mode: percentile(c.latencies, 0.5) * 1000
            for c in cells
            if c.concurrency == concurrency and c.round_index == index
        }
        if "none" in p50:
            rounds.append({mode: p50[mode] - p50["none"] for mode in p50 if mode != "none"})
    return rounds


def round_cpu(cells: Sequence[Cell], concurrency: int) -> list[dict[str, float]]:
    """Per round, the apiserver's CPU (ms) per create of each mode's batch."""
    by_round: dict[int, dict[str, float]] = {}
    for cell in cells:
        if cell.concurrency == concurrency:
            by_round.setdefault(cell.round_index, {})[cell.mode] = cpu_per_create([cell])
    return [by_round[index] for index in sorted(by_round)]


def ratios(rounds: Sequence[dict[str, float]], mode: str, peer: str) -> list[float]:
    """``mode`` over ``peer`` in each round that has both."""
    return [times(r[mode], r[peer]) for r in rounds if mode in r and peer in r]


def round_ratios(cells: Sequence[Cell], concurrency: int) -> list[tuple[float, float]]:
    """Per round: shipped's added p50 over the no-op webhook's, and compiled's over
    shipped's."""
    return [
        (times(r["shipped"], r["noop"]), times(r["compiled"], r["shipped"]))
        for r in round_added(cells, concurrency)
        if all(mode in r for mode in ("noop", "shipped", "compiled"))
    ]


def median_known(values: Sequence[float]) -> float:
    known = [v for v in values if not math.isnan(v)]
    return statistics.median(known) if known else float("nan")


def _spread(values: Sequence[float]) -> str:
    known = [v for v in values if not math.isnan(v)]
    if not known:
        return "n/a"
    return f"{min(known):.2f}-{max(known):.2f}x (median {statistics.median(known):.2f}x)"


def report(cells: list[Cell], concurrencies: Sequence[int]) -> tuple[bool, list[str]]:
    """The table of modes, what each adds over no admission, and the verdicts on the
    targets of issues 11 and 29 (all met: True)."""
    lines = [
        f"{'conc':>4}  {'mode':<9} {'creates':>7} {'creates/s':>9} {'p50 ms':>8} "
        f"{'p99 ms':>8} {'apiserver CPU ms/create':>23} {'mutated':>7} {'errors':>6}"
    ]
    for concurrency in concurrencies:
        for mode in MODES:
            group = [c for c in cells if c.mode == mode and c.concurrency == concurrency]
            latencies = [x for c in group for x in c.latencies]
            rates = [c.rate for c in group if c.latencies]
            lines.append(
                f"{concurrency:>4}  {mode:<9} {len(latencies):>7} "
                f"{statistics.median(rates) if rates else float('nan'):>9.1f} "
                f"{percentile(latencies, 0.5) * 1000:>8.2f} "
                f"{percentile(latencies, 0.99) * 1000:>8.2f} "
                f"{_cpu_text(cpu_per_create(group)):>23} "
                f"{sum(c.mutated for c in group):>7} {sum(len(c.errors) for c in group):>6}"
            )
    lines += [heap_line(cells, c) for c in concurrencies if c > 1]
    lines += ["", "added over no admission (ms, and x what the no-op webhook adds):"]
    met = True
    for concurrency in concurrencies:
        for name, fraction in (("p50", 0.5), ("p99", 0.99)):
            extra = added(cells, concurrency, fraction)
            noop = extra["noop"]
            parts = [
                f"{mode} {extra[mode]:+.2f} ms ({_times_text(extra[mode], noop)})"
                for mode in MODES[1:]
            ]
            lines.append(f"  c={concurrency} {name}: " + ", ".join(parts))
        extra = added(cells, concurrency, 0.5)
        noop, shipped, compiled = extra["noop"], extra["shipped"], extra["compiled"]
        checks = [
            (f"shipped <= {SHIPPED_OVER_NOOP}x noop", shipped <= SHIPPED_OVER_NOOP * noop),
            (
                f"compiled <= {COMPILED_OVER_SHIPPED}x shipped",
                compiled <= COMPILED_OVER_SHIPPED * shipped,
            ),
        ]
        if concurrency == 1:
            checks.append(
                (
                    f"compiled <= {COMPILED_OVER_NOOP_C1}x noop",
                    compiled <= COMPILED_OVER_NOOP_C1 * noop,
                )
            )
        for what, ok in checks:
            lines.append(f"    target c={concurrency} p50 {what}: {'met' if ok else 'NOT met'}")
            met = met and ok
        if concurrency > 1 and (ratios := round_ratios(cells, concurrency)):
            lines.append(
                f"    round by round: shipped {_spread([r[0] for r in ratios])} noop, "
                f"compiled {_spread([r[1] for r in ratios])} shipped"
            )
        if concurrency == 1:
            # Where the compiled target sits on this machine: no policy doing this mutation
            # costs less than its constant ops.
            lines.append(
                f"    floor: the reference policy adds {times(extra['reference'], noop):.2f}x "
                f"noop (compiled target {COMPILED_OVER_NOOP_C1}x); compiled is "
                f"+{extra['compiled'] - extra['reference']:.2f} ms above it"
            )
    peers_met, peer_lines = peer_report(cells, concurrencies)
    return met and peers_met, [*lines, "", *peer_lines]


def _peer_line(
    what: str, pooled: float, by_round: Sequence[float], limit: float
) -> tuple[bool, str]:
    """One target of issue 29: met when the pooled ratio and the median round's are both
    within ``limit`` (a ratio without meaning, a peer adding nothing, is not met)."""
    median = median_known(by_round)
    ok = pooled <= limit and (not by_round or median <= limit)
    text = (
        f"  {what:<36} {_times_text(pooled, 1.0):>7} {_times_text(median, 1.0):>7}   "
        f"<= {limit}x: {'met' if ok else 'NOT met'}"
    )
    return ok, text


def peer_report(cells: list[Cell], concurrencies: Sequence[int]) -> tuple[bool, list[str]]:
    """The targets of issue 29: what gpushare adds at p50 (and the apiserver's CPU per create
    under it) as a multiple of what a peer doing the same work adds, pooled over rounds and
    in the median round."""
    lines = [
        "against peers doing the same work (issue 29; pooled, median round, target):",
    ]
    met = True
    for concurrency in concurrencies:
        pooled = added(cells, concurrency, 0.5)
        rounds = round_added(cells, concurrency)
        targets: list[tuple[str, float, list[float], float]] = [
            (
                f"c={concurrency} p50 added {mode} / {peer}",
                times(pooled[mode], pooled[peer]),
                ratios(rounds, mode, peer),
                limit,
            )
            for mode, peer, limit in PEER_TARGETS
        ]
        if concurrency > 1:
            mode, peer, limit = CPU_TARGET
            cpu = {
                m: cpu_per_create(
                    [c for c in cells if c.mode == m and c.concurrency == concurrency]
                )
                for m in (mode, peer)
            }
            targets.append(
                (
                    f"c={concurrency} apiserver CPU {mode} / {peer}",
                    times(cpu[mode], cpu[peer]),
                    ratios(round_cpu(cells, concurrency), mode, peer),
                    limit,
                )
            )
        for what, ratio, by_round, limit in targets:
            ok, text = _peer_line(what, ratio, by_round, limit)
            lines.append(text)
            met = met and ok
    return met, lines
