"""``gpushare policy check`` checks the set: clashing device-plugin configs, fractions no pool
serves, excluded namespaces, pool selectors GPU Feature Discovery never matches."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from webhook import cli
from webhook.core import (
    Allocation,
    Mode,
    Policy,
    PolicySet,
    Pool,
    Severity,
    check_policy_set,
    load_policies,
)
from webhook.node.errors import InvalidPoliciesError
from webhook.node.pools import find_daemon_pool

REPO = Path(__file__).resolve().parents[1]


def policy(name: str, spec: str) -> str:
    return (
        f"apiVersion: gpushare.io/v1alpha1\nkind: GpuSharingPolicy\nmetadata: {{name: {name}}}\n"
        "spec:\n" + textwrap.indent(textwrap.dedent(spec), "  ")
    )


TEAM_A = policy(
    "team-a",
    """\
    match: {namespaces: [team-a]}
    mode: time-slicing
    fraction: {min: 0.1, max: 0.5}
    pools:
      - name: ts-half
        replicas: 2
    """,
)


def check(tmp_path: Path, capsys: pytest.CaptureFixture[str], **files: str) -> tuple[int, str, str]:
    for name, text in files.items():
        (tmp_path / f"{name}.yaml").write_text(text)
    code = cli.main(["policy", "check", str(tmp_path)])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_clean_set_is_ok(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = check(tmp_path, capsys, a=TEAM_A)
    assert (code, err) == (0, "")
    assert out == f"{tmp_path}: ok (1 policy: team-a)\n"


def test_two_pools_defining_one_device_plugin_config_differently_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    team_b = (
        TEAM_A.replace("team-a", "team-b")
        .replace("replicas: 2", "replicas: 4")
        .replace("max: 0.5", "max: 0.25")
    )
    code, out, err = check(tmp_path, capsys, a=TEAM_A, b=team_b)
    assert code == 2
    assert err.splitlines() == [
        f"{tmp_path / 'b.yaml'}: spec.pools[0]: error: pool 'ts-half' of policy 'team-b' "
        f"({tmp_path / 'b.yaml'}) and pool 'ts-half' of policy 'team-a' "
        f"({tmp_path / 'a.yaml'}) both define device-plugin config 'ts-half' but disagree on "
        "replicas (4 vs 2): one node group gets one config, so make them agree or give one "
        "pool its own devicePluginConfig name. (line 9)"
    ]
    assert out == f"{tmp_path}: 1 error(s), 0 warning(s) (2 policies: team-a, team-b)\n"
    # The same set, file by file, was fine: only the set shows the clash.
    for name in ("a", "b"):
        assert cli.main(["policy", "check", str(tmp_path / f"{name}.yaml")]) == 0
    capsys.readouterr()
    # The pools may share a config where they agree, or use configs of their own.
    renamed = team_b.replace("replicas: 4", "replicas: 4\n      devicePluginConfig: ts-quarter")
    code, _, err = check(tmp_path, capsys, b=renamed)
    assert (code, err) == (0, "")


def test_the_files_of_a_path_given_twice_are_read_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a.yaml").write_text(TEAM_A)
    assert cli.main(["policy", "check", str(tmp_path), str(tmp_path / "a.yaml")]) == 0
    assert capsys.readouterr().err == ""


def test_fractions_above_every_slot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    partly = TEAM_A.replace("max: 0.5", "max: 0.8")
    code, out, err = check(tmp_path, capsys, a=partly)
    assert code == 0  # a warning: asks up to 0.5 are served
    assert err == (
        f"{tmp_path / 'a.yaml'}: spec.fraction.max: warning: fractions above 0.5 up to 0.8 are "
        "within fraction but above the largest slot of any pool, pool 'ts-half' (1/2 = 0.5 "
        "of a GPU): they are denied; lower fraction.max to 0.5 or add a pool with fewer "
        "replicas (line 7)\n"
    )
    assert out.endswith("ok (1 policy: team-a; 1 warning(s))\n")
    wholly = TEAM_A.replace("min: 0.1, max: 0.5", "min: 0.6, max: 0.9")
    code, _, err = check(tmp_path, capsys, a=wholly)
    assert code == 2
    assert ": spec.fraction.min: error: fraction.min 0.6 is above the largest slot" in err
    assert "every gpu-fraction and gpu-memory ask is denied" in err


def test_count_allocation_serves_every_fraction() -> None:
    pools = (Pool("one", 4, gpus_per_node=1),)
    counted = Policy(
        "c", "c.yaml", Mode.MPS_DAEMON, pools, default=True, allocation=Allocation.COUNT
    )
    assert check_policy_set(PolicySet((counted,))) == []
    sliced = Policy("s", "s.yaml", Mode.MPS_DAEMON, pools, default=True)
    [finding] = check_policy_set(PolicySet((sliced,)))
    assert finding.severity is Severity.WARNING  # max 1.0 by default, the slot is 1/4
    assert "fractions above 0.25 up to 1 (not included: 1 is a whole GPU)" in finding.message


def test_excluded_namespaces_named_in_a_policy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    some = TEAM_A.replace("[team-a]", "[team-a, kube-system, 'ml-*']")
    code, _, err = check(tmp_path, capsys, a=some)
    assert code == 0
    assert err == (
        f"{tmp_path / 'a.yaml'}: spec.match.namespaces[1]: warning: namespace 'kube-system' "
        "is excluded from all policies (always: the control plane's namespace; the webhook "
        "configurations leave it out), so this entry has no effect: remove it (line 5)\n"
    )
    only = TEAM_A.replace("[team-a]", "[kube-public, team-x]")
    settings = (
        "apiVersion: gpushare.io/v1alpha1\nkind: GpuSharingSettings\nmetadata: {name: s}\n"
        "spec: {excludeNamespaces: ['team-*', kube-public]}\n"
    )
    code, _, err = check(tmp_path, capsys, a=only, settings=settings)
    assert code == 2
    assert err.startswith(
        f"{tmp_path / 'a.yaml'}: spec.match.namespaces: error: every namespace this policy "
        "matches ('kube-public', 'team-x') is excluded from all policies (GpuSharingSettings "
        "excludeNamespaces"
    )
    # A default policy applies elsewhere anyway: the entries only have no effect.
    default = only.replace("match: {namespaces: [kube-public, team-x]}", "default: true\n  "
                           "match: {namespaces: [kube-public, team-x]}")  # fmt: skip
    code, _, err = check(tmp_path, capsys, a=default, settings=settings)
    assert code == 0 and err.count(": warning: namespace ") == 2


@pytest.mark.parametrize(
    ("resource", "selector", "problem"),
    [
        # k8s-device-plugin internal/lm/resource.go: "-SHARED" where shared, not renamed.
        ("nvidia.com/gpu", "nvidia.com/gpu.product: NVIDIA-L4",
         "labels the nodes of this pool nvidia.com/gpu.product=NVIDIA-L4-SHARED"),
        ("nvidia.com/gpu", "nvidia.com/gpu.product: NVIDIA-L4-SHARED", ""),
        ("nvidia.com/gpu.shared", "nvidia.com/gpu.product: NVIDIA-L4-SHARED",
         "labels the nodes of this pool nvidia.com/gpu.product=NVIDIA-L4: their device-plugin "
         "config renames"),
        ("nvidia.com/gpu.shared", "nvidia.com/gpu.product: NVIDIA-L4", ""),
        ("nvidia.com/gpu.shared", "nvidia.com/gpu.replicas: '4'",
         "nvidia.com/gpu.replicas=2 (from the pool's device-plugin config), never '4'"),
        ("nvidia.com/gpu.shared", "nvidia.com/gpu.replicas: '2'", ""),
        ("nvidia.com/gpu.shared", "nvidia.com/gpu.sharing-strategy: mps",
         "nvidia.com/gpu.sharing-strategy=time-slicing"),
        ("nvidia.com/gpu.shared", "nvidia.com/gpu.memory: 24Gi",
         "sets nvidia.com/gpu.memory to a whole number of MiB, never '24Gi'"),
        ("nvidia.com/gpu.shared", "nvidia.com/gpu.memory: '23034'", ""),
        ("nvidia.com/gpu.shared", "example.com/zone: a", ""),
    ],
)  # fmt: skip
def test_pool_selectors_gfd_can_never_match(
    resource: str,
    selector: str,
    problem: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    whole = "  wholeGpus: {max: 0}\n" if resource == "nvidia.com/gpu" else ""
    text = (
        TEAM_A.replace(
            "mode: time-slicing", f"mode: time-slicing\n  resourceName: {resource}"
        ).replace("replicas: 2", f"replicas: 2\n      nodeSelector: {{{selector}}}")
        + whole
    )
    code, _, err = check(tmp_path, capsys, a=text)
    if not problem:
        assert (code, err) == (0, "")
        return
    assert code == 2
    [line] = err.splitlines()
    assert line.startswith(f"{tmp_path / 'a.yaml'}: spec.pools[0].nodeSelector.")
    assert ": error: GPU Feature Discovery " in line and problem in line
    assert line.endswith("(line 12)")


def test_the_shipped_policies_pass_as_one_set() -> None:
    policies = load_policies(REPO / "policies")
    examples = [load_policies(p) for p in sorted((REPO / "policies/examples").glob("*.yaml"))]
    for policy_set in (policies, *examples):
        assert check_policy_set(policy_set) == []


def test_the_mps_daemon_refuses_clashing_pools_as_invalid_policies() -> None:
    a = Policy("a", "a.yaml", Mode.MPS_DAEMON, (Pool("p", 4, gpu_memory_mib=1000),))
    b = Policy("b", "b.yaml", Mode.MPS_DAEMON, (Pool("p", 4, gpu_memory_mib=2000),))
    with pytest.raises(InvalidPoliciesError, match="disagree on gpuMemory"):
        find_daemon_pool(PolicySet((a, b)), pool_name="p", node_config_label=None)


# -- the driver memory limit: its hook, and the nodes that enforce it --------------------------

ENFORCED = TEAM_A.replace(
    "mode: time-slicing",
    "mode: time-slicing\n  gpuMemory: 80Gi\n  enforcement: {driverMemoryLimit: require}",
)
NODES = """\
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Node
  metadata:
    name: gpu-1
    labels: {gpushare.io/driver-memory-limit: "false"}
    annotations: {gpushare.io/driver-memory-limit-reason: "cgroup v1"}
"""


def check_nodes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], policy_text: str, nodes: str
) -> tuple[int, str, str]:
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "a.yaml").write_text(policy_text)
    (tmp_path / "nodes.yaml").write_text(nodes)
    code = cli.main(["policy", "check", str(policies), "--nodes", str(tmp_path / "nodes.yaml")])
    out, err = capsys.readouterr()
    return code, out, err


def test_require_without_an_enforcing_node_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = check_nodes(tmp_path, capsys, ENFORCED, NODES)
    assert code == 2
    [line] = err.splitlines()
    assert line.startswith(f"{tmp_path / 'policies/a.yaml'}: spec.pools[0]: error: pods of pool ")
    assert "'ts-half' will stay Pending (driverMemoryLimit: require): none of the 1 node(s)" in line
    assert "(gpu-1: cgroup v1): run `gpushare node-agent` on the pool's nodes" in line
    assert out.startswith(f"{tmp_path / 'policies'}: 1 error(s), 0 warning(s)")
    # The same nodes, one of them enforcing: clean. Without --nodes: nothing is said.
    enforcing = NODES + "- {apiVersion: v1, kind: Node, metadata: {name: gpu-2, labels: "
    enforcing += '{gpushare.io/driver-memory-limit: "true"}}}\n'
    (tmp_path / "policies").rename(tmp_path / "old")
    assert check_nodes(tmp_path, capsys, ENFORCED, enforcing)[0] == 0
    assert check(tmp_path / "old", capsys)[0] == 0


def test_auto_without_an_enforcing_node_is_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = check_nodes(tmp_path, capsys, TEAM_A, NODES)
    assert code == 0
    assert ": spec.pools[0]: warning: pods of pool 'ts-half' run without the driver memory " in err
    assert "(driverMemoryLimit: auto)" in err and out.endswith("1 warning(s))\n")


def test_a_nodes_file_with_something_else_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = check_nodes(tmp_path, capsys, TEAM_A, "apiVersion: v1\nkind: Pod\n")
    assert code == 2 and out == ""
    assert f"{tmp_path / 'nodes.yaml'}: line 1: the document is a Pod, not a Node: give the " in err


def test_a_mig_pool_that_writes_the_driver_limit_is_warned_about(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = TEAM_A.replace(
        "replicas: 2",
        "replicas: 2\n      nodeSelector: {nvidia.com/gpu.product: A100-SXM4-40GB-MIG-3g.20gb}",
    )
    code, _, err = check(tmp_path, capsys, a=text)
    assert code == 0
    assert ": spec.pools[0]: warning: pool 'ts-half' of policy 'team-a' " in err
    assert "selects MIG devices" in err


def test_a_node_list_from_the_api_is_read_as_kubectl_s(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # GET /api/v1/nodes answers a NodeList (JSON); kubectl get -o yaml a v1 List.
    node_list = (
        '{"apiVersion": "v1", "kind": "NodeList", "items": [{"apiVersion": "v1", "kind": '
        '"Node", "metadata": {"name": "gpu-9", "labels": '
        '{"gpushare.io/driver-memory-limit": "true"}}}]}'
    )
    code, out, err = check_nodes(tmp_path, capsys, ENFORCED, node_list)
    assert (code, err) == (0, "")
    assert out.startswith(f"{tmp_path / 'policies'}: ok (1 policy: team-a)")
