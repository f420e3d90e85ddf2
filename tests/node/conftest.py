"""Fixtures for the node-side tests: a stand-in MPS control program with its own pipe and log
directories, and cleanup of any daemon a test left running."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from node_fakes import FakeMps, kill_quietly, write_fake_control


@pytest.fixture
def fake_mps(tmp_path: Path) -> Iterator[FakeMps]:
    """The stand-in control program; any daemon it started is killed afterwards."""
    fake = FakeMps(
        binary=write_fake_control(tmp_path), pipe=tmp_path / "pipe", log=tmp_path / "log"
    )
    fake.pipe.mkdir()
    try:
        yield fake
    finally:
        control = fake.control()
        kill_quietly(control.daemon_pid())
