"""The harness binary, built (or found in its cache) by build.sh beside this file.

build.sh keys its cache on the content of go.mod, go.sum, the Go sources and itself, so an
unchanged harness costs nothing; a cold build takes minutes, hence the caller's timeout.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

HARNESS_DIR = Path(__file__).resolve().parent
BUILD_SCRIPT = HARNESS_DIR / "build.sh"


class HarnessBuildError(RuntimeError):
    """build.sh failed, timed out or printed no executable; the message carries its output."""


def build_binary(timeout: float | None = None) -> Path:
    """Run build.sh and return the binary path it prints on its last line of stdout."""
    return run_build_script(BUILD_SCRIPT, "harness/build.sh", HarnessBuildError, timeout)


def run_build_script(
    script: Path, name: str, error: type[RuntimeError], timeout: float | None
) -> Path:
    """Run a caching Go build script (this harness's, or a tool's under tools/) and return
    the executable it prints on its last line of stdout; ``error`` carries its output."""
    # Own process group, so a timeout stops the go toolchain too, not only the script.
    with subprocess.Popen(
        [str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as build:
        try:
            stdout, stderr = build.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(build.pid, signal.SIGKILL)
            stdout, stderr = build.communicate()
            raise error(f"{name} took over {timeout:.0f}s\n{stderr}") from None
    lines = stdout.strip().splitlines()
    if build.returncode != 0 or not lines:
        raise error(
            f"{name} failed (exit {build.returncode})\n"
            f"--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}"
        )
    binary = Path(lines[-1])
    if not os.access(binary, os.X_OK):
        raise error(f"{name} printed {binary}, which is not an executable file")
    return binary
