"""The coverage-guided run: ``atheris_decoder.py`` as a subprocess, bounded by time.

20 seconds in CI, 30 minutes with ``GPUSHARE_LONG_TESTS=1``. It must exit 0, leave no
crash, timeout or out-of-memory artifact, execute a fair number of inputs, and reach
the coverage the seeds alone reach and more (an uninstrumented or broken harness reports
a handful of edges).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.long_runs import scaled

from .support import PATHS, seed_reviews, wrong_shapes

pytest.importorskip("atheris", reason="atheris is in the dev extra (Linux wheels only)")

HARNESS = Path(__file__).with_name("atheris_decoder.py")
SECONDS = scaled(20, 1800)
# Seeds alone reach about 580 edges of the instrumented webhook package (measured).
MIN_COVERAGE = 500
MIN_EXECUTIONS = 2_000

pytestmark = pytest.mark.timeout(SECONDS + 300)


def test_coverage_guided_fuzzing_of_the_admission_path(tmp_path: Path) -> None:
    corpus, artifacts = tmp_path / "corpus", tmp_path / "artifacts"
    corpus.mkdir()
    artifacts.mkdir()
    run = subprocess.run(
        [
            sys.executable,
            str(HARNESS),
            f"-max_total_time={SECONDS}",
            f"-artifact_prefix={artifacts}/",
            "-print_final_stats=1",
            str(corpus),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=SECONDS + 240,
        check=False,
    )
    output = run.stdout + run.stderr
    tail = "\n".join(line for line in output.splitlines() if "Instrumenting" not in line)[-4000:]
    assert run.returncode == 0, tail
    assert not list(artifacts.iterdir()), f"{sorted(p.name for p in artifacts.iterdir())}\n{tail}"
    done = re.findall(r"#(\d+)\s+DONE\s+cov: (\d+) ft: (\d+) corp: (\d+)", output)
    assert done, tail
    executions, coverage, features, corpus_size = map(int, done[-1])
    print(
        f"atheris: {executions} executions in {SECONDS} s, cov {coverage} edges, "
        f"ft {features}, corpus {corpus_size}"
    )
    assert executions >= MIN_EXECUTIONS, tail
    assert coverage >= MIN_COVERAGE, tail
    seeds = len(PATHS) * (len(list(seed_reviews())) + len(list(wrong_shapes())))
    assert len(list(corpus.iterdir())) > seeds, "libFuzzer kept no input beyond the seeds"
