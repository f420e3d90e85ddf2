"""The real-GPU checks (tests/gpu/*.sh) as tests: run only where GPUSHARE_GPU_CHECKS=1 and
nvidia-smi is on the PATH, skipped everywhere else (the suite passes on machines without a
GPU; CI has none). Each script prints its own summary and exits 0 when every check passed or
was skipped with its reason.

- real_mps_check.sh: `gpushare mps-daemon` for real, its clients' memory and SM limits;
- enforcement_check.sh: an allocation above the cap fails under the MPS pinned limit and the
  driver memory limit (skipped without R615 and cgroup v2), and the node agent's NVML reads.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ENABLED = os.environ.get("GPUSHARE_GPU_CHECKS") == "1"

pytestmark = [
    pytest.mark.skipif(not ENABLED, reason="GPU checks run only with GPUSHARE_GPU_CHECKS=1"),
    pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="no nvidia-smi: no GPU here"),
    pytest.mark.timeout(600),
]


@pytest.mark.parametrize("script", ["enforcement_check.sh", "real_mps_check.sh"])
def test_the_check_passes_on_this_gpu(script: str) -> None:
    result = subprocess.run(
        ["bash", str(HERE / script)], capture_output=True, text=True, timeout=540, check=False
    )
    print(result.stdout)
    assert result.returncode == 0, (
        f"{script} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
    )
