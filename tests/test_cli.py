"""The ``gpushare`` command line itself: version, help everywhere, one meaning per flag,
commands without a subcommand, and exit 2 for invalid policies in every command."""

from __future__ import annotations

import argparse
import copy
import importlib.metadata
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from webhook import cli
from webhook.server.settings import ENV_PREFIX, ServeSettings

REPO = Path(__file__).resolve().parents[1]


def commands() -> Iterator[tuple[str, cli.Command]]:
    """Every command of the tree, by its parser's prog, the root first."""
    for command in cli.build_command_tree().walk():
        yield command.parser.prog, command


def options() -> Iterator[tuple[str, str, argparse.Action]]:
    """(prog, option string, action) for every flag of every command (argparse's own -h
    aside: the tree keeps what the commands add)."""
    for prog, command in commands():
        for action in command.arguments:
            for option in action.option_strings:
                yield prog, option, action


def test_the_tree_holds_every_command() -> None:
    progs = {prog for prog, _ in commands()}
    assert progs == {
        "gpushare",
        *(
            f"gpushare {name}"
            for name in (
                "mutate", "explain", "policy", "policy check", "policy schema", "serve",
                "certs", "webhook-config", "mps-daemon", "node-agent", "device-plugin-config",
                "dra-templates", "share-capacity", "plan", "compile", "check-admission",
            )
        ),
    }  # fmt: skip


@pytest.mark.parametrize("prog", [prog for prog, _ in commands()])
def test_every_command_has_a_description_and_every_flag_a_help(prog: str) -> None:
    command = dict(commands())[prog]
    description = command.parser.description
    assert description and len(description) > 20, prog
    for name, subcommand in command.subcommands.items():
        assert subcommand.help, f"{prog} {name}: no help in the command list"
    for action in command.arguments:
        name = "/".join(action.option_strings) or action.dest
        assert action.help and action.help != argparse.SUPPRESS, f"{prog} {name}: no help"


@pytest.mark.parametrize("prog", [prog for prog, _ in commands()])
def test_the_tree_keeps_every_flag_the_usage_shows(prog: str) -> None:
    """A flag added to the parser around the tree would escape the checks above."""
    command = dict(commands())[prog]
    shown = set(re.findall(r"(?<![\w-])--?[A-Za-z][\w-]*", command.parser.format_usage()))
    kept = {option for action in command.arguments for option in action.option_strings}
    assert "-h" in shown, prog
    assert shown - {"-h"} <= kept, prog


def test_one_meaning_per_flag() -> None:
    """``-o`` is an output format wherever it exists; a file or folder written is ``--out``;
    every other flag takes the same kind of value in every command that has it."""
    kinds: dict[str, set[tuple[object, ...]]] = {}
    for prog, option, action in options():
        if option in ("-o", "--output"):
            assert action.choices, f"{prog} {option} is not an output format"
            assert action.option_strings == ["-o", "--output"], prog
            continue
        if option == "--out":
            assert action.type is Path and not action.choices, prog
        kind = (type(action).__name__, action.type, action.nargs, bool(action.choices))
        kinds.setdefault(option, set()).add(kind)
    mixed = {option: kind for option, kind in kinds.items() if len(kind) > 1}
    assert not mixed


def test_policies_flag_reads_the_same_default_everywhere_but_the_node_daemon() -> None:
    helps = {prog: action.help for prog, option, action in options() if option == "--policies"}
    assert set(helps) == {
        "gpushare mutate", "gpushare explain", "gpushare serve", "gpushare webhook-config",
        "gpushare mps-daemon", "gpushare device-plugin-config", "gpushare dra-templates",
        "gpushare plan", "gpushare compile",
    }  # fmt: skip
    for prog, text in helps.items():
        if prog != "gpushare mps-daemon":  # a DaemonSet passes it (env GPUSHARE_POLICIES)
            assert text is not None
            assert "$GPUSHARE_POLICIES, ./policies" in text, prog


def test_version_is_the_installed_distribution(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--version"])
    assert exit_info.value.code == 0
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert capsys.readouterr().out == f"gpushare {declared}\n"
    assert importlib.metadata.version("gpushare") == declared


@pytest.mark.parametrize(
    ("argv", "usage", "listed"),
    [
        ([], "usage: gpushare [-h]", "policy              check policies as a set"),
        (["policy"], "usage: gpushare policy", "check     check policy files or directories"),
    ],
)
def test_a_command_without_its_subcommand_prints_its_help_and_exits_2(
    argv: list[str], usage: str, listed: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(argv) == 2  # argparse's code for a usage error
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(usage)
    assert listed in err  # the whole help: each command with its help line


def test_serve_help_lists_every_gpushare_variable() -> None:
    text = dict(commands())["gpushare serve"].parser.format_help()
    for name in ServeSettings.__dataclass_fields__:
        assert f"{ENV_PREFIX}{name.upper()} " in text, name
    assert "GPUSHARE_STATE_DIR" in text
    assert "GPUSHARE_PORT                              --port (default 8443)" in text
    assert "GPUSHARE_REQUEST_READ_TIMEOUT_SECONDS      --request-read-timeout" in text


# -- exit 2 for invalid policies, in every command that loads them --------------------------


@pytest.fixture
def invalid_policies(tmp_path: Path) -> Path:
    path = tmp_path / "bad.yaml"
    path.write_text(
        "apiVersion: gpushare.io/v1alpha1\nkind: GpuSharingPolicy\nmetadata: {name: bad}\n"
        "spec: {default: true, mode: time-slicing, pools: [{name: p, replica: 2}]}\n"
    )
    return path


@pytest.fixture
def pod(tmp_path: Path) -> Path:
    path = tmp_path / "pod.yaml"
    path.write_text(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p, annotations: {gpu-fraction: '0.5'}}\n"
        "spec: {containers: [{name: c, image: python:3.11}]}\n"
    )
    return path


def command_lines(policies: Path, pod: Path, tmp_path: Path) -> dict[str, list[str]]:
    ca = tmp_path / "ca.crt"
    p = str(policies)
    return {
        "policy check": ["policy", "check", p],
        "mutate": ["mutate", "-f", str(pod), "--policies", p],
        "explain": ["explain", "-f", str(pod), "--policies", p],
        "serve": ["serve", "--policies", p, "--state-dir", str(tmp_path / "state")],
        "webhook-config": [
            "webhook-config",
            "--ca",
            str(ca),
            "--url",
            "https://x",
            "--policies",
            p,
        ],
        "device-plugin-config": ["device-plugin-config", "--policies", p],
        "mps-daemon": ["mps-daemon", "--policies", p, "--node-name", "n"],
        "dra-templates": ["dra-templates", "--policies", p, "-n", "team-a"],
        "plan": ["plan", "-f", str(pod), "--policies", p],
        "compile": ["compile", "--policies", p],
    }


@pytest.mark.parametrize(
    "command",
    [
        "policy check", "mutate", "explain", "serve", "webhook-config", "device-plugin-config",
        "mps-daemon", "dra-templates", "plan", "compile",
    ],
)  # fmt: skip
def test_invalid_policies_exit_2_in_every_command(
    command: str, invalid_policies: Path, pod: Path, tmp_path: Path
) -> None:
    (tmp_path / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    argv = command_lines(invalid_policies, pod, tmp_path)[command]
    environment = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    run = subprocess.run(
        [sys.executable, "-m", "webhook.cli", *argv],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=False, env=environment,
    )  # fmt: skip
    assert run.returncode == 2, run.stderr
    assert "did you mean 'replicas'?" in run.stderr, run.stderr
    assert run.stdout == ""


def test_every_policy_loading_command_is_covered() -> None:
    """A new command with --policies must join the commands above."""
    with_policies = {
        prog.removeprefix("gpushare ") for prog, option, _ in options() if option == "--policies"
    }
    assert with_policies | {"policy check"} == set(command_lines(Path(), Path(), Path("/tmp")))


def test_a_reader_that_stops_reading_ends_the_command_quietly(tmp_path: Path) -> None:
    """`gpushare compile ... | head`: exit 141 (SIGPIPE's), no traceback on stderr."""
    documents = list(yaml.safe_load_all((REPO / "policies/default.yaml").read_text()))
    (default,) = [d for d in documents if d["kind"] == "GpuSharingPolicy"]
    for index in range(4):  # about 40 KB of CEL each: more than a pipe's 64 KiB buffer
        policy = copy.deepcopy(default)
        policy["metadata"]["name"] = f"team-{index}"
        policy["spec"]["default"] = False
        policy["spec"]["match"] = {"namespaces": [f"team-{index}"]}
        (tmp_path / f"team-{index}.yaml").write_text(yaml.safe_dump(policy))
    process = subprocess.Popen(
        [sys.executable, "-m", "webhook.cli", "compile", "--policies", str(tmp_path)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # the reader goes away before the output comes
    stderr = process.stderr.read().decode()
    process.stderr.close()
    assert process.wait(timeout=120) == cli.EXIT_BROKEN_PIPE, stderr
    assert "Traceback" not in stderr
