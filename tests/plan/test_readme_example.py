"""The README's worked example is what the command prints today: its table, re-run from the
command line the README shows (the pictures to a scratch directory: their bytes depend on
the matplotlib and FreeType versions, their content is checked in test_pictures)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from webhook.cli import main

REPO = Path(__file__).resolve().parents[2]


def test_readme_plan_example_is_current(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    readme = (REPO / "docs/planning.md").read_text()
    block = re.search(r"```\n\$ (gpushare plan .*?)\n(.*?)\n```", readme, re.DOTALL)
    assert block, "the README's gpushare plan example"
    command_lines, printed = [], []
    for line in block.group(0).splitlines()[1:-1]:
        if command_lines and not command_lines[-1].endswith("\\"):
            printed.append(line)
        else:
            command_lines.append(line.removeprefix("$ "))
    argv = shlex.split(" ".join(line.rstrip("\\") for line in command_lines))[1:]
    assert argv[argv.index("--out") + 1] == "docs/images"
    argv[argv.index("--out") + 1] = str(tmp_path)
    monkeypatch.chdir(REPO)
    assert main(argv) == 0
    table = capsys.readouterr().out.split("\n\n")[0]
    assert table.splitlines() == printed
    for name in ("plan-chart.png", "plan-packing.png"):  # the README shows these
        assert (tmp_path / name).stat().st_size > 0
        assert (REPO / "docs/images" / name).is_file()
