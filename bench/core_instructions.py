"""Instructions per ``mutate`` call on the benchmark's pods, counted by valgrind (callgrind).

    .venv/bin/python bench/core_instructions.py          # ~40 s; needs valgrind (Debian)

Runs this file under callgrind twice, with 0 and with N rounds of the three bodies of
``admission_bench``, and prints (Ir(N) - Ir(0)) / (3 N): start-up cancels out, and an
instruction count does not move with the load of a shared machine the way time does.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

ROUNDS = 300


def run_calls(rounds: int) -> None:
    import orjson

    from bench.admission_bench import bodies
    from webhook.core.policy.loader import default_policies_path, load_policies
    from webhook.core.verdict import mutate

    policies = load_policies(default_policies_path())
    pods = [orjson.loads(body)["request"]["object"] for body in bodies()]
    for pod in pods:  # fill the memo caches, as a running server has
        mutate(pod, "ml-team", policies)
    for _ in range(rounds):
        for pod in pods:
            mutate(pod, "ml-team", policies)


def instructions(rounds: int, work: Path) -> int:
    result = subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={work / f'callgrind.{rounds}'}",
            sys.executable,
            __file__,
            "--calls",
            str(rounds),
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    match = re.search(r"refs:\s+([\d,]+)", result.stderr)
    if not match:
        raise SystemExit(f"no instruction count in valgrind's output:\n{result.stderr[-2000:]}")
    return int(match.group(1).replace(",", ""))


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--calls":
        run_calls(int(sys.argv[2]))
        return 0
    if shutil.which("valgrind") is None:
        print("valgrind is not installed: apt-get install valgrind", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="gpushare-callgrind-") as work:
        baseline = instructions(0, Path(work))
        loaded = instructions(ROUNDS, Path(work))
    print(f"instructions per mutate: {(loaded - baseline) // (3 * ROUNDS)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
