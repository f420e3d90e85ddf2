"""The Helm CLI for the chart tests, built (or found in its cache) by tools/helm/build.sh.

Like the harness binary (binary.py): Helm is built from its Go module (helm.sh/helm/v3, pinned
in harness/tools/helm/go.mod, a module of its own so harness/go.mod never sees Helm's
dependencies) into a content-addressed cache outside the repository. `GPUSHARE_HELM` names a
prebuilt binary instead (scripts/test exports the one it built).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

from harness.binary import run_build_script

HELM_BUILD_SCRIPT = Path(__file__).resolve().parent / "tools/helm/build.sh"
CHART = Path(__file__).resolve().parents[1] / "deploy/helm/gpushare"
# A cold build compiles Helm and much of client-go: minutes on a busy two-core machine.
BUILD_TIMEOUT_S = float(os.environ.get("GPUSHARE_HELM_BUILD_TIMEOUT", "1800"))
RUN_TIMEOUT_S = 120


class HelmBuildError(RuntimeError):
    """build.sh failed, timed out or printed no executable; the message carries its output."""


def helm_binary(timeout: float = BUILD_TIMEOUT_S) -> Path:
    """$GPUSHARE_HELM, else the path tools/helm/build.sh prints (building on a cache miss)."""
    given = os.environ.get("GPUSHARE_HELM")
    if given:
        if not os.access(given, os.X_OK):
            raise HelmBuildError(f"GPUSHARE_HELM={given} is not an executable file")
        return Path(given)
    return run_build_script(HELM_BUILD_SCRIPT, "tools/helm/build.sh", HelmBuildError, timeout)


def run_helm(
    binary: Path, *args: str, home: Path, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    """`helm ARGS` with its config, cache and data kept under `home` (never the user's)."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_DATA_HOME": str(home / "data"),
    }
    return subprocess.run(
        [str(binary), *args],
        input=input,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        env=env,
        check=False,
    )


def template_args(
    release: str = "gpushare",
    namespace: str = "gpushare-system",
    values: Sequence[Path] = (),
    sets: Sequence[str] = (),
) -> list[str]:
    """`helm template` arguments for the repository's chart."""
    args = ["template", release, str(CHART), "--namespace", namespace]
    for path in values:
        args += ["--values", str(path)]
    for item in sets:
        args += ["--set", item]
    return args
