"""GPU operators' CustomResourceDefinitions and example manifests, for the e2e tests.

tools/operator-crds/build.sh gathers them from the projects' own Go modules (KubeRay,
Kubeflow Training Operator and Trainer, Argo Workflows, JobSet, LeaderWorkerSet, KServe;
and the Prometheus Operator's PodMonitor, ServiceMonitor and PrometheusRule, for gpushare's
own monitoring objects), pinned by version and h1: sum in tools/operator-crds/modules.txt,
into a content-addressed cache directory outside the repository (like the harness binary:
binary.py), beside minimal CRDs of ours (tools/operator-crds/minimal/) for operators whose
modules the Go module proxy does not serve. `GPUSHARE_OPERATOR_CRDS` names a directory
built beforehand instead (scripts/test exports the one it built); without it, build.sh runs
on demand.

The directory holds <project>/crds/<file>, <project>/samples/<path inside the module>,
index.tsv (one line per file: project, crd|sample, path in the directory, source) and a
copy of modules.txt. `read_pins` parses modules.txt itself, without building anything (for
test parametrization at collection time).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from harness.binary import run_build_script

TOOL_DIR = Path(__file__).resolve().parent / "tools/operator-crds"
BUILD_SCRIPT = TOOL_DIR / "build.sh"
PIN_FILE = TOOL_DIR / "modules.txt"
ENV = "GPUSHARE_OPERATOR_CRDS"
# A cold build downloads seven module zips (about 60 MB); seconds on a good link.
BUILD_TIMEOUT_S = float(os.environ.get("GPUSHARE_OPERATOR_CRDS_BUILD_TIMEOUT", "600"))

FileKind = Literal["crd", "sample"]


class OperatorCrdsError(RuntimeError):
    """build.sh failed or timed out, or a directory or pin file is not what it should be."""


@dataclass(frozen=True)
class Pin:
    """One project of modules.txt: its Go module (None for a `local` project of ours)."""

    project: str
    module: str | None
    version: str | None
    crds: tuple[str, ...]
    samples: tuple[str, ...]

    @property
    def source(self) -> str:
        """`module@version`, or where a local project's files live in the repository."""
        if self.module is None:
            return "harness/tools/operator-crds"
        return f"{self.module}@{self.version}"


@dataclass(frozen=True)
class Entry:
    """One file of the built directory (a line of its index.tsv)."""

    project: str
    kind: FileKind
    path: Path  # absolute, inside the built directory
    source: str  # module@version/path inside the module, or the repository path


def read_pins(pin_file: Path = PIN_FILE) -> list[Pin]:
    """The projects of modules.txt in file order, parsed as build.sh parses them."""
    pins: list[Pin] = []
    current: tuple[str, str | None, str | None] | None = None
    crds: list[str] = []
    samples: list[str] = []

    def close() -> None:
        if current is not None:
            pins.append(Pin(*current, crds=tuple(crds), samples=tuple(samples)))

    for number, line in enumerate(pin_file.read_text().splitlines(), start=1):
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        directive, args = words[0], words[1:]
        if directive == "module" and len(args) == 4:
            close()
            current, crds, samples = (args[0], args[1], args[2]), [], []
        elif directive == "local" and len(args) == 1:
            close()
            current, crds, samples = (args[0], None, None), [], []
        elif directive in ("crd", "sample") and len(args) == 1 and current is not None:
            (crds if directive == "crd" else samples).append(args[0])
        else:
            raise OperatorCrdsError(f"{pin_file}:{number}: cannot read {line!r}")
    close()
    return pins


def operator_crds_dir(timeout: float = BUILD_TIMEOUT_S) -> Path:
    """$GPUSHARE_OPERATOR_CRDS, else the directory build.sh prints (building on a miss)."""
    given = os.environ.get(ENV)
    if given:
        directory = Path(given)
        if not (directory / "index.tsv").is_file():
            raise OperatorCrdsError(f"{ENV}={given} is not a directory that build.sh made")
        return directory
    directory = run_build_script(
        BUILD_SCRIPT, "tools/operator-crds/build.sh", OperatorCrdsError, timeout
    )
    if not (directory / "index.tsv").is_file():
        raise OperatorCrdsError(f"tools/operator-crds/build.sh printed {directory}, no index")
    return directory


@dataclass(frozen=True)
class OperatorCrds:
    """A directory build.sh made: its files by project (`load` reads one)."""

    root: Path
    entries: tuple[Entry, ...]

    @property
    def projects(self) -> list[str]:
        """Project names in modules.txt order."""
        return list(dict.fromkeys(entry.project for entry in self.entries))

    def crd_files(self, project: str) -> list[Path]:
        """The project's CRD files, in modules.txt order (KeyError for an unknown project)."""
        return [e.path for e in self._of(project) if e.kind == "crd"]

    def crds_by_project(self) -> dict[str, list[Path]]:
        """Every project's CRD files."""
        return {project: self.crd_files(project) for project in self.projects}

    def samples(self, project: str) -> list[Path]:
        """The project's sample manifests (empty for a project of ours)."""
        return [e.path for e in self._of(project) if e.kind == "sample"]

    def sample(self, project: str, name: str) -> Path:
        """The sample named by its path inside the module (as in modules.txt), or by its
        file name where that is unique within the project."""
        samples = self.samples(project)
        # build.sh copies a sample to <project>/samples/<its path inside the module>.
        prefix = self.root / project / "samples"
        if prefix / name in samples:
            return prefix / name
        by_file_name = [path for path in samples if path.name == name]
        if len(by_file_name) == 1:
            return by_file_name[0]
        known = ", ".join(str(path.relative_to(prefix)) for path in samples) or "none"
        raise KeyError(f"{project} has no sample {name!r} (samples: {known})")

    def source(self, path: Path) -> str:
        """Where a file of the directory came from: module@version/path, or ours."""
        for entry in self.entries:
            if entry.path == path:
                return entry.source
        raise KeyError(path)

    def _of(self, project: str) -> list[Entry]:
        entries = [e for e in self.entries if e.project == project]
        if not entries:
            raise KeyError(f"no project {project!r} (projects: {', '.join(self.projects)})")
        return entries


def load(root: Path | None = None, timeout: float = BUILD_TIMEOUT_S) -> OperatorCrds:
    """The directory `root`, else `operator_crds_dir()`, read through its index.tsv."""
    directory = operator_crds_dir(timeout) if root is None else root
    entries: list[Entry] = []
    for number, line in enumerate((directory / "index.tsv").read_text().splitlines(), 1):
        fields = line.split("\t")
        if len(fields) != 4 or fields[1] not in ("crd", "sample"):
            raise OperatorCrdsError(f"{directory}/index.tsv:{number}: cannot read {line!r}")
        project, kind, relative, source = fields
        path = directory / relative
        if not path.is_file():
            raise OperatorCrdsError(f"{path} is listed in index.tsv but missing")
        entries.append(Entry(project, "crd" if kind == "crd" else "sample", path, source))
    return OperatorCrds(directory, tuple(entries))
