"""``gpushare plan`` as a user runs it: the table, -o json, -o html, the pictures, stdin,
and one-line errors with exit 2."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from webhook.cli import main


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_table(policy_dir: Path, mix_csv: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "--csv", str(mix_csv), "--policies", str(policy_dir), "--gpus-per-node", "4"]
    code, out, _ = run(argv, capsys)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["as", "configured", "default", "inference-mps-daemon", "ml-mps"]
    # inference-mps-daemon counts slots of 1/10: 0.7 -> 7, 0.5 -> 5, 0.25 -> 3, 0.1 -> 1;
    # FFD: [7 3] [5 5] [5 3 1 1] [3 3 3 1] [3 3 3 1] [3 3 1 1 1]: 6 GPUs, + 4 whole = 10.
    assert lines[3].split() == ["GPUs", "needed", "11", "11", "10", "10"]
    assert '  not served: odd (1 pod): gpu-fraction "0.7" does not fit any GPU pool' in out


def test_json_and_pictures(
    policy_dir: Path, mix_csv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "pictures"
    argv = [
        "plan", "--csv", str(mix_csv), "--policies", str(policy_dir), "-o", "json",
        "--out", str(out), "--packing-scheme", "ml-mps",
        "--policy", "default", "--policy", "ml-mps",
    ]  # fmt: skip
    code, stdout, stderr = run(argv, capsys)
    assert code == 0
    report = json.loads(stdout)
    assert report["kind"] == "PlanReport"
    assert [s["scheme"] for s in report["schemes"]] == ["default", "ml-mps"]
    default = report["schemes"][0]
    assert default["gpus"] == default["lowerBoundGpus"]
    quarter = next(p for p in default["pools"] if p["pool"] == "default/ts-quarter")
    assert quarter["bins"][0] == [{"workload": "infer", "pods": 4}]
    names = ["plan-chart.png", "plan-packing.png", "plan-chart.svg", "plan-packing.svg"]
    assert stderr.splitlines() == [f"wrote {out / name}" for name in names]
    assert (out / "plan-chart.svg").read_text().startswith("<?xml")
    assert "ml-mps: 10 GPUs" in (out / "plan-packing.svg").read_text()


def test_html_page(policy_dir: Path, mix_csv: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        ["plan", "--csv", str(mix_csv), "--policies", str(policy_dir), "-o", "html"], capsys
    )
    assert code == 0
    assert out.startswith("<!DOCTYPE html>")
    assert out.count("<svg") == 2
    assert "&quot;0.7&quot;" in out  # input text is escaped


def test_manifests_from_stdin(
    policy_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = (
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\nspec:\n  replicas: 6\n"
        "  template:\n    metadata: {annotations: {gpu-fraction: '0.25'}}\n"
        "    spec: {containers: [{name: main, image: nginx}]}\n"
    )
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(manifest.encode())))
    code, out, _ = run(
        ["plan", "-f", "-", "--policies", str(policy_dir), "--policy", "default", "-o", "json"],
        capsys,
    )
    assert code == 0
    (scheme,) = json.loads(out)["schemes"]
    assert (scheme["podsServed"], scheme["gpus"]) == (6, 2)  # ceil(6 / 4)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--policy", "nope"], "error: no policy named 'nope'; the policies are default, "),
        (["--packing-scheme", "nope"], "error: --packing-scheme 'nope' is not a scheme"),
        (["--gpus-per-node", "0"], "error: --gpus-per-node 0: give 1 or more"),
    ],
)
def test_usage_errors(
    policy_dir: Path,
    mix_csv: Path,
    extra: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _, err = run(
        ["plan", "--csv", str(mix_csv), "--policies", str(policy_dir), *extra], capsys
    )
    assert code == 2
    assert err.startswith(message)


def test_bad_csv_exits_2_with_the_line(
    policy_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    table = tmp_path / "bad.csv"
    table.write_text("name,fraction,count\na,0.5,x\n")
    code, _, err = run(["plan", "--csv", str(table), "--policies", str(policy_dir)], capsys)
    assert code == 2
    assert err == f"{table}:2: count 'x' is not a whole number from 1 to 1,000,000\n"


def test_unreachable_cluster(
    policy_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text(
        "apiVersion: v1\nkind: Config\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:9'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: x, context: {cluster: c, user: u}}]\n"
        "current-context: x\n"
    )
    code, _, err = run(
        ["plan", "--cluster", "--kubeconfig", str(config), "--policies", str(policy_dir)], capsys
    )
    assert code == 2
    assert err.startswith("error: cannot reach the cluster: ")


NODES = """\
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Node
  metadata:
    name: l4-1
    labels: {nvidia.com/gpu.product: NVIDIA-L4, gpushare.io/driver-memory-limit: "true"}
- apiVersion: v1
  kind: Node
  metadata:
    name: a100-1
    labels: {nvidia.com/gpu.product: NVIDIA-A100-SXM4-80GB}
"""


def test_enforcing_nodes_in_the_table_and_json(
    policy_dir: Path, mix_csv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text(NODES)
    argv = ["plan", "--csv", str(mix_csv), "--policies", str(policy_dir), "--nodes", str(nodes)]
    code, out, _ = run(argv, capsys)
    assert code == 0
    section = out[out.index("enforcing nodes (gpushare.io/driver-memory-limit=true):") :]
    lines = section.splitlines()
    # l4-mps selects the L4 node, which enforces; ts-half may land on either node.
    assert "  inference-mps-daemon/l4-mps (driverMemoryLimit: auto): 1 of 1 node(s) enforce it" in (
        lines
    )
    assert "  default/ts-half (driverMemoryLimit: auto): 1 of 2 node(s) enforce it" in lines
    assert any(
        ": warning: pods of pool 'ts-half' placed on 1 of its 2 nodes run without" in line
        for line in lines
    )
    code, out, _ = run([*argv, "-o", "json"], capsys)
    report = json.loads(out)["enforcingNodes"]
    l4 = next(item for item in report if item["pool"] == "l4-mps")
    assert l4 == {
        "policy": "inference-mps-daemon",
        "pool": "l4-mps",
        "driverMemoryLimit": "auto",
        "nodes": ["l4-1"],
        "enforcingNodes": ["l4-1"],
    }
    half = next(item for item in report if item["pool"] == "ts-half")
    assert half["severity"] == "warning" and half["nodes"] == ["l4-1", "a100-1"]


def test_without_nodes_nothing_is_said_about_them(
    policy_dir: Path, mix_csv: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["plan", "--csv", str(mix_csv), "--policies", str(policy_dir)]
    code, out, _ = run(argv, capsys)
    assert code == 0 and "enforcing nodes" not in out
    code, out, _ = run([*argv, "-o", "json"], capsys)
    assert "enforcingNodes" not in json.loads(out)
