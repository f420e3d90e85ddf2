"""deploy/helm/gpushare installed with the real Helm into a real kube-apiserver, answering pods.

What is real: Helm (built from helm.sh/helm/v3), `helm install` and `helm upgrade` against the
harness's kube-apiserver and etcd, the certgen hook Jobs' own command (`gpushare certs
--in-cluster`, taken from the rendered Jobs) run as a process with the token of the chart's
certgen ServiceAccount (so the chart's RBAC is what allows it), the webhook (`gpushare
serve`) on the Secret that command wrote and the policies ConfigMap the chart installed, and
the apiserver calling it through the chart's Service and webhook configurations.

What cannot be here, and what stands in: no kubelet or controllers run, so Helm installs with
--no-hooks (it would wait for the hook Jobs forever) and the test runs each Job's command at
the point Helm would; no pod of the Deployment starts, so the webhook runs as a local process
and an EndpointSlice, which the EndpointSlice controller would write for the ready pods, points
the chart's Service at it. The apiserver of this module runs with
--enable-aggregator-routing=true, so it resolves the Service to that endpoint as a cluster
without kube-proxy on the control plane must (kube-aggregator's NewEndpointServiceResolver;
otherwise it dials the Service's cluster IP, routed by kube-proxy). Endpoints may not be
loopback addresses (ValidateEndpointIP), so the webhook listens on this machine's own IPv4
address.

Helm 3 installs client-side; every values file's rendering is also applied server-side (dry
run, kubectl's strict field validation) so the real API validates each object it holds.

Also here, because it needs the harness's kubectl (kustomize): the kustomize bases and the
chart render the same objects (tests/test_helm_render.py holds the chart's admission objects
equal to `gpushare webhook-config`).
"""

from __future__ import annotations

import base64
import json
import shutil
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import REPO, unique_name
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from harness.api import create_pod, status_message
from harness.cli import clean_environment
from harness.controlplane import ControlPlane
from harness.helm import CHART, run_helm, template_args
from harness.processes import free_ports
from harness.webhookserver import GPUSHARE, WebhookServer
from webhook.constants import APPLIED_ANNOTATION, FRACTION_ANNOTATION

RELEASE = "gpushare"
NAMESPACE = "gpushare-system"
SERVICE_HOST = f"{RELEASE}.{NAMESPACE}.svc"
SHARED_RESOURCE = "nvidia.com/gpu.shared"
HELM_ONLY_LABELS = {
    "app.kubernetes.io/instance",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/version",
    "helm.sh/chart",
}
IN_FORCE_TIMEOUT_S = 30.0


def machine_ipv4() -> str:
    """This machine's outbound IPv4 address (a UDP connect sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("198.51.100.1", 9))  # TEST-NET-2: only routing is asked
        except OSError:
            pytest.skip("this machine has no non-loopback IPv4 address for an endpoint")
        address: str = probe.getsockname()[0]
    if address.startswith("127."):
        pytest.skip("this machine has no non-loopback IPv4 address for an endpoint")
    return address


@pytest.fixture(scope="module")
def plane(harness_binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A control plane of its own: aggregator routing, and a Fail webhook pointing at a
    Service that the other modules must never meet."""
    workdir = tmp_path_factory.mktemp("helm-plane")
    with ControlPlane(
        binary=harness_binary,
        workdir=workdir,
        with_scheduler=False,
        extra_apiserver_flags=("--enable-aggregator-routing=true",),
    ) as plane:
        yield plane


def helm_cli(helm: Path, plane: ControlPlane, home: Path, *args: str) -> str:
    result = run_helm(helm, *args, "--kubeconfig", str(plane.kubeconfig), home=home)
    assert result.returncode == 0, result.stderr
    return result.stdout


def documents(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def certgen_command(rendered: list[dict[str, Any]], job: str) -> list[str]:
    (document,) = [d for d in rendered if d["kind"] == "Job" and d["metadata"]["name"] == job]
    command: list[str] = document["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[:2] == ["gpushare", "certs"]
    return command[1:]


def token_kubeconfig(plane: ControlPlane, path: Path, service_account: str) -> Path:
    """A kubeconfig with a bound token of `service_account` (TokenRequest)."""
    request = k8s.AuthenticationV1TokenRequest(
        spec=k8s.V1TokenRequestSpec(audiences=[], expiration_seconds=600)
    )
    token = (
        k8s.CoreV1Api(plane.api)
        .create_namespaced_service_account_token(service_account, NAMESPACE, request)
        .status.token
    )
    ca = base64.b64encode(plane.pki.ca_cert.read_bytes()).decode()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "e2e", "cluster": {"server": plane.server, "certificate-authority-data": ca}}
        ],
        "users": [{"name": service_account, "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "e2e", "user": service_account}}],
        "current-context": "sa",
    }
    path.write_text(yaml.safe_dump(config))
    return path


def run_certgen(args: list[str], kubeconfig: Path) -> subprocess.CompletedProcess[str]:
    environment = clean_environment()
    for proxy in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        environment.pop(proxy, None)
    return subprocess.run(
        [*GPUSHARE, *args, f"--kubeconfig={kubeconfig}"],
        capture_output=True,
        text=True,
        timeout=120,
        env=environment,
        cwd=REPO,
        check=False,
    )


def ca_bundles(plane: ControlPlane) -> dict[str, set[str]]:
    admission = k8s.AdmissionregistrationV1Api(plane.api)
    bundles: dict[str, set[str]] = {}
    for kind, read in (
        ("Mutating", admission.read_mutating_webhook_configuration),
        ("Validating", admission.read_validating_webhook_configuration),
    ):
        stored = read(RELEASE)
        bundles[kind] = {w.client_config.ca_bundle or "" for w in stored.webhooks}
    return bundles


def readyz(port: int, ca_file: Path) -> bool:
    """GET /readyz over TLS, verifying the certificate for the Service's name."""
    context = ssl.create_default_context(cafile=str(ca_file))
    try:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
            context.wrap_socket(raw, server_hostname=SERVICE_HOST) as tls,
        ):
            tls.sendall(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            return tls.recv(64).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


def wait_until(what: str, check: Any, timeout: float = IN_FORCE_TIMEOUT_S) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.2)


def annotated_pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": {FRACTION_ANNOTATION: "0.5"}},
        "spec": {"containers": [{"name": "cuda", "image": "nvcr.io/nvidia/cuda:12.6.3-base"}]},
    }


def test_helm_install_certgen_and_the_webhook_answering_through_the_chart(
    helm: Path, plane: ControlPlane, tmp_path: Path
) -> None:
    home = tmp_path / "helm-home"
    host = machine_ipv4()
    rendered = documents(run_helm(helm, *template_args(RELEASE, NAMESPACE), home=home).stdout)
    core = k8s.CoreV1Api(plane.api)
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=NAMESPACE)))

    # 1. pre-install: the hook RBAC, then the create Job's command as its ServiceAccount.
    hooks = [
        d
        for d in rendered
        # Not the Jobs, nor the admission check's `helm test` pod: their commands run below.
        if d["kind"] not in ("Job", "Pod")
        and "helm.sh/hook" in d["metadata"].get("annotations", {})
    ]
    assert {d["kind"] for d in hooks} == {
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "ClusterRole",
        "ClusterRoleBinding",
    }
    plane.kubectl(
        "apply", "--server-side", "--field-manager=helm-hooks", "-f", "-",
        input=yaml.safe_dump_all(hooks),
    )  # fmt: skip
    as_certgen = token_kubeconfig(plane, tmp_path / "certgen.kubeconfig", f"{RELEASE}-certgen")
    create = run_certgen(certgen_command(rendered, f"{RELEASE}-certgen-create"), as_certgen)
    assert create.returncode == 0, create.stderr
    assert f"created Secret {NAMESPACE}/{RELEASE}-tls (no Secret yet)" in create.stdout
    assert f"no MutatingWebhookConfiguration {RELEASE} yet" in create.stdout

    # 2. helm install: every object of the chart stored by the real apiserver.
    install = helm_cli(
        helm, plane, home, "install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--no-hooks"
    )
    assert "STATUS: deployed" in install
    notes = install.split("NOTES:", 1)[1]
    assert 'gpu-fraction: "0.5"' in notes
    assert f"kubectl -n {NAMESPACE} rollout status deployment/{RELEASE}" in notes
    stored = {
        (kind, name)
        for kind, name in (
            (d["kind"], d["metadata"]["name"])
            for d in documents(
                helm_cli(helm, plane, home, "get", "manifest", RELEASE, "-n", NAMESPACE)
            )
        )
    }
    assert {
        ("Deployment", RELEASE),
        ("Service", RELEASE),
        ("PodDisruptionBudget", RELEASE),
        ("ResourceQuota", f"{RELEASE}-critical-pods"),
        ("ConfigMap", f"{RELEASE}-policies"),
        ("MutatingWebhookConfiguration", RELEASE),
        ("ValidatingAdmissionPolicy", RELEASE),
        ("ValidatingAdmissionPolicyBinding", RELEASE),
        ("ValidatingWebhookConfiguration", RELEASE),
    } <= stored
    assert ca_bundles(plane) == {"Mutating": {""}, "Validating": {""}}

    # 3. post-install: the patch Job's command writes the Secret's CA into caBundle.
    patch = run_certgen(certgen_command(rendered, f"{RELEASE}-certgen-patch"), as_certgen)
    assert patch.returncode == 0, patch.stderr
    assert f"kept Secret {NAMESPACE}/{RELEASE}-tls: valid until" in patch.stdout
    assert f"patched caBundle of MutatingWebhookConfiguration {RELEASE}" in patch.stdout
    secret = core.read_namespaced_secret(f"{RELEASE}-tls", NAMESPACE)
    assert secret.type == "kubernetes.io/tls"
    ca_b64 = secret.data["ca.crt"]
    assert ca_bundles(plane) == {"Mutating": {ca_b64}, "Validating": {ca_b64}}

    # The same token may read its own Secret, and no other.
    core.create_namespaced_secret(
        NAMESPACE,
        k8s.V1Secret(metadata=k8s.V1ObjectMeta(name="someone-elses"), string_data={"a": "b"}),
    )
    foreign = run_certgen(
        [
            "certs", "--in-cluster", "--service", RELEASE, "--namespace", NAMESPACE,
            "--secret", "someone-elses", "--webhook-configuration", RELEASE,
        ],
        as_certgen,
    )  # fmt: skip
    assert foreign.returncode == 1
    assert f"Cannot read Secret {NAMESPACE}/someone-elses: HTTP 403 Forbidden." in foreign.stderr
    assert "lacks the RBAC the chart's certgen Role and ClusterRole grant" in foreign.stderr
    untouched = core.read_namespaced_secret("someone-elses", NAMESPACE)
    assert base64.b64decode(untouched.data["a"]) == b"b"

    # 4. The webhook, on the Secret and the chart's policies, behind the chart's Service.
    certs = tmp_path / "tls"
    certs.mkdir()
    for key in ("ca.crt", "tls.crt", "tls.key"):
        (certs / key).write_bytes(base64.b64decode(secret.data[key]))
    (certs / "tls.key").chmod(0o600)
    policies = tmp_path / "policies"
    policies.mkdir()
    for name, text in core.read_namespaced_config_map(
        f"{RELEASE}-policies", NAMESPACE
    ).data.items():
        (policies / name).write_text(text)
    (port,) = free_ports(1)
    server = WebhookServer.launch(
        tmp_path / "serve", policies, certs, port=port, extra_args=("--host", "0.0.0.0")
    )
    try:
        wait_until(
            "gpushare serve /readyz",
            lambda: server.check_alive() or readyz(port, certs / "ca.crt"),
            60,
        )
        service = core.read_namespaced_service(RELEASE, NAMESPACE)
        assert service.spec.ports[0].port == 443 and service.spec.ports[0].name == "https"
        # What the EndpointSlice controller writes for a ready pod of the Deployment.
        k8s.DiscoveryV1Api(plane.api).create_namespaced_endpoint_slice(
            NAMESPACE,
            k8s.V1EndpointSlice(
                metadata=k8s.V1ObjectMeta(
                    name=f"{RELEASE}-local", labels={"kubernetes.io/service-name": RELEASE}
                ),
                address_type="IPv4",
                endpoints=[
                    k8s.V1Endpoint(
                        addresses=[host], conditions=k8s.V1EndpointConditions(ready=True)
                    )
                ],
                ports=[k8s.DiscoveryV1EndpointPort(name="https", port=port, protocol="TCP")],
            ),
        )
        namespace = unique_name("helm")
        core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=namespace)))

        def mutated() -> dict[str, Any] | None:
            try:
                pod = create_pod(
                    plane.api, namespace, annotated_pod(unique_name("half")), dry_run=True
                ).pod
            except ApiException as error:
                # Until the informers see the EndpointSlice and caBundle: Fail refuses.
                assert error.status in (500, 403), status_message(error)
                return None
            return pod

        wait_until("the webhook answering through the chart's Service", mutated)
        # The post-install admission check, as its hook Job runs it: the Job's command with
        # its ServiceAccount's token (the chart's Role: create on pods in `default` only).
        check_job = f"{RELEASE}-admission-check"
        (check_command,) = [
            d["spec"]["template"]["spec"]["containers"][0]["command"]
            for d in rendered
            if d["kind"] == "Job" and d["metadata"]["name"] == check_job
        ]
        assert check_command[:2] == ["gpushare", "check-admission"]
        as_check = token_kubeconfig(plane, tmp_path / "check.kubeconfig", check_job)
        checked = run_certgen(check_command[1:], as_check)
        assert checked.returncode == 0, checked.stderr
        assert "check-admission: passed: a dry-run pod annotated gpu-fraction 0.5 in " in (
            checked.stdout
        )
        admitted = create_pod(plane.api, namespace, annotated_pod("half-a-gpu")).pod
        record = json.loads(admitted["metadata"]["annotations"][APPLIED_ANNOTATION])
        assert record["resource"] == SHARED_RESOURCE
        limits = admitted["spec"]["containers"][0]["resources"]["limits"]
        assert limits[SHARED_RESOURCE] == "1"

        # 5. helm upgrade keeps the caBundle (Helm's 3-way merge leaves fields it never
        # wrote), and the Jobs' commands, run again, change nothing.
        helm_cli(
            helm, plane, home, "upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE,
            "--no-hooks", "--set", "replicaCount=4",
        )  # fmt: skip
        assert ca_bundles(plane) == {"Mutating": {ca_b64}, "Validating": {ca_b64}}
        again = run_certgen(certgen_command(rendered, f"{RELEASE}-certgen-create"), as_certgen)
        assert again.returncode == 0, again.stderr
        assert "kept Secret" in again.stdout
        assert f"MutatingWebhookConfiguration {RELEASE} already trusts the CA" in again.stdout
        after = core.read_namespaced_secret(f"{RELEASE}-tls", NAMESPACE)
        assert after.metadata.resource_version == secret.metadata.resource_version
        assert create_pod(plane.api, namespace, annotated_pod("second")).pod["metadata"][
            "annotations"
        ][APPLIED_ANNOTATION]

        # 6. A certificate inside the renewal window is replaced (a new CA), and caBundle
        # carries the new CA and the old one: the replica still serving the old certificate
        # (the kubelet refreshes a mounted Secret only after a while) keeps answering.
        renew = [*certgen_command(rendered, f"{RELEASE}-certgen-create"), "--days=800"]
        renew.append("--renew-before-days=400")  # the 365-day certificate is inside
        renewed = run_certgen(renew, as_certgen)
        assert renewed.returncode == 0, renewed.stderr
        assert "expires" in renewed.stdout and "within the renewal window" in renewed.stdout
        assert f"patched caBundle of MutatingWebhookConfiguration {RELEASE}" in renewed.stdout
        new_ca = core.read_namespaced_secret(f"{RELEASE}-tls", NAMESPACE).data["ca.crt"]
        assert new_ca != ca_b64
        both = base64.b64encode(base64.b64decode(new_ca) + base64.b64decode(ca_b64)).decode()
        assert ca_bundles(plane) == {"Mutating": {both}, "Validating": {both}}
        wait_until("the old certificate trusted through the rotation", mutated)
    finally:
        server.stop()


# -- the kustomize bases and the chart ---------------------------------------------------------


def normalised(documents_: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """Objects by (kind, name), without what only Helm adds (its labels, the instance in
    selectors) and without comments' effect (YAML already drops them)."""

    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            kept = {k: strip(v) for k, v in value.items() if k not in HELM_ONLY_LABELS}
            # Helm's hook annotations (the admission check's objects are hooks in the chart).
            if isinstance(kept.get("annotations"), dict):
                hooks = {k for k in kept["annotations"] if k.startswith("helm.sh/hook")}
                kept["annotations"] = {
                    k: v for k, v in kept["annotations"].items() if k not in hooks
                }
                if hooks and not kept["annotations"]:
                    del kept["annotations"]
            return kept
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    return {(d["kind"], d["metadata"]["name"]): strip(d) for d in documents_}


def test_the_kustomize_overlay_and_the_chart_render_the_same_objects(
    helm: Path, plane: ControlPlane, tmp_path: Path
) -> None:
    """deploy/overlays/cert-manager (base + cert-manager) against the chart in cert-manager
    mode: the chart's defaults are the base's settings, so every object both render is equal
    once Helm's own labels are set aside. The admission objects are the generator's in both,
    each held to `gpushare webhook-config` on its own (tests/test_helm_render.py for the
    chart, tests/e2e/test_deploy.py for the overlay), so here they only need to be there.
    The opt-in parts too: the NetworkPolicies (deploy/components/networkpolicy, its
    placeholder CIDR given to the chart) and the admission check (deploy/admission-check;
    hooks in the chart, plus its `helm test` pod)."""
    shutil.copytree(REPO / "deploy", tmp_path / "deploy")
    overlay = tmp_path / "opted-in"  # beside the copy: kustomize refuses absolute bases
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "resources": ["../deploy/overlays/cert-manager", "../deploy/admission-check"],
                "components": ["../deploy/components/networkpolicy"],
            }
        )
    )
    kustomized = normalised(documents(plane.kubectl("kustomize", str(overlay)).stdout))
    sets = ("certificates.mode=cert-manager", "networkPolicy.enabled=true")
    sets += ("networkPolicy.apiserverCIDRs={192.0.2.0/24}",)
    chart = normalised(
        documents(
            run_helm(helm, *template_args(RELEASE, NAMESPACE, sets=sets), home=tmp_path).stdout
        )
    )
    del chart[("Pod", f"{RELEASE}-admission-check-test")]
    # The Namespace: Helm installs into one (--create-namespace); NOTES says how to label it.
    assert set(kustomized) - set(chart) == {("Namespace", NAMESPACE)}
    assert set(chart) == set(kustomized) - {("Namespace", NAMESPACE)}
    admission = {
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    }
    compared = [key for key in chart if key[0] not in admission]
    # 6 of the base, 4 of cert-manager, 2 NetworkPolicies, 4 of the admission check
    assert len(compared) == 16, compared
    different = [key for key in compared if chart[key] != kustomized[key]]
    assert not different, {key: (kustomized[key], chart[key]) for key in different}
    for key in chart:
        if key[0] in admission:  # the same filters, wherever they sit
            assert chart[key]["metadata"]["labels"] == kustomized[key]["metadata"]["labels"]


def test_the_mps_daemon_kustomization_and_the_chart_render_the_same_objects(
    helm: Path, plane: ControlPlane, tmp_path: Path
) -> None:
    """deploy/mps-daemon (with its network-policy component) against the chart with the MPS
    daemon on, the same policy file and image: equal but for two deliberate differences,
    rewritten here: the chart's policies ConfigMap has a stable name (kustomize adds a hash
    suffix) and the chart states imagePullPolicy."""
    kustomized = normalised(
        documents(plane.kubectl("kustomize", str(REPO / "deploy/mps-daemon")).stdout)
    )
    policy = REPO / "deploy/mps-daemon/policies/mps-daemon.yaml"
    sets = (
        "mpsDaemon.enabled=true",
        "mpsDaemon.deviceConfigs={l4-mps}",
        "image.repository=gpushare",
        "safetyNet.enabled=false",  # the webhook's half is not compared here
        "webhook.validatingWebhook=pods",
        # The component's RFC 1918 ranges (the chart's NetworkPolicies are opt-in).
        "networkPolicy.enabled=true",
        "networkPolicy.apiserverCIDRs={10.0.0.0/8,172.16.0.0/12,192.168.0.0/16}",
        # The component's scrapers on 9400: the namespace monitoring's Prometheus pods.
        "networkPolicy.metricsFrom[0].namespaceSelector.matchLabels"
        ".kubernetes\\.io/metadata\\.name=monitoring",
        "networkPolicy.metricsFrom[0].podSelector.matchLabels.app\\.kubernetes\\.io/name=prometheus",
    )
    rendered = run_helm(
        helm,
        *template_args(RELEASE, NAMESPACE, sets=sets),
        "--set-file",
        f"policies.files.mps-daemon\\.yaml={policy}",
        home=tmp_path,
    )
    assert rendered.returncode == 0, rendered.stderr
    chart = {
        key: doc
        for key, doc in normalised(documents(rendered.stdout)).items()
        if doc["metadata"].get("namespace") == "gpushare-mps"
        or key in {("Namespace", "gpushare-mps")}
        or key[1] == "gpushare-mps-daemon"
    }
    (hashed,) = [key for key in kustomized if key[0] == "ConfigMap"]
    assert hashed[1].startswith("gpushare-mps-policies-")
    configmap = kustomized.pop(hashed)
    configmap["metadata"]["name"] = "gpushare-mps-policies"
    kustomized[("ConfigMap", "gpushare-mps-policies")] = configmap
    pod = kustomized[("DaemonSet", "gpushare-mps-daemon")]["spec"]["template"]["spec"]
    for volume in pod["volumes"]:
        if volume.get("configMap", {}).get("name") == hashed[1]:
            volume["configMap"]["name"] = "gpushare-mps-policies"
    pod["containers"][0]["imagePullPolicy"] = "IfNotPresent"
    assert set(chart) == set(kustomized)
    different = [key for key in chart if chart[key] != kustomized[key]]
    assert not different, {key: (kustomized[key], chart[key]) for key in different}


def test_the_dra_templates_kustomizations_and_the_chart_render_the_same_objects(
    helm: Path, plane: ControlPlane, tmp_path: Path
) -> None:
    """deploy/dra-templates against the chart's reconciler with a ClusterRole (the dra
    example's glob), and deploy/dra-templates-namespaced against it over a policy naming the
    overlay's two namespaces (a Role in each): equal once Helm's labels are set aside."""

    def keyed(documents_: list[dict[str, Any]]) -> dict[tuple[str, str, str], Any]:
        """By (kind, namespace, name): the Roles share a name across namespaces."""
        found = {}
        for document in documents_:
            (stripped,) = normalised([document]).values()
            metadata = document["metadata"]
            found[(document["kind"], metadata.get("namespace", ""), metadata["name"])] = stripped
        return found

    def chart(policy: Path, *sets: str) -> dict[tuple[str, str, str], Any]:
        result = run_helm(
            helm,
            *template_args(
                RELEASE,
                NAMESPACE,
                sets=(
                    "draReconciler.enabled=true",
                    "safetyNet.enabled=false",
                    "webhook.validatingWebhook=pods",
                    *sets,
                ),
            ),
            "--set-file",
            f"policies.files.dra\\.yaml={policy}",
            home=tmp_path,
        )
        assert result.returncode == 0, result.stderr
        ours = [
            d for d in documents(result.stdout) if d["metadata"]["name"].endswith("dra-templates")
        ]
        return keyed(ours)

    example = REPO / "policies/examples/dra.yaml"
    kustomized = keyed(
        documents(plane.kubectl("kustomize", str(REPO / "deploy/dra-templates")).stdout)
    )
    assert {k[0] for k in kustomized} == {
        "ClusterRole", "ClusterRoleBinding", "Deployment", "ServiceAccount",
    }  # fmt: skip
    assert chart(example) == kustomized
    named = tmp_path / "named.yaml"
    named.write_text(
        example.read_text().replace('["gpu-dra-*"]', "[gpu-dra-team-a, gpu-dra-team-b]")
    )
    overlay = keyed(
        documents(plane.kubectl("kustomize", str(REPO / "deploy/dra-templates-namespaced")).stdout)
    )
    assert {k[0] for k in overlay} == {"Deployment", "Role", "RoleBinding", "ServiceAccount"}
    assert chart(named) == overlay


# Kinds whose CustomResourceDefinitions come with cert-manager, not with Kubernetes.
CERT_MANAGER_KINDS = {"Certificate", "Issuer"}


@pytest.mark.parametrize(
    "values", [None, "production.yaml", "cert-manager.yaml", "mps-daemon.yaml", "secret.yaml"]
)
def test_every_rendered_object_is_accepted_by_a_server_side_apply(
    helm: Path, plane: ControlPlane, tmp_path: Path, values: str | None
) -> None:
    """`helm template` with each values file, applied server-side (dry run) to the real
    apiserver: every object passes the API's own validation, not only the chart's schema."""
    files = [] if values is None else [REPO / "tests/helm_values" / values]
    if values == "secret.yaml":  # its caBundle must be a PEM certificate: any CA will do
        ca = tmp_path / "ca.yaml"
        pem = plane.pki.ca_cert.read_text()
        ca.write_text(yaml.safe_dump({"certificates": {"secret": {"caBundle": pem}}}))
        files.append(ca)
    result = run_helm(helm, *template_args("ssa", "gpushare-ssa", files), home=tmp_path / "home")
    assert result.returncode == 0, result.stderr
    rendered = documents(result.stdout)
    namespaces = {"gpushare-ssa"} | {
        d["metadata"]["namespace"] for d in rendered if d["metadata"].get("namespace")
    }
    core = k8s.CoreV1Api(plane.api)
    existing = {n.metadata.name for n in core.list_namespace().items}
    for name in sorted(namespaces - existing):
        core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name)))
    applied = [d for d in rendered if d["kind"] not in CERT_MANAGER_KINDS]
    skipped = {d["kind"] for d in rendered} & CERT_MANAGER_KINDS
    assert bool(skipped) == (values == "cert-manager.yaml"), skipped  # only that mode has them
    applied_result = plane.kubectl(
        "apply", "--server-side", "--dry-run=server", "--force-conflicts",
        "--field-manager=ssa-check", "-f", "-",
        input=yaml.safe_dump_all(applied), check=False,
    )  # fmt: skip
    assert applied_result.returncode == 0, applied_result.stderr
    lines = [line for line in applied_result.stdout.splitlines() if line.strip()]
    assert len(lines) == len(applied), applied_result.stdout
    assert all("serverside-applied (server dry run)" in line for line in lines), lines
