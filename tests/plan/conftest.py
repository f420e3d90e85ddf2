"""Policies and mixes the plan tests share."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# 3 x 0.5, 10 x 0.25, 7 x 0.1, 2 x two whole GPUs, and one 0.7 nothing serves.
MIX_CSV = """name,fraction,memory,count
train,0.5,,3
infer,0.25,,10
tiny,0.1,,7
big,2,,2
odd,0.7,,1
"""


@pytest.fixture
def policy_dir(tmp_path: Path) -> Path:
    """The bundled default (time-slicing) and the mps and mps-daemon examples."""
    directory = tmp_path / "policies"
    directory.mkdir()
    shutil.copy(REPO / "policies/default.yaml", directory / "default.yaml")
    for example in ("mps.yaml", "mps-daemon.yaml"):
        shutil.copy(REPO / "policies/examples" / example, directory / example)
    return directory


@pytest.fixture
def mix_csv(tmp_path: Path) -> Path:
    path = tmp_path / "mix.csv"
    path.write_text(MIX_CSV)
    return path
