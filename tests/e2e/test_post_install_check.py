"""The check after an install, against the real kube-apiserver: `gpushare check-admission`.

What is real: the apiserver, its admission chain (gpushare's mutating webhook served by
`gpushare serve` and registered by `gpushare webhook-config`, the safety-net
ValidatingAdmissionPolicy), RBAC, server-side dry runs, and Helm refusing values. What
stands in: "the webhook is unreachable" is a registration whose URL nothing listens on
(a NetworkPolicy without the apiserver's addresses, or a Service without endpoints, fail
the same way: the apiserver's call gets no answer); no kubelet runs, so the Job's command
runs as a process with its ServiceAccount's token (as tests/e2e/test_helm_chart.py runs
the certgen Jobs, and there the chart's own check Job).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import REPO
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from harness.api import ensure_namespace
from harness.cli import GPUSHARE, clean_environment
from harness.controlplane import ControlPlane
from harness.helm import CHART, run_helm
from harness.processes import free_ports
from harness.registration import GpushareWebhook
from webhook.constants import APPLIED_ANNOTATION

CHECK = "check-admission"
KUSTOMIZATION = REPO / "deploy/admission-check"
CHECK_ACCOUNT = ("gpushare-system", "gpushare-admission-check")
MUTATE = "mutate.gpushare.io"


def check_admission(
    *args: str, kubeconfig: Path, timeout: int = 0
) -> subprocess.CompletedProcess[str]:
    """`gpushare check-admission ARGS` as a process, talking to the apiserver directly."""
    environment = clean_environment()
    for proxy in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        environment.pop(proxy, None)
    return subprocess.run(
        [*GPUSHARE, CHECK, *args, f"--kubeconfig={kubeconfig}", f"--timeout={timeout}"],
        capture_output=True,
        text=True,
        timeout=timeout + 120,
        env=environment,
        cwd=REPO,
        check=False,
    )


def unreachable_url() -> str:
    """An HTTPS URL on this machine where nothing listens (the port is freed again)."""
    (port,) = free_ports(1)
    return f"https://127.0.0.1:{port}"


@pytest.fixture
def registration(gpushare_webhook: GpushareWebhook) -> Iterator[GpushareWebhook]:
    """The module's registration, put back in force after a test swapped it."""
    try:
        yield gpushare_webhook
    finally:
        gpushare_webhook.restore()


def test_the_check_passes_while_gpushare_answers(
    gpushare_webhook: GpushareWebhook, control_plane: ControlPlane
) -> None:
    result = check_admission(
        "--namespace", gpushare_webhook.probe_namespace, kubeconfig=control_plane.kubeconfig
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    line = result.stdout.strip()
    assert line.startswith("gpushare check-admission: passed: a dry-run pod annotated")
    assert f"{MUTATE} mutated it: {APPLIED_ANNOTATION}=" in line
    # A dry run: nothing was stored.
    pods = k8s.CoreV1Api(control_plane.api).list_namespaced_pod(gpushare_webhook.probe_namespace)
    assert not [p for p in pods.items if p.metadata.name.startswith("gpushare-admission-check")]


def test_an_unreachable_webhook_under_fail_fails_the_check_with_the_reason(
    registration: GpushareWebhook, control_plane: ControlPlane
) -> None:
    """failurePolicy Fail: the apiserver refuses the pod, and the check says why."""
    documents = registration.configuration("--failure-policy", "Fail", url=unreachable_url())
    registration.swap(
        documents,
        lambda probe: probe.annotated.startswith("rejected: ") and MUTATE in probe.annotated,
        "the registration pointing nowhere",
    )
    result = check_admission(
        "--namespace", registration.probe_namespace, kubeconfig=control_plane.kubeconfig
    )
    assert result.returncode == 1, result.stdout
    assert result.stdout == ""
    *attempts, verdict = result.stderr.strip().splitlines()
    assert len(attempts) == 1 and attempts[0].startswith("gpushare check-admission: attempt 1:")
    assert verdict.startswith("gpushare check-admission: FAILED after 1 attempt(s)")
    assert "the apiserver refused the pod (HTTP 500)" in verdict
    assert f'failed calling webhook "{MUTATE}"' in verdict
    assert "could not get an answer from gpushare's webhook" in verdict
    assert "NetworkPolicy keeps the apiserver's addresses from port 8443" in verdict


def test_an_unreachable_webhook_under_ignore_still_fails_the_check(
    registration: GpushareWebhook, control_plane: ControlPlane
) -> None:
    """failurePolicy Ignore: the apiserver goes on without the webhook and admits the pod
    unmutated, unshared (or the safety net refuses it, where it is printed to): either way
    the pod does not come back mutated, and the check fails, saying why."""
    documents = registration.configuration("--failure-policy", "Ignore", url=unreachable_url())
    registration.swap(
        documents,
        lambda probe: probe.annotated != "mutated",
        "the Ignore registration pointing nowhere",
    )
    ignored = check_admission(
        "--namespace", registration.probe_namespace, kubeconfig=control_plane.kubeconfig
    )
    assert ignored.returncode == 1, ignored.stdout
    assert "FAILED after 1 attempt(s)" in ignored.stderr
    assert (
        "failurePolicy Ignore let the pod through unshared" in ignored.stderr
        or "could not get an answer from gpushare's webhook" in ignored.stderr
    ), ignored.stderr

    mutating = [d for d in documents if d["kind"] == "MutatingWebhookConfiguration"]
    registration.swap(
        mutating,
        lambda probe: probe.annotated == "admitted",
        "the Ignore registration pointing nowhere, without the safety net",
        drop_safety_net=True,
    )
    unshared = check_admission(
        "--namespace", registration.probe_namespace, kubeconfig=control_plane.kubeconfig
    )
    assert unshared.returncode == 1, unshared.stdout
    verdict = unshared.stderr.strip().splitlines()[-1]
    assert "FAILED after 1 attempt(s)" in verdict
    assert f"admitted without gpushare's record ({APPLIED_ANNOTATION})" in verdict
    assert "failurePolicy Ignore let the pod through unshared" in verdict


def test_the_check_waits_for_a_webhook_that_comes_up(
    registration: GpushareWebhook, control_plane: ControlPlane
) -> None:
    """After an install the endpoints and caBundle take a moment: attempts go on until one
    passes (or the timeout)."""
    documents = registration.configuration("--failure-policy", "Fail", url=unreachable_url())
    registration.swap(
        documents,
        lambda probe: probe.annotated.startswith("rejected: "),
        "the registration pointing nowhere",
    )
    environment = clean_environment()
    process = subprocess.Popen(
        [*GPUSHARE, CHECK, "--namespace", registration.probe_namespace,
         f"--kubeconfig={control_plane.kubeconfig}", "--timeout=90"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment, cwd=REPO,
    )  # fmt: skip
    try:
        assert process.stderr is not None
        first = process.stderr.readline()
        assert first.startswith("gpushare check-admission: attempt 1:"), first
        registration.register()  # the webhook "comes up"
        stdout, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, stderr
    assert "passed" in stdout


@pytest.fixture
def kustomized_check(control_plane: ControlPlane) -> Iterator[list[dict[str, Any]]]:
    """deploy/admission-check applied for real, all but its Job (no controller would run
    it); deleted afterwards."""
    rendered = [
        d
        for d in yaml.safe_load_all(control_plane.kubectl("kustomize", str(KUSTOMIZATION)).stdout)
        if d
    ]
    ensure_namespace(k8s.CoreV1Api(control_plane.api), CHECK_ACCOUNT[0])
    rest = [d for d in rendered if d["kind"] != "Job"]
    control_plane.kubectl(
        "apply", "--server-side", "--field-manager=e2e-check", "-f", "-",
        input=yaml.safe_dump_all(rest),
    )  # fmt: skip
    try:
        yield rendered
    finally:
        control_plane.kubectl(
            "delete", "--ignore-not-found", "-f", "-", input=yaml.safe_dump_all(rest)
        )


def test_the_kustomize_job_passes_with_its_own_least_privilege(
    gpushare_webhook: GpushareWebhook,
    control_plane: ControlPlane,
    kustomized_check: list[dict[str, Any]],
    tmp_path: Path,
) -> None:
    """deploy/admission-check's Job command, run with its ServiceAccount's token: it passes
    in the namespace its Role names, and is forbidden anywhere else."""
    (job,) = [d for d in kustomized_check if d["kind"] == "Job"]
    pod = job["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == CHECK_ACCOUNT[1]
    command = pod["containers"][0]["command"]
    assert command[:2] == ["gpushare", CHECK]
    as_check = control_plane.service_account_kubeconfig(
        *CHECK_ACCOUNT, tmp_path / "check.kubeconfig", expiration_seconds=600
    )
    passed = check_admission(*command[2:], kubeconfig=as_check)
    assert passed.returncode == 0, passed.stderr
    assert "passed: a dry-run pod annotated gpu-fraction 0.5 in namespace default" in (
        passed.stdout
    )
    elsewhere = check_admission(
        *command[2:], "--namespace", gpushare_webhook.probe_namespace, kubeconfig=as_check
    )
    assert elsewhere.returncode == 1
    assert "the apiserver refused the pod (HTTP 403)" in elsewhere.stderr
    # Forbidden cannot change by waiting: one attempt, however long the timeout.
    assert "FAILED after 1 attempt(s)" in elsewhere.stderr
    assert 'cannot create resource "pods"' in elsewhere.stderr


def test_the_chart_refuses_a_network_policy_without_the_apiservers_addresses(
    helm: Path, control_plane: ControlPlane, tmp_path: Path
) -> None:
    """`helm install` against the real apiserver: networkPolicy.enabled without
    apiserverCIDRs (or extraFrom peers) is refused before anything is written."""
    namespace = "e2e-np-refused"
    result = run_helm(
        helm, "install", "np-refused", str(CHART), "--namespace", namespace,
        "--create-namespace", "--set", "networkPolicy.enabled=true",
        "--kubeconfig", str(control_plane.kubeconfig), home=tmp_path,
    )  # fmt: skip
    assert result.returncode == 1, result.stdout
    assert "values don't meet the specifications of the schema" in result.stderr
    assert "at '/networkPolicy/apiserverCIDRs': minItems: got 0, want 1" in result.stderr
    with pytest.raises(ApiException) as missing:
        k8s.CoreV1Api(control_plane.api).read_namespace(namespace)
    assert missing.value.status == 404
    listed = run_helm(
        helm, "list", "--all-namespaces", "-q", "--kubeconfig", str(control_plane.kubeconfig),
        home=tmp_path,
    )  # fmt: skip
    assert "np-refused" not in listed.stdout
