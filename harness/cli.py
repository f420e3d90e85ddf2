"""gpushare's command line exactly as a user runs it, each call its own process.

`certs` and `webhook-config` produce what the harness serves and registers, so the e2e
tests and the benchmark go through the commands a user runs, not around them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from harness.processes import LOOPBACK

REPO = Path(__file__).resolve().parents[1]
# `gpushare` is the console script for webhook.cli:main; running the module with this very
# interpreter needs no PATH and no installed script.
GPUSHARE = (sys.executable, "-m", "webhook.cli")
CLI_TIMEOUT_S = 60.0


class CliError(RuntimeError):
    """`gpushare <command>` failed; the message carries its output."""


def gpushare(
    *args: str, input: str | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run `gpushare <args>` and capture its text output."""
    result = subprocess.run(
        [*GPUSHARE, *args],
        input=input,
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        cwd=REPO,
        env=clean_environment(),
        check=False,
    )
    if check and result.returncode != 0:
        raise CliError(
            f"gpushare {' '.join(args)} exited {result.returncode}\n"
            f"--- stdout ---\n{result.stdout}\n--- stderr ---\n{result.stderr}"
        )
    return result


def clean_environment() -> dict[str, str]:
    """The caller's environment without settings that would redirect gpushare."""
    environ = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("GPUSHARE_") and key != "PROMETHEUS_MULTIPROC_DIR"
    }
    environ["PYTHONUNBUFFERED"] = "1"
    return environ


def write_certificates(directory: Path, service: str = "gpushare") -> Path:
    """`gpushare certs` for `service` in gpushare-system, valid for 127.0.0.1 too."""
    gpushare(
        "certs",
        "--service",
        service,
        "--namespace",
        "gpushare-system",
        "--ip",
        LOOPBACK,
        "--out",
        str(directory),
    )
    return directory


def webhook_configuration(ca_file: Path, url: str, *extra_args: str) -> list[dict[str, Any]]:
    """The documents `gpushare webhook-config --ca CA --url URL [extra]` prints."""
    text = gpushare("webhook-config", "--ca", str(ca_file), "--url", url, *extra_args).stdout
    return [doc for doc in yaml.safe_load_all(text) if doc]
