"""Session fixtures for the end-to-end tests: the harness binary and a running control plane,
and gpushare's webhook served (`webhook_server`, session) and registered
(`gpushare_webhook`, per module; see harness/webhookserver.py and harness/registration.py).

Every test collected under tests/e2e/ gets the `e2e` marker, and its pytest-timeout budget
covers the test body only: building the harness (minutes when cold) and starting the
control plane happen in session fixtures with deadlines of their own.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable, Generator, Iterator
from pathlib import Path

import pytest
import yaml
from gpu_nodes import FakeGpuNode, create_fake_node
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from kueue_plane import KueueTestPlane, kueue_test_plane
from operator_plane import OperatorPlane, install_operator_crds

from harness.api import ensure_namespace
from harness.binary import HarnessBuildError, build_binary
from harness.controlplane import ControlPlane
from harness.kueue import KueueBuild, KueueError
from harness.kueue import load_build as load_kueue_build
from harness.operator_crds import OperatorCrds, OperatorCrdsError
from harness.operator_crds import load as load_operator_crds
from harness.registration import GpushareWebhook
from harness.webhookserver import WebhookServer

E2E_DIR = Path(__file__).resolve().parent
# A cold build (empty Go caches) compiles much of Kubernetes; leave room for slow hosts.
BUILD_TIMEOUT_S = float(os.environ.get("GPUSHARE_HARNESS_BUILD_TIMEOUT", "2400"))
# Where the session's control plane is kept, so failure reports can show its logs.
CONTROL_PLANE_KEY = pytest.StashKey[ControlPlane]()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark tests in this directory `e2e` and time only their bodies."""
    for item in items:
        if E2E_DIR not in item.path.parents:
            continue
        item.add_marker(pytest.mark.e2e)
        # func_only: the session fixtures' own deadlines bound setup, which a cold build
        # would otherwise push past the suite-wide 300 s. A test's own timeout marker wins.
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(func_only=True))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Attach the control plane's log tails to the report of a failed e2e test."""
    report = yield
    if report.failed and E2E_DIR in item.path.parents:
        plane = item.config.stash.get(CONTROL_PLANE_KEY, None)
        if plane is not None and plane.components:
            report.sections.append(("control plane logs", plane.logs()))
    return report


@pytest.fixture(scope="session")
def harness_binary() -> Path:
    """Path to the harness binary, built (or found in the cache) by harness/build.sh.

    A failed build fails the tests with the build log: e2e tests are never skipped.
    """
    try:
        return build_binary(BUILD_TIMEOUT_S)
    except HarnessBuildError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def control_plane(
    harness_binary: Path, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[ControlPlane]:
    """A running etcd + kube-apiserver + kube-scheduler for the whole session.

    Attributes: `server` (https URL), `kubeconfig` (Path, admin, cert data inline),
    `api` (shared admin ApiClient), `pki`, `workdir`, `binary`; methods: `api_client()`
    (a new client), `kubectl(*args)`, `logs()`.
    """
    with ControlPlane(binary=harness_binary, workdir=tmp_path_factory.mktemp("controlplane")) as cp:
        request.config.stash[CONTROL_PLANE_KEY] = cp
        try:
            yield cp
        finally:
            del request.config.stash[CONTROL_PLANE_KEY]


@pytest.fixture(scope="session")
def api_client(control_plane: ControlPlane) -> k8s.ApiClient:
    """The control plane's shared admin ApiClient (closed when the control plane stops)."""
    return control_plane.api


@pytest.fixture(scope="session")
def core_v1(api_client: k8s.ApiClient) -> k8s.CoreV1Api:
    """CoreV1Api on the admin client."""
    return k8s.CoreV1Api(api_client)


def unique_name(prefix: str) -> str:
    """A DNS-1123 name unique within the session (objects outlive tests in one cluster)."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def namespace(core_v1: k8s.CoreV1Api) -> Iterator[str]:
    """A fresh namespace for one test; its pods are force-deleted afterwards.

    Pods bound to fake nodes would otherwise keep holding node resources: with no kubelet
    a graceful delete never completes, so the cleanup uses grace period 0. The namespace
    itself stays Terminating (no namespace controller runs), which is harmless.
    """
    name = unique_name("e2e")
    core_v1.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name)))
    try:
        yield name
    finally:
        core_v1.delete_collection_namespaced_pod(name, grace_period_seconds=0)
        core_v1.delete_namespace(name)


@pytest.fixture
def fake_nodes(core_v1: k8s.CoreV1Api) -> Iterator[Callable[[FakeGpuNode], k8s.V1Node]]:
    """A factory that creates fake GPU nodes and deletes them when the test ends."""
    created: list[str] = []

    def create(spec: FakeGpuNode) -> k8s.V1Node:
        created.append(spec.name)
        return create_fake_node(core_v1, spec)

    try:
        yield create
    finally:
        for name in created:
            try:
                core_v1.delete_node(name)
            except ApiException as exc:
                # The create itself may have failed; anything else is a real problem.
                if exc.status != 404:
                    raise


# --------------------------------------------------------------------------------------
# gpushare's webhook: served by `gpushare serve`, registered by `gpushare webhook-config`

REPO = E2E_DIR.parents[1]
PROBE_NAMESPACE = "e2e-probe"


@pytest.fixture(scope="session")
def webhook_policies(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The policies the e2e webhook serves, in a directory of their own.

    The bundled policies/default.yaml (time-slicing everywhere), copies of
    policies/examples/mps.yaml (ml-* namespaces) and mps-daemon.yaml (inference), and the
    team-vision policy of tests/corpus/team-policy-local-file (team-vision-*) without that
    case's own fallback default, so every corpus case has its policy in one set.
    """
    directory = tmp_path_factory.mktemp("policies")
    shutil.copy(REPO / "policies/default.yaml", directory / "default.yaml")
    for example in ("mps.yaml", "mps-daemon.yaml"):
        shutil.copy(REPO / "policies/examples" / example, directory / example)
    team = REPO / "tests/corpus/team-policy-local-file/policies.yaml"
    documents = [
        doc
        for doc in yaml.safe_load_all(team.read_text())
        if doc and not doc.get("spec", {}).get("default")
    ]
    assert documents, f"no team policy left in {team}"
    (directory / "team-vision.yaml").write_text(yaml.safe_dump_all(documents, sort_keys=False))
    return directory


@pytest.fixture(scope="session")
def webhook_server(
    tmp_path_factory: pytest.TempPathFactory, webhook_policies: Path
) -> Iterator[WebhookServer]:
    """`gpushare serve` (gunicorn, 2 workers, TLS) on a free 127.0.0.1 port for the session.

    Certificates come from `gpushare certs --service gpushare --namespace gpushare-system
    --ip 127.0.0.1`; the JSON admission log goes to `server.log_path`.
    """
    server = WebhookServer.start(tmp_path_factory.mktemp("webhook"), webhook_policies)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def probe_namespace(core_v1: k8s.CoreV1Api) -> str:
    """Where registration probes run their server-side dry runs (nothing is stored)."""
    ensure_namespace(core_v1, PROBE_NAMESPACE)
    return PROBE_NAMESPACE


@pytest.fixture(scope="module")
def gpushare_webhook(
    control_plane: ControlPlane, webhook_server: WebhookServer, probe_namespace: str
) -> Iterator[GpushareWebhook]:
    """gpushare registered with the apiserver for the tests of one module.

    Applies what `gpushare webhook-config --ca <ca.crt> --url https://127.0.0.1:<port>
    --policies <webhook_policies>` prints and waits (polling dry runs) until the mutating
    webhook answers and the safety-net policy refuses a pod asking by hand; afterwards
    deletes the configurations and the policy and waits until they are out of force, so
    other modules (which create shared-GPU pods by hand) never meet them. The server itself
    lives for the session.
    """
    webhook = GpushareWebhook(webhook_server, control_plane.api, probe_namespace)
    webhook.register()
    try:
        yield webhook
    finally:
        webhook.unregister()


# --------------------------------------------------------------------------------------
# GPU operators' CRDs and samples, from their Go modules (harness/operator_crds.py)


@pytest.fixture(scope="session")
def operator_crds() -> OperatorCrds:
    """The CRDs and published samples of KubeRay, Kubeflow Training Operator and Trainer,
    Argo Workflows, JobSet, LeaderWorkerSet and KServe (pinned in
    harness/tools/operator-crds/modules.txt), and minimal CRDs of ours: $GPUSHARE_OPERATOR_CRDS,
    else built by harness/tools/operator-crds/build.sh. `crd_files(project)`,
    `sample(project, name)`; a failed build fails the tests with its output.
    """
    try:
        return load_operator_crds()
    except OperatorCrdsError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="module")
def operator_plane(
    harness_binary: Path, operator_crds: OperatorCrds, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorPlane]:
    """A control plane of the module's own (etcd and kube-apiserver, no scheduler) with every
    operator CRD of `operator_crds` installed server-side and Established
    (tests/e2e/operator_plane.py): `plane`, `crds`, `installed` (CRD names by project)."""
    workdir = tmp_path_factory.mktemp("operator-plane")
    with ControlPlane(binary=harness_binary, workdir=workdir, with_scheduler=False) as plane:
        yield OperatorPlane(plane, operator_crds, install_operator_crds(plane, operator_crds))


# --------------------------------------------------------------------------------------
# Kueue, the real controller, built from its Go module (harness/kueue.py)


@pytest.fixture(scope="session")
def kueue_build() -> KueueBuild:
    """Kueue's manager and CRDs (sigs.k8s.io/kueue, pinned in harness/tools/kueue/go.mod):
    $GPUSHARE_KUEUE, else built by harness/tools/kueue/build.sh; a failed build fails the
    tests with its output."""
    try:
        return load_kueue_build()
    except KueueError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="module")
def kueue_plane(
    harness_binary: Path,
    operator_crds: OperatorCrds,
    kueue_build: KueueBuild,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[KueueTestPlane]:
    """A control plane of the module's own with the job and garbage-collector controllers,
    the JobSet and KubeRay CRDs and Kueue running (tests/e2e/kueue_plane.py): `plane`,
    `kueue` (queues, jobs' suspension, Workloads), `namespace()`, `logs()`."""
    workdir = tmp_path_factory.mktemp("kueue-plane")
    with kueue_test_plane(harness_binary, operator_crds, kueue_build, workdir) as plane:
        yield plane
