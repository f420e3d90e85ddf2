"""The objects the policies' quota sections declare (webhook/install/declared_quotas.py), and
`gpushare webhook-config --quotas`, which prints them.

The ResourceQuotas are checked against Kubernetes' own schema here; the Kueue objects against
the CRDs of the Kueue the e2e tests build, and applied to an apiserver that serves them, in
tests/e2e/test_quota_objects.py (Kueue's CRDs come with its build, which the fast suite
does not make). The chart renders the same objects: tests/test_helm_render.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from webhook import cli
from webhook.core import load_policy_texts
from webhook.errors import PolicyError
from webhook.install import quota_objects
from webhook.install.certs import certificate_pem, create_ca

KUBERNETES_VERSION = "1.30.0"  # the oldest the chart supports (Chart.yaml kubeVersion)
LABELS = {"app.kubernetes.io/name": "gpushare"}

TEAMS = """\
apiVersion: gpushare.io/v1alpha1
kind: GpuSharingPolicy
metadata: {name: teams}
spec:
  default: true
  mode: time-slicing
  pools: [{name: half, replicas: 2}]
  quota:
    shareResource: true
    namespaces: {team-b: "1.5", team-a: "4", team-c: "0.025"}
    kueue:
      clusterQueue: gpu-shares
      gpus: "8.5"
      namespaces: [team-b, team-a]
      resources: {memory: 256Gi, cpu: "64"}
"""

RESEARCH = """\
apiVersion: gpushare.io/v1alpha1
kind: GpuSharingPolicy
metadata: {name: research}
spec:
  mode: time-slicing
  match: {namespaces: [research]}
  pools: [{name: quarter, replicas: 4}]
  quota:
    shareResource: true
    namespaces: {research: "2"}
    kueue: {clusterQueue: research, gpus: "1", namespaces: [research]}
"""

PLAIN = """\
apiVersion: gpushare.io/v1alpha1
kind: GpuSharingPolicy
metadata: {name: plain}
spec:
  default: true
  mode: time-slicing
  pools: [{name: half, replicas: 2}]
"""

DECLARED = {"gpushare.io/declared-by": "policy teams in teams.yaml"}


def resource_quota(namespace: str, milli: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {
            "name": "gpushare-gpu-shares",
            "namespace": namespace,
            "labels": LABELS,
            "annotations": DECLARED,
        },
        "spec": {"hard": {"requests.gpushare.io/milligpu": milli}},
    }


def local_queue(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "LocalQueue",
        "metadata": {
            "name": "gpu-shares",
            "namespace": namespace,
            "labels": LABELS,
            "annotations": DECLARED,
        },
        "spec": {"clusterQueue": "gpu-shares"},
    }


EXPECTED = [
    resource_quota("team-a", "4000"),
    resource_quota("team-b", "1500"),
    resource_quota("team-c", "25"),
    {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ResourceFlavor",
        "metadata": {"name": "gpushare", "labels": LABELS},
        "spec": {},
    },
    {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ClusterQueue",
        "metadata": {"name": "gpu-shares", "labels": LABELS, "annotations": DECLARED},
        "spec": {
            "namespaceSelector": {
                "matchExpressions": [
                    {
                        "key": "kubernetes.io/metadata.name",
                        "operator": "In",
                        "values": ["team-b", "team-a"],
                    }
                ]
            },
            "resourceGroups": [
                {
                    "coveredResources": ["gpushare.io/milligpu", "cpu", "memory"],
                    "flavors": [
                        {
                            "name": "gpushare",
                            "resources": [
                                {"name": "gpushare.io/milligpu", "nominalQuota": "8500"},
                                {"name": "cpu", "nominalQuota": "64"},
                                {"name": "memory", "nominalQuota": "256Gi"},
                            ],
                        }
                    ],
                }
            ],
        },
    },
    local_queue("team-b"),
    local_queue("team-a"),
]


def objects(*files: tuple[str, str]) -> list[dict[str, Any]]:
    return quota_objects(load_policy_texts(files), LABELS)


def test_the_objects_of_a_policy_with_both_sections() -> None:
    assert objects(("policies/teams.yaml", TEAMS)) == EXPECTED


def test_the_resource_quotas_are_valid_kubernetes_objects() -> None:
    quotas = [d for d in objects(("teams.yaml", TEAMS)) if d["kind"] == "ResourceQuota"]
    assert len(quotas) == 3
    for document in quotas:
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


def test_the_flavor_is_shared_and_each_object_names_its_policy_and_file() -> None:
    found = objects(("a/teams.yaml", TEAMS), ("b/research.yaml", RESEARCH))
    assert [(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]) for d in found] == [
        ("ResourceQuota", "team-a", "gpushare-gpu-shares"),
        ("ResourceQuota", "team-b", "gpushare-gpu-shares"),
        ("ResourceQuota", "team-c", "gpushare-gpu-shares"),
        ("ResourceQuota", "research", "gpushare-gpu-shares"),
        ("ResourceFlavor", None, "gpushare"),
        ("ClusterQueue", None, "gpu-shares"),
        ("LocalQueue", "team-b", "gpu-shares"),
        ("LocalQueue", "team-a", "gpu-shares"),
        ("ClusterQueue", None, "research"),
        ("LocalQueue", "research", "research"),
    ]
    declared = {
        (d["metadata"]["name"], d["metadata"].get("namespace")): d["metadata"].get("annotations")
        for d in found
    }
    assert declared[("gpushare", None)] is None  # the flavor is every queue's
    assert declared[("gpushare-gpu-shares", "research")] == {
        "gpushare.io/declared-by": "policy research in research.yaml"
    }
    group = found[-2]["spec"]["resourceGroups"][0]  # the ClusterQueue research
    assert group["coveredResources"] == ["gpushare.io/milligpu"]
    assert group["flavors"][0]["resources"] == [
        {"name": "gpushare.io/milligpu", "nominalQuota": "1000"}
    ]


def test_no_declared_quota_no_objects() -> None:
    assert objects(("plain.yaml", PLAIN)) == []
    only_namespaces = TEAMS.partition("    kueue:")[0]
    assert [d["kind"] for d in objects(("teams.yaml", only_namespaces))] == ["ResourceQuota"] * 3


def test_the_share_among_the_other_resources_is_refused() -> None:
    text = TEAMS.replace('cpu: "64"}', 'cpu: "64", gpushare.io/milligpu: "9000"}')
    with pytest.raises(PolicyError) as raised:
        objects(("teams.yaml", text))
    assert raised.value.problems == [
        "teams.yaml: spec.quota.kueue.resources: gpushare.io/milligpu is the queue's GPU "
        "share, set by quota.kueue.gpus: remove it from resources (line 15)"
    ]


# -- gpushare webhook-config --quotas -----------------------------------------------------------


@pytest.fixture
def ca_file(tmp_path: Path) -> Path:
    path = tmp_path / "ca.crt"
    path.write_bytes(certificate_pem(create_ca().certificate))
    return path


def webhook_config(
    capsys: pytest.CaptureFixture[str], ca: Path, policies: Path, *args: str
) -> tuple[int, str, str]:
    argv = ["webhook-config", "--ca", str(ca), "--url", "https://127.0.0.1:8443"]
    code = cli.main([*argv, "--policies", str(policies), *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_webhook_config_prints_the_quota_objects_after_the_configurations(
    tmp_path: Path, ca_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "teams.yaml").write_text(TEAMS)
    code, out, err = webhook_config(capsys, ca_file, policies)
    assert (code, err) == (0, "")
    admission = [d for d in yaml.safe_load_all(out) if d]
    code, out, err = webhook_config(capsys, ca_file, policies, "--quotas")
    assert (code, err) == (0, "")
    documents = [d for d in yaml.safe_load_all(out) if d]
    assert documents == [*admission, *EXPECTED]


def test_webhook_config_quotas_without_declared_quotas_says_so(
    tmp_path: Path, ca_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "plain.yaml").write_text(PLAIN)
    code, out, err = webhook_config(capsys, ca_file, tmp_path / "plain.yaml", "--quotas")
    assert code == 0
    assert err == "gpushare webhook-config: the policies declare no quotas.\n"
    kinds = {d["kind"] for d in yaml.safe_load_all(out) if d}
    assert "ResourceQuota" not in kinds and "MutatingWebhookConfiguration" in kinds


def test_webhook_config_quotas_refusals(
    tmp_path: Path, ca_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "teams.yaml").write_text(TEAMS)
    code, out, err = webhook_config(
        capsys, ca_file, tmp_path / "teams.yaml", "--quotas", "--workload-webhooks"
    )
    assert (code, out) == (2, "")
    assert err == "gpushare webhook-config: --workload-webhooks prints no --quotas.\n"
    shared = TEAMS.replace('cpu: "64"}', 'cpu: "64", gpushare.io/milligpu: "9000"}')
    (tmp_path / "teams.yaml").write_text(shared)
    code, out, err = webhook_config(capsys, ca_file, tmp_path / "teams.yaml", "--quotas")
    assert (code, out) == (2, "")
    assert "gpushare.io/milligpu is the queue's GPU share" in err
