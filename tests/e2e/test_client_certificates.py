"""The apiserver proves who it is: gpushare serving with `--client-ca`.

A control plane of its own starts kube-apiserver with an AdmissionConfiguration whose
kubeConfigFile gives it a client certificate for webhook calls (the documented way:
https://kubernetes.io/docs/reference/access-authn-authz/extensible-admission-controllers/#authenticate-apiservers).
gpushare, started with the CA of that certificate as `--client-ca`, must admit through
it exactly as without; a webhook call without the certificate is refused (the server tests
show the 403 and the failed handshake for a stranger's certificate).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from conftest import unique_name
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from pods import annotated_pod, plain_pod

from harness.api import create_pod, ensure_namespace
from harness.cli import webhook_configuration
from harness.controlplane import ControlPlane
from harness.processes import wait_for
from harness.registration import GpushareWebhook, Registration
from harness.webhookserver import WebhookServer
from tests.client_certs import write_client_pki
from webhook.constants import SHARED_GPU_RESOURCE


def _admission_configuration(directory: Path, cert_file: Path, key_file: Path) -> Path:
    kubeconfig = directory / "webhook-client.kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                # "*": the same certificate for every webhook this apiserver calls.
                "users": [
                    {
                        "name": "*",
                        "user": {
                            "client-certificate": str(cert_file),
                            "client-key": str(key_file),
                        },
                    }
                ],
            }
        )
    )
    webhook_plugin = {
        "apiVersion": "apiserver.config.k8s.io/v1",
        "kind": "WebhookAdmissionConfiguration",
        "kubeConfigFile": str(kubeconfig),
    }
    configuration = directory / "admission.yaml"
    configuration.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "apiserver.config.k8s.io/v1",
                "kind": "AdmissionConfiguration",
                "plugins": [
                    {"name": "MutatingAdmissionWebhook", "configuration": webhook_plugin},
                    {"name": "ValidatingAdmissionWebhook", "configuration": webhook_plugin},
                ],
            }
        )
    )
    return configuration


@pytest.fixture(scope="module")
def authenticated_plane(
    harness_binary: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ControlPlane, Path]]:
    pki = tmp_path_factory.mktemp("apiserver-client")
    ca_file, cert_file, key_file = write_client_pki(pki, "apiserver-webhook-client")
    configuration = _admission_configuration(pki, cert_file, key_file)
    with ControlPlane(
        binary=harness_binary,
        workdir=tmp_path_factory.mktemp("authenticated-plane"),
        with_scheduler=False,
        extra_apiserver_flags=[f"--admission-control-config-file={configuration}"],
    ) as plane:
        yield plane, ca_file


def test_the_apiserver_with_a_client_certificate_is_served(
    authenticated_plane: tuple[ControlPlane, Path],
    webhook_policies: Path,
    tmp_path: Path,
) -> None:
    plane, client_ca = authenticated_plane
    server = WebhookServer.start(
        tmp_path / "webhook", webhook_policies, extra_args=["--client-ca", str(client_ca)]
    )
    try:
        core = k8s.CoreV1Api(plane.api)
        ensure_namespace(core, "e2e-probe")
        webhook = GpushareWebhook(server, plane.api, "e2e-probe")
        webhook.register()  # waits until dry-run pods come back mutated
        namespace = unique_name("client-cert")
        ensure_namespace(core, namespace)
        stored = create_pod(plane.api, namespace, annotated_pod("shared")).pod
        limits = stored["spec"]["containers"][0]["resources"]["limits"]
        assert limits[SHARED_GPU_RESOURCE] == "1"
    finally:
        server.stop()


def test_an_apiserver_without_the_certificate_is_refused(
    authenticated_plane: tuple[ControlPlane, Path],
    control_plane: ControlPlane,
    webhook_policies: Path,
    namespace: str,
    tmp_path: Path,
) -> None:
    """The session's control plane presents no client certificate: annotated pods fail."""
    _, client_ca = authenticated_plane
    server = WebhookServer.start(
        tmp_path / "webhook", webhook_policies, extra_args=["--client-ca", str(client_ca)]
    )
    registration = Registration(control_plane.api)
    documents = webhook_configuration(
        server.ca_file, server.url, "--policies", str(webhook_policies)
    )
    try:
        registration.apply(documents)

        def refused() -> str | None:
            try:
                create_pod(control_plane.api, namespace, annotated_pod("x"), dry_run=True)
            except ApiException as error:
                return str(error.body) if "client certificate" in str(error.body) else None
            return None

        message = wait_for("the webhook to refuse the uncertified apiserver", refused, timeout=30)
        assert "--client-ca" in message
        plain = create_pod(control_plane.api, namespace, plain_pod("plain"), dry_run=True)
        assert plain.pod["metadata"]["name"] == "plain"  # ordinary pods are not sent at all
    finally:
        for document in documents:
            registration.delete(document["metadata"]["name"])
        server.stop()
