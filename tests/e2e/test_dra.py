"""Dynamic Resource Allocation with consumable GPU memory, on the real control plane.

Three steps, each on the one before: the scheduler packs memory claims onto fake GPUs
(the harness proof); gpushare's template reconciler keeps ResourceClaimTemplates in the
namespaces a dra policy governs (server-side apply, prune, namespace watch); and annotated
pods, mutated by the real gpushare webhook serving policies/examples/dra.yaml, get claims
from those templates that the scheduler allocates until the Hopper GPUs are full, never on
the Ampere GPU the policy's selectors leave out.

The cluster is the harness's etcd + kube-apiserver + kube-scheduler (v1.37.2) plus an
upstream kube-controller-manager running only the resourceclaim controller, which makes
each pod's ResourceClaim from its ResourceClaimTemplate (pkg/controller/resourceclaim).
There is no kubelet and no DRA driver: each fake node's ResourceSlice is published here
the way NVIDIA's driver publishes a GPU with consumable shares on
(kubernetes-sigs/dra-driver-nvidia-gpu, cmd/gpu-kubelet-plugin/deviceinfo.go attributes,
consumable_shares.go `--consumable-shares=memory`: allowMultipleAllocations and a
`memory` capacity whose requestPolicy steps by 1Mi). Binding is the proof: the scheduler's
DRA plugin allocates each claim a share of a GPU's memory (KEP-5075, DRAConsumableCapacity,
beta and on by default since 1.36: k8s.io/kubernetes pkg/features/kube_features.go) until
the memory is spent, and the next pod stays Pending as unschedulable.
"""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import unique_name
from gpu_nodes import FakeGpuNode
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from harness.api import ensure_namespace
from harness.controlplane import ControlPlane
from harness.processes import wait_for
from harness.registration import PAUSE_IMAGE, GpushareWebhook
from harness.webhookserver import WebhookServer
from webhook.constants import APPLIED_ANNOTATION, FRACTION_ANNOTATION
from webhook.core import PolicySet, load_policies
from webhook.core.modes.dra import CLAIM_NAME, namespace_templates
from webhook.core.policy.loader import load_policy_texts
from webhook.dra import ReconcilerStatus
from webhook.dra.reconciler import TemplateApi, TemplateApiError, TemplateReconciler, run

DRIVER = "gpu.nvidia.com"
DEVICE_CLASS = "gpu.nvidia.com"
RESOURCE_API = "/apis/resource.k8s.io/v1"
# An H100 80GB HBM3 as NVML reports it (memory.total 81559 MiB), rounded down to the 1Mi
# step as the driver does: four 20Gi shares do not fit, three do.
H100_MEMORY = "81559Mi"
H100_PRODUCT = "NVIDIA H100 80GB HBM3"
REPO = Path(__file__).resolve().parents[2]
DRA_EXAMPLE = REPO / "policies/examples/dra.yaml"
SCHEDULE_TIMEOUT_S = 60.0

NodeFactory = Callable[[FakeGpuNode], k8s.V1Node]


def api_request(
    api: k8s.ApiClient,
    method: str,
    path: str,
    body: Mapping[str, Any] | None = None,
    *,
    content_type: str = "application/json",
) -> dict[str, Any]:
    """One raw JSON call: the generated models lag behind resource.k8s.io/v1's newer fields
    (consumable capacity) and validate dict bodies against themselves."""
    headers = {"Accept": "application/json"}
    if body is not None:
        headers["Content-Type"] = content_type
    call = api.param_serialize(
        method, path, header_params=headers, body=body, auth_settings=["BearerToken"]
    )
    response = api.call_api(*call)
    data: bytes = response.read()  # type: ignore[no-untyped-call]
    if not 200 <= response.status <= 299:
        raise ApiException.from_response(http_resp=response, body=None, data=None)
    result: dict[str, Any] = json.loads(data)
    return result


def delete_ignoring_absent(api: k8s.ApiClient, path: str) -> None:
    try:
        api_request(api, "DELETE", path)
    except ApiException as exc:
        if exc.status != 404:
            raise


def device_class() -> dict[str, Any]:
    """The DeviceClass NVIDIA's chart installs (deployments/helm/dra-driver-nvidia-gpu/
    templates/deviceclass-gpu.yaml), without its extendedResourceName: other e2e modules
    ask for nvidia.com/gpu on device-plugin nodes."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": DEVICE_CLASS},
        "spec": {
            "selectors": [
                {
                    "cel": {
                        "expression": f"device.driver == '{DRIVER}' && "
                        f"device.attributes['{DRIVER}'].type == 'gpu'"
                    }
                }
            ]
        },
    }


def gpu_slice(
    node: str,
    gpus: int,
    memory: str = H100_MEMORY,
    product: str = H100_PRODUCT,
    architecture: str = "Hopper",
) -> dict[str, Any]:
    """The ResourceSlice NVIDIA's kubelet plugin would publish for `node`'s GPUs with
    `--consumable-shares=memory`: each GPU allows several allocations and gives out its
    `memory` capacity in 1Mi steps (a claim asking none takes all of it)."""
    devices = []
    for index in range(gpus):
        devices.append(
            {
                "name": f"gpu-{index}",
                "allowMultipleAllocations": True,
                "attributes": {
                    "type": {"string": "gpu"},
                    "uuid": {"string": f"GPU-{node}-{index}"},
                    "productName": {"string": product},
                    "brand": {"string": "Nvidia"},
                    "architecture": {"string": architecture},
                    "cudaComputeCapability": {"version": "9.0.0"},
                    "driverVersion": {"version": "580.95.5"},
                    "cudaDriverVersion": {"version": "13.0.0"},
                },
                "capacity": {
                    "memory": {
                        "value": memory,
                        "requestPolicy": {
                            "default": memory,
                            "validRange": {"min": "1Mi", "max": memory, "step": "1Mi"},
                        },
                    }
                },
            }
        )
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{DRIVER}"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def share_template(name: str, memory: str) -> dict[str, Any]:
    """A ResourceClaimTemplate asking one GPU's worth of `memory` as consumable capacity."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu",
                            "exactly": {
                                "deviceClassName": DEVICE_CLASS,
                                "capacity": {"requests": {"memory": memory}},
                            },
                        }
                    ]
                }
            }
        },
    }


def claim_pod(name: str, template: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [
                {"name": "main", "image": PAUSE_IMAGE, "resources": {"claims": [{"name": "gpu"}]}}
            ],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
        },
    }


@pytest.fixture(scope="module")
def claim_controller(control_plane: ControlPlane) -> ControlPlane:
    """The control plane with kube-controller-manager running the resourceclaim controller."""
    control_plane.start_controller_manager(
        ["resourceclaim-controller"], ready_log="Starting resource claim controller"
    )
    return control_plane


@pytest.fixture
def dra_nodes(
    claim_controller: ControlPlane, fake_nodes: NodeFactory, api_client: k8s.ApiClient
) -> Iterator[list[str]]:
    """The NVIDIA DeviceClass and two fake nodes with one H100 each, published as slices.

    Nodes and slices exist before any pod (a pod created first would meet no device and
    back off). Slices and the class go when the test ends.
    """
    api_request(api_client, "POST", f"{RESOURCE_API}/deviceclasses", device_class())
    nodes = [unique_name("dra-node") for _ in range(2)]
    try:
        for node in nodes:
            fake_nodes(FakeGpuNode(name=node, product="NVIDIA-H100-80GB-HBM3"))
            api_request(api_client, "POST", f"{RESOURCE_API}/resourceslices", gpu_slice(node, 1))
        yield nodes
    finally:
        for node in nodes:
            delete_ignoring_absent(api_client, f"{RESOURCE_API}/resourceslices/{node}-{DRIVER}")
        delete_ignoring_absent(api_client, f"{RESOURCE_API}/deviceclasses/{DEVICE_CLASS}")


def pod_states(core_v1: k8s.CoreV1Api, namespace: str) -> dict[str, tuple[str | None, str]]:
    """Each pod's node (None while unbound) and its PodScheduled condition's message."""
    states = {}
    for pod in core_v1.list_namespaced_pod(namespace).items:
        conditions = pod.status.conditions or []
        message = next((c.message or "" for c in conditions if c.type == "PodScheduled"), "")
        states[pod.metadata.name] = (pod.spec.node_name, message)
    return states


def wait_bound_and_unschedulable(
    core_v1: k8s.CoreV1Api, namespace: str, bound: int, pending: int
) -> dict[str, tuple[str | None, str]]:
    """Wait until `bound` pods have a node and `pending` are marked unschedulable."""

    def settled() -> dict[str, tuple[str | None, str]] | None:
        states = pod_states(core_v1, namespace)
        on_nodes = [n for n, _ in states.values() if n]
        refused = [m for n, m in states.values() if not n and "cannot allocate all claims" in m]
        return states if len(on_nodes) == bound and len(refused) == pending else None

    return wait_for(
        f"{bound} pods bound and {pending} unschedulable in {namespace}",
        settled,
        timeout=SCHEDULE_TIMEOUT_S,
        interval=0.5,
        on_timeout=lambda: json.dumps(pod_states(core_v1, namespace), indent=1),
    )


def allocations(api: k8s.ApiClient, namespace: str) -> list[dict[str, Any]]:
    """The device results of every allocated claim in `namespace`."""
    claims = api_request(api, "GET", f"{RESOURCE_API}/namespaces/{namespace}/resourceclaims")
    results = []
    for claim in claims["items"]:
        allocation = claim.get("status", {}).get("allocation")
        if allocation:
            results += allocation["devices"]["results"]
    return results


def test_scheduler_packs_memory_shares_until_the_gpus_are_full(
    dra_nodes: list[str], namespace: str, core_v1: k8s.CoreV1Api, api_client: k8s.ApiClient
) -> None:
    """Seven pods asking 20Gi each of two 81559Mi GPUs: three per GPU, the 7th Pending."""
    api_request(
        api_client,
        "POST",
        f"{RESOURCE_API}/namespaces/{namespace}/resourceclaimtemplates",
        share_template("share-20gi", "20Gi"),
    )
    for index in range(7):
        core_v1.create_namespaced_pod(namespace, claim_pod(f"share-{index}", "share-20gi"))

    states = wait_bound_and_unschedulable(core_v1, namespace, bound=6, pending=1)
    per_node: dict[str, int] = {}
    for node, _ in states.values():
        if node:
            per_node[node] = per_node.get(node, 0) + 1
    assert per_node == dict.fromkeys(dra_nodes, 3)

    results = allocations(api_client, namespace)
    assert len(results) == 6
    for result in results:
        assert result["driver"] == DRIVER
        assert result["consumedCapacity"] == {"memory": "20Gi"}
        # Each allocation of a multi-allocatable device gets a share ID of its own.
        assert result.get("shareID")
    assert len({(r["pool"], r["device"], r["shareID"]) for r in results}) == 6


# -- the templates: gpushare dra-templates' reconciler against the real apiserver ---------


def template_names(api: k8s.ApiClient, namespace: str) -> set[str]:
    answer = api_request(
        api, "GET", f"{RESOURCE_API}/namespaces/{namespace}/resourceclaimtemplates"
    )
    return {t["metadata"]["name"] for t in answer["items"]}


def small_dra_policies(granularity: str) -> PolicySet:
    """A dra policy for the dra-rec-* namespaces with few share sizes (16Gi steps)."""
    text = f"""
apiVersion: gpushare.io/v1alpha1
kind: GpuSharingPolicy
metadata: {{name: rec}}
spec:
  match: {{namespaces: ["dra-rec-*"]}}
  mode: dra
  gpuMemory: 80Gi
  fraction: {{min: 0.2, max: 1}}
  dra: {{granularity: {granularity}}}
"""
    return load_policy_texts([("rec.yaml", text)])


def test_reconciler_keeps_the_templates_where_dra_policies_govern(
    api_client: k8s.ApiClient, core_v1: k8s.CoreV1Api
) -> None:
    governed, other = unique_name("dra-rec"), unique_name("web")
    for name in (governed, other):
        core_v1.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name)))
    reconciler = TemplateReconciler(TemplateApi(api_client), namespace_templates)
    policies = small_dra_policies("16Gi")
    sixteens = {f"gpushare-rec-{n}gi" for n in (16, 32, 48, 64, 80)}

    first = reconciler.reconcile_namespace(policies, governed)
    assert (sorted(first.applied), first.errors) == (
        sorted(f"{governed}/{n}" for n in sixteens),
        [],
    )
    assert template_names(api_client, governed) == sixteens
    assert reconciler.reconcile_namespace(policies, other).applied == []
    assert template_names(api_client, other) == set()

    # A second pass writes nothing; a template deleted by hand comes back, alone.
    again = reconciler.reconcile_namespace(policies, governed)
    assert (again.applied, again.unchanged, again.deleted) == ([], 5, [])
    delete_ignoring_absent(
        api_client, f"{RESOURCE_API}/namespaces/{governed}/resourceclaimtemplates/gpushare-rec-32gi"
    )
    repaired = reconciler.reconcile_namespace(policies, governed)
    assert repaired.applied == [f"{governed}/gpushare-rec-32gi"]

    # A policy edit: sizes that go are deleted, new ones applied, the rest left alone.
    coarser = reconciler.reconcile_namespace(small_dra_policies("40Gi"), governed)
    assert sorted(coarser.applied) == [f"{governed}/gpushare-rec-40gi"]
    assert sorted(coarser.deleted) == sorted(
        f"{governed}/gpushare-rec-{n}gi" for n in (16, 32, 48, 64)
    )
    assert coarser.unchanged == 1  # 80Gi: same size, same spec
    assert template_names(api_client, governed) == {"gpushare-rec-40gi", "gpushare-rec-80gi"}

    # Running: a namespace created later gets its templates from the namespace watch.
    stop = threading.Event()
    status = ReconcilerStatus()
    loop = threading.Thread(
        target=run,
        args=(reconciler, lambda: policies, stop),
        kwargs={"watch_s": 5, "status": status},
        daemon=True,
    )
    loop.start()
    try:
        later = unique_name("dra-rec")
        core_v1.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=later)))
        wait_for(
            f"templates in {later}",
            lambda: True if template_names(api_client, later) == sixteens else None,
            timeout=SCHEDULE_TIMEOUT_S,
            interval=0.5,
        )
        # The first full pass put the 16Gi set back in the namespace edited above too.
        assert template_names(api_client, governed) == sixteens
        # What the probes and metrics report of it (webhook/dra/status.py).
        assert status.ready()[0] and status.alive()[0]
        new = status.registry.get_sample_value(
            "gpushare_dra_reconciles_total", {"scope": "namespace", "outcome": "ok"}
        )
        assert new is not None and new >= 1
        created = status.registry.get_sample_value("gpushare_dra_templates_created_total")
        assert created is not None and created >= 5 + 4  # the new namespace, the 16Gi put back
    finally:
        stop.set()
        loop.join(timeout=30)
    assert not loop.is_alive()


# -- the whole path: annotation -> webhook -> claim from a template -> scheduler -------------


@pytest.fixture(scope="module")
def dra_webhook(
    control_plane: ControlPlane,
    tmp_path_factory: pytest.TempPathFactory,
    probe_namespace: str,
) -> Iterator[GpushareWebhook]:
    """A gpushare serve of its own serving the bundled default policy and the dra example
    (gpu-dra-* namespaces), registered for this module's tests."""
    policies = tmp_path_factory.mktemp("dra-policies")
    shutil.copy(REPO / "policies/default.yaml", policies / "default.yaml")
    shutil.copy(DRA_EXAMPLE, policies / "dra.yaml")
    server = WebhookServer.start(tmp_path_factory.mktemp("dra-webhook"), policies)
    webhook = GpushareWebhook(server, control_plane.api, probe_namespace)
    try:
        webhook.register()
        yield webhook
        webhook.unregister()
    finally:
        server.stop()


def annotated_pod(name: str, fraction: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": {FRACTION_ANNOTATION: fraction}},
        "spec": {"containers": [{"name": "main", "image": PAUSE_IMAGE}]},
    }


def test_annotated_pods_get_claims_the_scheduler_packs_onto_the_selected_gpus(
    dra_nodes: list[str],
    dra_webhook: GpushareWebhook,
    fake_nodes: NodeFactory,
    api_client: k8s.ApiClient,
    core_v1: k8s.CoreV1Api,
) -> None:
    """Seven pods asking gpu-fraction 0.25 (20Gi of the policy's 80Gi) in a gpu-dra-*
    namespace: three per H100, none on the A100 (the policy selects Hopper), the 7th
    Pending."""
    ampere = unique_name("dra-a100")
    fake_nodes(FakeGpuNode(name=ampere))
    api_request(
        api_client,
        "POST",
        f"{RESOURCE_API}/resourceslices",
        gpu_slice(ampere, 1, "81920Mi", "NVIDIA A100-SXM4-80GB", "Ampere"),
    )
    namespace = unique_name("gpu-dra")
    core_v1.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=namespace)))
    try:
        reconciler = TemplateReconciler(TemplateApi(api_client), namespace_templates)
        result = reconciler.reconcile_namespace(load_policies(DRA_EXAMPLE), namespace)
        assert (len(result.applied), result.errors) == (77, [])  # 4Gi .. 80Gi

        for index in range(7):
            admitted = core_v1.create_namespaced_pod(namespace, annotated_pod(f"p{index}", "0.25"))
            claims = [c.to_dict() for c in admitted.spec.resource_claims]
            assert claims == [
                {
                    "name": CLAIM_NAME,
                    "resource_claim_name": None,
                    "resource_claim_template_name": "gpushare-dra-h100-20gi",
                }
            ]
            applied = json.loads(admitted.metadata.annotations[APPLIED_ANNOTATION])
            assert (applied["mode"], applied["memory"]) == ("dra", "20Gi")

        states = wait_bound_and_unschedulable(core_v1, namespace, bound=6, pending=1)
        per_node: dict[str, int] = {}
        for node, _ in states.values():
            if node:
                per_node[node] = per_node.get(node, 0) + 1
        assert per_node == dict.fromkeys(dra_nodes, 3)
        results = allocations(api_client, namespace)
        assert {r["consumedCapacity"]["memory"] for r in results} == {"20Gi"}
        assert ampere not in {r["pool"] for r in results}
    finally:
        core_v1.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
        delete_ignoring_absent(api_client, f"{RESOURCE_API}/resourceslices/{ampere}-{DRIVER}")


# -- the reconciler's Deployment and RBAC (deploy/dra-templates) --------------------------


def test_the_reconciler_deployment_applies_and_its_rbac_is_enough_and_no_more(
    control_plane: ControlPlane, api_client: k8s.ApiClient, core_v1: k8s.CoreV1Api
) -> None:
    """kubectl apply -k deploy/dra-templates (server-side dry run of the Deployment, the
    RBAC for real), then a pass as its ServiceAccount: templates applied; secrets refused."""
    ensure_namespace(core_v1, "gpushare-system")
    rendered = control_plane.kubectl("kustomize", str(REPO / "deploy/dra-templates")).stdout
    kinds = sorted(d["kind"] for d in yaml.safe_load_all(rendered) if d)
    assert kinds == ["ClusterRole", "ClusterRoleBinding", "Deployment", "ServiceAccount"]
    control_plane.kubectl("apply", "--dry-run=server", "-f", "-", input=rendered)
    control_plane.kubectl("apply", "-f", str(REPO / "deploy/dra-templates/rbac.yaml"))

    account = "system:serviceaccount:gpushare-system:gpushare-dra-templates"
    as_account = control_plane.api_client()
    try:
        as_account.set_default_header("Impersonate-User", account)
        namespace = unique_name("dra-rec")
        core_v1.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=namespace)))
        reconciler = TemplateReconciler(TemplateApi(as_account), namespace_templates)
        policies = small_dra_policies("16Gi")

        def one_pass() -> bool | None:  # RBAC bindings take a moment to be in force
            result = reconciler.reconcile_namespace(policies, namespace)
            return True if len(result.applied) == 5 and not result.errors else None

        wait_for("a pass as the ServiceAccount", one_pass, timeout=30.0, interval=0.5)
        with pytest.raises(ApiException) as refused:
            k8s.CoreV1Api(as_account).list_namespaced_secret(namespace)
        assert refused.value.status == 403
    finally:
        as_account.close()  # type: ignore[no-untyped-call]


TEAM_NAMESPACES = ("gpu-dra-team-a", "gpu-dra-team-b")  # deploy/dra-templates-namespaced's


def test_the_namespaced_overlay_confines_the_reconciler_to_its_namespaces(
    control_plane: ControlPlane, api_client: k8s.ApiClient, core_v1: k8s.CoreV1Api
) -> None:
    """kubectl apply -k deploy/dra-templates-namespaced: the reconciler without its
    ClusterRole, a Role in each namespace of its list, and --namespace naming them. A pass
    as its ServiceAccount over that list applies the templates there; another namespace a
    policy governs, and the namespace list, are refused."""
    for namespace in ("gpushare-system", *TEAM_NAMESPACES):
        ensure_namespace(core_v1, namespace)
    rendered = control_plane.kubectl(
        "kustomize", str(REPO / "deploy/dra-templates-namespaced")
    ).stdout
    documents = [d for d in yaml.safe_load_all(rendered) if d]
    assert sorted((d["kind"], d["metadata"].get("namespace", "")) for d in documents) == [
        ("Deployment", "gpushare-system"),
        ("Role", "gpu-dra-team-a"),
        ("Role", "gpu-dra-team-b"),
        ("RoleBinding", "gpu-dra-team-a"),
        ("RoleBinding", "gpu-dra-team-b"),
        ("ServiceAccount", "gpushare-system"),
    ]
    (deployment,) = [d for d in documents if d["kind"] == "Deployment"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][-1] == "--namespace=" + ",".join(TEAM_NAMESPACES)
    control_plane.kubectl("apply", "--dry-run=server", "-f", "-", input=rendered)
    rbac = [d for d in documents if d["kind"] != "Deployment"]
    control_plane.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(rbac))
    # The cluster-wide binding of deploy/dra-templates (applied by the test above) would
    # grant what this one must not: gone, as the overlay replaces it.
    control_plane.kubectl(
        "delete", "clusterrolebinding", "gpushare-dra-templates", "--ignore-not-found"
    )

    other = unique_name("dra-rec")
    core_v1.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=other)))
    policies = load_policy_texts(
        [
            (
                "teams.yaml",
                f"""
apiVersion: gpushare.io/v1alpha1
kind: GpuSharingPolicy
metadata: {{name: teams}}
spec:
  match: {{namespaces: [{", ".join((*TEAM_NAMESPACES, other))}]}}
  mode: dra
  gpuMemory: 80Gi
  fraction: {{min: 0.5, max: 1}}
  dra: {{granularity: 40Gi}}
""",
            )
        ]
    )
    account = "system:serviceaccount:gpushare-system:gpushare-dra-templates"
    as_account = control_plane.api_client()
    try:
        as_account.set_default_header("Impersonate-User", account)
        api = TemplateApi(as_account)
        fixed = TemplateReconciler(api, namespace_templates, namespaces=TEAM_NAMESPACES)

        def confined() -> bool | None:  # RBAC changes take a moment to be in force
            done, result = fixed.reconcile_all(policies)
            outside = TemplateReconciler(api, namespace_templates).reconcile_namespace(
                policies, other
            )
            if done != set(TEAM_NAMESPACES) or result.errors or not outside.errors:
                return None
            assert "HTTP 403" in outside.errors[0], outside.errors
            return True

        wait_for("a pass confined to the Roles' namespaces", confined, timeout=30.0, interval=0.5)
        for namespace in TEAM_NAMESPACES:
            assert template_names(api_client, namespace) == {
                "gpushare-teams-40gi",
                "gpushare-teams-80gi",
            }
        assert template_names(api_client, other) == set()
        with pytest.raises(TemplateApiError) as listing:
            api.namespaces()
        assert listing.value.status == 403
    finally:
        as_account.close()  # type: ignore[no-untyped-call]
