"""What gpushare's admission policies cost per pod inside the apiserver, side by side.

Run from the repository root (builds or reuses harness/tools/cel-cost, a few lines of Go on
k8s.io/apiserver's own admission-policy code, like the harness):

    .venv/bin/python bench/cel_cost.py                       # ~1 minute
    .venv/bin/python bench/cel_cost.py --policies policies/examples/mps.yaml
    .venv/bin/python bench/cel_cost.py --only compiled --cpuprofile /tmp/compiled.pprof
    .venv/bin/python bench/cel_cost.py --only compiled --memprofile /tmp/compiled.allocs

For e2e_bench.py's annotated training pod (gpu-fraction "0.5"), in one process, the
batches of every policy interleaved and the best batch of each reported (microseconds per
pod; the figure shared-machine noise disturbs least), with the heap each admission allocates
(KiB and allocations per pod: the same on every run, and what costs garbage collection in
an apiserver with a large live heap):

- **trivial**: a MutatingAdmissionPolicy with one constant op: the floor of any
  mutating policy (encoding the pod to JSON, applying the patch, decoding it);
- **reference**: the webhook's own patch for this pod as constant JSONPatch ops, with no
  variables or conditions: what a hand-written policy doing exactly this mutation costs;
- **compiled**: the MutatingAdmissionPolicy ``gpushare compile`` prints, matchConditions
  included (``--reinvocation IfNeeded`` doubles this: the apiserver calls it again after
  its own change);
- **safety net**: the ValidatingAdmissionPolicy ``gpushare webhook-config`` prints,
  evaluated on the pod as mutated;
- **denials**: the ValidatingAdmissionPolicy ``gpushare compile`` prints beside its
  mutating policy (the denials it wrote), evaluated on the pod as mutated: with
  **compiled**, what the compiled policies cost a pod.

Every policy's result is checked first (the compiled and reference policies must produce
the webhook's pod; the safety net and the denials must admit it). Loopback-free, no
apiserver; bounded by --batches x --batch admissions per policy.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import yaml  # noqa: E402

from bench.e2e_bench import bench_pod, constant_ops, mutating_policy  # noqa: E402
from harness.binary import HarnessBuildError, run_build_script  # noqa: E402
from harness.cli import gpushare, webhook_configuration, write_certificates  # noqa: E402
from webhook.compile import compile_policies  # noqa: E402
from webhook.core import load_policies  # noqa: E402

TOOL_BUILD = REPO / "harness/tools/cel-cost/build.sh"
TRIVIAL_OP = {"op": "add", "path": "/metadata/annotations/gpushare.io~1applied", "value": "x"}


def _of_kind(documents: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    return next(d for d in documents if d["kind"] == kind)


def _written(directory: Path, documents: dict[str, dict[str, Any]]) -> list[Path]:
    """Each document as NAME.yaml in ``directory`` (the name the report prints)."""
    paths = []
    for name, document in documents.items():
        path = directory / f"{name}.yaml"
        path.write_text(yaml.safe_dump(document))
        paths.append(path)
    return paths


def write_inputs(directory: Path, policies: Path) -> tuple[list[Path], list[Path], Path, Path]:
    pod_file = directory / "pod.json"
    pod_file.write_text(json.dumps(bench_pod("cel-cost")))
    mutate = ["mutate", "-f", str(pod_file), "-n", "bench", "--policies", str(policies)]
    mutated = yaml.safe_load(gpushare(*mutate, "-o", "yaml").stdout)
    mutated_file = directory / "mutated.json"
    mutated_file.write_text(json.dumps(mutated))
    patch = json.loads(gpushare(*mutate, "-o", "patch").stdout)
    compiled = compile_policies(load_policies(policies))
    maps = {
        "trivial": mutating_policy("trivial", constant_ops([TRIVIAL_OP])),
        "reference": mutating_policy("reference", constant_ops(patch)),
        "compiled": _of_kind(compiled, "MutatingAdmissionPolicy"),
    }
    certs = write_certificates(directory / "certs", service="cel-cost")
    shipped = webhook_configuration(
        certs / "ca.crt", "https://127.0.0.1:1", "--policies", str(policies)
    )
    vaps = {
        "safety-net": _of_kind(shipped, "ValidatingAdmissionPolicy"),
        "denials": _of_kind(compiled, "ValidatingAdmissionPolicy"),
    }
    return _written(directory, maps), _written(directory, vaps), pod_file, mutated_file


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--policies", type=Path, default=REPO / "policies/default.yaml")
    parser.add_argument("--batch", type=int, default=300, help="admissions per batch")
    parser.add_argument("--batches", type=int, default=15, help="batches per policy")
    parser.add_argument(
        "--only",
        action="append",
        choices=("trivial", "reference", "compiled", "safety-net", "denials"),
        help="time only this policy (repeat; each is still checked first)",
    )
    parser.add_argument(
        "--cpuprofile",
        type=Path,
        help="write a Go CPU profile of the timed batches (go tool pprof)",
    )
    parser.add_argument(
        "--memprofile",
        type=Path,
        help="write a Go heap profile of every allocation of one batch (go tool pprof "
        "-sample_index=alloc_objects)",
    )
    args = parser.parse_args(argv)
    try:
        tool = run_build_script(TOOL_BUILD, "tools/cel-cost/build.sh", HarnessBuildError, 900.0)
    except HarnessBuildError as exc:
        print(exc, file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="gpushare-cel-cost-") as name:
        directory = Path(name)
        maps, vaps, pod, mutated = write_inputs(directory, args.policies)
        command = [str(tool), "-pod", str(pod), "-mutated", str(mutated)]
        for path in maps:
            command += ["-m", str(path)]
        for path in vaps:
            command += ["-v", str(path)]
        expected = json.loads(mutated.read_text())
        shown = subprocess.run([*command, "-show"], check=False, capture_output=True, text=True)
        if shown.returncode != 0:
            print(shown.stdout + shown.stderr, file=sys.stderr)
            return 1
        outputs = [json.loads(line) for line in shown.stdout.splitlines() if line.startswith("{")]
        for path, output in zip(maps[1:], outputs[1:], strict=True):
            if output["metadata"]["annotations"] != expected["metadata"]["annotations"] or (
                output["spec"] != expected["spec"]
            ):
                print(f"{path.stem} does not give the webhook's pod", file=sys.stderr)
                return 1
        timed_command = [str(tool), "-pod", str(pod), "-mutated", str(mutated)]
        for flag, paths in (("-m", maps), ("-v", vaps)):
            for path in paths:
                if not args.only or path.stem in args.only:
                    timed_command += [flag, str(path)]
        if args.cpuprofile:
            timed_command += ["-cpuprofile", str(args.cpuprofile.resolve())]
        if args.memprofile:
            timed_command += ["-memprofile", str(args.memprofile.resolve())]
        timed = subprocess.run(
            [*timed_command, "-batch", str(args.batch), "-batches", str(args.batches)],
            capture_output=True,
            text=True,
            check=True,
        )
        print(
            f"per pod, best of {args.batches} batches of {args.batch}, and heap allocated "
            f"per pod ({args.policies}):"
        )
        for line in timed.stdout.splitlines():
            figures, _, timed_path = line.strip().rpartition("  ")
            print(f"  {Path(timed_path).stem:<12} {figures.strip()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
