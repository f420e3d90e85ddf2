"""How ``gpushare plan``'s cost grows with the mix: 1,000, 10,000 and 100,000 pods.

    .venv/bin/python bench/plan_bench.py                 # about a minute on 2 cores
    .venv/bin/python bench/plan_bench.py --sizes 1000 10000 --rounds 5

Two mixes at each size, planned under the bundled default policy and the mps and
mps-daemon examples (four schemes: as configured and each policy):

- **rows**: one CSV row per pod (count 1), fractions drawn from eight sizes, in three
  namespaces: what a cluster's pod list looks like. Equal pods are decided once per scheme,
  so the core runs a handful of times and the cost is reading, grouping and packing.
- **distinct**: every pod asks a different gpu-memory (MiB), so the core decides every
  pod under every scheme: the worst case for the decision step.

Times are the process's CPU seconds (``time.process_time``), steadier than wall time on a
shared machine; the command is single-threaded, so on an idle machine they are its wall
time. For each it prints the median over rounds of the time to decide (the core, per scheme)
and to pack and total (first-fit decreasing per pool), seconds and microseconds per pod, and
the growth ratio from one size to the next (10x the pods: a ratio near 10 is linear).
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from webhook.core import PolicySet, load_policies
from webhook.plan.csv_input import parse_table
from webhook.plan.outcome import outcome
from webhook.plan.schemes import fates, schemes
from webhook.plan.workload import Workload

REPO = Path(__file__).resolve().parents[1]
FRACTIONS = ["0.5", "0.25", "0.2", "0.125", "0.1", "0.3", "1", "2"]
NAMESPACES = ["default", "ml-research", "inference"]


def rows_mix(pods: int, seed: int = 1) -> list[Workload]:
    chooser = random.Random(seed)
    lines = ["name,fraction,count,namespace"]
    lines += [
        f"pod-{n},{chooser.choice(FRACTIONS)},1,{chooser.choice(NAMESPACES)}" for n in range(pods)
    ]
    return parse_table("\n".join(lines) + "\n", "bench.csv")


def distinct_mix(pods: int) -> list[Workload]:
    lines = ["name,memory,count,namespace"]
    # 1000 MiB and n KiB: a different ask (and request text) for every pod.
    lines += [f"pod-{n},{1_024_000 + n}Ki,1,ml-research" for n in range(pods)]
    return parse_table("\n".join(lines) + "\n", "bench.csv")


def policies() -> PolicySet:
    with tempfile.TemporaryDirectory(prefix="plan-bench-") as scratch:
        directory = Path(scratch)
        shutil.copy(REPO / "policies/default.yaml", directory / "default.yaml")
        for example in ("mps.yaml", "mps-daemon.yaml"):
            shutil.copy(REPO / "policies/examples" / example, directory / example)
        return load_policies(directory)


def one_round(workloads: list[Workload], policy_set: PolicySet) -> tuple[float, float]:
    """Seconds to decide and to pack, every scheme. A fresh policy set each round, so the
    core's memos start empty, as in one run of the command."""
    decide = pack = 0.0
    for scheme in schemes(policy_set):
        started = time.process_time()
        decided = fates(scheme, workloads, 8)
        middle = time.process_time()
        outcome(scheme, decided)
        pack += time.process_time() - middle
        decide += middle - started
    return decide, pack


def measure(make: Callable[[int], list[Workload]], size: int, rounds: int) -> tuple[float, float]:
    decides, packs = [], []
    for _ in range(rounds):
        workloads = make(size)
        decide, pack = one_round(workloads, policies())
        decides.append(decide)
        packs.append(pack)
    return statistics.median(decides), statistics.median(packs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(
        f"{'mix':9} {'pods':>8} {'decide s':>9} {'pack s':>8} {'total s':>8} "
        f"{'us/pod':>7} {'growth':>7}"
    )
    for name, make in (("rows", rows_mix), ("distinct", distinct_mix)):
        previous: float | None = None
        for size in args.sizes:
            decide, pack = measure(make, size, args.rounds)
            total = decide + pack
            growth = f"{total / previous:7.1f}" if previous else "      -"
            print(
                f"{name:9} {size:8,d} {decide:9.3f} {pack:8.3f} {total:8.3f} "
                f"{total / size * 1e6:7.1f} {growth}"
            )
            previous = total


if __name__ == "__main__":
    main()
