"""The kubectl commands the docs show, against the harness's real kube-apiserver.

tests/test_docs_commands.py states the convention and runs every command the docs show that
needs no cluster; the kubectl commands it lists in IN_THE_HARNESS run here, in their page's
order with the page's local commands, against the control plane with gpushare registered as
`gpushare webhook-config` prints it (conftest.py: the bundled default policy governs the
namespaces these commands use). What they print (kubectl's stderr, where warnings and errors
go, then its stdout) must be what the page shows. What they create is deleted afterwards.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from kubernetes import client as k8s

from harness.api import ensure_namespace
from harness.controlplane import ControlPlane
from harness.registration import GpushareWebhook
from tests.test_docs_commands import (
    GPUSHARE,
    IN_THE_HARNESS,
    PAGES,
    REPO,
    check_result,
    read_page,
    run_command,
    runs_here,
    saved_files,
    scratch_checkout,
    shell_environment,
)

HARNESS_PAGES = [p for p in PAGES if any(c.text in IN_THE_HARNESS for c in read_page(p).commands)]


def namespaces_of_saved_files() -> set[str]:
    return {
        document["metadata"]["namespace"]
        for content in saved_files().values()
        for document in yaml.safe_load_all(content)
        if isinstance(document, dict) and document.get("metadata", {}).get("namespace")
    }


@pytest.mark.parametrize("page", HARNESS_PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_the_kubectl_commands_of_a_page_do_what_it_shows(
    page: Path,
    tmp_path: Path,
    control_plane: ControlPlane,
    core_v1: k8s.CoreV1Api,
    gpushare_webhook: GpushareWebhook,
) -> None:
    for namespace in namespaces_of_saved_files():
        ensure_namespace(core_v1, namespace)
    run = scratch_checkout(tmp_path)
    kubectl = (str(control_plane.binary), "kubectl", f"--kubeconfig={control_plane.kubeconfig}")
    environment = shell_environment(tmp_path, {"gpushare": GPUSHARE, "kubectl": kubectl})
    applied = [c for c in read_page(page).commands if c.text in IN_THE_HARNESS]
    try:
        for item in read_page(page).commands:
            if runs_here(item):
                result = run_command(item, run, environment)
                check_result(item, result, run, result.stdout)
            elif item in applied:
                result = run_command(item, run, environment)
                check_result(item, result, run, result.stderr + result.stdout)
    finally:
        for item in applied:
            control_plane.kubectl(
                "delete", "--ignore-not-found", "-f", str(run / item.argv[-1]), check=False
            )
