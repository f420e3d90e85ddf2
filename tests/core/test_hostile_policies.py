"""Policy files a careless or hostile author could write: refused fast, briefly and clearly.

Each case once cost the service dearly: a 532-byte alias bomb printed 80 MB and OOM-killed
workers, 500 levels of nesting or a 4,300-digit priority raised a traceback instead of a
problem line, and a duplicate key silently kept the last value.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from webhook.core.policy.loader import load_policies, load_policy_text
from webhook.errors import PolicyError

from .support import run_cli

VALID = """\
apiVersion: gpushare.io/v1alpha1
kind: GpuSharingPolicy
metadata:
  name: team
spec:
  default: true
  mode: time-slicing
  pools:
    - name: half
      replicas: 2
"""


def alias_bomb(levels: int = 9) -> str:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for level in range(1, levels):
        refs = ", ".join(f"*a{level - 1}" for _ in range(9))
        lines.append(f"a{level}: &a{level} [{refs}]")
    return VALID + "\n".join(f"  {line}" for line in lines) + "\n"


def deeply_nested(depth: int = 500) -> str:
    return VALID + "  extra: " + "[" * depth + "]" * depth + "\n"


HOSTILE = {
    "alias bomb": (alias_bomb(), "YAML alias"),
    "deep nesting": (deeply_nested(), "nests deeper than 32 levels"),
    "huge priority": (VALID + "  priority: " + "9" * 5000 + "\n", "number of 5000 digits"),
    "duplicate key": (VALID + "  mode: mps\n", "has the key 'mode' twice"),
}


@pytest.mark.parametrize("case", HOSTILE, ids=list(HOSTILE))
def test_hostile_policy_is_refused_quickly_with_a_short_clear_problem(case: str) -> None:
    text, expected = HOSTILE[case]
    started = time.monotonic()
    with pytest.raises(PolicyError) as error:
        load_policy_text(text, "team.yaml")
    assert time.monotonic() - started < 2
    (problem,) = error.value.problems
    assert problem.startswith("team.yaml: <yaml>: ") and expected in problem, problem
    assert "(line " in problem and len(problem) < 300


def test_policy_check_prints_one_short_line_for_an_alias_bomb(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(alias_bomb())
    result = run_cli("policy", "check", str(bomb))
    assert result.returncode == 2
    assert "YAML alias" in result.stderr and len(result.stderr) < 1000
    assert "Traceback" not in result.stderr


def test_the_valid_policy_behind_the_cases_loads() -> None:
    assert [policy.name for policy in load_policy_text(VALID).policies] == ["team"]


def _with_valid_policy(directory: Path) -> Path:
    directory.mkdir()
    (directory / "team.yaml").write_text(VALID)
    return directory


@pytest.mark.parametrize("kind", ["dangling link", "looping link", "fifo"])
def test_a_policy_entry_that_is_not_a_regular_file_is_refused_not_skipped(
    tmp_path: Path, kind: str
) -> None:
    directory = _with_valid_policy(tmp_path / "policies")
    odd = directory / "odd.yaml"
    if kind == "dangling link":
        odd.symlink_to(tmp_path / "missing.yaml")
    elif kind == "looping link":
        odd.symlink_to(odd)
    else:
        os.mkfifo(odd)
    started = time.monotonic()
    with pytest.raises(PolicyError) as error:
        load_policies(directory)
    assert time.monotonic() - started < 2  # a FIFO is never opened for reading
    (problem,) = error.value.problems
    assert problem.startswith(f"{odd}: <file>: is not a regular file")


def test_a_policy_file_over_a_mebibyte_is_refused(tmp_path: Path) -> None:
    directory = _with_valid_policy(tmp_path / "policies")
    (directory / "huge.yaml").write_text("# padding\n" * 120_000)
    with pytest.raises(PolicyError) as error:
        load_policies(directory)
    (problem,) = error.value.problems
    assert "huge.yaml: <file>: is larger than 1048576 bytes" in problem
