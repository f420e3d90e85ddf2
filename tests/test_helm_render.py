"""deploy/helm/gpushare rendered by the real Helm (built from helm.sh/helm/v3 by
harness/tools/helm/build.sh): `helm lint`, `helm template` with several values files, the
webhook configurations equal to `gpushare webhook-config`'s, and bad values refused by
values.schema.json with the message checked. Applying the chart to a real apiserver is
tests/e2e/test_helm_chart.py.
"""

from __future__ import annotations

import base64
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.cli import gpushare
from harness.helm import CHART, run_helm, template_args
from webhook.core import builtin_kinds, load_policy_texts
from webhook.errors import PolicyError
from webhook.install import quota_objects, webhook_entries
from webhook.install.certs import certificate_pem, create_ca
from webhook.server.settings import ServeSettings

REPO = Path(__file__).resolve().parents[1]
VALUES = REPO / "tests/helm_values"
NAMESPACE = "gpushare-system"
HELM_ONLY_LABELS = {
    "app.kubernetes.io/instance",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/version",
    "helm.sh/chart",
}
WEBHOOK_KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
# The post-install admission check, in every certificate mode.
CHECK_JOB = "gpushare-admission-check"
# The suite's 300 s bound each test's body only: a cold Helm build in the fixture takes
# minutes (scripts/test builds it beforehand; the build has its own deadline).
pytestmark = pytest.mark.timeout(300, func_only=True)


@pytest.fixture(scope="module")
def helm_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("helm-home")


def render(
    helm: Path, home: Path, *values: Path, sets: tuple[str, ...] = (), namespace: str = NAMESPACE
) -> list[dict[str, Any]]:
    result = run_helm(helm, *template_args("gpushare", namespace, values, sets), home=home)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def refused(helm: Path, home: Path, *sets: str) -> str:
    result = run_helm(helm, *template_args(sets=sets), home=home)
    assert result.returncode == 1 and result.stdout == "", result.stdout
    assert "values don't meet the specifications of the schema" in result.stderr
    return result.stderr


def find(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    matches = [
        d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]
    assert len(matches) == 1, [(d["kind"], d["metadata"]["name"]) for d in docs]
    return matches[0]


def comparable(document: dict[str, Any]) -> dict[str, Any]:
    """An admission object without caBundle, cert-manager's annotation and Helm's labels."""
    labels = {k: v for k, v in document["metadata"]["labels"].items() if k not in HELM_ONLY_LABELS}
    labels.pop("app.kubernetes.io/part-of", None)
    metadata = {"name": document["metadata"]["name"], "labels": labels}
    annotations = {
        k: v
        for k, v in document["metadata"].get("annotations", {}).items()
        if k != "cert-manager.io/inject-ca-from"
    }
    if annotations:
        metadata["annotations"] = annotations
    result = {**document, "metadata": metadata}
    if "webhooks" in document:
        webhooks = []
        for webhook in document["webhooks"]:
            client = {k: v for k, v in webhook["clientConfig"].items() if k != "caBundle"}
            webhooks.append({**webhook, "clientConfig": client})
        result["webhooks"] = webhooks
    return result


def generator_output(tmp_path: Path, *args: str) -> str:
    """`gpushare webhook-config --service gpushare ARGS` (any CA), as printed."""
    if not (tmp_path / "ca.crt").exists():
        gpushare("certs", "--service", "x", "--namespace", "y", "--out", str(tmp_path))
    return gpushare(
        "webhook-config", "--ca", str(tmp_path / "ca.crt"), "--service", "gpushare", *args
    ).stdout


def generated(tmp_path: Path, *args: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(generator_output(tmp_path, *args)) if doc]


ADMISSION_KINDS = (
    *WEBHOOK_KINDS,
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
)


def chart_admission(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The chart's admission objects, in the generator's order."""
    found = [comparable(d) for d in docs if d["kind"] in ADMISSION_KINDS]
    order = {"MutatingWebhookConfiguration": 0, "ValidatingAdmissionPolicy": 1}
    order |= {"ValidatingAdmissionPolicyBinding": 2, "ValidatingWebhookConfiguration": 3}
    return sorted(found, key=lambda d: order[d["kind"]])


# -- lint and the files -----------------------------------------------------------------------


def test_helm_lint_strict_with_every_values_file(helm: Path, helm_home: Path) -> None:
    for values in [None, *sorted(VALUES.glob("*.yaml"))]:
        args = ["lint", "--strict", str(CHART), "--namespace", NAMESPACE]
        if values is not None:
            args += ["--values", str(values)]
        if values is not None and values.name == "secret.yaml":
            args += ["--set", "certificates.secret.caBundle=-----BEGIN CERTIFICATE-----"]
        result = run_helm(helm, *args, home=helm_home)
        assert result.returncode == 0, (values, result.stdout, result.stderr)
        assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout


def test_the_bundled_policies_are_a_copy_of_the_default() -> None:
    copy = CHART / "files/policies/default.yaml"
    assert copy.read_bytes() == (REPO / "policies/default.yaml").read_bytes()


# -- the webhook configurations are the generator's -------------------------------------------


def test_default_admission_objects_are_what_webhook_config_prints(
    helm: Path, helm_home: Path, tmp_path: Path
) -> None:
    docs = render(helm, helm_home)
    expected = generated(tmp_path, "--namespace", NAMESPACE)
    assert [d["kind"] for d in expected] == [
        "MutatingWebhookConfiguration",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "ValidatingWebhookConfiguration",
    ]
    assert chart_admission(docs) == [comparable(d) for d in expected]
    # certgen (the default): no caBundle until the patch Job writes it.
    for document in docs:
        if document["kind"] in WEBHOOK_KINDS:
            assert all("caBundle" not in w["clientConfig"] for w in document["webhooks"])


def test_other_namespace_failure_policy_pod_webhook_and_own_policies(
    helm: Path, helm_home: Path, tmp_path: Path
) -> None:
    policies = tmp_path / "policies"
    policies.mkdir()
    text = (REPO / "policies/default.yaml").read_text()
    settings = (
        "excludeNamespaces: [kube-system, kube-public, kube-node-lease, gpushare-system, "
        "gpushare-mps, gpushare-node]"
    )
    assert settings in text
    own = text.replace(
        settings, 'excludeNamespaces: [kube-system, monitoring, "team-*", gpushare-system]'
    )
    (policies / "default.yaml").write_text(own)
    args = ("--namespace", "gpu-ops", "--failure-policy", "Ignore", "--timeout", "10")
    args += ("--shared-resource", "nvidia.com/gpu", "--validating-webhook", "pods")
    output = tmp_path / "admission.yaml"
    output.write_text(generator_output(tmp_path, *args, "--policies", str(policies)))
    result = run_helm(
        helm,
        *template_args(namespace="gpu-ops", values=[VALUES / "production.yaml"]),
        "--set-file",
        f"policies.files.default\\.yaml={policies / 'default.yaml'}",
        "--set-file",
        f"safetyNet.generated={output}",
        home=helm_home,
    )
    assert result.returncode == 0, result.stderr
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    expected = [d for d in yaml.safe_load_all(output.read_text()) if d]
    assert chart_admission(docs) == [comparable(d) for d in expected]
    selector = find(docs, "MutatingWebhookConfiguration")["webhooks"][0]["namespaceSelector"]
    # The glob stays with the webhook; the release namespace is always excluded.
    assert selector["matchExpressions"][0]["values"] == [
        "kube-system",
        "gpu-ops",
        "gpushare-system",
        "monitoring",
    ]
    assert find(docs, "ConfigMap", "gpushare-policies")["data"] == {"default.yaml": own}


# -- certificates, three ways -----------------------------------------------------------------


def test_certgen_jobs_hooks_and_rbac_limited_to_the_named_objects(
    helm: Path, helm_home: Path
) -> None:
    docs = render(helm, helm_home)
    create = find(docs, "Job", "gpushare-certgen-create")
    patch = find(docs, "Job", "gpushare-certgen-patch")
    assert create["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert patch["metadata"]["annotations"]["helm.sh/hook"] == "post-install,post-upgrade"
    command = create["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[:3] == ["gpushare", "certs", "--in-cluster"]
    assert "--secret=gpushare-tls" in command and "--webhook-configuration=gpushare" in command
    assert "--missing-ok" in command
    assert "--missing-ok" not in patch["spec"]["template"]["spec"]["containers"][0]["command"]
    role = find(docs, "Role", "gpushare-certgen")
    assert role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["secrets"],
            "resourceNames": ["gpushare-tls"],
            "verbs": ["get", "update"],
        },
        # RBAC cannot name the object of a create: it has no name when authorised.
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
    ]
    cluster_role = find(docs, "ClusterRole", "gpushare-certgen")
    assert cluster_role["rules"] == [
        {
            "apiGroups": ["admissionregistration.k8s.io"],
            "resources": ["mutatingwebhookconfigurations", "validatingwebhookconfigurations"],
            "resourceNames": ["gpushare"],
            "verbs": ["get", "patch"],
        }
    ]
    # The RBAC exists for both hook phases and before the Jobs (lower weight).
    for kind in ("ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"):
        annotations = find(docs, kind, "gpushare-certgen")["metadata"]["annotations"]
        assert annotations["helm.sh/hook"] == "pre-install,pre-upgrade,post-install,post-upgrade"
        assert int(annotations["helm.sh/hook-weight"]) < 0
    assert not [d for d in docs if d["kind"] == "Certificate"]


RENEWAL_RBAC = ("ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding")


def test_the_renewal_cronjob_runs_the_hooks_pod_with_rbac_of_its_own(
    helm: Path, helm_home: Path
) -> None:
    """Renewal without `helm upgrade`: a CronJob whose pod is the create hook's but for its
    ServiceAccount and --renew-only in place of --missing-ok, with RBAC that is no hook's
    (the hooks' is deleted once they succeed) and names every object it reaches."""
    docs = render(helm, helm_home, sets=("certificates.secretName=team-tls",))
    cronjob = find(docs, "CronJob", "gpushare-certgen-renew")
    spec = cronjob["spec"]
    assert spec["schedule"] == "17 3 * * *"
    assert spec["concurrencyPolicy"] == "Forbid"
    assert (spec["successfulJobsHistoryLimit"], spec["failedJobsHistoryLimit"]) == (1, 3)
    job = spec["jobTemplate"]["spec"]
    assert (job["activeDeadlineSeconds"], job["backoffLimit"]) == (120, 3)
    pod = job["template"]
    hook_pod = find(docs, "Job", "gpushare-certgen-create")["spec"]["template"]
    assert pod["spec"].pop("serviceAccountName") == "gpushare-certgen-renew"
    assert hook_pod["spec"].pop("serviceAccountName") == "gpushare-certgen"
    (container,) = pod["spec"]["containers"]
    (hook_container,) = hook_pod["spec"]["containers"]
    assert container["command"][-1] == "--renew-only"
    assert hook_container["command"][-1] == "--missing-ok"
    assert "--secret=team-tls" in container["command"]
    assert container.pop("command")[:-1] == hook_container.pop("command")[:-1]
    assert pod == hook_pod  # the same image, securityContext, token, resources
    assert pod["spec"]["automountServiceAccountToken"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True

    for kind in RENEWAL_RBAC:
        metadata = find(docs, kind, "gpushare-certgen-renew")["metadata"]
        assert "helm.sh/hook" not in metadata.get("annotations", {}), kind
    assert "helm.sh/hook" not in cronjob["metadata"].get("annotations", {})
    # get/update of the one Secret, no create; get/patch of the two configurations.
    assert find(docs, "Role", "gpushare-certgen-renew")["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["secrets"],
            "resourceNames": ["team-tls"],
            "verbs": ["get", "update"],
        }
    ]
    assert find(docs, "ClusterRole", "gpushare-certgen-renew")["rules"] == [
        {
            "apiGroups": ["admissionregistration.k8s.io"],
            "resources": ["mutatingwebhookconfigurations", "validatingwebhookconfigurations"],
            "resourceNames": ["gpushare"],
            "verbs": ["get", "patch"],
        }
    ]
    for kind, role in (("RoleBinding", "Role"), ("ClusterRoleBinding", "ClusterRole")):
        binding = find(docs, kind, "gpushare-certgen-renew")
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": role,
            "name": "gpushare-certgen-renew",
        }
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "gpushare-certgen-renew", "namespace": NAMESPACE}
        ]


def test_the_renewal_schedule_and_its_names_follow_the_values(helm: Path, helm_home: Path) -> None:
    docs = render(
        helm,
        helm_home,
        sets=(
            "certificates.certgen.renewSchedule=@weekly",
            "certificates.certgen.validDays=90",
            "certificates.certgen.renewBeforeDays=20",
            "fullnameOverride=gpu-webhook",
        ),
    )
    spec = find(docs, "CronJob", "gpu-webhook-certgen-renew")["spec"]
    assert spec["schedule"] == "@weekly"
    command = spec["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert "--days=90" in command and "--renew-before-days=20" in command
    assert "--secret=gpu-webhook-tls" in command
    assert "--webhook-configuration=gpu-webhook" in command
    cluster_role = find(docs, "ClusterRole", "gpu-webhook-certgen-renew")
    assert cluster_role["rules"][0]["resourceNames"] == ["gpu-webhook"]


@pytest.mark.parametrize(
    ("values", "sets"),
    [
        ((), ("certificates.certgen.renewSchedule=",)),
        ((VALUES / "cert-manager.yaml",), ()),
        ((VALUES / "secret.yaml",), ()),
    ],
    ids=["renewSchedule-empty", "cert-manager", "secret"],
)
def test_no_renewal_cronjob_where_nothing_of_certgen_renews(
    helm: Path, helm_home: Path, tmp_path: Path, values: tuple[Path, ...], sets: tuple[str, ...]
) -> None:
    """cert-manager renews its own certificates; a Secret of yours is yours to renew; and
    renewSchedule "" leaves renewal to `helm upgrade` (NOTES says so)."""
    if VALUES / "secret.yaml" in values:
        ca = tmp_path / "ca.yaml"
        pem = certificate_pem(create_ca().certificate).decode()
        ca.write_text(yaml.safe_dump({"certificates": {"secret": {"caBundle": pem}}}))
        values = (*values, ca)
    docs = render(helm, helm_home, *values, sets=sets)
    assert not [d for d in docs if d["kind"] == "CronJob"]
    assert not [d for d in docs if d["metadata"]["name"].endswith("-certgen-renew")]


def test_cert_manager_mode(helm: Path, helm_home: Path) -> None:
    docs = render(helm, helm_home, VALUES / "cert-manager.yaml")
    # No certgen Job (the admission check's Job runs in every mode).
    assert [d["metadata"]["name"] for d in docs if d["kind"] == "Job"] == [CHECK_JOB]
    assert not [d for d in docs if d["kind"] == "Issuer"]
    certificate = find(docs, "Certificate", "gpushare-serving")
    assert certificate["spec"]["issuerRef"] == {"kind": "ClusterIssuer", "name": "corp-ca"}
    assert certificate["spec"]["secretName"] == "gpushare-tls"
    assert "gpushare.gpushare-system.svc" in certificate["spec"]["dnsNames"]
    for kind in WEBHOOK_KINDS:
        annotations = find(docs, kind)["metadata"]["annotations"]
        assert annotations == {"cert-manager.io/inject-ca-from": "gpushare-system/gpushare-serving"}
    # Without an issuerRef: the self-signed CA chain of deploy/overlays/cert-manager.
    own = render(helm, helm_home, sets=("certificates.mode=cert-manager",))
    assert {d["metadata"]["name"] for d in own if d["kind"] == "Issuer"} == {
        "gpushare-selfsigned",
        "gpushare-ca",
    }


def test_user_supplied_secret_mode(helm: Path, helm_home: Path, tmp_path: Path) -> None:
    pem = certificate_pem(create_ca().certificate).decode()
    values = tmp_path / "ca.yaml"
    values.write_text(yaml.safe_dump({"certificates": {"secret": {"caBundle": pem}}}))
    docs = render(helm, helm_home, VALUES / "secret.yaml", values)
    assert [d["metadata"]["name"] for d in docs if d["kind"] == "Job"] == [CHECK_JOB]
    assert not [d for d in docs if d["kind"] == "Certificate"]
    volumes = find(docs, "Deployment")["spec"]["template"]["spec"]["volumes"]
    assert {"name": "tls", "secret": {"secretName": "my-webhook-tls"}} in volumes
    encoded = base64.b64encode(pem.encode()).decode()
    for kind in WEBHOOK_KINDS:
        for webhook in find(docs, kind)["webhooks"]:
            assert webhook["clientConfig"]["caBundle"] == encoded


# -- the optional parts -----------------------------------------------------------------------


def test_mps_daemon_in_its_privileged_namespace(helm: Path, helm_home: Path) -> None:
    docs = render(helm, helm_home, VALUES / "mps-daemon.yaml")
    namespace = find(docs, "Namespace", "gpushare-mps")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    daemonset = find(docs, "DaemonSet", "gpushare-mps-daemon")
    assert daemonset["metadata"]["namespace"] == "gpushare-mps"
    terms = daemonset["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert terms[0]["matchExpressions"][0]["values"] == ["l4-mps"]
    # The policies follow the daemon into its namespace (no cross-namespace mounts).
    webhook_policies = find(docs, "ConfigMap", "gpushare-policies")["data"]
    assert find(docs, "ConfigMap", "gpushare-mps-policies")["data"] == webhook_policies
    assert not [d for d in render(helm, helm_home) if d["kind"] == "DaemonSet"]


def test_device_plugin_configs_from_the_generator(
    helm: Path, helm_home: Path, tmp_path: Path
) -> None:
    values = tmp_path / "dp.yaml"
    gpushare(
        "device-plugin-config",
        "--policies",
        str(REPO / "policies/examples/mps-daemon.yaml"),
        "-o",
        "helm-values",
        "--out",
        str(values),
    )
    configmap = yaml.safe_load(
        gpushare(
            "device-plugin-config", "--policies", str(REPO / "policies/examples/mps-daemon.yaml")
        ).stdout
    )
    docs = render(helm, helm_home, values)
    rendered = find(docs, "ConfigMap", "gpushare-device-plugin-configs")
    assert rendered["metadata"]["namespace"] == "gpu-operator"
    assert rendered["data"] == configmap["data"]
    assert "default" in rendered["data"]


def test_policies_from_files(helm: Path, helm_home: Path) -> None:
    example = REPO / "policies/examples/mps-daemon.yaml"
    # (The safety net compiled for these is test_other_namespace_...'s business.)
    no_net = ("safetyNet.enabled=false", "webhook.validatingWebhook=pods")
    result = run_helm(
        helm,
        *template_args(sets=no_net),
        "--set-file",
        f"policies.files.mps\\.yaml={example}",
        home=helm_home,
    )
    assert result.returncode == 0, result.stderr
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    assert find(docs, "ConfigMap", "gpushare-policies")["data"] == {"mps.yaml": example.read_text()}
    external = render(helm, helm_home, sets=("policies.existingConfigMap=team-policies", *no_net))
    assert not [d for d in external if d["kind"] == "ConfigMap"]
    volumes = find(external, "Deployment")["spec"]["template"]["spec"]["volumes"]
    assert {"name": "policies", "configMap": {"name": "team-policies"}} in volumes


def test_defaults_a_cluster_admin_expects(helm: Path, helm_home: Path) -> None:
    docs = render(helm, helm_home)
    spec = find(docs, "Deployment")["spec"]
    assert spec["replicas"] == 3
    assert spec["strategy"]["rollingUpdate"] == {"maxUnavailable": 0, "maxSurge": 1}
    pod = spec["template"]["spec"]
    assert "preferredDuringSchedulingIgnoredDuringExecution" in pod["affinity"]["podAntiAffinity"]
    assert pod["automountServiceAccountToken"] is False
    assert pod["priorityClassName"] == "system-cluster-critical"
    budget = find(docs, "PodDisruptionBudget")["spec"]
    assert (budget["maxUnavailable"], "minAvailable" in budget) == (1, False)
    assert budget["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    # No NetworkPolicy until the admin names the apiserver's addresses; the admission check
    # runs after every install and upgrade; /metrics has a port of its own.
    assert not [d for d in docs if d["kind"] == "NetworkPolicy"]
    assert find(docs, "Job", "gpushare-admission-check")
    (container,) = pod["containers"]
    assert {"name": "metrics", "containerPort": 9090, "protocol": "TCP"} in container["ports"]
    assert {"name": "GPUSHARE_METRICS_PORT", "value": "9090"} in container["env"]
    for kind in WEBHOOK_KINDS:
        for webhook in find(docs, kind)["webhooks"]:
            # The pods' webhooks, and the one charging Kueue-managed workloads their share
            # (admitted without it, a workload escapes its queue's quota), fail closed.
            closed = ("mutate.", "validate.", "kueue.")
            expected = "Fail" if webhook["name"].startswith(closed) else "Ignore"
            assert webhook["failurePolicy"] == expected


# -- scheduling and disruption: priority, the budget --------------------------------------------


@pytest.mark.parametrize(
    ("sets", "expected"),
    [
        # One replica: a minAvailable could never be met, so no drain could ever evict it.
        (("replicaCount=1",), {"maxUnavailable": 1}),
        (("replicaCount=2",), {"maxUnavailable": 1}),
        (("replicaCount=3",), {"maxUnavailable": 1}),
        # minAvailable, where set, always leaves one replica to evict.
        (("replicaCount=1", "podDisruptionBudget.minAvailable=2"), {"maxUnavailable": 1}),
        (("replicaCount=2", "podDisruptionBudget.minAvailable=2"), {"minAvailable": 1}),
        (("replicaCount=3", "podDisruptionBudget.minAvailable=2"), {"minAvailable": 2}),
        (("replicaCount=5", "podDisruptionBudget.minAvailable=3"), {"minAvailable": 3}),
        (("replicaCount=5", "podDisruptionBudget.maxUnavailable=2"), {"maxUnavailable": 2}),
    ],
)
def test_the_budget_never_blocks_a_drain(
    helm: Path, helm_home: Path, sets: tuple[str, ...], expected: dict[str, int]
) -> None:
    budget = find(render(helm, helm_home, sets=sets), "PodDisruptionBudget")["spec"]
    assert budget == {
        **expected,
        "unhealthyPodEvictionPolicy": "AlwaysAllow",
        "selector": {
            "matchLabels": {
                "app.kubernetes.io/name": "gpushare",
                "app.kubernetes.io/component": "webhook",
                "app.kubernetes.io/instance": "gpushare",
            }
        },
    }
    replicas = int(sets[0].split("=")[1])
    # Evictions a healthy Deployment allows at once: at least one, never all but where 1.
    allowed = expected.get("maxUnavailable") or replicas - expected["minAvailable"]
    assert allowed >= 1 and (replicas == 1 or allowed < replicas)


def test_production_values_keep_their_budget_within_reach(helm: Path, helm_home: Path) -> None:
    docs = render(helm, helm_home, VALUES / "production.yaml")
    assert find(docs, "Deployment")["spec"]["replicas"] == 4
    assert find(docs, "PodDisruptionBudget")["spec"]["minAvailable"] == 3
    assert not [
        d for d in render(helm, helm_home, sets=("podDisruptionBudget.enabled=false",))
        if d["kind"] == "PodDisruptionBudget"
    ]  # fmt: skip


def critical_pods_quota(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == "ResourceQuota"]


def test_priority_class_and_the_quota_that_lets_its_pods_in(helm: Path, helm_home: Path) -> None:
    """system-cluster-critical by default, with the ResourceQuota that clusters limiting its
    consumption (limitedResources; GKE) need in the namespace; "" opts out of both."""
    docs = render(helm, helm_home)
    (quota,) = critical_pods_quota(docs)
    assert quota["metadata"]["name"] == "gpushare-critical-pods"
    assert quota["metadata"]["namespace"] == NAMESPACE
    assert quota["spec"] == {
        "hard": {"pods": "1G"},
        "scopeSelector": {
            "matchExpressions": [
                {
                    "scopeName": "PriorityClass",
                    "operator": "In",
                    "values": ["system-cluster-critical"],
                }
            ]
        },
    }

    own = render(helm, helm_home, sets=("priorityClassName=gpu-infra",))
    pod = find(own, "Deployment")["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "gpu-infra"
    (quota,) = critical_pods_quota(own)
    assert quota["spec"]["scopeSelector"]["matchExpressions"][0]["values"] == ["gpu-infra"]

    none = render(helm, helm_home, sets=("priorityClassName=",))
    assert "priorityClassName" not in find(none, "Deployment")["spec"]["template"]["spec"]
    assert not critical_pods_quota(none)
    no_quota = render(helm, helm_home, sets=("priorityClassQuota=false",))
    spec = find(no_quota, "Deployment")["spec"]["template"]["spec"]
    assert spec["priorityClassName"] == "system-cluster-critical"
    assert not critical_pods_quota(no_quota)


# -- bad values fail at helm install / helm template ------------------------------------------


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (("webhook.failurePolicy=Sometimes",), "value must be one of 'Fail', 'Ignore'"),
        (("webhook.timeoutSeconds=31",), "at '/webhook/timeoutSeconds': maximum: got 31, want 30"),
        (("certificates.mode=vault",), "value must be one of 'certgen', 'cert-manager', 'secret'"),
        # Not a cron schedule of five fields or a macro: the CronJob would be refused only
        # when Helm applies it, after the hooks ran.
        *(
            (
                (f"certificates.certgen.renewSchedule={schedule}",),
                f"at '/certificates/certgen/renewSchedule': '{schedule}' does not match pattern",
            )
            for schedule in ("daily", "0 3 * *", "*/5 * * * * *", "TZ=UTC 0 3 * * *")
        ),
        (
            ("certificates.mode=secret",),
            "at '/certificates/secret/caBundle': '' does not match pattern "
            "'-----BEGIN CERTIFICATE-----'",
        ),
        (("mpsDaemon.enabled=true",), "at '/mpsDaemon/deviceConfigs': minItems: got 0, want 1"),
        (
            ("devicePluginConfig.enabled=true", "devicePluginConfig.data.x=version: v1"),
            "at '/devicePluginConfig/data': missing property 'default'",
        ),
        (("replicaCount=0",), "at '/replicaCount': minimum: got 0, want 1"),
        (("webhook.sharedResources={}",), "at '/webhook/sharedResources/0': '' does not match"),
        (("networkPolicy.apiserverCIDRs={10.0.0.0}",), "does not match pattern"),
        (
            ("networkPolicy.enabled=true",),
            "at '/networkPolicy/apiserverCIDRs': minItems: got 0, want 1",
        ),
        (("metricsPort=70000",), "at '/metricsPort': maximum: got 70,000, want 65,535"),
        (("replicas=3",), "additional properties 'replicas' not allowed"),
        (("webhook.failurepolicy=Fail",), "additional properties 'failurepolicy' not allowed"),
        (
            ("podDisruptionBudget.maxUnavailable=0",),
            "at '/podDisruptionBudget/maxUnavailable': minimum: got 0, want 1",
        ),
        (("priorityClassName=Critical_Pods",), "at '/priorityClassName': 'Critical_Pods' does"),
    ],
)
def test_bad_values_are_refused_by_the_schema(
    helm: Path, helm_home: Path, sets: tuple[str, ...], message: str
) -> None:
    assert message in refused(helm, helm_home, *sets)


def test_the_schema_is_valid_json_schema() -> None:
    import json

    import jsonschema

    schema = json.loads((CHART / "values.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    jsonschema.validate(values, schema)


def test_helm_reports_its_version(helm: Path, helm_home: Path) -> None:
    result = run_helm(helm, "version", "--short", home=helm_home)
    go_mod = (REPO / "harness/tools/helm/go.mod").read_text()
    assert result.stdout.strip() in go_mod, (result.stdout, "the -X version ldflag")
    assert isinstance(result, subprocess.CompletedProcess)


# -- the workload-template webhooks: generated from the core's table of kinds -----------------

WORKLOAD_WEBHOOKS_FILE = CHART / "files/workload-webhooks.yaml"
WORKLOAD_WEBHOOKS_HEADER = """\
# The workload-template webhooks of the ValidatingWebhookConfiguration, one per match
# condition, from the core's table of workload kinds (webhook/core/workload_kinds.yaml), for
# templates/webhookconfigurations.yaml. Generated: after changing the table, run
#   GPUSHARE_REGENERATE=1 .venv/bin/python -m pytest tests/test_helm_render.py -k workload_webhooks
"""


def test_the_workload_webhooks_are_the_generators() -> None:
    webhooks = webhook_entries(builtin_kinds())
    expected = WORKLOAD_WEBHOOKS_HEADER + yaml.safe_dump(webhooks, sort_keys=False, width=1000)
    if os.environ.get("GPUSHARE_REGENERATE") == "1":
        WORKLOAD_WEBHOOKS_FILE.write_text(expected)
    assert WORKLOAD_WEBHOOKS_FILE.read_text() == expected, (
        "files/workload-webhooks.yaml is stale: "
        + WORKLOAD_WEBHOOKS_HEADER.splitlines()[-1].lstrip("# ")
    )


OWN_KIND = """\
apiVersion: gpushare.io/v1alpha1
kind: GpuSharingSettings
metadata: {name: own-kinds}
spec:
  workloadKinds:
    - apiVersion: ml.example.com/v1
      kind: TrainingRun
      resource: trainingruns
      templates: [{path: "spec.stages[*].podTemplate", itemName: stage}]
"""


def test_own_workload_kinds_join_the_chart_through_its_values(
    helm: Path, helm_home: Path, tmp_path: Path
) -> None:
    """`webhook-config --workload-webhooks` prints the value that makes the chart's
    validating configuration the generator's for policies with their own kinds."""
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "default.yaml").write_text((REPO / "policies/default.yaml").read_text())
    (policies / "own.yaml").write_text(OWN_KIND)
    values = tmp_path / "values.yaml"
    values.write_text(
        "webhook:\n  "
        + generator_output(
            tmp_path, "--namespace", NAMESPACE, "--workload-webhooks", "--policies", str(policies)
        )
        .replace("\n", "\n  ")
        .rstrip()
        + "\n"
    )
    extra = yaml.safe_load(values.read_text())["webhook"]["extraWorkloadWebhooks"]
    assert [w["name"] for w in extra] == ["trainingruns.gpushare.io"]
    chart = chart_admission(render(helm, helm_home, values))
    expected = generated(tmp_path, "--namespace", NAMESPACE, "--policies", str(policies))
    (chart_vwc,) = [d for d in chart if d["kind"] == "ValidatingWebhookConfiguration"]
    (expected_vwc,) = [d for d in expected if d["kind"] == "ValidatingWebhookConfiguration"]
    assert chart_vwc["webhooks"] == comparable(expected_vwc)["webhooks"]


# -- the safety net: compiled from the policies by the generator ------------------------------

SAFETY_NET_FILE = CHART / "files/safety-net.yaml"
SAFETY_NET_HEADER = """\
# The ValidatingAdmissionPolicy `gpushare webhook-config` compiles from the chart's bundled
# policies (files/policies/), for templates/safety-net.yaml: printed with --failure-policy
# Fail, then Ignore (the template takes the one of webhook.failurePolicy). Generated: after
# changing the policies or the generator, run
#   GPUSHARE_REGENERATE=1 .venv/bin/python -m pytest tests/test_helm_render.py -k safety_net_file
"""


def generated_safety_net(tmp_path: Path) -> str:
    texts = []
    for failure_policy in ("Fail", "Ignore"):
        documents = generated(
            tmp_path,
            *("--namespace", NAMESPACE, "--failure-policy", failure_policy),
            *("--policies", str(CHART / "files/policies")),
        )
        (policy,) = [d for d in documents if d["kind"] == "ValidatingAdmissionPolicy"]
        texts.append(yaml.safe_dump(policy, sort_keys=False, width=1000))
    return SAFETY_NET_HEADER + "---\n".join(texts)


def test_the_bundled_safety_net_file_is_the_generator_output(tmp_path: Path) -> None:
    expected = generated_safety_net(tmp_path)
    if os.environ.get("GPUSHARE_REGENERATE") == "1":
        SAFETY_NET_FILE.write_text(expected)
    assert SAFETY_NET_FILE.read_text() == expected, (
        "files/safety-net.yaml is stale: " + SAFETY_NET_HEADER.splitlines()[-1].lstrip("# ")
    )


def test_the_safety_net_follows_the_failure_policy(
    helm: Path, helm_home: Path, tmp_path: Path
) -> None:
    """Under Ignore the chart's safety net is the one printed with --failure-policy Ignore:
    it lets an annotated pod the webhook never mutated through (no never-mutated check), as
    Ignore says. One printed for the other failure policy is refused, not rewritten."""
    docs = render(helm, helm_home, sets=("webhook.failurePolicy=Ignore",))
    expected = generated(tmp_path, "--namespace", NAMESPACE, "--failure-policy", "Ignore")
    assert chart_admission(docs) == [comparable(d) for d in expected]
    policy = find(docs, "ValidatingAdmissionPolicy")["spec"]
    assert policy["failurePolicy"] == "Ignore"
    assert not [v for v in policy["validations"] if "never mutated" in v["message"]]
    fail = find(render(helm, helm_home), "ValidatingAdmissionPolicy")["spec"]
    assert [v for v in fail["validations"] if "never mutated" in v["message"]]

    output = tmp_path / "admission.yaml"
    output.write_text(generator_output(tmp_path, "--namespace", NAMESPACE))
    result = run_helm(
        helm,
        *template_args(sets=("webhook.failurePolicy=Ignore",)),
        *("--set-file", f"safetyNet.generated={output}"),
        home=helm_home,
    )
    assert result.returncode == 1
    assert (
        "safetyNet.generated was printed with --failure-policy Fail but webhook.failurePolicy "
        "is Ignore: print it again with --failure-policy Ignore"
    ) in result.stderr


def test_own_policies_need_their_own_safety_net(
    helm: Path, helm_home: Path, tmp_path: Path
) -> None:
    result = run_helm(
        helm, *template_args(sets=("policies.existingConfigMap=team",)), home=helm_home
    )
    assert result.returncode == 1
    assert "replace the bundled policies, so the safety net compiled for those" in result.stderr
    # Without the safety net, the pod webhook must check the pods.
    message = refused(helm, helm_home, "safetyNet.enabled=false")
    assert "at '/webhook/validatingWebhook': value must be 'pods'" in message
    docs = render(
        helm,
        helm_home,
        sets=("safetyNet.enabled=false", "webhook.validatingWebhook=pods"),
    )
    assert not [d for d in docs if d["kind"].startswith("ValidatingAdmissionPolicy")]
    names = [w["name"] for w in find(docs, "ValidatingWebhookConfiguration")["webhooks"]]
    assert names[0] == "validate.gpushare.io"


# -- the quotas the policies declare: quota_objects' objects ----------------------------------

QUOTA_KINDS = ("ResourceQuota", "ResourceFlavor", "ClusterQueue", "LocalQueue")
QUOTA_POLICY = """\
apiVersion: gpushare.io/v1alpha1
kind: GpuSharingPolicy
metadata: {{name: {name}}}
spec:
  mode: time-slicing
  match: {{namespaces: [{namespaces}]}}
  pools: [{{name: half, replicas: 2}}]
  quota:
    shareResource: true
    namespaces: {quotas}
    kueue: {{clusterQueue: {name}, gpus: "{gpus}", namespaces: [{namespaces}]{resources}}}
"""
QUOTA_FILES = {
    # A settings document first, and a policy without quotas beside the declared ones.
    "teams.yaml": "---\n".join(
        [
            OWN_KIND,
            QUOTA_POLICY.format(
                name="teams",
                namespaces="team-b, team-a",
                quotas='{team-b: "1.5", team-a: "4", team-c: "0.025"}',
                gpus="8.5",
                resources=', resources: {memory: 256Gi, cpu: "64", example.com/nic: "2"}',
            ),
        ]
    ),
    "research.yaml": QUOTA_POLICY.format(
        name="research", namespaces="research", quotas='{research: "2"}', gpus="1", resources=""
    )
    + "---\n"
    + (REPO / "policies/default.yaml").read_text().split("---\n", 1)[1],
}


def quota_values(tmp_path: Path, **quotas: bool) -> Path:
    values = tmp_path / "quota-values.yaml"
    content = {
        "policies": {"files": QUOTA_FILES},
        "safetyNet": {"enabled": False},
        "webhook": {"validatingWebhook": "pods"},
        "quotas": quotas,
    }
    values.write_text(yaml.safe_dump(content))
    return values


def by_identity(documents: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The quota objects, in one order (Helm sorts its output by kind); not the quota that
    admits the webhook's own PriorityClass (test_priority_class_...)."""
    found = [
        d
        for d in documents
        if d["kind"] in QUOTA_KINDS and d["metadata"]["name"] != "gpushare-critical-pods"
    ]
    return sorted(
        found,
        key=lambda d: (d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"]),
    )


def test_the_quota_objects_are_what_quota_objects_makes_of_the_same_policies(
    helm: Path, helm_home: Path, tmp_path: Path
) -> None:
    docs = render(helm, helm_home, quota_values(tmp_path, enabled=True, kueue=True))
    labels = find(docs, "ConfigMap", "gpushare-policies")["metadata"]["labels"]
    expected = quota_objects(load_policy_texts(sorted(QUOTA_FILES.items())), labels)
    assert [d["kind"] for d in expected].count("LocalQueue") == 3
    assert by_identity(docs) == by_identity(expected)
    # Without quotas.kueue (Kueue's CRDs absent): the ResourceQuotas only.
    docs = render(helm, helm_home, quota_values(tmp_path, enabled=True))
    quotas = [d for d in expected if d["kind"] == "ResourceQuota"]
    assert [d["metadata"]["namespace"] for d in quotas] == [
        "research",  # research.yaml before teams.yaml, as the loader reads a directory
        "team-a",
        "team-b",
        "team-c",
    ]
    assert by_identity(docs) == by_identity(quotas)
    assert not by_identity(render(helm, helm_home, quota_values(tmp_path)))
    # The bundled policies declare none.
    assert not by_identity(render(helm, helm_home, sets=("quotas.enabled=true",)))


def test_quota_values_refused(helm: Path, helm_home: Path, tmp_path: Path) -> None:
    message = refused(helm, helm_home, "quotas.kueue=true")
    assert "at '/quotas/enabled': value must be true" in message
    own = ("policies.existingConfigMap=team", "safetyNet.enabled=false")
    own += ("webhook.validatingWebhook=pods", "quotas.enabled=true")
    result = run_helm(helm, *template_args(sets=own), home=helm_home)
    assert result.returncode == 1
    assert "quotas.enabled renders the quotas of the policies this chart installs" in result.stderr
    shared = QUOTA_FILES["teams.yaml"].replace('cpu: "64"', 'cpu: "64", gpushare.io/milligpu: "1"')
    values = quota_values(tmp_path, enabled=True, kueue=True)
    content = yaml.safe_load(values.read_text())
    content["policies"]["files"]["teams.yaml"] = shared
    values.write_text(yaml.safe_dump(content))
    result = run_helm(helm, *template_args(values=[values]), home=helm_home)
    assert result.returncode == 1
    # The chart says what the policy loader says (which refuses the file in the webhook).
    sentence = "gpushare.io/milligpu is the queue's GPU share, set by quota.kueue.gpus: remove it"
    assert f"teams.yaml: policy teams: spec.quota.kueue.resources: {sentence}" in result.stderr
    with pytest.raises(PolicyError) as raised:
        load_policy_texts([("teams.yaml", shared)])
    assert sentence in raised.value.problems[0]


# -- the NetworkPolicy: only with the apiserver's addresses -------------------------------------


def network_policies(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "NetworkPolicy"}


def pod_spec(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = find(docs, kind, name)["spec"]["template"]["spec"]
    return spec


WEBHOOK_PORT = [{"protocol": "TCP", "port": 8443}]


def test_the_network_policy_admits_the_addresses_given_and_nothing_else(
    helm: Path, helm_home: Path, tmp_path: Path
) -> None:
    konnectivity = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
        "podSelector": {"matchLabels": {"k8s-app": "konnectivity-agent"}},
    }
    monitoring = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "mon"}}}
    sets = ("networkPolicy.enabled=true", "networkPolicy.apiserverCIDRs={10.0.0.0/28}")
    cidrs = network_policies(render(helm, helm_home, sets=sets))
    assert set(cidrs) == {"gpushare-default-deny", "gpushare-webhook-from-apiserver"}
    assert cidrs["gpushare-default-deny"]["policyTypes"] == ["Ingress", "Egress"]
    assert cidrs["gpushare-webhook-from-apiserver"]["ingress"] == [
        {"from": [{"ipBlock": {"cidr": "10.0.0.0/28"}}], "ports": WEBHOOK_PORT}
    ]
    # Konnectivity: the agents' pods, no CIDR; Prometheus on the metrics port only.
    policy = {"enabled": True, "extraFrom": [konnectivity], "metricsFrom": [monitoring]}
    values = tmp_path / "np-values.yaml"
    values.write_text(yaml.safe_dump({"networkPolicy": policy}))
    peers = network_policies(render(helm, helm_home, values))
    assert peers["gpushare-webhook-from-apiserver"]["ingress"] == [
        {"from": [konnectivity], "ports": WEBHOOK_PORT}
    ]
    assert peers["gpushare-metrics"]["ingress"] == [
        {"from": [monitoring], "ports": [{"protocol": "TCP", "port": 9090}]}
    ]
    # No metrics port, no rule for it.
    assert "gpushare-metrics" not in network_policies(
        render(helm, helm_home, values, sets=("metricsPort=0",))
    )


def test_a_network_policy_without_addresses_is_refused_with_what_to_set(
    helm: Path, helm_home: Path
) -> None:
    """By the schema at `helm install`; by the template where the schema is skipped."""
    message = refused(helm, helm_home, "networkPolicy.enabled=true")
    assert "at '/networkPolicy/apiserverCIDRs': minItems: got 0, want 1" in message
    skipped = run_helm(
        helm, *template_args(sets=("networkPolicy.enabled=true",)), "--skip-schema-validation",
        home=helm_home,
    )  # fmt: skip
    assert skipped.returncode == 1 and skipped.stdout == ""
    assert (
        "networkPolicy.enabled needs networkPolicy.apiserverCIDRs (the CIDRs the kube-apiserver "
        "calls the webhook from) or networkPolicy.extraFrom peers" in skipped.stderr
    )
    # The MPS daemon's egress needs the apiserver's addresses too.
    peer = "networkPolicy.extraFrom[0].podSelector.matchLabels.k8s-app=konnectivity-agent"
    mps = ("mpsDaemon.enabled=true", "mpsDaemon.deviceConfigs={l4-mps}")
    sets = ("networkPolicy.enabled=true", peer, *mps)
    result = run_helm(helm, *template_args(sets=sets), home=helm_home)
    assert result.returncode == 1
    expected = "networkPolicy.enabled with mpsDaemon.enabled needs networkPolicy.apiserverCIDRs"
    assert expected in result.stderr


# -- the metrics port --------------------------------------------------------------------------


def test_the_metrics_port_is_a_setting_of_the_server_and_off_with_0(
    helm: Path, helm_home: Path
) -> None:
    (container,) = pod_spec(render(helm, helm_home, sets=("metricsPort=9191",)), "Deployment")[
        "containers"
    ]
    settings = ServeSettings.from_environ({e["name"]: e["value"] for e in container["env"]})
    assert settings.metrics_port == 9191 and settings.port == 8443
    assert {"name": "metrics", "containerPort": 9191, "protocol": "TCP"} in container["ports"]
    (off,) = pod_spec(render(helm, helm_home, sets=("metricsPort=0",)), "Deployment")["containers"]
    assert [p["name"] for p in off["ports"]] == ["https"]
    assert "GPUSHARE_METRICS_PORT" not in {e["name"] for e in off["env"]}
    clash = run_helm(helm, *template_args(sets=("metricsPort=8443",)), home=helm_home)
    assert clash.returncode == 1
    assert "metricsPort 8443 is the admission port" in clash.stderr


# -- the admission check: a hook Job after install and upgrade, a `helm test` pod -------------


def test_the_admission_check_runs_after_the_ca_bundle_with_rbac_for_one_namespace(
    helm: Path, helm_home: Path
) -> None:
    docs = render(helm, helm_home)
    job = find(docs, "Job", "gpushare-admission-check")
    test = find(docs, "Pod", "gpushare-admission-check-test")
    patch = find(docs, "Job", "gpushare-certgen-patch")
    annotations = job["metadata"]["annotations"]
    assert annotations["helm.sh/hook"] == "post-install,post-upgrade"
    assert annotations["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
    # After the patch Job has written caBundle.
    weight = int(annotations["helm.sh/hook-weight"])
    assert weight > int(patch["metadata"]["annotations"]["helm.sh/hook-weight"])
    assert test["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert job["spec"]["backoffLimit"] == 2 and job["spec"]["activeDeadlineSeconds"] == 300
    pod = job["spec"]["template"]["spec"]
    assert {k: v for k, v in test["spec"].items() if k != "activeDeadlineSeconds"} == pod
    assert pod["restartPolicy"] == "Never" and pod["automountServiceAccountToken"] is True
    (container,) = pod["containers"]
    assert container["command"] == [
        "gpushare", "check-admission", "--namespace=default", "--timeout=60",
    ]  # fmt: skip
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    # The check's own account: create on pods in the check's namespace, nothing else, only
    # while a hook runs (before the Job and the test pod: a lower weight).
    role = find(docs, "Role", "gpushare-admission-check")
    binding = find(docs, "RoleBinding", "gpushare-admission-check")
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == "default"
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]}]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": pod["serviceAccountName"], "namespace": NAMESPACE}
    ]
    for kind in ("ServiceAccount", "Role", "RoleBinding"):
        hook = find(docs, kind, "gpushare-admission-check")["metadata"]["annotations"]
        assert hook["helm.sh/hook"] == "post-install,post-upgrade,test"
        assert int(hook["helm.sh/hook-weight"]) < weight
    cluster_wide = ("ClusterRole", "ClusterRoleBinding")
    assert not [d for d in docs if d["kind"] in cluster_wide and "check" in d["metadata"]["name"]]


def test_the_admission_check_namespace_must_be_one_the_webhook_serves(
    helm: Path, helm_home: Path
) -> None:
    for namespace in (NAMESPACE, "kube-system", "kube-public"):
        sets = (f"admissionCheck.namespace={namespace}",)
        result = run_helm(helm, *template_args(sets=sets), home=helm_home)
        assert result.returncode == 1, namespace
        expected = f'admissionCheck.namespace "{namespace}" is a namespace the webhook never serves'
        assert expected in result.stderr
    sets = ("admissionCheck.namespace=gpu-check", "admissionCheck.podImage=r.example/pause:1")
    own = render(helm, helm_home, sets=sets)
    command = pod_spec(own, "Job", "gpushare-admission-check")["containers"][0]["command"]
    assert "--namespace=gpu-check" in command and "--image=r.example/pause:1" in command
    assert find(own, "Role", "gpushare-admission-check")["metadata"]["namespace"] == "gpu-check"
    off = render(helm, helm_home, sets=("admissionCheck.enabled=false",))
    assert not [d for d in off if "admission-check" in d["metadata"]["name"]]
