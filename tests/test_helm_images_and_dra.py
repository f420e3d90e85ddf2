"""The chart's images and its DRA template reconciler, rendered by the real Helm.

Images: the webhook runs the admission image (no Kubernetes client), every pod that talks to
the API runs the cluster image, and a digest pins either as <repository>@<digest> (the form
kustomize's images[].digest writes), refused by the schema unless it is sha256 and 64 hex
digits. The reconciler (draReconciler): off by default; on, a Deployment with its probes and
metrics port, and RBAC as narrow as the policies allow: a Role per namespace where every dra
policy names its namespaces exactly, a ClusterRole where one matches a glob or is default:
true. Applying the namespaced RBAC to a real apiserver and reconciling through it is
tests/e2e/test_dra.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.helm import run_helm, template_args

REPO = Path(__file__).resolve().parents[1]
NAMESPACE = "gpushare-system"
DIGEST = "sha256:" + "0123456789abcdef" * 4
OTHER_DIGEST = "sha256:" + "fedcba9876543210" * 4
# The pod's own claims are checked by the webhook, not here: no safety net compiled for
# policies of the test's own.
OWN_POLICIES = ("safetyNet.enabled=false", "webhook.validatingWebhook=pods")
pytestmark = pytest.mark.timeout(300, func_only=True)


@pytest.fixture(scope="module")
def helm_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("helm-home")


def helm_template(
    helm: Path, home: Path, *sets: str, files: dict[str, str] | None = None
) -> tuple[int, list[dict[str, Any]], str]:
    """(exit status, documents, stderr) of `helm template` with --set and policy files."""
    args = template_args(sets=sets)
    for name, path in (files or {}).items():
        args += ["--set-file", f"policies.files.{name.replace('.', chr(92) + '.')}={path}"]
    result = run_helm(helm, *args, home=home)
    documents = [d for d in yaml.safe_load_all(result.stdout) if d] if result.stdout else []
    return result.returncode, documents, result.stderr


def rendered(helm: Path, home: Path, *sets: str, **files: str) -> list[dict[str, Any]]:
    code, documents, stderr = helm_template(helm, home, *sets, files=files or None)
    assert code == 0, stderr
    return documents


def one(documents: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [d for d in documents if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, [(d["kind"], d["metadata"]["name"]) for d in documents]
    return found[0]


def images(documents: list[dict[str, Any]]) -> dict[tuple[str, str], str]:
    """(kind, name) -> the image of its one container, for every workload rendered."""
    found = {}
    for document in documents:
        spec = document.get("spec") or {}
        if document["kind"] == "CronJob":
            spec = spec["jobTemplate"]["spec"]
        pod = (spec.get("template") or {}).get("spec") or (
            spec if document["kind"] == "Pod" else {}
        )
        for container in pod.get("containers", []):
            found[(document["kind"], document["metadata"]["name"])] = container["image"]
    return found


# -- images ------------------------------------------------------------------------------------


def test_the_webhook_runs_the_admission_image_and_api_clients_the_cluster_image(
    helm: Path, helm_home: Path
) -> None:
    documents = rendered(helm, helm_home, "mpsDaemon.enabled=true", "mpsDaemon.deviceConfigs={a}")
    found = images(documents)
    assert found.pop(("Deployment", "gpushare")) == "ghcr.io/gpushare/gpushare:0.1.0"
    assert found.pop(("DaemonSet", "gpushare-mps-daemon")) == (
        "ghcr.io/gpushare/gpushare-cluster:0.1.0"
    )
    assert found.pop(("Job", "gpushare-certgen-create")) == (
        "ghcr.io/gpushare/gpushare-cluster:0.1.0"
    )
    # Whatever else runs `gpushare` against the API (certgen's renewal, the admission check)
    # runs the cluster image too.
    for (kind, name), image in found.items():
        assert image.startswith("ghcr.io/gpushare/gpushare-cluster"), (kind, name, image)


def test_digests_pin_each_image_as_repository_at_digest(helm: Path, helm_home: Path) -> None:
    documents = rendered(
        helm,
        helm_home,
        f"image.digest={DIGEST}",
        "image.tag=ignored",
        f"clusterImage.digest={OTHER_DIGEST}",
        "mpsDaemon.enabled=true",
        "mpsDaemon.deviceConfigs={a}",
    )
    found = images(documents)
    assert found[("Deployment", "gpushare")] == f"ghcr.io/gpushare/gpushare@{DIGEST}"
    assert found[("DaemonSet", "gpushare-mps-daemon")] == (
        f"ghcr.io/gpushare/gpushare-cluster@{OTHER_DIGEST}"
    )
    assert found[("Job", "gpushare-certgen-create")] == (
        f"ghcr.io/gpushare/gpushare-cluster@{OTHER_DIGEST}"
    )


def test_the_certgen_image_overrides_the_cluster_image_field_by_field(
    helm: Path, helm_home: Path
) -> None:
    def certgen(*sets: str) -> str:
        return images(rendered(helm, helm_home, *sets))[("Job", "gpushare-certgen-create")]

    assert certgen("certificates.certgen.image.tag=1.2") == "ghcr.io/gpushare/gpushare-cluster:1.2"
    assert certgen(f"certificates.certgen.image.digest={DIGEST}") == (
        f"ghcr.io/gpushare/gpushare-cluster@{DIGEST}"
    )
    # Another repository never inherits clusterImage's digest: it belongs to that one.
    assert certgen(
        f"clusterImage.digest={OTHER_DIGEST}", "certificates.certgen.image.repository=my/certgen"
    ) == ("my/certgen:0.1.0")


@pytest.mark.parametrize(
    ("value", "where"),
    [
        ("image.digest", "/image/digest"),
        ("clusterImage.digest", "/clusterImage/digest"),
        ("certificates.certgen.image.digest", "/certificates/certgen/image/digest"),
    ],
)
@pytest.mark.parametrize("bad", ["sha256:abc", "sha512:" + "0" * 64, "0" * 64, DIGEST.upper()])
def test_a_digest_that_is_not_sha256_and_64_hex_digits_is_refused(
    helm: Path, helm_home: Path, value: str, where: str, bad: str
) -> None:
    code, _, stderr = helm_template(helm, helm_home, f"{value}={bad}")
    assert code == 1
    assert f"at '{where}': '{bad}' does not match pattern '^(sha256:[a-f0-9]{{64}})?$'" in stderr


# -- the DRA template reconciler ---------------------------------------------------------------

GLOB_POLICY = REPO / "policies/examples/dra.yaml"  # match.namespaces: ["gpu-dra-*"]


def exact_policy(tmp_path: Path, *namespaces: str, default: bool = False) -> str:
    """The dra example naming exactly ``namespaces`` (and default: true if asked)."""
    text = GLOB_POLICY.read_text()
    assert 'namespaces: ["gpu-dra-*"]' in text
    text = text.replace('namespaces: ["gpu-dra-*"]', f"namespaces: [{', '.join(namespaces)}]")
    if default:
        text = text.replace("  priority: 10\n", "  priority: 10\n  default: true\n")
    path = tmp_path / "dra.yaml"
    path.write_text(text)
    return str(path)


def dra_objects(documents: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    return sorted(
        (d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"])
        for d in documents
        if d["metadata"]["name"] == "gpushare-dra-templates"
    )


def command(documents: list[dict[str, Any]]) -> list[str]:
    deployment = one(documents, "Deployment", "gpushare-dra-templates")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return list(container["command"])


RULES = [
    {
        "apiGroups": ["resource.k8s.io"],
        "resources": ["resourceclaimtemplates"],
        "verbs": ["get", "list", "create", "patch", "delete"],
    }
]


def test_the_reconciler_is_off_by_default(helm: Path, helm_home: Path) -> None:
    assert dra_objects(rendered(helm, helm_home)) == []


def test_glob_policies_get_a_cluster_role_and_a_deployment_with_probes(
    helm: Path, helm_home: Path
) -> None:
    documents = rendered(
        helm,
        helm_home,
        "draReconciler.enabled=true",
        *OWN_POLICIES,
        **{"dra.yaml": str(GLOB_POLICY)},
    )
    assert dra_objects(documents) == [
        ("ClusterRole", "", "gpushare-dra-templates"),
        ("ClusterRoleBinding", "", "gpushare-dra-templates"),
        ("Deployment", NAMESPACE, "gpushare-dra-templates"),
        ("ServiceAccount", NAMESPACE, "gpushare-dra-templates"),
    ]
    role = one(documents, "ClusterRole", "gpushare-dra-templates")
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch"]},
        *RULES,
    ]
    deployment = one(documents, "Deployment", "gpushare-dra-templates")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "ghcr.io/gpushare/gpushare-cluster:0.1.0"
    assert container["command"] == [
        "gpushare", "dra-templates", "--apply", "--watch", "--listen=0.0.0.0:9402",
        "--resync=600",
    ]  # fmt: skip
    assert container["ports"] == [{"name": "metrics", "containerPort": 9402, "protocol": "TCP"}]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["serviceAccountName"] == "gpushare-dra-templates"
    # The webhook's own policies, the same files the webhook names templates from.
    assert {"name": "policies", "configMap": {"name": "gpushare-policies"}} in pod["volumes"]
    assert deployment["spec"]["replicas"] == 1


def test_exactly_named_namespaces_get_a_role_each_and_nothing_cluster_wide(
    helm: Path, helm_home: Path, tmp_path: Path
) -> None:
    policy = exact_policy(tmp_path, "team-b", "team-a", "team-b")
    documents = rendered(
        helm, helm_home, "draReconciler.enabled=true", *OWN_POLICIES, **{"dra.yaml": policy}
    )
    assert dra_objects(documents) == [
        ("Deployment", NAMESPACE, "gpushare-dra-templates"),
        ("Role", "team-a", "gpushare-dra-templates"),
        ("Role", "team-b", "gpushare-dra-templates"),
        ("RoleBinding", "team-a", "gpushare-dra-templates"),
        ("RoleBinding", "team-b", "gpushare-dra-templates"),
        ("ServiceAccount", NAMESPACE, "gpushare-dra-templates"),
    ]
    ours = [d for d in documents if d["metadata"]["name"] == "gpushare-dra-templates"]
    for document in ours:
        if document["kind"] == "Role":
            assert document["rules"] == RULES
        if document["kind"] == "RoleBinding":
            assert document["subjects"] == [
                {"kind": "ServiceAccount", "name": "gpushare-dra-templates", "namespace": NAMESPACE}
            ]
    # No ClusterRole of the reconciler's anywhere, and it keeps those namespaces alone.
    assert not [d for d in ours if d["kind"].startswith("Cluster")]
    assert command(documents)[-1] == "--namespace=team-a,team-b"


def test_the_namespaces_can_be_named_outright(helm: Path, helm_home: Path, tmp_path: Path) -> None:
    """policies.existingConfigMap: the chart cannot read the policies; namespaces names
    them. Without it, auto falls back to the ClusterRole."""
    own = ("policies.existingConfigMap=team-policies", *OWN_POLICIES)
    named = rendered(
        helm, helm_home, "draReconciler.enabled=true", "draReconciler.namespaces={ml-x}", *own
    )
    assert ("Role", "ml-x", "gpushare-dra-templates") in dra_objects(named)
    assert command(named)[-1] == "--namespace=ml-x"
    volumes = one(named, "Deployment", "gpushare-dra-templates")["spec"]["template"]["spec"]
    assert {"name": "policies", "configMap": {"name": "team-policies"}} in volumes["volumes"]
    unknown = rendered(helm, helm_home, "draReconciler.enabled=true", *own)
    assert ("ClusterRole", "", "gpushare-dra-templates") in dra_objects(unknown)
    # And over policies the chart can read: the list given wins.
    policy = exact_policy(tmp_path, "team-a")
    given = rendered(
        helm,
        helm_home,
        "draReconciler.enabled=true",
        "draReconciler.namespaces={team-a,team-c}",
        *OWN_POLICIES,
        **{"dra.yaml": policy},
    )
    assert command(given)[-1] == "--namespace=team-a,team-c"


def test_rbac_cluster_is_kept_where_asked(helm: Path, helm_home: Path, tmp_path: Path) -> None:
    policy = exact_policy(tmp_path, "team-a")
    documents = rendered(
        helm,
        helm_home,
        "draReconciler.enabled=true",
        "draReconciler.rbac=cluster",
        *OWN_POLICIES,
        **{"dra.yaml": policy},
    )
    assert [k for k, _, _ in dra_objects(documents)].count("ClusterRole") == 1
    assert not [a for a in command(documents) if a.startswith("--namespace")]


@pytest.mark.parametrize(
    ("sets", "policy", "message"),
    [
        (
            ("draReconciler.rbac=namespaced",),
            "glob",
            "draReconciler.rbac namespaced: dra policy dra-h100 in dra.yaml matches namespaces "
            '"gpu-dra-*" (a glob). Name the namespaces in draReconciler.namespaces, or set '
            "draReconciler.rbac to cluster",
        ),
        (
            ("draReconciler.rbac=namespaced",),
            "default",
            "draReconciler.rbac namespaced: dra policy dra-h100 in dra.yaml is default: true",
        ),
        (
            ("draReconciler.rbac=namespaced", "policies.existingConfigMap=team"),
            None,
            "draReconciler.rbac namespaced: the policies are policies.existingConfigMap, which "
            "the chart cannot read",
        ),
        (
            (),
            None,
            "draReconciler.enabled: none of the policies this chart installs is a dra policy",
        ),
    ],
)
def test_narrowing_that_cannot_hold_is_refused_with_the_reason(
    helm: Path,
    helm_home: Path,
    tmp_path: Path,
    sets: tuple[str, ...],
    policy: str | None,
    message: str,
) -> None:
    files = {}
    if policy == "glob":
        files["dra.yaml"] = str(GLOB_POLICY)
    elif policy == "default":
        files["dra.yaml"] = exact_policy(tmp_path, "team-a", default=True)
    code, _, stderr = helm_template(
        helm, helm_home, "draReconciler.enabled=true", *OWN_POLICIES, *sets, files=files
    )
    assert code == 1 and message in stderr, stderr


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (("draReconciler.rbac=some",), "at '/draReconciler/rbac': value must be one of"),
        (("draReconciler.namespaces={team-*}",), "at '/draReconciler/namespaces/0'"),
        (("draReconciler.metricsPort=80",), "at '/draReconciler/metricsPort': minimum"),
        (("draReconciler.resyncSeconds=5",), "at '/draReconciler/resyncSeconds': minimum"),
    ],
)
def test_bad_reconciler_values_are_refused_by_the_schema(
    helm: Path, helm_home: Path, sets: tuple[str, ...], message: str
) -> None:
    code, _, stderr = helm_template(helm, helm_home, *sets)
    assert code == 1 and "values don't meet the specifications of the schema" in stderr
    assert message in stderr, stderr
