"""The serving certificate renewed with no `helm upgrade`: the renewal CronJob, through the
real kube-apiserver, with a certificate that expires during the test.

A release nobody upgrades must not end with the apiserver refusing every annotated pod
(failurePolicy Fail) the day its certificate expires. The chart's CronJob
`<fullname>-certgen-renew` (templates/certgen-renew.yaml) and deploy/certgen-renew, which
deploy/overlays/gpushare-certs includes, run `gpushare certs --in-cluster --renew-only` on a
schedule. For each way to install (the chart with `helm install`, the overlay with `kubectl
apply --server-side -k`), the test:

1. installs gpushare with a Secret whose serving certificate expires LEAF_LIFETIME after it
   is issued (its CA has years left), as a year-old installation looks near its end, and
   the caBundle trusting that CA; runs `gpushare serve` on the Secret's files laid out as a
   kubelet mounts a Secret, behind the installation's Service (an EndpointSlice, as in
   tests/e2e/test_helm_chart.py, whose module docstring says why this apiserver runs with
   --enable-aggregator-routing and why the webhook listens on this machine's address);
2. sees an annotated pod mutated through the apiserver, then, once the certificate has
   expired, refused: the apiserver's TLS handshake with the webhook fails on the expiry;
3. runs the command of the stored CronJob, as a process with a token of the CronJob's
   ServiceAccount (so its RBAC, and nothing more, is what allows it): the Secret holds a
   new CA and certificate, and the caBundle of every webhook the new CA followed by the old
   one (a replica still serving the old certificate stays trusted across the switch);
4. swaps the mounted files as the kubelet does (`..data`), and the apiserver calls the
   webhook again: the annotated pod is mutated;
5. runs the CronJob's command again: nothing due, nothing written (no resourceVersion moves);
   for the overlay, applies it again as docs/deploying.md says to after a renewal (its old
   files conflict and put nothing back; copied from the Secret, they apply);
6. checks the ServiceAccount's rights with the apiserver's authorizer (its Secret and the two
   configurations, by name, and nothing else: no create, no other Secret) and that
   --renew-only, with the Secret gone, creates none and says who does.

What stands in: no kube-controller-manager or kubelet runs, so the test runs the CronJob's
command at the point its Job's pod would and moves the mounted files itself. The server runs
with --keepalive 1 so that the apiserver makes a new TLS handshake for each call, as it does
once its idle connections to a replica are gone: a certificate is checked at the handshake.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
import shutil
import socket
import ssl
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import REPO, unique_name
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from harness.api import create_pod, status_message
from harness.cli import clean_environment, gpushare
from harness.controlplane import ControlPlane
from harness.helm import CHART, run_helm, template_args
from harness.processes import free_ports
from harness.registration import Registration
from harness.webhookserver import GPUSHARE, WebhookServer
from webhook.constants import APPLIED_ANNOTATION, FRACTION_ANNOTATION
from webhook.install.certs import (
    Issued,
    certificate_pem,
    create_ca,
    private_key_pem,
    service_dns_names,
)

DEPLOY = REPO / "deploy"
# Long enough to see the webhook answer before it expires (applying, starting the server);
# every second of it is a second the test waits.
LEAF_LIFETIME = dt.timedelta(seconds=20)
WAIT_S = 45.0
HELM_ONLY_LABELS = {
    "app.kubernetes.io/instance",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/version",
    "helm.sh/chart",
}
RENEWAL_KINDS = (
    "ServiceAccount",
    "Role",
    "RoleBinding",
    "ClusterRole",
    "ClusterRoleBinding",
    "CronJob",
)


@dataclass(frozen=True)
class Installation:
    """Where one way of installing put the webhook: every name the renewal touches."""

    namespace: str
    fullname: str  # the Service and the two webhook configurations
    secret: str
    policies: Path

    @property
    def renewal(self) -> str:
        return f"{self.fullname}-certgen-renew"


# -- certificates ----------------------------------------------------------------------------


def short_lived_serving_certificate(ca: Issued, names: list[str]) -> Issued:
    """What `webhook.install.certs.issue_serving_certificate` issues, but ending
    LEAF_LIFETIME from now (it counts in days)."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[-1])]))
        .issuer_name(ca.certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + LEAF_LIFETIME)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), critical=False
        )
        .sign(ca.key, hashes.SHA256())
    )
    return Issued(key, certificate)


def expiring_files(namespace: str, service: str) -> dict[str, bytes]:
    """ca.crt (ten years), tls.crt (LEAF_LIFETIME), tls.key: a Secret's data."""
    ca = create_ca()
    leaf = short_lived_serving_certificate(ca, service_dns_names(service, namespace))
    return {
        "ca.crt": certificate_pem(ca.certificate),
        "tls.crt": certificate_pem(leaf.certificate),
        "tls.key": private_key_pem(leaf.key),
    }


def not_after(pem: bytes) -> dt.datetime:
    return x509.load_pem_x509_certificate(pem).not_valid_after_utc


class SecretMount:
    """A directory laid out as the kubelet mounts a Secret: each key a symlink through
    `..data` to a timestamped directory, swapped in one rename on update."""

    def __init__(self, path: Path, data: dict[str, bytes]) -> None:
        self.path = path
        path.mkdir()
        self.generation = 0
        self._write(data)
        for name in data:
            (path / name).symlink_to(f"..data/{name}")

    def update(self, data: dict[str, bytes]) -> None:
        self._write(data)

    def _write(self, data: dict[str, bytes]) -> None:
        self.generation += 1
        target = self.path / f"..generation_{self.generation}"
        target.mkdir()
        for name, content in data.items():
            (target / name).write_bytes(content)
            (target / name).chmod(0o600)
        staging = self.path / "..data_tmp"
        staging.symlink_to(target.name)
        os.replace(staging, self.path / "..data")


# -- the cluster ------------------------------------------------------------------------------


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
    """A control plane of its own: aggregator routing, and Fail webhooks that the other
    modules must never meet."""
    with ControlPlane(
        binary=harness_binary,
        workdir=tmp_path_factory.mktemp("renewal-plane"),
        with_scheduler=False,
        extra_apiserver_flags=("--enable-aggregator-routing=true",),
    ) as plane:
        yield plane


def documents(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def cronjob_command(plane: ControlPlane, where: Installation) -> list[str]:
    """The command of the CronJob as the apiserver stored it, without `gpushare`."""
    stored = k8s.BatchV1Api(plane.api).read_namespaced_cron_job(where.renewal, where.namespace)
    pod = stored.spec.job_template.spec.template.spec
    assert pod.service_account_name == where.renewal
    command: list[str] = pod.containers[0].command
    assert command[:3] == ["gpushare", "certs", "--in-cluster"] and "--renew-only" in command
    return command[1:]


def run_as(args: list[str], kubeconfig: Path) -> subprocess.CompletedProcess[str]:
    environment = clean_environment()
    for proxy in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        environment.pop(proxy, None)
    return subprocess.run(
        [*GPUSHARE, *args, f"--kubeconfig={kubeconfig}"],
        capture_output=True,
        text=True,
        timeout=60,
        env=environment,
        cwd=REPO,
        check=False,
    )


def secret_data(plane: ControlPlane, where: Installation) -> tuple[dict[str, bytes], str]:
    secret = k8s.CoreV1Api(plane.api).read_namespaced_secret(where.secret, where.namespace)
    data = {key: base64.b64decode(value) for key, value in secret.data.items()}
    return data, secret.metadata.resource_version


def configurations(plane: ControlPlane, where: Installation) -> list[Any]:
    admission = k8s.AdmissionregistrationV1Api(plane.api)
    return [
        admission.read_mutating_webhook_configuration(where.fullname),
        admission.read_validating_webhook_configuration(where.fullname),
    ]


def ca_bundles(plane: ControlPlane, where: Installation) -> set[bytes]:
    return {
        base64.b64decode(webhook.client_config.ca_bundle or "")
        for configuration in configurations(plane, where)
        for webhook in configuration.webhooks
    }


def patch_ca_bundles(plane: ControlPlane, where: Installation, ca: bytes) -> None:
    """The caBundle the chart's post-install hook wrote a year ago."""
    admission = k8s.AdmissionregistrationV1Api(plane.api)
    encoded = base64.b64encode(ca).decode()
    for configuration, patch in zip(
        configurations(plane, where),
        (
            admission.patch_mutating_webhook_configuration,
            admission.patch_validating_webhook_configuration,
        ),
        strict=True,
    ):
        operations = [
            {"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": encoded}
            for i in range(len(configuration.webhooks))
        ]
        patch(where.fullname, operations, _content_type="application/json-patch+json")


def wait_until(what: str, check: Callable[[], Any], timeout: float = WAIT_S) -> Any:
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


def admission(plane: ControlPlane, namespace: str) -> tuple[bool, str]:
    """A dry-run create of an annotated pod: (mutated, or the apiserver's refusal)."""
    try:
        pod = create_pod(plane.api, namespace, annotated_pod(unique_name("half")), dry_run=True)
    except ApiException as error:
        return False, status_message(error)
    record = json.loads(pod.pod["metadata"]["annotations"][APPLIED_ANNOTATION])
    return True, record["resource"]


# -- the two ways to install ------------------------------------------------------------------


def install_with_helm(
    helm: Path, plane: ControlPlane, tmp_path: Path
) -> tuple[Installation, dict[str, bytes]]:
    """`helm install` (hooks not run: no job controller here), then the Secret and caBundle
    the hooks made long ago, their certificate now near its end."""
    release, namespace = "renewal", "gpushare-renewal"
    home = tmp_path / "helm-home"
    core = k8s.CoreV1Api(plane.api)
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=namespace)))
    installed = run_helm(
        helm, "install", release, str(CHART), "--namespace", namespace, "--no-hooks",
        "--kubeconfig", str(plane.kubeconfig), home=home,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr
    fullname = f"{release}-gpushare"
    policies = tmp_path / "policies"
    policies.mkdir()
    configmap = core.read_namespaced_config_map(f"{fullname}-policies", namespace)
    for name, text in configmap.data.items():
        (policies / name).write_text(text)
    where = Installation(namespace, fullname, f"{fullname}-tls", policies)
    files = expiring_files(namespace, fullname)
    core.create_namespaced_secret(
        namespace,
        k8s.V1Secret(
            metadata=k8s.V1ObjectMeta(name=where.secret),
            type="kubernetes.io/tls",
            data={key: base64.b64encode(value).decode() for key, value in files.items()},
        ),
    )
    patch_ca_bundles(plane, where, files["ca.crt"])
    return where, files


def install_with_kustomize(
    helm: Path, plane: ControlPlane, tmp_path: Path
) -> tuple[Installation, dict[str, bytes]]:
    """deploy/overlays/gpushare-certs as docs/deploying.md applies it (in a copy of deploy/:
    the generated files must not land in the checkout), with the expiring certificate as
    the one `gpushare certs` wrote."""
    namespace, service = "gpushare-system", "gpushare"
    root = tmp_path / "deploy"
    for part in ("base", "certgen-renew", "overlays/gpushare-certs"):
        shutil.copytree(DEPLOY / part, root / part)
    overlay = root / "overlays/gpushare-certs"
    files = expiring_files(namespace, service)
    for name, content in files.items():
        (overlay / name).write_bytes(content)
    config = gpushare(
        "webhook-config", "--ca", str(overlay / "ca.crt"), "--service", service,
        "--namespace", namespace, "--policies", str(root / "base/policies"),
    )  # fmt: skip
    (overlay / "webhooks.yaml").write_text(config.stdout)
    plane.kubectl("apply", "--server-side", "-k", str(overlay))
    return Installation(namespace, service, f"{service}-tls", root / "base/policies"), files


INSTALLS = {"helm": install_with_helm, "kustomize": install_with_kustomize}


@pytest.mark.parametrize("way", sorted(INSTALLS))
def test_an_expired_certificate_is_renewed_by_the_cronjob_and_the_webhook_answers_again(
    helm: Path, plane: ControlPlane, tmp_path: Path, way: str
) -> None:
    where, files = INSTALLS[way](helm, plane, tmp_path)
    core = k8s.CoreV1Api(plane.api)
    old_ca, old_leaf = files["ca.crt"], files["tls.crt"]
    expires = not_after(old_leaf)
    pods = unique_name("renewal-pods")
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=pods)))
    host = machine_ipv4()
    mount = SecretMount(tmp_path / "tls", files)
    (port,) = free_ports(1)
    server = WebhookServer.launch(
        tmp_path / "serve",
        where.policies,
        mount.path,
        port=port,
        extra_args=("--host", "0.0.0.0", "--keepalive", "1"),
    )
    try:
        # What the EndpointSlice controller writes for a ready pod of the Deployment.
        k8s.DiscoveryV1Api(plane.api).create_namespaced_endpoint_slice(
            where.namespace,
            k8s.V1EndpointSlice(
                metadata=k8s.V1ObjectMeta(
                    name=f"{where.fullname}-local",
                    labels={"kubernetes.io/service-name": where.fullname},
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

        # 2. Answering while the certificate is valid; refused once it has expired.
        def answers() -> str | None:
            server.check_alive()
            mutated, detail = admission(plane, pods)
            return detail if mutated else None

        wait_until("the webhook answering through the Service", answers)
        assert dt.datetime.now(dt.UTC) < expires, "LEAF_LIFETIME is too short for this machine"
        time.sleep(max((expires - dt.datetime.now(dt.UTC)).total_seconds(), 0) + 1)

        def refused_for_expiry() -> str | None:
            mutated, detail = admission(plane, pods)
            return detail if not mutated and "certificate has expired" in detail else None

        refusal = wait_until("the apiserver refusing the expired certificate", refused_for_expiry)
        assert 'failed calling webhook "mutate.gpushare.io"' in refusal

        # 3. The CronJob's command, as its ServiceAccount.
        as_cronjob = plane.service_account_kubeconfig(
            where.namespace, where.renewal, tmp_path / "renew.kubeconfig", expiration_seconds=600
        )
        command = cronjob_command(plane, where)
        renewed = run_as(command, as_cronjob)
        assert renewed.returncode == 0, renewed.stderr
        assert (
            f"renewed Secret {where.namespace}/{where.secret} (tls.crt expires "
            f"{expires:%Y-%m-%d}, within the renewal window); valid until" in renewed.stdout
        ), renewed.stdout
        for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            assert f"patched caBundle of {kind} {where.fullname}" in renewed.stdout
        new, version = secret_data(plane, where)
        assert new["ca.crt"] != old_ca and new["tls.crt"] != old_leaf
        new_leaf = x509.load_pem_x509_certificate(new["tls.crt"])
        new_leaf.verify_directly_issued_by(x509.load_pem_x509_certificate(new["ca.crt"]))
        assert new_leaf.not_valid_after_utc - dt.datetime.now(dt.UTC) > dt.timedelta(days=364)
        # The new CA, then the old one, in every webhook of both configurations.
        assert ca_bundles(plane, where) == {new["ca.crt"] + old_ca}
        assert not admission(plane, pods)[0], "the server still serves the expired pair"

        # 4. The kubelet refreshes the mounted Secret; the next handshake has the new pair.
        mount.update(new)
        wait_until("the webhook answering with the renewed certificate", answers)
        assert served_certificate(port) == new_leaf

        # 5. Nothing due: the next run writes nothing.
        versions = [c.metadata.resource_version for c in configurations(plane, where)]
        again = run_as(command, as_cronjob)
        assert again.returncode == 0, again.stderr
        assert f"kept Secret {where.namespace}/{where.secret}: valid until" in again.stdout
        for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            assert f"{kind} {where.fullname} already trusts the CA" in again.stdout
        assert secret_data(plane, where)[1] == version
        assert [c.metadata.resource_version for c in configurations(plane, where)] == versions

        if way == "kustomize":
            overlay_applied_again(plane, tmp_path / "deploy/overlays/gpushare-certs", where, new)
            wait_until("the webhook answering after the overlay is applied again", answers)
    finally:
        server.stop()
        Registration(plane.api).delete(where.fullname)

    # 6. Its rights: the Secret and the configurations by name, nothing RBAC cannot name.
    check_rights(plane, where)
    core.delete_namespaced_secret(where.secret, where.namespace)
    missing = run_as(command, as_cronjob)
    assert missing.returncode == 1
    assert f"No Secret {where.namespace}/{where.secret} to renew: --renew-only" in missing.stderr
    with pytest.raises(ApiException) as gone:
        core.read_namespaced_secret(where.secret, where.namespace)
    assert gone.value.status == 404


def overlay_applied_again(
    plane: ControlPlane, overlay: Path, where: Installation, renewed: dict[str, bytes]
) -> None:
    """docs/deploying.md, the overlay applied again after a renewal: its old files conflict
    with the renewal's writes (field manager gpushare-certs) and put nothing back; with the
    Secret's files copied into it and webhooks.yaml generated from that CA, an apply with
    --force-conflicts goes through and changes no certificate."""
    stale = plane.kubectl("apply", "--server-side", "-k", str(overlay), check=False)
    assert stale.returncode != 0
    assert 'conflicts with "gpushare-certs" using v1:\n- .data.ca.crt' in stale.stderr
    assert 'conflicts with "gpushare-certs" using admissionregistration' in stale.stderr
    assert secret_data(plane, where)[0] == renewed

    for key in ("ca.crt", "tls.crt", "tls.key"):
        jsonpath = "jsonpath={.data." + key.replace(".", "\\.") + "}"
        encoded = plane.kubectl(
            "-n", where.namespace, "get", "secret", where.secret, "-o", jsonpath
        ).stdout  # fmt: skip
        (overlay / key).write_bytes(base64.b64decode(encoded))
    config = gpushare(
        "webhook-config", "--ca", str(overlay / "ca.crt"), "--service", where.fullname,
        "--namespace", where.namespace, "--policies", str(where.policies),
    )  # fmt: skip
    (overlay / "webhooks.yaml").write_text(config.stdout)
    forced = plane.kubectl(
        "apply", "--server-side", "--force-conflicts", "-k", str(overlay), check=False
    )
    assert forced.returncode == 0, forced.stderr
    assert secret_data(plane, where)[0] == renewed
    assert ca_bundles(plane, where) == {renewed["ca.crt"]}


def served_certificate(port: int) -> x509.Certificate:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)


def check_rights(plane: ControlPlane, where: Installation) -> None:
    user = f"system:serviceaccount:{where.namespace}:{where.renewal}"
    groups = [
        "system:serviceaccounts",
        f"system:serviceaccounts:{where.namespace}",
        "system:authenticated",
    ]
    secrets = ("", "secrets", where.namespace)
    configs = ("admissionregistration.k8s.io", "mutatingwebhookconfigurations", "")
    validating = ("admissionregistration.k8s.io", "validatingwebhookconfigurations", "")
    expected = {
        ("get", *secrets, where.secret): True,
        ("update", *secrets, where.secret): True,
        ("get", *configs, where.fullname): True,
        ("patch", *configs, where.fullname): True,
        ("patch", *validating, where.fullname): True,
        ("create", *secrets, ""): False,
        ("list", *secrets, ""): False,
        ("get", *secrets, "someone-elses"): False,
        ("delete", *secrets, where.secret): False,
        ("patch", *secrets, where.secret): False,
        ("patch", *configs, "someone-elses"): False,
        ("delete", *configs, where.fullname): False,
        ("update", *configs, where.fullname): False,
        ("create", "batch", "jobs", where.namespace, ""): False,
        ("get", "", "configmaps", where.namespace, f"{where.fullname}-policies"): False,
    }
    answers = {}
    for verb, group, resource, namespace, name in expected:
        review = k8s.V1SubjectAccessReview(
            spec=k8s.V1SubjectAccessReviewSpec(
                user=user,
                groups=groups,
                resource_attributes=k8s.V1ResourceAttributes(
                    verb=verb,
                    group=group,
                    resource=resource,
                    namespace=namespace or None,
                    name=name or None,
                ),
            )
        )
        answer = k8s.AuthorizationV1Api(plane.api).create_subject_access_review(review)
        answers[(verb, group, resource, namespace, name)] = bool(answer.status.allowed)
    assert answers == expected

    # Exactly these rules: everything it may do in its namespace (cluster-wide rules
    # included), less what a ServiceAccount of another namespace may do anyway.
    admission = "admissionregistration.k8s.io"
    assert rules_of(plane, user, where.namespace) - rules_of(
        plane, "system:serviceaccount:default:nobody", where.namespace
    ) == {
        ("", "secrets", "get", where.secret),
        ("", "secrets", "update", where.secret),
        *(
            (admission, resource, verb, where.fullname)
            for resource in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations")
            for verb in ("get", "patch")
        ),
    }


def rules_of(plane: ControlPlane, user: str, namespace: str) -> set[tuple[str, str, str, str]]:
    """(group, resource, verb, name) `user` may use in `namespace`, as the apiserver lists
    them for the user itself: a SelfSubjectRulesReview sent impersonating it."""
    api = plane.api_client()
    api.set_default_header("Impersonate-User", user)  # the apiserver adds its groups
    try:
        review = k8s.AuthorizationV1Api(api).create_self_subject_rules_review(
            k8s.V1SelfSubjectRulesReview(spec=k8s.V1SelfSubjectRulesReviewSpec(namespace=namespace))
        )
    finally:
        api.close()  # type: ignore[no-untyped-call]
    assert not review.status.incomplete, review.status.evaluation_error
    return {
        (group, resource, verb, name)
        for rule in review.status.resource_rules
        for group in rule.api_groups or [""]
        for resource in rule.resources or []
        for verb in rule.verbs
        for name in rule.resource_names or [""]
    }


# -- the overlay's renewal is the chart's -----------------------------------------------------


def normalised(documents_: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in HELM_ONLY_LABELS}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    return {(d["kind"], d["metadata"]["name"]): strip(d) for d in documents_}


def test_deploy_certgen_renew_is_the_charts_renewal(
    helm: Path, plane: ControlPlane, tmp_path: Path
) -> None:
    """deploy/certgen-renew and the chart's renewal objects (release gpushare in
    gpushare-system, the base's names) are equal once Helm's own labels are set aside."""
    kustomized = normalised(
        documents(plane.kubectl("kustomize", str(DEPLOY / "certgen-renew")).stdout)
    )
    rendered = run_helm(helm, *template_args(), home=tmp_path)
    assert rendered.returncode == 0, rendered.stderr
    chart = {
        key: doc
        for key, doc in normalised(documents(rendered.stdout)).items()
        if key[1] == "gpushare-certgen-renew"
    }
    assert sorted(kind for kind, _ in chart) == sorted(RENEWAL_KINDS)
    assert set(kustomized) == set(chart)
    different = [key for key in chart if chart[key] != kustomized[key]]
    assert not different, {key: (kustomized[key], chart[key]) for key in different}
