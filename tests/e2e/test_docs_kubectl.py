"""The cluster commands the docs show, against the harness's real kube-apiserver.

tests/test_docs_commands.py states the convention and runs every command the docs show that
needs no cluster; the commands it lists in IN_THE_HARNESS (kubectl, Helm, and gpushare's own
cluster commands) run here, in their page's order with the page's local commands, exactly as
the page writes them. The harness stands in for the reader's cluster only: its admin
kubeconfig is the scratch HOME's ~/.kube/config, which kubectl, Helm and `--kubeconfig
~/.kube/config` all read, and a placeholder the reader fills in (`<node>`) gets the value
STEPS states. What a command prints (kubectl: its stderr, where warnings and errors go, then
its stdout; the others: stdout) must be what the page shows, and STEPS checks what it did to
the cluster beyond its exit status.

Two kinds of page:

- WEBHOOK_PAGES show what gpushare does to workloads. Their commands run on the session's
  control plane with gpushare registered as `gpushare webhook-config` prints it (conftest.py:
  the bundled default policy governs the namespaces these commands use); what they create is
  deleted afterwards.
- The others install gpushare (the chart, the kustomize overlay, the compiled policies, the
  DRA reconciler, the device plugin configs). They run on a control plane of this module's
  own, which no other module meets (their Fail webhooks call Services with no endpoints),
  each page starting from a cluster without gpushare (`reset`: the namespace controller runs
  for that). Nothing runs pods here (no kubelet, no job controller), so HookJobs runs the
  chart's hook Jobs the way their pods would, and Helm, which waits on them, goes on. What a
  page takes for granted at some point (deploy/base applied before deploy/dra-templates, the
  GPU Operator's namespace, a GPU node, the chart installed) STEPS makes so first, saying why.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import re
import shlex
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest
import yaml
from gpu_nodes import FakeGpuNode, create_fake_node
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from harness.api import as_json, ensure_namespace
from harness.cli import clean_environment
from harness.controlplane import ControlPlane
from harness.processes import wait_for
from harness.registration import GpushareWebhook
from tests.test_docs_commands import (
    GPUSHARE,
    IN_THE_HARNESS,
    PAGES,
    REPO,
    Command,
    check_result,
    read_page,
    run_command,
    runs_here,
    saved_files,
    scratch_checkout,
    shell_environment,
)

HARNESS_PAGES = [p for p in PAGES if any(c.text in IN_THE_HARNESS for c in read_page(p).commands)]
WEBHOOK_PAGES = [REPO / "docs/annotations.md"]
INSTALL_PAGES = [p for p in HARNESS_PAGES if p not in WEBHOOK_PAGES]

RELEASE = "gpushare"
NAMESPACE = "gpushare-system"
SYSTEM_NAMESPACES = frozenset({"default", "kube-system", "kube-public", "kube-node-lease"})
# The cluster-scoped kinds the ways of installing gpushare write: on this module's own
# control plane every object of them is the pages'.
CLUSTER_KINDS = (
    "mutatingwebhookconfigurations",
    "validatingwebhookconfigurations",
    "validatingadmissionpolicies",
    "validatingadmissionpolicybindings",
    "mutatingadmissionpolicies",
    "mutatingadmissionpolicybindings",
    "nodes",
)
RESET_TIMEOUT_S = 60.0
HOOK_TIMEOUT_S = 60.0
# Hook Jobs that need the chart's webhook pods serving, which no kubelet runs here: written
# Complete without running. The admission check's command runs in tests/e2e/test_helm_chart.py
# against the chart's Service, a local `gpushare serve` standing in for the pods.
NEEDS_THE_WEBHOOK_PODS = frozenset({f"{RELEASE}-admission-check"})
_PLACEHOLDER = re.compile(r"<[a-z][a-z ]*>")


def namespaces_of_saved_files() -> set[str]:
    return {
        document["metadata"]["namespace"]
        for content in saved_files().values()
        for document in yaml.safe_load_all(content)
        if isinstance(document, dict) and document.get("metadata", {}).get("namespace")
    }


def cluster_environment(
    directory: Path, plane: ControlPlane, helm: Path | None = None
) -> dict[str, str]:
    """test_docs_commands' environment, with kubectl (the harness's) and Helm on PATH and the
    control plane's admin kubeconfig as the reader's ~/.kube/config."""
    tools: dict[str, tuple[str, ...]] = {
        "gpushare": GPUSHARE,
        "kubectl": (str(plane.binary), "kubectl"),
    }
    if helm is not None:
        tools["helm"] = (str(helm),)
    environment = shell_environment(directory, tools)
    kube = Path(environment["HOME"]) / ".kube"
    kube.mkdir(exist_ok=True)
    shutil.copy(plane.kubeconfig, kube / "config")
    return environment


def printed_by(item: Command, result: subprocess.CompletedProcess[str]) -> str:
    return result.stderr + result.stdout if item.program == "kubectl" else result.stdout


# -- pages about workloads: the session's control plane, gpushare registered -------------------


@pytest.mark.parametrize("page", WEBHOOK_PAGES, ids=lambda p: str(p.relative_to(REPO)))
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
    environment = cluster_environment(tmp_path, control_plane)
    applied = [c for c in read_page(page).commands if c.text in IN_THE_HARNESS]
    try:
        for item in read_page(page).commands:
            if runs_here(item):
                result = run_command(item, run, environment)
                check_result(item, result, run, result.stdout)
            elif item in applied:
                result = run_command(item, run, environment)
                check_result(item, result, run, printed_by(item, result))
    finally:
        for item in applied:
            control_plane.kubectl(
                "delete", "--ignore-not-found", "-f", str(run / item.argv[-1]), check=False
            )


# -- pages that install gpushare: a control plane of this module's own -------------------------


class HookJobs:
    """What runs Helm's hook Jobs in a cluster, the job controller and a kubelet, standing in.

    Each Job that appears runs once, as a process, if its container runs gpushare: the same
    command, with a token of the Job's ServiceAccount (so the chart's RBAC is what allows
    it); those of NEEDS_THE_WEBHOOK_PODS are only written Complete. Its status is then
    written Complete or Failed as the job controller writes it, which is what Helm waits on.
    `runs` holds each Job's name and result, `errors` what went wrong.
    """

    def __init__(self, plane: ControlPlane, workdir: Path) -> None:
        self.plane = plane
        self.workdir = workdir
        self.runs: list[tuple[str, subprocess.CompletedProcess[str]]] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="hook-jobs", daemon=True)

    def __enter__(self) -> HookJobs:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join(timeout=HOOK_TIMEOUT_S + 10)
        if kind is None:
            assert not self.errors, "\n".join(self.errors)

    def _watch(self) -> None:
        api = self.plane.api_client()
        batch = k8s.BatchV1Api(api)
        done: set[str] = set()
        try:
            while not self._stop.wait(0.1):
                try:
                    jobs = batch.list_job_for_all_namespaces().items
                except ApiException as error:  # the next poll tries again
                    self.errors.append(f"listing Jobs: {error}")
                    continue
                for job in jobs:
                    if job.metadata.uid not in done:
                        done.add(job.metadata.uid)
                        try:
                            self._run(api, job)
                        except Exception as error:  # reported when the page ends
                            self.errors.append(f"Job {job.metadata.name}: {error!r}")
        finally:
            api.close()  # type: ignore[no-untyped-call]

    def _run(self, api: k8s.ApiClient, job: k8s.V1Job) -> None:
        name, namespace = job.metadata.name, job.metadata.namespace
        pod = job.spec.template.spec
        (container,) = pod.containers
        argv = [*(container.command or ()), *(container.args or ())]
        started = datetime.datetime.now(datetime.UTC).isoformat()
        succeeded = False
        if name in NEEDS_THE_WEBHOOK_PODS:
            succeeded = True
        elif argv[:1] != ["gpushare"]:
            self.errors.append(f"Job {namespace}/{name} runs {argv}: nothing here runs that")
        else:
            kubeconfig = self._token_kubeconfig(api, namespace, pod.service_account_name)
            environment = clean_environment()
            for proxy in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
                environment.pop(proxy, None)
            try:
                result = subprocess.run(
                    [*GPUSHARE, *argv[1:], f"--kubeconfig={kubeconfig}"],
                    capture_output=True,
                    text=True,
                    timeout=HOOK_TIMEOUT_S,
                    env=environment,
                    cwd=REPO,
                    check=False,
                )
            except subprocess.TimeoutExpired:  # as activeDeadlineSeconds would: Failed
                self.errors.append(f"Job {namespace}/{name}: {argv} ran past {HOOK_TIMEOUT_S}s")
            else:
                self.runs.append((name, result))
                succeeded = result.returncode == 0
        now = datetime.datetime.now(datetime.UTC).isoformat()
        if succeeded:
            ends = ("SuccessCriteriaMet", "Complete")
            status: dict[str, Any] = {"succeeded": 1, "completionTime": now}
        else:
            ends = ("FailureTarget", "Failed")
            status = {"failed": 1}
        status["startTime"] = started
        status["conditions"] = [
            {"type": end, "status": "True", "lastTransitionTime": now} for end in ends
        ]
        try:
            k8s.BatchV1Api(api).patch_namespaced_job_status(name, namespace, {"status": status})
        except ApiException as error:
            self.errors.append(f"Job {namespace}/{name}: writing its status: {error}")

    def _token_kubeconfig(self, api: k8s.ApiClient, namespace: str, account: str) -> Path:
        """A kubeconfig with a bound token of `account` (TokenRequest), as a pod mounts."""
        request = k8s.AuthenticationV1TokenRequest(
            spec=k8s.V1TokenRequestSpec(audiences=[], expiration_seconds=600)
        )
        token = (
            k8s.CoreV1Api(api)
            .create_namespaced_service_account_token(account, namespace, request)
            .status.token
        )
        ca = base64.b64encode(self.plane.pki.ca_cert.read_bytes()).decode()
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "e2e",
                    "cluster": {"server": self.plane.server, "certificate-authority-data": ca},
                }
            ],
            "users": [{"name": account, "user": {"token": token}}],
            "contexts": [{"name": "pod", "context": {"cluster": "e2e", "user": account}}],
            "current-context": "pod",
        }
        path = self.workdir / f"{namespace}-{account}-{len(self.runs)}.kubeconfig"
        path.write_text(yaml.safe_dump(config))
        return path


def reset(plane: ControlPlane) -> None:
    """A cluster without gpushare: every namespace but the system ones deleted (the namespace
    controller deletes what they hold, Helm's release records included) and every object of
    CLUSTER_KINDS, and the ClusterRoles and bindings named gpushare*."""
    core = k8s.CoreV1Api(plane.api)
    doomed = {n.metadata.name for n in core.list_namespace().items} - SYSTEM_NAMESPACES
    for name in doomed:
        try:
            core.delete_namespace(name)
        except ApiException as error:
            if error.status not in (404, 409):  # gone, or already being deleted
                raise
    plane.kubectl("delete", ",".join(CLUSTER_KINDS), "--all", "--wait=false")
    roles = plane.kubectl("get", "clusterroles,clusterrolebindings", "-o", "name").stdout.split()
    ours = [role for role in roles if role.split("/", 1)[1].startswith("gpushare")]
    if ours:
        plane.kubectl("delete", *ours)

    def gone() -> bool | None:
        left = {n.metadata.name for n in core.list_namespace().items} & doomed
        return None if left else True

    wait_for("the namespaces of the previous page deleted", gone, timeout=RESET_TIMEOUT_S)


@dataclasses.dataclass
class Cluster:
    """One page's commands on the module's control plane: where they run, and how."""

    plane: ControlPlane
    run: Path  # the scratch checkout the page's commands run in
    environment: dict[str, str]
    hooks: HookJobs

    @property
    def core(self) -> k8s.CoreV1Api:
        return k8s.CoreV1Api(self.plane.api)

    def shell(self, script: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """A command of the test's own (not the page's), in the page's environment."""
        result = subprocess.run(
            ["bash", "-c", script],
            cwd=self.run,
            env=self.environment,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert not check or result.returncode == 0, f"`{script}`: {result.stderr}"
        return result

    def page_command(self, item: Command) -> None:
        """One command the page shows that needs the cluster: STEPS' preparation, the
        command as written (placeholders filled), its exit status and output, STEPS' check."""
        step = STEPS.get(item.text, Step())
        if step.before is not None:
            step.before(self)
        script = item.script
        values = step.placeholders(self) if step.placeholders is not None else {}
        for placeholder, value in values.items():
            assert placeholder in script, f"{item.where}: no {placeholder} any more"
            script = script.replace(placeholder, value)
        assert not _PLACEHOLDER.search(script), f"{item.where}: STEPS fills no {script!r}"
        result = run_command(dataclasses.replace(item, script=script), self.run, self.environment)
        check_result(item, result, self.run, printed_by(item, result))
        if step.check is not None:
            step.check(self, item, result)


@dataclasses.dataclass(frozen=True)
class Step:
    """What the test does around one command a page shows: `before`, what the page takes for
    granted at that point, made so; `placeholders`, what stands for each of the reader's
    values; `check`, what the command must have done beyond its exit status and output."""

    before: Callable[[Cluster], None] | None = None
    placeholders: Callable[[Cluster], dict[str, str]] | None = None
    check: Callable[[Cluster, Command, subprocess.CompletedProcess[str]], None] | None = None


HELM_INSTALL = "helm install gpushare deploy/helm/gpushare -n gpushare-system --create-namespace"
LABEL_NAMESPACE = (
    "kubectl label namespace gpushare-system gpushare.io/webhook=exclude "
    "pod-security.kubernetes.io/enforce=restricted"
)
GPUSHARE_CERTS_OVERLAY = "kubectl apply --server-side -k deploy/overlays/gpushare-certs"
APPLY_COMPILED = "kubectl apply -f compiled.yaml"
DRA_TEMPLATES_KUSTOMIZATION = "kubectl apply -k deploy/dra-templates"
DRA_TEMPLATES_APPLY = "gpushare dra-templates --apply --kubeconfig ~/.kube/config"
CERTGEN_BY_HAND = (
    "gpushare certs --in-cluster --service gpushare --namespace gpushare-system "
    "--secret gpushare-tls --webhook-configuration gpushare --renew-before-days 30 "
    "--kubeconfig ~/.kube/config"
)
APPLY_DP_CONFIGS = "kubectl apply -f dp-configs.yaml"
LABEL_NODE = (
    "kubectl label node <node> nvidia.com/device-plugin.config=<pool config name> --overwrite"
)
HELM_DP_VALUES = (
    "helm upgrade --install gpushare deploy/helm/gpushare -n gpushare-system -f dp-values.yaml"
)
GPU_NODE = "gpu-node-a"
DRA_NAMESPACE = "gpu-dra-team-a"  # the namespace dra.md's GitOps command names
DP_CONFIGS = ("gpu-operator", "gpushare-device-plugin-configs")


# Preparations: what a page takes for granted.


def without_the_chart(cluster: Cluster) -> None:
    """The kustomize overlay is the page's other way to install gpushare: it goes into a
    cluster without the chart (over it, the server-side apply conflicts with what Helm and
    certgen wrote: the Secret's data, the caBundle, a NetworkPolicy's podSelector)."""
    reset(cluster.plane)


def chart_installed(cluster: Cluster) -> None:
    """The release gpushare in gpushare-system, installed as docs/deploying.md does it."""
    if cluster.shell(f"helm status {RELEASE} -n {NAMESPACE}", check=False).returncode == 0:
        return
    (install,) = [
        c for c in read_page(REPO / "docs/deploying.md").commands if c.text == HELM_INSTALL
    ]
    cluster.page_command(install)


def base_applied(cluster: Cluster) -> None:
    """deploy/dra-templates goes "after deploy/base" (the page's comment): its namespace and
    the policies ConfigMap the reconciler mounts."""
    cluster.shell("kubectl apply --server-side -k deploy/base")


def dra_policy_and_namespace(cluster: Cluster) -> None:
    """The reader's policies (./policies, the command's default) hold a dra policy, the
    page's example (the bundled default alone has none, and the pass would write nothing),
    and a namespace it governs exists: the one the page's GitOps command names."""
    shutil.copy(cluster.run / "policies/examples/dra.yaml", cluster.run / "policies/dra.yaml")
    ensure_namespace(cluster.core, DRA_NAMESPACE)


def gpu_operator_namespace(cluster: Cluster) -> None:
    """The ConfigMap goes "in the operator's namespace, gpu-operator here" (the page): the
    GPU Operator's installation made it."""
    ensure_namespace(cluster.core, DP_CONFIGS[0])


def a_gpu_node(cluster: Cluster) -> None:
    """A GPU node as GPU Feature Discovery labels one (no kubelet: the Node object alone)."""
    create_fake_node(cluster.core, FakeGpuNode(name=GPU_NODE))


def the_chart_instead(cluster: Cluster) -> None:
    """The page's "or, with gpushare's chart": the other way to the same ConfigMap, so the
    one `kubectl apply` made goes (Helm adopts no object it did not make), into the chart
    installed "as in docs/deploying.md" (the page links there)."""
    cluster.shell(f"kubectl -n {DP_CONFIGS[0]} delete configmap {DP_CONFIGS[1]}")
    chart_installed(cluster)


def node_and_pool_config(cluster: Cluster) -> dict[str, str]:
    """<node>: the GPU node; <pool config name>: the first pool's config in dp-configs.yaml
    (`default` is what unlabelled nodes get)."""
    pools = sorted(set(dp_configs(cluster.run / "dp-configs.yaml")) - {"default"})
    assert pools, "dp-configs.yaml holds no pool's config"
    return {"<node>": GPU_NODE, "<pool config name>": pools[0]}


# Checks: what a command did.


def dp_configs(path: Path) -> dict[str, str]:
    (configmap,) = [d for d in yaml.safe_load_all(path.read_text()) if d]
    data: dict[str, str] = configmap["data"]
    return data


def ca_bundles(cluster: Cluster) -> set[str]:
    admission = k8s.AdmissionregistrationV1Api(cluster.plane.api)
    return {
        webhook.client_config.ca_bundle or ""
        for configuration in (
            admission.read_mutating_webhook_configuration(RELEASE),
            admission.read_validating_webhook_configuration(RELEASE),
        )
        for webhook in configuration.webhooks
    }


def tls_secret(cluster: Cluster) -> dict[str, str]:
    secret = cluster.core.read_namespaced_secret(f"{RELEASE}-tls", NAMESPACE)
    assert secret.type == "kubernetes.io/tls"
    data: dict[str, str] = secret.data
    return data


def installed_with_certgen(
    cluster: Cluster, item: Command, result: subprocess.CompletedProcess[str]
) -> None:
    """Helm deployed the release after its certgen hook Jobs ran (as their ServiceAccount):
    the Secret made, its CA in the caBundle of both configurations."""
    assert "STATUS: deployed" in result.stdout, result.stdout
    jobs = [name for name, _ in cluster.hooks.runs[-2:]]
    assert jobs == [f"{RELEASE}-certgen-create", f"{RELEASE}-certgen-patch"], jobs
    for name, run in cluster.hooks.runs[-2:]:
        assert run.returncode == 0, f"{name}: {run.stderr}"
    assert ca_bundles(cluster) == {tls_secret(cluster)["ca.crt"]}


def namespace_labelled(
    cluster: Cluster, item: Command, result: subprocess.CompletedProcess[str]
) -> None:
    labels = cluster.core.read_namespace(NAMESPACE).metadata.labels
    assert labels["gpushare.io/webhook"] == "exclude", labels
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted", labels


def stored(cluster: Cluster, item: Command, result: subprocess.CompletedProcess[str]) -> None:
    """Every object kubectl reports applied is in the API as its name (kubectl get of the
    same file or kustomization finds each)."""
    words = item.argv
    source = words[words.index("-f") if "-f" in words else words.index("-k") :][:2]
    found = cluster.shell(f"kubectl get {shlex.join(source)} -o name").stdout.split()
    reported = [line.split()[0] for line in result.stdout.splitlines() if line.strip()]
    assert reported and sorted(found) == sorted(reported), (found, reported)


def overlay_stored(
    cluster: Cluster, item: Command, result: subprocess.CompletedProcess[str]
) -> None:
    """The overlay's objects stored, with the Secret and caBundle from the page's
    `gpushare certs` and `gpushare webhook-config`."""
    stored(cluster, item, result)
    certs = cluster.run / "certs"
    secret = tls_secret(cluster)
    for name in ("ca.crt", "tls.crt", "tls.key"):
        assert base64.b64decode(secret[name]) == (certs / name).read_bytes(), name
    assert ca_bundles(cluster) == {base64.b64encode((certs / "ca.crt").read_bytes()).decode()}


def templates_applied(
    cluster: Cluster, item: Command, result: subprocess.CompletedProcess[str]
) -> None:
    """The pass applied, in the namespace a dra policy governs, exactly the templates the
    page's GitOps command printed for it (templates.yaml)."""
    printed = [d for d in yaml.safe_load_all((cluster.run / "templates.yaml").read_text()) if d]
    assert printed
    assert f"{len(printed)} applied, 0 unchanged, 0 deleted, 0 errors" in result.stderr, (
        result.stderr
    )
    listed = k8s.ResourceV1Api(cluster.plane.api).list_namespaced_resource_claim_template(
        DRA_NAMESPACE
    )
    stored_templates = {t.metadata.name: as_json(cluster.plane.api, t) for t in listed.items}
    assert set(stored_templates) == {d["metadata"]["name"] for d in printed}
    for template in printed:  # as printed, but for the defaults the API fills in
        assert within(template["spec"], stored_templates[template["metadata"]["name"]]["spec"])


def within(part: Any, whole: Any) -> bool:
    """Whether `whole` holds every field of `part` with the same value."""
    if isinstance(part, dict):
        return isinstance(whole, dict) and all(
            k in whole and within(v, whole[k]) for k, v in part.items()
        )
    if isinstance(part, list):
        return (
            isinstance(whole, list)
            and len(part) == len(whole)
            and all(within(p, w) for p, w in zip(part, whole, strict=True))
        )
    return bool(part == whole)


def certificate_kept(
    cluster: Cluster, item: Command, result: subprocess.CompletedProcess[str]
) -> None:
    """The chart's Secret fits: kept, and both configurations already trust its CA."""
    assert f"kept Secret {NAMESPACE}/{RELEASE}-tls: valid until" in result.stdout, result.stdout
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        assert f"{kind} {RELEASE} already trusts the CA" in result.stdout, result.stdout


def node_labelled(
    cluster: Cluster, item: Command, result: subprocess.CompletedProcess[str]
) -> None:
    labels = cluster.core.read_node(GPU_NODE).metadata.labels
    assert (
        labels["nvidia.com/device-plugin.config"]
        == node_and_pool_config(cluster)["<pool config name>"]
    )


def chart_renders_the_dp_configs(
    cluster: Cluster, item: Command, result: subprocess.CompletedProcess[str]
) -> None:
    """The upgrade went through its certgen hooks, and the chart's ConfigMap is the one
    `kubectl apply -f dp-configs.yaml` made: the same configs either way."""
    assert f'Release "{RELEASE}" has been upgraded' in result.stdout, result.stdout
    installed_with_certgen(cluster, item, result)
    configmap = cluster.core.read_namespaced_config_map(DP_CONFIGS[1], DP_CONFIGS[0])
    assert configmap.metadata.labels["app.kubernetes.io/managed-by"] == "Helm"
    assert configmap.data == dp_configs(cluster.run / "dp-configs.yaml")


STEPS: dict[str, Step] = {
    # docs/deploying.md
    HELM_INSTALL: Step(check=installed_with_certgen),
    LABEL_NAMESPACE: Step(check=namespace_labelled),
    GPUSHARE_CERTS_OVERLAY: Step(before=without_the_chart, check=overlay_stored),
    APPLY_COMPILED: Step(check=stored),
    # docs/dra.md
    DRA_TEMPLATES_KUSTOMIZATION: Step(before=base_applied, check=stored),
    DRA_TEMPLATES_APPLY: Step(before=dra_policy_and_namespace, check=templates_applied),
    # docs/monitoring.md
    CERTGEN_BY_HAND: Step(before=chart_installed, check=certificate_kept),
    # docs/node-side.md
    APPLY_DP_CONFIGS: Step(before=gpu_operator_namespace, check=stored),
    LABEL_NODE: Step(before=a_gpu_node, placeholders=node_and_pool_config, check=node_labelled),
    HELM_DP_VALUES: Step(before=the_chart_instead, check=chart_renders_the_dp_configs),
}


@pytest.fixture(scope="module")
def install_plane(
    harness_binary: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    """The control plane the install pages share, one page after another (see `reset`): no
    scheduler (nothing is scheduled), the namespace controller (namespaces are deleted)."""
    workdir = tmp_path_factory.mktemp("docs-plane")
    with ControlPlane(binary=harness_binary, workdir=workdir, with_scheduler=False) as plane:
        plane.start_controller_manager(
            ["namespace-controller"], ready_log="Starting namespace controller"
        )
        yield plane


def test_every_step_is_a_command_in_the_harness() -> None:
    assert set(STEPS) <= set(IN_THE_HARNESS), set(STEPS) - set(IN_THE_HARNESS)
    assert set(WEBHOOK_PAGES) <= set(HARNESS_PAGES)
    for page in WEBHOOK_PAGES:
        assert not set(STEPS) & {c.text for c in read_page(page).commands}, page


@pytest.mark.parametrize("page", INSTALL_PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_the_install_commands_of_a_page_do_what_it_shows(
    page: Path, tmp_path: Path, install_plane: ControlPlane, helm: Path
) -> None:
    reset(install_plane)
    run = scratch_checkout(tmp_path)
    environment = cluster_environment(tmp_path, install_plane, helm)
    with HookJobs(install_plane, tmp_path / "hook-jobs") as hooks:
        cluster = Cluster(install_plane, run, environment, hooks)
        for item in read_page(page).commands:
            if runs_here(item):
                result = run_command(item, run, environment)
                check_result(item, result, run, result.stdout)
            elif item.text in IN_THE_HARNESS:
                cluster.page_command(item)
