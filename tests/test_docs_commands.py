"""The commands README.md and docs/*.md show, run as a reader would run them.

The convention the docs keep, so that this test can find and check what they show:

- A fenced block tagged ```sh holds commands, one a line (a trailing backslash continues the
  line, a line starting with `#` is a comment). It shows no output; each command must exit 0.
- A fenced block tagged ```console (or untagged) shows a session: a line starting with `$ `
  is a command, and the lines after it, up to the next `$ ` line, are what it prints on
  stdout (for kubectl: stderr, where its warnings and errors go, then stdout). A command
  expected to fail says so in a trailing comment, `# exits N`. Untagged blocks without a
  `$ ` line are not sessions (output quoted alone, diagrams).
- A ```yaml block whose first line is a file name alone (`# my.yaml`) is a file the reader
  saves: every such file is written where the commands run, before they run.
- Shown output is compared line by line, trailing spaces dropped, with the directory the
  commands run in written as `$PWD`. A line `...` stands for any number of lines, and the
  shown output may stop where the real output has a blank line (a doc showing only the first
  paragraph, as docs/planning.md does); otherwise it must be exact.

The commands of each page run in page order in a scratch directory holding copies of the
checkout's policies/, deploy/ and docs/images/ (commands run from the checkout's root, and
some write there), with `gpushare` being this checkout's command line, as tests/test_cli.py
runs it (`python -m webhook.cli`). Run here: `gpushare` commands and the file tools of
LOCAL_TOOLS. Every other command is listed in IN_THE_HARNESS (the commands that need a
cluster, kubectl, Helm and gpushare's own, which tests/e2e/test_docs_kubectl.py runs as
written against the harness's real kube-apiserver) or, where no cluster here can run it, in
NOT_RUN with the reason; the `gpushare` commands among them are still parsed by the real
argument parser. A command the docs show that is neither run nor listed fails
this test, and so does a listed command no doc shows any more. Inline commands in prose
(`like this`) are not checked: put a command a reader should run in a block.
"""

from __future__ import annotations

import difflib
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = (REPO / "README.md", *sorted((REPO / "docs").glob("*.md")))
# What the commands may read or write, copied for each page (the checkout stays untouched).
SCRATCH_COPIES = ("policies", "deploy", "docs/images")
LOCAL_TOOLS = frozenset({"cp", "mkdir", "sed"})
TIMEOUT_S = 120

_NVIDIA_CHART = (
    "installs NVIDIA's chart from NVIDIA's Helm repository (the reader's `helm repo add`), "
    "on the internet: not available offline"
)
_BENCH = "a benchmark: minutes of CPU on loopback (docs/performance.md gives its figures)"
_MULTIARCH = (
    "builds for both architectures from a registry's multi-arch base: buildah, the registry "
    "and qemu-user-static for the other architecture"
)
_ADMISSION_CHECK = (
    "the admission check's Job needs a job controller, a kubelet and the webhook's pods "
    "running; tests/e2e/test_post_install_check.py applies deploy/admission-check and runs "
    "its Job's command with its ServiceAccount's token against the real kube-apiserver"
)
_TORCH = "installs CUDA wheels of PyTorch/JAX (about 5 GB per venv) and needs them"
NOT_RUN: dict[str, str] = {
    # README.md
    "./scripts/run": "starts the webhook and serves until stopped (tests/server run it)",
    "./scripts/test": "the whole test suite, this test included",
    "./scripts/test --fast": "the fast test suite, this test included",
    "curl --cacert .state/certs/ca.crt -H 'Content-Type: application/json' "
    'https://127.0.0.1:8443/mutate -d \'{ "apiVersion": "admission.k8s.io/v1", '
    '"kind": "AdmissionReview", "request": {"uid": "1", "operation": "CREATE", '
    '"namespace": "default", "kind": {"group": "", "version": "v1", "kind": "Pod"}, '
    '"resource": {"group": "", "version": "v1", "resource": "pods"}, "object": '
    '{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "demo", "annotations": '
    '{"gpu-fraction": "0.5"}}, "spec": {"containers": [{"name": "main", "image": '
    '"python:3.12"}]}}}}\'': "needs ./scripts/run serving: "
    "tests/server/test_serve_reachability.py runs this block against a live server",
    # docs/deploying.md
    "./scripts/run --host 0.0.0.0": "serves on every address until stopped "
    "(tests/server/test_serve_reachability.py covers --host 0.0.0.0)",
    "kubectl apply --server-side -k deploy/overlays/cert-manager": (
        "needs cert-manager's CRDs (Certificate, Issuer) and its CA injector, which are not "
        "available offline; tests/e2e/test_deploy.py renders the overlay, dry-runs all but "
        "those kinds and shows the apiserver refusing them for that reason"
    ),
    "kubectl apply --server-side -k deploy/admission-check": _ADMISSION_CHECK,
    "kubectl -n gpushare-system wait --for=condition=complete --timeout=5m "
    "job/gpushare-admission-check": _ADMISSION_CHECK,
    "kubectl -n gpushare-system logs job/gpushare-admission-check": _ADMISSION_CHECK,
    "kubectl delete -k deploy/admission-check": _ADMISSION_CHECK,
    "docker build -t gpushare:0.1.0 .": "needs docker and a registry",
    "docker build --target cluster -t gpushare-cluster:0.1.0 .": "needs docker and a registry",
    "scripts/image": "builds the image with buildah as root (tests/test_image.py does)",
    "scripts/image --cluster": "builds the cluster image with buildah as root (likewise)",
    "scripts/image --stock": "builds the image with buildah from a registry's base",
    "buildah build --platform linux/amd64,linux/arm64 --manifest gpushare:0.1.0 .": _MULTIARCH,
    "buildah build --platform linux/amd64,linux/arm64 --target cluster "
    "--manifest gpushare-cluster:0.1.0 .": _MULTIARCH,
    "buildah manifest push --all gpushare:0.1.0 docker://registry.example.com/gpushare:0.1.0": (
        "pushes to a registry"
    ),
    "buildah manifest push --all gpushare-cluster:0.1.0 "
    "docker://registry.example.com/gpushare-cluster:0.1.0": "pushes to a registry",
    # docs/frameworks.md
    "python3 -m venv /tmp/venv-torch29 && /tmp/venv-torch29/bin/pip install torch==2.9.0": _TORCH,
    "python3 -m venv /tmp/venv-torch210 && /tmp/venv-torch210/bin/pip install torch==2.10.0": (
        _TORCH
    ),
    "PYTORCH_CUDA_ALLOC_CONF=per_process_memory_fraction:0.5 /tmp/venv-torch29/bin/python -c "
    "\"import torch; torch.cuda.memory._set_allocator_settings('')\"": _TORCH,
    "python scripts/check_framework_knobs.py --torch /tmp/venv-torch29/bin/python "
    "--torch /tmp/venv-torch210/bin/python --jax /tmp/venv-jax/bin/python": _TORCH,
    "GPUSHARE_FRAMEWORK_PYTHONS=torch=/tmp/venv-torch29/bin/python,"
    "torch=/tmp/venv-torch210/bin/python,jax=/tmp/venv-jax/bin/python "
    ".venv/bin/python -m pytest tests/core/test_framework_wheels.py": _TORCH,
    # docs/node-side.md
    "helm upgrade --install gpu-operator nvidia/gpu-operator -n gpu-operator "
    "--set devicePlugin.config.name=gpushare-device-plugin-configs "
    "--set devicePlugin.config.default=default": _NVIDIA_CHART,
    "kubectl patch clusterpolicies.nvidia.com/cluster-policy --type merge -p "
    '\'{"spec": {"devicePlugin": {"config": {"name": "gpushare-device-plugin-configs", '
    '"default": "default"}}}}\'': (
        "needs the GPU Operator's ClusterPolicy CRD (clusterpolicies.nvidia.com), which only "
        "installing the operator from NVIDIA's Helm repository brings: not available offline"
    ),
    "helm upgrade --install nvdp nvdp/nvidia-device-plugin -n nvidia-device-plugin "
    "--set config.name=gpushare-device-plugin-configs --set config.default=default "
    "--set gfd.enabled=true": _NVIDIA_CHART,
    # docs/performance.md
    "git worktree add /tmp/baseline HEAD": "changes the checkout's git state",
    ".venv/bin/python bench/admission_bench.py --baseline /tmp/baseline": (
        f"{_BENCH}; needs wrk and the worktree above"
    ),
    ".venv/bin/python bench/e2e_bench.py --rounds 6": _BENCH,
    ".venv/bin/python bench/e2e_bench.py": _BENCH,
    ".venv/bin/python bench/cel_cost.py": _BENCH,
    ".venv/bin/python bench/plan_bench.py --rounds 1": _BENCH,
}
IN_THE_HARNESS: dict[str, str] = {
    # docs/annotations.md
    "kubectl apply -f typo.yaml": "a workload refused at admission",
    "kubectl apply -f notebook.yaml": "a workload admitted with warnings",
    # docs/deploying.md
    "helm install gpushare deploy/helm/gpushare -n gpushare-system --create-namespace": (
        "the chart, its certgen hook Jobs run as their pods would"
    ),
    "kubectl label namespace gpushare-system gpushare.io/webhook=exclude "
    "pod-security.kubernetes.io/enforce=restricted": "the chart's namespace labelled",
    "kubectl apply --server-side -k deploy/overlays/gpushare-certs": (
        "the overlay, after the page's certs and webhook-config, instead of the chart"
    ),
    "kubectl apply -f compiled.yaml": "the compiled policies stored",
    # docs/dra.md
    "kubectl apply -k deploy/dra-templates": "the reconciler's manifests, after deploy/base",
    "gpushare dra-templates --apply --kubeconfig ~/.kube/config": (
        "one pass: the templates of the page's dra policy applied"
    ),
    # docs/monitoring.md
    "gpushare certs --in-cluster --service gpushare --namespace gpushare-system "
    "--secret gpushare-tls --webhook-configuration gpushare --renew-before-days 30 "
    "--kubeconfig ~/.kube/config": "the certgen command by hand, on the chart's Secret",
    # docs/node-side.md
    "kubectl apply -f dp-configs.yaml": "the device plugin ConfigMap, in gpu-operator",
    "kubectl label node <node> nvidia.com/device-plugin.config=<pool config name> --overwrite": (
        "a GPU node given a pool's config (<node>, <pool config name>: a fake node, a pool)"
    ),
    "helm upgrade --install gpushare deploy/helm/gpushare -n gpushare-system "
    "-f dp-values.yaml": "the same ConfigMap from the chart",
}


@dataclass(frozen=True)
class Command:
    """One command a page shows, and what it shows it printing (None: nothing shown).

    `script` is the command as written, for the shell; `text` the same on one line, without
    its trailing comment: how NOT_RUN and IN_THE_HARNESS name it."""

    page: Path
    line: int
    script: str
    text: str
    shown: tuple[str, ...] | None
    exit_status: int

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"

    @property
    def program(self) -> str:
        words = [w for w in shlex.split(self.text) if not re.match(r"^\w+=", w)]
        return words[0] if words else ""

    @property
    def argv(self) -> list[str]:
        """The words of the command up to its first redirection, pipe or `&&`."""
        words = []
        for word in shlex.split(self.text):
            if word in ("|", "&&", ";") or re.match(r"^\d?>>?", word):
                break
            words.append(word)
        return words


@dataclass(frozen=True)
class Page:
    """The commands of one page, in order, and the files its yaml blocks save."""

    path: Path
    commands: tuple[Command, ...]
    files: dict[str, str]


_FENCE = re.compile(r"^```(\S*)\s*$")
_SAVED_FILE = re.compile(r"^# ([\w.-]+\.(?:ya?ml|json|csv))$")
_EXIT_STATUS = re.compile(r"\s#\s*exits (\d+)\s*$")
_COMMENT = re.compile(r"\s+#\s.*$")


def fenced_blocks(text: str) -> list[tuple[str, int, list[str]]]:
    """(tag, line of the first content line, lines) of every fenced block."""
    blocks: list[tuple[str, int, list[str]]] = []
    current: tuple[str, int, list[str]] | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        fence = _FENCE.match(line)
        if current is None and fence:
            current = (fence.group(1), number + 1, [])
        elif current is not None and line.rstrip() == "```":
            blocks.append(current)
            current = None
        elif current is not None:
            current[2].append(line)
    return blocks


def continues(lines: Sequence[str]) -> bool:
    """Whether a command goes on after these lines: a trailing backslash, or an open quote."""
    if lines[-1].rstrip().endswith("\\"):
        return True
    try:
        shlex.split("\n".join(lines), comments=True)
    except ValueError:  # "No closing quotation"
        return True
    return False


def logical_lines(lines: Sequence[str], first: int) -> list[tuple[int, list[str]]]:
    """The physical lines of each command, with the line number it starts on."""
    commands: list[tuple[int, list[str]]] = []
    pending: list[str] = []
    start = first
    for number, line in enumerate(lines, start=first):
        if not pending:
            start = number
        pending.append(line)
        if not continues(pending):
            commands.append((start, pending))
            pending = []
    if pending:
        commands.append((start, pending))
    return commands


def command(page: Path, line: int, raw: Sequence[str], shown: tuple[str, ...] | None) -> Command:
    """A command as written, keyed on one line without its trailing comment."""
    one_line = " ".join(r.rstrip().removesuffix("\\") for r in raw)
    status = _EXIT_STATUS.search(raw[-1])
    text = " ".join(_COMMENT.sub("", one_line).split())
    script = "\n".join(raw)
    return Command(page, line, script, text, shown, int(status.group(1)) if status else 0)


def session(page: Path, lines: Sequence[str], first: int) -> list[Command]:
    """The `$ ` commands of a console block with the lines each is shown printing."""
    commands: list[Command] = []
    index = 0
    while index < len(lines):
        if not lines[index].startswith("$ "):
            index += 1
            continue
        start = index
        raw = [lines[index][2:]]
        while continues(raw) and index + 1 < len(lines):
            index += 1
            raw.append(lines[index])
        index += 1
        printed = []
        while index < len(lines) and not lines[index].startswith("$ "):
            printed.append(lines[index].rstrip())
            index += 1
        while printed and not printed[-1]:
            printed.pop()
        commands.append(command(page, first + start, raw, tuple(printed)))
    return commands


@cache
def read_page(path: Path) -> Page:
    commands: list[Command] = []
    files: dict[str, str] = {}
    for tag, first, lines in fenced_blocks(path.read_text()):
        if tag == "sh":
            for number, raw in logical_lines(lines, first):
                if raw[0].strip() and not raw[0].lstrip().startswith("#"):
                    commands.append(command(path, number, raw, None))
        elif tag in ("console", "") and any(line.startswith("$ ") for line in lines):
            commands.extend(session(path, lines, first))
        elif tag == "yaml" and lines and (saved := _SAVED_FILE.match(lines[0])):
            files[saved.group(1)] = "\n".join(lines[1:]) + "\n"
    return Page(path, tuple(commands), files)


def all_commands() -> list[Command]:
    return [c for page in PAGES for c in read_page(page).commands]


def saved_files() -> dict[str, str]:
    """Every file the docs save, by name; one name, one content."""
    files: dict[str, str] = {}
    for page in PAGES:
        for name, content in read_page(page).files.items():
            assert files.get(name, content) == content, f"two different files named {name}"
            files[name] = content
    return files


def runs_here(item: Command) -> bool:
    listed = item.text in NOT_RUN or item.text in IN_THE_HARNESS
    return not listed and (item.program == "gpushare" or item.program in LOCAL_TOOLS)


def output_matches(shown: Sequence[str], printed: Sequence[str]) -> bool:
    """The convention above: exact lines, `...` for any lines, an early end at a blank line."""

    @cache
    def match(i: int, j: int) -> bool:
        if i == len(shown):
            return j == len(printed) or printed[j] == ""
        if shown[i] == "...":
            return any(match(i + 1, k) for k in range(j, len(printed) + 1))
        return j < len(printed) and shown[i] == printed[j] and match(i + 1, j + 1)

    return match(0, 0)


def scratch_checkout(directory: Path) -> Path:
    """A directory to run a page's commands in: copies of SCRATCH_COPIES and the saved files."""
    run = directory / "checkout"
    for relative in SCRATCH_COPIES:
        shutil.copytree(REPO / relative, run / relative, symlinks=True)
    for name, content in saved_files().items():
        (run / name).write_text(content)
    return run


def shell_environment(directory: Path, tools: dict[str, Sequence[str]]) -> dict[str, str]:
    """The environment commands run in: `tools` (name -> argv prefix) first on PATH, a HOME
    of their own, no GPUSHARE_* settings or KUBECONFIG of the caller's."""
    bin_dir = directory / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, prefix in tools.items():
        script = bin_dir / name
        script.write_text(f'#!/bin/sh\nexec {shlex.join(prefix)} "$@"\n')
        script.chmod(0o755)
    home = directory / "home"
    home.mkdir(exist_ok=True)
    environment = {
        k: v for k, v in os.environ.items() if not k.startswith("GPUSHARE_") and k != "KUBECONFIG"
    }
    python_path = [str(REPO), *filter(None, [environment.get("PYTHONPATH")])]
    environment.update(
        PATH=f"{bin_dir}{os.pathsep}{environment.get('PATH', '/usr/bin:/bin')}",
        HOME=str(home),
        PYTHONPATH=os.pathsep.join(python_path),
    )
    return environment


GPUSHARE = (sys.executable, "-m", "webhook.cli")


def run_command(
    item: Command, run: Path, environment: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", f"set -o pipefail\n{item.script}"],
        cwd=run,
        env=environment,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )


def check_result(
    item: Command, result: subprocess.CompletedProcess[str], run: Path, printed: str
) -> None:
    """Exit status as shown (0 unless `# exits N`), and output as shown, if any."""
    assert result.returncode == item.exit_status, (
        f"{item.where}: `{item.text}` exited {result.returncode}, the doc expects "
        f"{item.exit_status}\nstdout:\n{result.stdout[-3000:]}\nstderr:\n{result.stderr[-3000:]}"
    )
    if item.shown is None:
        return
    for path in {str(run.resolve()), str(run)}:
        printed = printed.replace(path, "$PWD")
    lines = [line.rstrip() for line in printed.splitlines()]
    if not output_matches(item.shown, lines):
        diff = "\n".join(difflib.unified_diff(item.shown, lines, "shown", "printed", lineterm=""))
        pytest.fail(f"{item.where}: `{item.text}` prints other than shown:\n{diff}")


def test_the_docs_show_commands_and_the_convention_finds_them() -> None:
    commands = all_commands()
    assert len(commands) > 40
    shown = [c.text for c in commands]
    for expected in ("./scripts/run", "./scripts/test", "gpushare mutate -f my.yaml"):
        assert expected in shown
    assert "my.yaml" in saved_files()


def test_every_command_is_run_or_listed_with_a_reason() -> None:
    commands = all_commands()
    unlisted = [
        f"{c.where}: {c.text}"
        for c in commands
        if not runs_here(c) and c.text not in NOT_RUN and c.text not in IN_THE_HARNESS
    ]
    assert not unlisted, (
        "commands the docs show that this test neither runs nor lists (add them to NOT_RUN "
        "or IN_THE_HARNESS with the reason, or make them runnable here):\n" + "\n".join(unlisted)
    )
    shown = {c.text for c in commands}
    stale = sorted((set(NOT_RUN) | set(IN_THE_HARNESS)) - shown)
    assert not stale, "listed commands no doc shows any more:\n" + "\n".join(stale)
    assert not set(NOT_RUN) & set(IN_THE_HARNESS)


@pytest.mark.parametrize(
    "page",
    [p for p in PAGES if any(runs_here(c) for c in read_page(p).commands)],
    ids=lambda p: str(p.relative_to(REPO)),
)
def test_the_commands_of_a_page_do_what_it_shows(page: Path, tmp_path: Path) -> None:
    run = scratch_checkout(tmp_path)
    environment = shell_environment(tmp_path, {"gpushare": GPUSHARE})
    for item in read_page(page).commands:
        if runs_here(item):
            result = run_command(item, run, environment)
            check_result(item, result, run, result.stdout)


@pytest.mark.parametrize(
    "item",
    [c for c in all_commands() if c.program == "gpushare" and not runs_here(c)],
    ids=lambda c: c.where,
)
def test_the_gpushare_commands_not_run_are_still_valid_command_lines(item: Command) -> None:
    from webhook.cli import build_parser

    try:
        build_parser().parse_args(item.argv[1:])
    except SystemExit as refused:
        pytest.fail(f"{item.where}: `{item.text}` is refused by gpushare's parser ({refused})")


def test_the_output_convention() -> None:
    printed = ["a", "b", "", "c"]
    assert output_matches(["a", "b", "", "c"], printed)
    assert output_matches(["a", "b"], printed)  # the first paragraph
    assert output_matches(["a", "..."], printed)
    assert output_matches(["...", "c"], printed)
    assert not output_matches(["a"], printed)  # stops inside a paragraph
    assert not output_matches(["a", "x"], printed)
    assert not output_matches(["a", "b", "", "c", "d"], printed)


# Links: every relative link of README.md and docs/*.md names a file that exists, and a
# `#fragment` a heading of that page (GitHub's anchors).
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(path: Path) -> set[str]:
    """GitHub's heading anchors of a page: lower case, punctuation dropped, spaces to -."""
    found: set[str] = set()
    text = path.read_text()
    for block in fenced_blocks(text):
        text = text.replace("\n".join(block[2]), "")
    for heading in re.findall(r"^#{1,6} (.+)$", text, re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        candidate, n = slug, 0
        while candidate in found:
            n += 1
            candidate = f"{slug}-{n}"
        found.add(candidate)
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_the_links_of_a_page_resolve(page: Path) -> None:
    text = page.read_text()
    for block in fenced_blocks(text):
        text = text.replace("\n".join(block[2]), "")
    broken = []
    for target in _LINK.findall(text):
        if re.match(r"^[a-z]+:", target):
            continue
        name, _, fragment = target.partition("#")
        linked = (page.parent / name).resolve() if name else page
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif fragment and linked.suffix == ".md" and fragment not in anchors(linked):
            broken.append(f"{target}: no heading with that anchor")
    assert not broken, f"{page.relative_to(REPO)}: " + "; ".join(broken)
