"""``gpushare mutate --all-modes`` / ``explain --all-modes``: one pod under every configured
scheme, each policy tried alone (issue 12)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from webhook import cli

REPO = Path(__file__).resolve().parents[1]
SCHEMES = ("aws-vgpu", "tencent-vcuda", "aliyun-gpushare", "hami", "kai", "aks-mps")
POD = """
apiVersion: v1
kind: Pod
metadata:
  name: train
  namespace: team-a
  annotations: {gpu-fraction: "0.1"}
spec:
  containers:
    - name: main
      image: registry.example.com/train:1
"""


@pytest.fixture
def policies(tmp_path: Path) -> Path:
    """The bundled default and every scheme example, as one policy directory."""
    folder = tmp_path / "policies"
    folder.mkdir()
    shutil.copy(REPO / "policies" / "default.yaml", folder)
    for name in SCHEMES:
        shutil.copy(REPO / "policies" / "examples" / f"{name}.yaml", folder)
    return folder


def _run(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, *args: str, pod: str = POD
) -> tuple[int, str, str]:
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(pod)
    code = cli.main([*args, "-f", str(manifest), "--all-modes"])
    out, err = capsys.readouterr()
    return code, out, err


def test_explain_all_modes_shows_each_scheme_what_it_isolates_and_needs(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, policies: Path
) -> None:
    code, out, _ = _run(capsys, tmp_path, "explain", "--policies", str(policies))
    assert code == 0
    for name in (*SCHEMES, "default"):
        assert f"- policy '{name}' (mode " in out
    assert "add /spec/containers/0/resources" in out
    assert '{"limits":{"k8s.amazonaws.com/vgpu":"1"}' in out
    assert '"tencent.com/vcuda-core":"10","tencent.com/vcuda-memory":"7"' in out
    assert 'add /spec/schedulerName "hami-scheduler"' in out
    assert 'add /spec/schedulerName "kai-scheduler"' in out
    assert out.count("isolation: ") == len(SCHEMES) + 1
    assert "nodes need: aws-virtual-gpu-device-plugin DaemonSet (--vgpu=10)" in out


def test_mutate_all_modes_json_has_one_report_per_scheme(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, policies: Path
) -> None:
    code, out, _ = _run(capsys, tmp_path, "mutate", "--policies", str(policies), "-o", "json")
    report = json.loads(out)
    assert code == 0
    by_policy = {s["policy"]: s for s in report["schemes"]}
    assert set(by_policy) == {*SCHEMES, "default"}
    hami = by_policy["hami"]["report"]["documents"][0]
    assert hami["result"]["spec"]["schedulerName"] == "hami-scheduler"
    assert by_policy["kai"]["scheduler"] == "kai-scheduler"
    # Each policy is tried alone, whatever its match (team-a matches none of the examples).
    assert all(s["report"]["summary"]["allowed"] == 1 for s in report["schemes"])


def test_mutate_all_modes_yaml_and_denials_under_some_schemes(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, policies: Path
) -> None:
    pod = POD.replace('"0.1"', '"0.05"')  # finer than one AWS vGPU
    code, out, _ = _run(capsys, tmp_path, "mutate", "--policies", str(policies), pod=pod)
    assert code == 0  # admitted under the other schemes
    assert "# policy 'aws-vgpu' (mode aws-vgpu, scheduler default-scheduler)" in out
    assert '#   - gpu-fraction "0.05" is finer than one vGPU' in out
    documents = [d for d in yaml.safe_load_all(out) if d]
    assert len(documents) == len(SCHEMES)  # every scheme but aws-vgpu admits it


def test_all_modes_exits_3_when_every_scheme_denies(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, policies: Path
) -> None:
    pod = POD.replace('"0.1"', '"0.0001"')
    code, _, _ = _run(capsys, tmp_path, "mutate", "--policies", str(policies), pod=pod)
    assert code == 3
    code, _, err = _run(capsys, tmp_path, "mutate", "--policies", str(policies), "-o", "patch")
    assert code == 2
    assert "--all-modes prints every scheme: use -o yaml or -o json." in err
