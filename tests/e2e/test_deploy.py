"""deploy/ against the real kube-apiserver: every manifest a cluster admin applies is accepted.

What is real and what cannot be here:
- deploy/overlays/gpushare-certs is applied for real (`kubectl apply --server-side -k`),
  after the steps its kustomization documents (certificates from `gpushare certs`,
  webhooks.yaml from `gpushare webhook-config`), in a copy of the tree: kustomize refuses
  files outside a kustomization's root, and the generated files must not land in the
  checkout. Nothing runs (no kubelet, no controller-manager), so "accepted and stored as
  written" is the check, plus the PodSecurity admission verdict on the restricted namespace.
- deploy/overlays/cert-manager needs cert-manager's CRDs, which are not installed: it is
  rendered (`kubectl kustomize`), everything but the cert-manager.io objects is applied as a
  server-side dry run, and the apiserver is shown to refuse the cert-manager kinds for
  exactly that reason.
- deploy/mps-daemon: server-side dry run here (tests/e2e/test_node_labelling.py applies it
  for real and runs the launcher with its RBAC).
"""

from __future__ import annotations

import base64
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import REPO
from kubernetes import client as k8s

from harness.api import as_json
from harness.cli import gpushare, webhook_configuration
from harness.controlplane import ControlPlane
from harness.registration import Registration
from webhook.core import builtin_kinds, load_policies
from webhook.install.certs import service_dns_names
from webhook.install.template_webhooks import template_webhooks
from webhook.server.settings import ServeSettings

DEPLOY = REPO / "deploy"
HELM_CHART = DEPLOY / "helm"
SYSTEM_NAMESPACE = "gpushare-system"
CA_INJECTION = "cert-manager.io/inject-ca-from"
CERT_MANAGER_GROUP = "cert-manager.io"
# Every kustomization a cluster admin applies; together they must reach every file.
KUSTOMIZATIONS = (
    "base",
    "overlays/gpushare-certs",
    "overlays/cert-manager",
    "mps-daemon",
    "node-agent",  # dry run below
    "dra-templates",  # applied (server-side dry run) in test_dra.py
    "dra-templates-namespaced",  # likewise, its Roles for real
    "share-capacity",  # run in tests/e2e/test_share_capacity.py
    "monitoring",  # rendered below; its kinds need the Prometheus Operator's CRDs
    # Opt-in NetworkPolicies (a component: placeholder CIDR) and the check after applying:
    # tests/e2e/test_security_posture.py and test_post_install_check.py apply them.
    "components/networkpolicy",
    "admission-check",
)
# Files the gpushare-certs overlay expects the admin to generate (git-ignored there).
GENERATED = ("ca.crt", "tls.crt", "tls.key", "webhooks.yaml")


def documents(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def kustomize(control_plane: ControlPlane, directory: Path) -> list[dict[str, Any]]:
    return documents(control_plane.kubectl("kustomize", str(directory)).stdout)


def server_side_apply(
    control_plane: ControlPlane, docs: list[dict[str, Any]], *, dry_run: bool
) -> subprocess.CompletedProcess[str]:
    args = ["apply", "--server-side", "--field-manager=e2e-deploy", "-f", "-"]
    if dry_run:
        args.append("--dry-run=server")
    return control_plane.kubectl(*args, input=yaml.safe_dump_all(docs))


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [doc for doc in docs if doc["kind"] == kind]


@pytest.fixture(scope="module", autouse=True)
def no_leftover_webhook_configurations(control_plane: ControlPlane) -> Iterator[None]:
    """The applied configurations point at a Service no pod serves here (Fail): remove
    them afterwards, or every annotated pod of a later test would be refused."""
    yield
    Registration(control_plane.api).delete("gpushare")


# -- files ----------------------------------------------------------------------------------


def test_base_policies_are_a_copy_of_the_bundled_default() -> None:
    copy = DEPLOY / "base/policies/default.yaml"
    assert not copy.is_symlink(), "kustomize refuses symlinks that leave the folder"
    assert copy.read_bytes() == (REPO / "policies/default.yaml").read_bytes()


def test_cert_manager_webhooks_are_the_generator_output_with_ca_injection(
    tmp_path: Path,
) -> None:
    """deploy/overlays/cert-manager/webhooks.yaml = `gpushare webhook-config --service
    gpushare --namespace gpushare-system --ca <any> --policies deploy/base/policies`, minus
    caBundle, plus the annotation on the webhook configurations."""
    gpushare(
        "certs", "--service", "gpushare", "--namespace", SYSTEM_NAMESPACE, "--out", str(tmp_path)
    )
    generated = documents(
        gpushare(
            "webhook-config",
            "--service",
            "gpushare",
            "--namespace",
            SYSTEM_NAMESPACE,
            "--ca",
            str(tmp_path / "ca.crt"),
            "--policies",
            str(DEPLOY / "base/policies"),
        ).stdout
    )
    for doc in generated:
        if doc["kind"].endswith("WebhookConfiguration"):
            doc["metadata"].setdefault("annotations", {})[CA_INJECTION] = (
                f"{SYSTEM_NAMESPACE}/gpushare-serving"
            )
        for webhook in doc.get("webhooks", ()):
            assert webhook["clientConfig"].pop("caBundle")

    committed = documents((DEPLOY / "overlays/cert-manager/webhooks.yaml").read_text())

    assert committed == generated
    certificates = documents((DEPLOY / "overlays/cert-manager/certificates.yaml").read_text())
    names = {doc["metadata"]["name"] for doc in certificates if doc["kind"] == "Certificate"}
    assert "gpushare-serving" in names


def test_the_kustomizations_reach_every_file_under_deploy(control_plane: ControlPlane) -> None:
    """No manifest or policy under deploy/ is left out of what the tests below apply."""
    reached: set[Path] = set()
    for name in KUSTOMIZATIONS:
        pending = [DEPLOY / name]
        while pending:
            folder = pending.pop()
            kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
            reached.add(folder / "kustomization.yaml")
            # Components (kind: Component) are kustomizations too (deploy/mps-daemon's
            # network-policy).
            for resource in [
                *kustomization.get("resources", []),
                *kustomization.get("components", []),
            ]:
                path = (folder / resource).resolve()
                if path.is_dir():
                    pending.append(path)
                else:
                    reached.add(path)
            for generator in [
                *kustomization.get("configMapGenerator", []),
                *kustomization.get("secretGenerator", []),
            ]:
                reached.update((folder / f).resolve() for f in generator.get("files", []))

    present = {
        p.resolve()
        for p in DEPLOY.rglob("*")
        if p.is_file()
        and p.name != ".gitignore"
        and p.parent.name != "__pycache__"
        # The Helm chart is no kustomization: tests/test_helm_render.py renders every file.
        and HELM_CHART not in p.parents
    }
    generated = {(DEPLOY / "overlays/gpushare-certs" / f).resolve() for f in GENERATED}

    assert present - generated <= reached
    assert generated <= reached


# -- certificates from `gpushare certs`: applied for real -----------------------------------


@pytest.fixture(scope="module")
def gpushare_certs_overlay(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of deploy/ with the overlay's documented steps done in it."""
    root = tmp_path_factory.mktemp("deploy") / "deploy"
    shutil.copytree(DEPLOY / "base", root / "base")
    shutil.copytree(DEPLOY / "certgen-renew", root / "certgen-renew")
    shutil.copytree(DEPLOY / "overlays/gpushare-certs", root / "overlays/gpushare-certs")
    overlay = root / "overlays/gpushare-certs"
    certs = root.parent / "certs"
    gpushare("certs", "--service", "gpushare", "--namespace", SYSTEM_NAMESPACE, "--out", str(certs))
    for name in ("ca.crt", "tls.crt", "tls.key"):
        shutil.copy(certs / name, overlay / name)
    config = gpushare(
        "webhook-config",
        "--ca",
        str(certs / "ca.crt"),
        "--service",
        "gpushare",
        "--namespace",
        SYSTEM_NAMESPACE,
        "--policies",
        str(root / "base/policies"),
    )
    (overlay / "webhooks.yaml").write_text(config.stdout)
    return overlay


@pytest.fixture(scope="module")
def applied(
    control_plane: ControlPlane, gpushare_certs_overlay: Path
) -> subprocess.CompletedProcess[str]:
    return control_plane.kubectl("apply", "--server-side", "-k", str(gpushare_certs_overlay))


def test_gpushare_certs_overlay_is_applied_server_side(
    applied: subprocess.CompletedProcess[str],
) -> None:
    expected = [
        "namespace/gpushare-system",
        "serviceaccount/gpushare",
        "configmap/gpushare-policies",
        "secret/gpushare-tls",
        "service/gpushare",
        "deployment.apps/gpushare",
        "poddisruptionbudget.policy/gpushare",
        "resourcequota/gpushare-critical-pods",
        "mutatingwebhookconfiguration.admissionregistration.k8s.io/gpushare",
        "validatingadmissionpolicy.admissionregistration.k8s.io/gpushare",
        "validatingadmissionpolicybinding.admissionregistration.k8s.io/gpushare",
        "validatingwebhookconfiguration.admissionregistration.k8s.io/gpushare",
        # deploy/certgen-renew: the renewal CronJob and its RBAC (test_cert_renewal.py).
        "serviceaccount/gpushare-certgen-renew",
        "role.rbac.authorization.k8s.io/gpushare-certgen-renew",
        "rolebinding.rbac.authorization.k8s.io/gpushare-certgen-renew",
        "clusterrole.rbac.authorization.k8s.io/gpushare-certgen-renew",
        "clusterrolebinding.rbac.authorization.k8s.io/gpushare-certgen-renew",
        "cronjob.batch/gpushare-certgen-renew",
    ]
    lines = applied.stdout.splitlines()
    for name in expected:
        assert f"{name} serverside-applied" in lines, applied.stdout
    assert len(lines) == len(expected), applied.stdout
    # The namespace enforces the restricted Pod Security Standard; PodSecurity admission
    # checks the Deployment's pod template against it and would warn here.
    assert "would violate PodSecurity" not in applied.stderr
    assert "Warning" not in applied.stderr, applied.stderr


def test_stored_deployment_is_what_the_issue_asks_for(
    applied: subprocess.CompletedProcess[str], control_plane: ControlPlane
) -> None:
    """3 replicas, no unavailability in rollouts, system-cluster-critical, anti-affinity,
    readiness on /readyz, a preStop delay, a restricted securityContext, resources; and its
    env is settings the server accepts, pointing into its mounts."""
    apps = k8s.AppsV1Api(control_plane.api)
    deployment = as_json(
        control_plane.api, apps.read_namespaced_deployment("gpushare", SYSTEM_NAMESPACE)
    )
    spec = deployment["spec"]
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    assert spec["replicas"] == 3
    assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert pod["priorityClassName"] == "system-cluster-critical"
    assert pod["affinity"]["podAntiAffinity"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["lifecycle"]["preStop"]["sleep"]["seconds"] > 0
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["resources"]["requests"] and container["resources"]["limits"]

    env = {e["name"]: e["value"] for e in container["env"]}
    settings = ServeSettings.from_environ(env)
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert settings.tls_cert.parent == settings.tls_key.parent == Path(mounts["tls"])
    assert volumes["tls"]["secret"]["secretName"] == "gpushare-tls"
    assert settings.policies == Path(mounts["policies"])
    assert volumes["policies"]["configMap"]["name"] == "gpushare-policies"
    # The webhook's own namespace is excluded by the one setting, the policies it serves.
    assert (
        SYSTEM_NAMESPACE in load_policies(REPO / "deploy" / "base" / "policies").excluded_namespaces
    )
    port = next(p for p in container["ports"] if p["name"] == "https")
    assert port["containerPort"] == settings.port
    # /metrics alone over plain HTTP, on the port named for scrapers.
    metrics = next(p for p in container["ports"] if p["name"] == "metrics")
    assert metrics["containerPort"] == settings.metrics_port == 9090


def test_stored_service_secret_policies_and_webhooks_fit_together(
    applied: subprocess.CompletedProcess[str],
    control_plane: ControlPlane,
    gpushare_certs_overlay: Path,
) -> None:
    api = control_plane.api
    core = k8s.CoreV1Api(api)
    admission = k8s.AdmissionregistrationV1Api(api)
    secret = as_json(api, core.read_namespaced_secret("gpushare-tls", SYSTEM_NAMESPACE))
    assert secret["type"] == "kubernetes.io/tls"
    for name in ("ca.crt", "tls.crt", "tls.key"):
        assert (
            base64.b64decode(secret["data"][name]) == (gpushare_certs_overlay / name).read_bytes()
        )
    policies = as_json(api, core.read_namespaced_config_map("gpushare-policies", SYSTEM_NAMESPACE))
    assert policies["data"] == {"default.yaml": (REPO / "policies/default.yaml").read_text()}
    service = as_json(api, core.read_namespaced_service("gpushare", SYSTEM_NAMESPACE))
    (port,) = service["spec"]["ports"]
    assert (port["port"], port["targetPort"]) == (443, "https")
    budget = as_json(
        api,
        k8s.PolicyV1Api(api).read_namespaced_pod_disruption_budget("gpushare", SYSTEM_NAMESPACE),
    )
    # One replica at a time, whatever the replica count: never a budget that blocks a drain.
    assert budget["spec"]["maxUnavailable"] == 1 and "minAvailable" not in budget["spec"]
    assert budget["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    # The quota that admits pods of the webhook's PriorityClass where its use is limited.
    quota = as_json(
        api, core.read_namespaced_resource_quota("gpushare-critical-pods", SYSTEM_NAMESPACE)
    )
    assert quota["spec"]["scopeSelector"]["matchExpressions"] == [
        {"scopeName": "PriorityClass", "operator": "In", "values": ["system-cluster-critical"]}
    ]

    ca_bundle = base64.b64encode((gpushare_certs_overlay / "ca.crt").read_bytes()).decode()
    for configuration in (
        admission.read_mutating_webhook_configuration("gpushare"),
        admission.read_validating_webhook_configuration("gpushare"),
    ):
        webhooks = {w["name"]: w for w in as_json(api, configuration)["webhooks"]}
        for name, webhook in webhooks.items():
            assert webhook["clientConfig"]["caBundle"] == ca_bundle, name
            # Pods go to /mutate and /validate; workload templates are checked at /validate,
            # and those Kueue manages get their share at /mutate.
            path = "/mutate" if name.startswith(("mutate.", "kueue.")) else "/validate"
            assert webhook["clientConfig"]["service"] == {
                "name": "gpushare",
                "namespace": SYSTEM_NAMESPACE,
                "path": path,
                "port": 443,
            }, name
            assert webhook["matchConditions"], name
        if "mutate.gpushare.io" in webhooks:
            assert webhooks["mutate.gpushare.io"]["failurePolicy"] == "Fail"
            assert webhooks["kueue.gpushare.io"]["failurePolicy"] == "Fail"
    # The pods' checks after mutation are the safety-net policy's (no CA, no call); the
    # validating configuration holds the workload-template webhooks.
    assert set(webhooks) == {w.name for w in template_webhooks(builtin_kinds())}
    assert {"workloads.gpushare.io", "rayclusters.gpushare.io"} <= set(webhooks)
    policy = as_json(api, admission.read_validating_admission_policy("gpushare"))
    binding = as_json(api, admission.read_validating_admission_policy_binding("gpushare"))
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert binding["spec"] == {"policyName": "gpushare", "validationActions": ["Deny"]}


def test_the_url_and_service_configurations_differ_only_in_where_they_call(
    gpushare_certs_overlay: Path,
) -> None:
    """What the other e2e tests register (`--url`) is the deployed configuration (`--service`)
    but for clientConfig and the Service's own namespace in the exclusions (which the default
    policies exclude as well): they prove the same filters, failure policy and reinvocation
    policy a cluster gets."""
    deployed = documents((gpushare_certs_overlay / "webhooks.yaml").read_text())
    local = webhook_configuration(
        gpushare_certs_overlay / "ca.crt",
        "https://127.0.0.1:8443",
        "--policies",
        str(gpushare_certs_overlay.parent.parent / "base/policies"),
    )
    where = ("clientConfig", "namespaceSelector")
    for service_doc, url_doc in zip(deployed, local, strict=True):
        if "webhooks" not in service_doc:  # the safety-net policy and binding: no call
            if service_doc["kind"] == "ValidatingAdmissionPolicy":
                service_selector = service_doc["spec"]["matchConstraints"].pop("namespaceSelector")
                url_selector = url_doc["spec"]["matchConstraints"].pop("namespaceSelector")
                assert (
                    service_selector["matchExpressions"][1:] == url_selector["matchExpressions"][1:]
                )
            assert service_doc == url_doc
            continue
        hooks = zip(service_doc["webhooks"], url_doc["webhooks"], strict=True)
        for service_hook, url_hook in hooks:
            assert "service" in service_hook["clientConfig"]
            assert "url" in url_hook["clientConfig"]
            service_expr, service_opt_out = service_hook["namespaceSelector"]["matchExpressions"]
            url_expr, url_opt_out = url_hook["namespaceSelector"]["matchExpressions"]
            assert set(service_expr["values"]) == set(url_expr["values"]) | {SYSTEM_NAMESPACE}
            assert (
                service_opt_out
                == url_opt_out
                == {
                    "key": "gpushare.io/webhook",
                    "operator": "NotIn",
                    "values": ["exclude"],
                }
            )
            assert {k: v for k, v in service_hook.items() if k not in where} == {
                k: v for k, v in url_hook.items() if k not in where
            }


# -- certificates from cert-manager: rendered and dry-run -----------------------------------


def test_cert_manager_overlay_renders_and_all_but_cert_manager_kinds_dry_run(
    control_plane: ControlPlane,
) -> None:
    rendered = kustomize(control_plane, DEPLOY / "overlays/cert-manager")
    cert_manager = [d for d in rendered if d["apiVersion"].startswith(f"{CERT_MANAGER_GROUP}/")]
    rest = [d for d in rendered if d not in cert_manager]

    assert {d["kind"] for d in cert_manager} == {"Issuer", "Certificate"}
    webhooks = [d for d in rendered if d["kind"].endswith("WebhookConfiguration")]
    assert len(webhooks) == 2
    for doc in webhooks:
        assert (
            doc["metadata"]["annotations"][CA_INJECTION] == f"{SYSTEM_NAMESPACE}/gpushare-serving"
        )
        assert all("caBundle" not in w["clientConfig"] for w in doc["webhooks"])
    (serving,) = [d for d in cert_manager if d["metadata"]["name"] == "gpushare-serving"]
    assert set(service_dns_names("gpushare", SYSTEM_NAMESPACE)) <= set(serving["spec"]["dnsNames"])
    (deployment,) = by_kind(rendered, "Deployment")
    (tls,) = [v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "tls"]
    assert tls["secret"]["secretName"] == serving["spec"]["secretName"]

    # Namespaced objects cannot be dry-run into a namespace that does not exist.
    server_side_apply(control_plane, by_kind(rendered, "Namespace"), dry_run=False)
    result = server_side_apply(control_plane, rest, dry_run=True)
    assert result.stdout.count("serverside-applied (server dry run)") == len(rest), result.stdout
    assert "Warning" not in result.stderr, result.stderr

    refused = control_plane.kubectl(
        "apply", "--server-side", "--dry-run=server", "-f", "-",
        input=yaml.safe_dump_all(cert_manager), check=False,
    )  # fmt: skip
    assert refused.returncode != 0
    assert f'no matches for kind "Certificate" in version "{CERT_MANAGER_GROUP}/v1"' in (
        refused.stderr
    )


# -- the node-side MPS daemon: dry-run ------------------------------------------------------


def test_mps_daemon_dry_runs(control_plane: ControlPlane) -> None:
    rendered = kustomize(control_plane, DEPLOY / "mps-daemon")
    namespaces = by_kind(rendered, "Namespace")
    # Client-side apply for the namespace, as test_node_labelling applies the whole folder.
    control_plane.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(namespaces))
    rest = [d for d in rendered if d["kind"] != "Namespace"]

    result = server_side_apply(control_plane, rest, dry_run=True)

    assert result.stdout.count("serverside-applied (server dry run)") == len(rest), result.stdout
    assert {d["kind"] for d in rest} >= {"DaemonSet", "ServiceAccount", "ClusterRole", "ConfigMap"}


def test_node_agent_dry_runs(control_plane: ControlPlane) -> None:
    rendered = kustomize(control_plane, DEPLOY / "node-agent")
    control_plane.kubectl(
        "apply", "-f", "-", input=yaml.safe_dump_all(by_kind(rendered, "Namespace"))
    )
    rest = [d for d in rendered if d["kind"] != "Namespace"]

    result = server_side_apply(control_plane, rest, dry_run=True)

    assert result.stdout.count("serverside-applied (server dry run)") == len(rest), result.stdout
    assert {d["kind"] for d in rest} == {
        "DaemonSet", "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
    }  # fmt: skip


def test_the_monitoring_kustomization_renders_the_dashboard_alerts_and_scrapes(
    control_plane: ControlPlane,
) -> None:
    """deploy/monitoring through the real kustomize: the dashboard JSON unchanged in a
    ConfigMap labelled for Grafana's sidecar, the PrometheusRule, a PodMonitor per target.
    (tests/test_monitoring.py checks what the expressions in them read.)"""
    rendered = kustomize(control_plane, DEPLOY / "monitoring")
    kinds = sorted((d["kind"], d["metadata"]["name"]) for d in rendered)
    assert [kind for kind, _ in kinds] == [
        "ConfigMap",
        "PodMonitor",
        "PodMonitor",
        "PodMonitor",
        "PrometheusRule",
    ]
    (dashboard,) = [d for d in rendered if d["kind"] == "ConfigMap"]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboard["data"]["gpushare-dashboard.json"] == (
        DEPLOY / "monitoring/gpushare-dashboard.json"
    ).read_text(encoding="utf-8")
    assert all(d["metadata"].get("namespace") for d in rendered)
