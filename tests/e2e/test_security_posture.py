"""deploy/ against the real kube-apiserver: least privilege, network isolation, pod security.

What is checked, and what cannot be here:
- RBAC. deploy/base and deploy/mps-daemon, and the opt-in deploy/components/networkpolicy
  and deploy/admission-check, are rendered (`kubectl kustomize`) and applied server-side
  for real; then the apiserver's own RBAC authorizer answers, for every
  ServiceAccount of deploy/, SubjectAccessReviews (ACCESS below: what it must be allowed,
  and dangerous rights it must not have) and SelfSubjectRulesReviews under impersonation
  (everything it may do, which must be exactly the needed rules on top of what any
  ServiceAccount gets). deploy/ has no certificate job (`gpushare certs` runs on the admin's
  machine; the cert-manager overlay uses cert-manager's own controllers); its one Job is the
  admission check (create on pods in `default`, for its dry run): a ServiceAccount or Job
  appearing in deploy/ without a row in ACCESS fails the tests.
- NetworkPolicy. The objects are accepted and stored, and select the pods and ports they
  should, checked against the stored Deployment, DaemonSet and Service; the kustomize
  patches their comments document render, change what they say, and are accepted. Whether
  traffic is really blocked is NOT tested: the harness has no kubelet, no pod network and
  no CNI, so nothing here enforces a NetworkPolicy, and no packet is sent.
- securityContext of the rendered pod templates, field by field (a failure names the
  field), and the apiserver's PodSecurity admission on pods built from the templates
  (server-side dry runs): the webhook passes `restricted`, the MPS daemon fails `baseline`
  for exactly its documented privileges. Whether the MPS daemon works under its
  capabilities and seccomp profile needs a GPU node, which this harness is not.
"""

from __future__ import annotations

import ipaddress
import re
import shutil
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from harness.api import as_json, create_pod, status_message
from harness.controlplane import ControlPlane

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
WEBHOOK_NS, WEBHOOK_SA = "gpushare-system", "gpushare"
MPS_NS, MPS_SA = "gpushare-mps", "gpushare-mps-daemon"
CHECK_SA = "gpushare-admission-check"
RBAC_GROUP = "rbac.authorization.k8s.io"
ADMISSION_GROUP = "admissionregistration.k8s.io"
# What every ServiceAccount may do anyway (discovery, self reviews): the reference the
# rules reviews subtract. A namespace nothing in deploy/ names.
BASELINE_USER = "system:serviceaccount:e2e-rbac-baseline:nobody"


def documents(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def kustomize(control_plane: ControlPlane, directory: Path) -> list[dict[str, Any]]:
    return documents(control_plane.kubectl("kustomize", str(directory)).stdout)


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    (doc,) = [
        d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]
    return doc


@pytest.fixture(scope="module")
def rendered(control_plane: ControlPlane) -> dict[str, list[dict[str, Any]]]:
    """base, mps-daemon, and what an admin opts into: the webhook's NetworkPolicies (a
    component, rendered on its own) and the admission check."""
    return {name: kustomize(control_plane, DEPLOY / path) for name, path in RENDERED.items()}


RENDERED = {
    "base": "base",
    "mps-daemon": "mps-daemon",
    "networkpolicy": "components/networkpolicy",
    "admission-check": "admission-check",
}


@pytest.fixture(scope="module")
def applied(
    control_plane: ControlPlane, rendered: dict[str, list[dict[str, Any]]]
) -> dict[str, list[dict[str, Any]]]:
    """The kustomizations applied server-side for real, namespaces first so that the
    namespaced objects find them. Nothing runs them (no kubelet, no controllers: the
    admission check's Job is stored and never started)."""
    docs = [doc for name in RENDERED for doc in rendered[name]]
    for batch in (
        [d for d in docs if d["kind"] == "Namespace"],
        [d for d in docs if d["kind"] != "Namespace"],
    ):
        result = control_plane.kubectl(
            "apply", "--server-side", "--field-manager=e2e-security", "-f", "-",
            input=yaml.safe_dump_all(batch),
        )  # fmt: skip
        assert result.stdout.count("serverside-applied") == len(batch), result.stdout
        assert "Warning" not in result.stderr, result.stderr
    return rendered


# -- RBAC: access reviews against the real authorizer --------------------------------------


@dataclass(frozen=True)
class Access:
    """One SubjectAccessReview: `verb` on `group/resource[/subresource]`, in `namespace`
    ("" = every namespace, or cluster-scoped), of object `name` ("" = any)."""

    verb: str
    resource: str
    group: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""

    def __str__(self) -> str:
        what = "/".join(p for p in (self.group or "core", self.resource, self.subresource) if p)
        where = f" in {self.namespace}" if self.namespace else " cluster-wide"
        return f"{self.verb} {what}{f' {self.name!r}' if self.name else ''}{where}"


def dangerous(own_namespace: str) -> list[Access]:
    """Rights no gpushare component needs, and whose theft would hurt most."""
    return [
        Access("*", "*", group="*"),
        Access("*", "*", group="*", namespace=own_namespace),
        *(Access(verb, "secrets") for verb in ("get", "list", "watch")),
        Access("get", "secrets", namespace=own_namespace),
        Access("get", "configmaps", namespace=own_namespace),
        Access("list", "pods"),
        Access("create", "pods", namespace="default"),
        Access("create", "pods", namespace=own_namespace),
        Access("create", "pods", subresource="exec", namespace="kube-system"),
        Access("create", "pods", subresource="eviction", namespace="default"),
        Access("create", "serviceaccounts", subresource="token", namespace=own_namespace),
        Access("get", "nodes"),
        Access("patch", "nodes"),
        Access("create", "nodes"),
        Access("update", "nodes"),
        Access("delete", "nodes"),
        Access("list", "nodes"),
        Access("watch", "nodes"),
        Access("patch", "nodes", subresource="status"),
        Access("patch", "nodes", subresource="proxy"),
        Access("get", "nodes", subresource="proxy"),
        Access("escalate", "clusterroles", group=RBAC_GROUP),
        Access("bind", "clusterroles", group=RBAC_GROUP),
        Access("create", "clusterrolebindings", group=RBAC_GROUP),
        Access("create", "rolebindings", group=RBAC_GROUP, namespace=own_namespace),
        Access("impersonate", "users"),
        Access("impersonate", "groups"),
        Access("impersonate", "serviceaccounts"),
        Access("patch", "mutatingwebhookconfigurations", group=ADMISSION_GROUP),
        Access("delete", "validatingwebhookconfigurations", group=ADMISSION_GROUP),
        # The pods' safety net: deleting the policy, or binding it to Warn, disarms it.
        Access("delete", "validatingadmissionpolicies", group=ADMISSION_GROUP),
        Access("patch", "validatingadmissionpolicybindings", group=ADMISSION_GROUP),
        Access("update", "certificatesigningrequests", "certificates.k8s.io", "approval"),
    ]


@dataclass(frozen=True)
class AccessRow:
    """A ServiceAccount's expected rights: `rules`, exactly, as (group, resource, verb,
    name) with "" for any name; `allowed` and `denied` (every dangerous right it is not
    allowed) as access reviews."""

    namespace: str
    name: str
    rules: frozenset[tuple[str, str, str, str]]
    allowed: tuple[Access, ...]
    # The one namespace whose Role grants `rules`; None: cluster-wide (a ClusterRole).
    rules_only_in: str | None = None

    def rules_in(self, namespace: str) -> frozenset[tuple[str, str, str, str]]:
        return self.rules if self.rules_only_in in (None, namespace) else frozenset()

    @property
    def user(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.name}"

    @property
    def denied(self) -> list[Access]:
        return [a for a in dangerous(self.namespace) if a not in self.allowed]


ACCESS = {
    # The webhook makes no API call (reads its certificate and policies from mounts): nothing.
    WEBHOOK_SA: AccessRow(WEBHOOK_NS, WEBHOOK_SA, frozenset(), ()),
    # The launcher reads its Node and merge-patches its labels and annotations
    # (webhook/node/node_api.py): get and patch nodes, nothing else; RBAC cannot narrow it
    # to the launcher's own node (deploy/mps-daemon/rbac.yaml).
    MPS_SA: AccessRow(
        MPS_NS,
        MPS_SA,
        frozenset({("", "nodes", "get", ""), ("", "nodes", "patch", "")}),
        (
            Access("get", "nodes"),
            Access("patch", "nodes"),
            Access("get", "nodes", name="gpu-node-1"),
            Access("patch", "nodes", name="gpu-node-1"),
        ),
    ),
    # The admission check (deploy/admission-check) makes a server-side dry run of a pod in
    # `default`: create on pods there, which RBAC cannot narrow to dry runs, and nothing else.
    CHECK_SA: AccessRow(
        WEBHOOK_NS,
        CHECK_SA,
        frozenset({("", "pods", "create", "")}),
        (Access("create", "pods", namespace="default"),),
        rules_only_in="default",
    ),
}


def access_allowed(api: k8s.ApiClient, row: AccessRow, access: Access) -> bool:
    """The authorizer's answer for the ServiceAccount's user and the groups its tokens carry."""
    review = k8s.V1SubjectAccessReview(
        spec=k8s.V1SubjectAccessReviewSpec(
            user=row.user,
            groups=[
                "system:serviceaccounts",
                f"system:serviceaccounts:{row.namespace}",
                "system:authenticated",
            ],
            resource_attributes=k8s.V1ResourceAttributes(
                verb=access.verb,
                group=access.group,
                resource=access.resource,
                subresource=access.subresource or None,
                namespace=access.namespace or None,
                name=access.name or None,
            ),
        )
    )
    answer = k8s.AuthorizationV1Api(api).create_subject_access_review(review)
    return bool(answer.status.allowed)


def rules_of(
    control_plane: ControlPlane, user: str, namespace: str
) -> tuple[set[tuple[str, str, str, str]], set[tuple[str, str]]]:
    """Everything `user` may do in `namespace` (cluster-wide rules included), as the apiserver
    lists it for the user itself: a SelfSubjectRulesReview sent impersonating it."""
    api = control_plane.api_client()
    # A ServiceAccount's user name without Impersonate-Group: the apiserver adds its groups.
    api.set_default_header("Impersonate-User", user)
    try:
        review = k8s.AuthorizationV1Api(api).create_self_subject_rules_review(
            k8s.V1SelfSubjectRulesReview(spec=k8s.V1SelfSubjectRulesReviewSpec(namespace=namespace))
        )
    finally:
        api.close()  # type: ignore[no-untyped-call]
    status = review.status
    assert not status.incomplete, status.evaluation_error
    resource_rules = {
        (group, resource, verb, name)
        for rule in status.resource_rules
        for group in rule.api_groups or [""]
        for resource in rule.resources or []
        for verb in rule.verbs
        for name in rule.resource_names or [""]
    }
    non_resource = {
        (url, verb)
        for rule in status.non_resource_rules
        for url in rule.non_resource_urls or []
        for verb in rule.verbs
    }
    return resource_rules, non_resource


def service_accounts(docs: list[dict[str, Any]]) -> set[str]:
    return {d["metadata"]["name"] for d in docs if d["kind"] == "ServiceAccount"}


def test_every_service_account_and_workload_in_deploy_has_an_access_row(
    control_plane: ControlPlane, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    """A new ServiceAccount (a certificate job, say) must get its row in ACCESS first."""
    cert_manager = kustomize(control_plane, DEPLOY / "overlays/cert-manager")
    everything = list(
        {
            (d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]): d
            for d in [*(doc for docs in rendered.values() for doc in docs), *cert_manager]
        }.values()
    )
    assert service_accounts(everything) == set(ACCESS)
    # The one Job: the admission check an admin runs after applying.
    jobs = [d for d in everything if d["kind"] in ("Job", "CronJob", "Pod")]
    assert [(d["kind"], d["metadata"]["name"]) for d in jobs] == [("Job", CHECK_SA)]
    for kind, name in (
        ("Deployment", "gpushare"),
        ("DaemonSet", "gpushare-mps-daemon"),
        ("Job", CHECK_SA),
    ):
        workload = one(everything, kind, name)
        pod = workload["spec"]["template"]["spec"]
        row = ACCESS[pod["serviceAccountName"]]
        assert workload["metadata"]["namespace"] == row.namespace


@pytest.mark.parametrize("account", sorted(ACCESS))
def test_access_reviews_allow_exactly_what_is_needed(
    account: str, applied: dict[str, list[dict[str, Any]]], control_plane: ControlPlane
) -> None:
    row = ACCESS[account]
    api = control_plane.api
    wrong = [f"{a}: denied, needed" for a in row.allowed if not access_allowed(api, row, a)]
    wrong += [f"{a}: allowed, must not be" for a in row.denied if access_allowed(api, row, a)]
    assert not wrong, f"{row.user}:\n" + "\n".join(wrong)

    # Exactly: everything it may do, minus what any ServiceAccount may, is its rules. The
    # baseline is a ServiceAccount of another namespace, so that grants to this one's
    # namespace group (system:serviceaccounts:<namespace>) count as its own.
    for namespace in sorted({row.namespace, WEBHOOK_NS, MPS_NS, "default", "kube-system"}):
        rules, urls = rules_of(control_plane, row.user, namespace)
        base_rules, base_urls = rules_of(control_plane, BASELINE_USER, namespace)
        expected = row.rules_in(namespace)
        assert rules - base_rules == expected, f"{row.user} in namespace {namespace}"
        assert urls == base_urls, f"{row.user}: non-resource URLs beyond any account's"


def test_bindings_name_each_service_account_only_as_deploy_says(
    applied: dict[str, list[dict[str, Any]]], control_plane: ControlPlane
) -> None:
    """Across the cluster, only the MPS daemon's ClusterRoleBinding names a gpushare account
    (or its namespace's group); the webhook's ServiceAccount mounts no token."""
    rbac = k8s.RbacAuthorizationV1Api(control_plane.api)
    bindings = [
        as_json(control_plane.api, b)
        for b in [
            *rbac.list_cluster_role_binding().items,
            *rbac.list_role_binding_for_all_namespaces().items,
        ]
    ]
    naming: dict[str, list[str]] = {account: [] for account in ACCESS}
    for binding in bindings:
        for subject in binding.get("subjects") or []:
            for account, row in ACCESS.items():
                if (subject["kind"], subject["name"], subject.get("namespace")) in (
                    ("ServiceAccount", row.name, row.namespace),
                    ("Group", f"system:serviceaccounts:{row.namespace}", None),
                    ("User", row.user, None),
                ):
                    meta = binding["metadata"]
                    where = f"{meta['namespace']}/" if "namespace" in meta else ""
                    naming[account].append(
                        f"{binding['roleRef']['name']} via {where}{meta['name']}"
                    )
    assert naming == {
        WEBHOOK_SA: [],
        MPS_SA: [f"{MPS_SA} via {MPS_SA}"],
        CHECK_SA: [f"{CHECK_SA} via default/{CHECK_SA}"],
    }

    core = k8s.CoreV1Api(control_plane.api)
    webhook_sa = as_json(
        control_plane.api, core.read_namespaced_service_account(WEBHOOK_SA, WEBHOOK_NS)
    )
    assert webhook_sa["automountServiceAccountToken"] is False


# -- NetworkPolicy: accepted, and selecting the right pods and ports ------------------------


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A label selector's verdict (matchLabels and matchExpressions)."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or []:
        key, operator, values = expression["key"], expression["operator"], expression.get("values")
        present = key in labels
        verdict = {
            "In": present and labels.get(key) in (values or []),
            "NotIn": not present or labels.get(key) not in (values or []),
            "Exists": present,
            "DoesNotExist": not present,
        }[operator]
        if not verdict:
            return False
    return True


@dataclass
class PodView:
    """What the NetworkPolicies of a namespace do to pods with these labels, taken together."""

    policies: list[str]
    ingress_isolated: bool
    egress_isolated: bool
    ingress: list[dict[str, Any]]
    egress: list[dict[str, Any]]


def view(policies: list[dict[str, Any]], labels: dict[str, str]) -> PodView:
    chosen = [p for p in policies if selects(p["spec"]["podSelector"], labels)]

    def rules(direction: str) -> list[dict[str, Any]]:
        key = direction.lower()
        return [
            r
            for p in chosen
            if direction in p["spec"]["policyTypes"]
            for r in p["spec"].get(key) or []
        ]

    return PodView(
        policies=sorted(p["metadata"]["name"] for p in chosen),
        ingress_isolated=any("Ingress" in p["spec"]["policyTypes"] for p in chosen),
        egress_isolated=any("Egress" in p["spec"]["policyTypes"] for p in chosen),
        ingress=rules("Ingress"),
        egress=rules("Egress"),
    )


def stored_policies(control_plane: ControlPlane, namespace: str) -> list[dict[str, Any]]:
    networking = k8s.NetworkingV1Api(control_plane.api)
    return [
        as_json(control_plane.api, p)
        for p in networking.list_namespaced_network_policy(namespace).items
    ]


def assert_private_ip_blocks(peers: list[dict[str, Any]], what: str) -> None:
    """Only ipBlocks (a pod or namespace selector would name pods, not the control plane),
    each within private address space (never 0.0.0.0/0)."""
    assert peers, f"{what}: an empty peer list allows every source"
    for peer in peers:
        assert set(peer) == {"ipBlock"}, f"{what}: {peer} is not an ipBlock"
        network = ipaddress.ip_network(peer["ipBlock"]["cidr"])
        assert network.is_private and network.prefixlen >= 8, f"{what}: {network} is too wide"


def named_port(container: dict[str, Any], name: str) -> int:
    (port,) = [p["containerPort"] for p in container["ports"] if p["name"] == name]
    return int(port)


def test_webhook_pods_take_only_port_8443_from_the_apiservers_addresses_and_send_nothing(
    applied: dict[str, list[dict[str, Any]]], control_plane: ControlPlane
) -> None:
    """The stored policies, read as a CNI would: what they allow the Deployment's pods.
    Not enforced here (no CNI in the harness): no connection is tried."""
    api = control_plane.api
    deployment = as_json(api, k8s.AppsV1Api(api).read_namespaced_deployment("gpushare", WEBHOOK_NS))
    service = as_json(api, k8s.CoreV1Api(api).read_namespaced_service("gpushare", WEBHOOK_NS))
    template = deployment["spec"]["template"]
    (container,) = template["spec"]["containers"]
    (service_port,) = service["spec"]["ports"]
    webhook_port = named_port(container, service_port["targetPort"])
    assert webhook_port == 8443

    policies = stored_policies(control_plane, WEBHOOK_NS)
    assert sorted(p["metadata"]["name"] for p in policies) == [
        "gpushare-default-deny",
        "gpushare-webhook-from-apiserver",
    ]
    # The deny-all isolates the webhook's pods only: the chart's certgen Jobs share the
    # namespace and must reach the apiserver (components/networkpolicy says why).
    assert view(policies, {}).policies == []

    pods = view(policies, template["metadata"]["labels"])
    assert pods.policies == ["gpushare-default-deny", "gpushare-webhook-from-apiserver"]
    assert pods.ingress_isolated and pods.egress_isolated
    assert pods.egress == [], "the webhook needs no egress: it reads mounted files only"
    (rule,) = pods.ingress
    assert rule["ports"] == [{"protocol": "TCP", "port": webhook_port}]
    assert_private_ip_blocks(rule["from"], "webhook ingress")
    # The allow rule opens nothing for other pods of the namespace.
    assert view(policies, {"app.kubernetes.io/name": "gpushare"}).ingress == []


def test_mps_daemon_pods_take_nothing_and_reach_only_the_apiserver(
    applied: dict[str, list[dict[str, Any]]], control_plane: ControlPlane
) -> None:
    """As for the webhook, for the DaemonSet's pods; again not enforced here (no CNI)."""
    api = control_plane.api
    daemonset = as_json(
        api, k8s.AppsV1Api(api).read_namespaced_daemon_set("gpushare-mps-daemon", MPS_NS)
    )
    template = daemonset["spec"]["template"]
    assert not template["spec"].get("hostNetwork"), "NetworkPolicy skips hostNetwork pods"

    policies = stored_policies(control_plane, MPS_NS)
    names = [
        "gpushare-mps-daemon-metrics",
        "gpushare-mps-daemon-to-apiserver",
        "gpushare-mps-default-deny",
    ]
    assert sorted(p["metadata"]["name"] for p in policies) == names
    pods = view(policies, template["metadata"]["labels"])
    assert pods.policies == names
    assert pods.ingress_isolated and pods.egress_isolated
    # Port 9400 serves the kubelet's probes (node-local, always allowed) and /metrics, which
    # only Prometheus's pods of the namespace monitoring reach (deploy/monitoring scrapes it).
    (scrape,) = pods.ingress
    assert scrape["ports"] == [{"protocol": "TCP", "port": 9400}]
    assert scrape["from"] == [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
        }
    ]
    (rule,) = pods.egress
    assert rule["ports"] == [
        {"protocol": "TCP", "port": 443},
        {"protocol": "TCP", "port": 6443},
    ], "the apiserver's Service port and its usual endpoint ports, nothing else (no DNS)"
    assert_private_ip_blocks(rule["to"], "MPS daemon egress")


def documented_patches(path: Path) -> list[list[dict[str, Any]]]:
    """The `patches:` examples written in a manifest's comments, parsed as YAML."""
    lines = path.read_text().splitlines()
    examples = []
    for start, line in enumerate(lines):
        if line.startswith("#") and line[1:].strip() == "patches:":
            block: list[str] = []
            for follow in lines[start:]:
                if not follow.startswith("#") or not follow[1:].strip():
                    break
                block.append(follow[1:])
            examples.append(yaml.safe_load(textwrap.dedent("\n".join(block)))["patches"])
    return examples


PATCHED = {
    "networkpolicy": DEPLOY / "components/networkpolicy/networkpolicy.yaml",
    "mps-daemon": DEPLOY / "mps-daemon/network-policy/networkpolicy.yaml",
}


@pytest.fixture
def deploy_copy(tmp_path: Path) -> Path:
    """A copy of deploy/ to put overlays beside (kustomize refuses absolute bases)."""
    shutil.copytree(DEPLOY, tmp_path / "deploy")
    return tmp_path


@pytest.mark.parametrize("kustomization", sorted(PATCHED))
def test_documented_network_policy_patches_render_and_are_accepted(
    kustomization: str,
    deploy_copy: Path,
    applied: dict[str, list[dict[str, Any]]],
    control_plane: ControlPlane,
) -> None:
    """The CIDRs are cluster-specific: the patches the comments show for them work as
    written, change only their target, and the apiserver accepts the result."""
    examples = documented_patches(PATCHED[kustomization])
    assert examples, f"no patch example in {PATCHED[kustomization]}"
    original = applied[kustomization]
    for index, patches in enumerate(examples):
        overlay = deploy_copy / f"overlay-{kustomization}-{index}"
        overlay.mkdir()
        # A component is taken in under `components:` (alone it renders its own objects).
        path = RENDERED[kustomization]
        field = "components" if path.startswith("components/") else "resources"
        (overlay / "kustomization.yaml").write_text(
            yaml.safe_dump({field: [f"../deploy/{path}"], "patches": patches})
        )
        patched = kustomize(control_plane, overlay)

        (entry,) = patches
        target = entry["target"]
        expected = [
            jsonpatch.apply_patch(d, yaml.safe_load(entry["patch"]))
            if (d["kind"], d["metadata"]["name"]) == (target["kind"], target["name"])
            else d
            for d in original
        ]
        assert patched == expected
        changed = one(patched, target["kind"], target["name"])
        assert changed != one(original, target["kind"], target["name"])
        result = control_plane.kubectl(
            # Forced: the stored object may be co-owned by another test's field manager.
            "apply", "--server-side", "--dry-run=server", "--field-manager=e2e-security",
            "--force-conflicts", "-f", "-", input=yaml.safe_dump(changed),
        )  # fmt: skip
        assert "serverside-applied (server dry run)" in result.stdout, result.stdout
        assert "Warning" not in result.stderr, result.stderr


# -- securityContext, as rendered --------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """A field of the pod spec and what it must be."""

    field: str
    value: Callable[[dict[str, Any], dict[str, Any]], Any]
    ok: Callable[[Any], bool]
    must: str


def effective(name: str) -> Callable[[dict[str, Any], dict[str, Any]], Any]:
    """A container securityContext field, falling back to the pod's (as the kubelet does)."""

    def value(pod: dict[str, Any], container: dict[str, Any]) -> Any:
        own = container.get("securityContext") or {}
        return own[name] if name in own else (pod.get("securityContext") or {}).get(name)

    return value


def container_field(*path: str) -> Callable[[dict[str, Any], dict[str, Any]], Any]:
    def value(pod: dict[str, Any], container: dict[str, Any]) -> Any:
        node: Any = container.get("securityContext") or {}
        for key in path:
            node = (node or {}).get(key)
        return node

    return value


def pod_field(name: str) -> Callable[[dict[str, Any], dict[str, Any]], Any]:
    return lambda pod, container: pod.get(name)


RULES = (
    Rule("securityContext.runAsNonRoot", effective("runAsNonRoot"), lambda v: v is True, "true"),
    Rule("securityContext.runAsUser", effective("runAsUser"), lambda v: v != 0, "not 0"),
    Rule(
        "securityContext.readOnlyRootFilesystem",
        container_field("readOnlyRootFilesystem"),
        lambda v: v is True,
        "true",
    ),
    Rule(
        "securityContext.allowPrivilegeEscalation",
        container_field("allowPrivilegeEscalation"),
        lambda v: v is False,
        "false",
    ),
    Rule("securityContext.privileged", container_field("privileged"), lambda v: not v, "unset"),
    Rule(
        "securityContext.capabilities.drop",
        container_field("capabilities", "drop"),
        lambda v: "ALL" in (v or []),
        "to include ALL",
    ),
    Rule(
        "securityContext.capabilities.add",
        container_field("capabilities", "add"),
        lambda v: not v,
        "empty",
    ),
    Rule(
        "securityContext.seccompProfile.type",
        lambda pod, c: (effective("seccompProfile")(pod, c) or {}).get("type"),
        lambda v: v in ("RuntimeDefault", "Localhost"),
        "RuntimeDefault",
    ),
    Rule(
        "spec.automountServiceAccountToken",
        pod_field("automountServiceAccountToken"),
        lambda v: v is False,
        "false",
    ),
    Rule("spec.hostNetwork", pod_field("hostNetwork"), lambda v: not v, "unset"),
    Rule("spec.hostPID", pod_field("hostPID"), lambda v: not v, "unset"),
    Rule("spec.hostIPC", pod_field("hostIPC"), lambda v: not v, "unset"),
    Rule(
        "spec.volumes[].hostPath",
        lambda pod, c: [v["hostPath"]["path"] for v in pod.get("volumes", []) if "hostPath" in v],
        lambda v: not v,
        "none",
    ),
)

# The MPS daemon's departures from RULES, each exactly this value, and the word its comment
# in deploy/mps-daemon/daemonset.yaml must use to say why.
MPS_EXCEPTIONS: dict[str, tuple[Any, str]] = {
    "securityContext.runAsNonRoot": (None, "runAsNonRoot"),
    "securityContext.runAsUser": (0, "runAsUser 0"),
    "securityContext.allowPrivilegeEscalation": (True, "allowPrivilegeEscalation"),
    "securityContext.capabilities.drop": (None, "drop: [ALL]"),
    "securityContext.capabilities.add": (["SYS_ADMIN"], "CAP_SYS_ADMIN"),
    "spec.automountServiceAccountToken": (True, "token"),
    "spec.hostPID": (True, "hostPID"),
    "spec.hostIPC": (True, "hostIPC"),
    "spec.volumes[].hostPath": (["/run/gpushare/mps"], "hostPath"),
}
WORKLOADS = {
    "webhook": ("base", "Deployment", {}),
    "mps-daemon": ("mps-daemon", "DaemonSet", MPS_EXCEPTIONS),
}


def violations(workload: dict[str, Any], exceptions: dict[str, tuple[Any, str]]) -> list[str]:
    pod = workload["spec"]["template"]["spec"]
    found = []
    for container in [*pod.get("initContainers", []), *pod["containers"]]:
        where = f"{workload['kind']} {workload['metadata']['name']}, container {container['name']}"
        for rule in RULES:
            value = rule.value(pod, container)
            if rule.field in exceptions:
                allowed = exceptions[rule.field][0]
                if value != allowed:
                    found.append(f"{where}: {rule.field} is {value!r}, documented as {allowed!r}")
            elif not rule.ok(value):
                found.append(f"{where}: {rule.field} is {value!r}, must be {rule.must}")
    return found


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_rendered_security_context(name: str, rendered: dict[str, list[dict[str, Any]]]) -> None:
    kustomization, kind, exceptions = WORKLOADS[name]
    workload = one(rendered[kustomization], kind)
    found = violations(workload, exceptions)
    assert not found, "\n".join(found)
    if exceptions:
        comments = "\n".join(
            line.strip()
            for line in (DEPLOY / "mps-daemon/daemonset.yaml").read_text().splitlines()
            if line.strip().startswith("#")
        )
        undocumented = [f for f, (_, word) in exceptions.items() if word not in comments]
        assert not undocumented, f"no comment in daemonset.yaml says why: {undocumented}"


def pod_from(workload: dict[str, Any], name: str) -> dict[str, Any]:
    template = workload["spec"]["template"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": template["metadata"]["labels"]},
        "spec": template["spec"],
    }


def test_webhook_pod_passes_pod_security_restricted(
    applied: dict[str, list[dict[str, Any]]], control_plane: ControlPlane
) -> None:
    """gpushare-system enforces `restricted`; a pod from the template is admitted, silently."""
    namespace = one(applied["base"], "Namespace")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    pod = pod_from(one(applied["base"], "Deployment"), "security-posture-webhook")
    admitted = create_pod(control_plane.api, WEBHOOK_NS, pod, dry_run=True)
    assert admitted.warnings == []


@pytest.fixture
def baseline_namespace(namespace: str, core_v1: k8s.CoreV1Api) -> Iterator[str]:
    core_v1.patch_namespace(
        namespace, {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "baseline"}}}
    )
    yield namespace


def test_mps_daemon_pod_breaks_baseline_only_by_its_documented_privileges(
    applied: dict[str, list[dict[str, Any]]],
    control_plane: ControlPlane,
    baseline_namespace: str,
) -> None:
    """PodSecurity's own list of what the MPS daemon needs beyond `baseline` (it runs in a
    `privileged` namespace): host namespaces, SYS_ADMIN and the hostPath, nothing more."""
    pod = pod_from(one(applied["mps-daemon"], "DaemonSet"), "security-posture-mps")
    # No RuntimeClass "nvidia" here (the RuntimeClass admission plugin would refuse first).
    del pod["spec"]["runtimeClassName"]
    with pytest.raises(ApiException) as refused:
        create_pod(control_plane.api, baseline_namespace, pod, dry_run=True)
    message = status_message(refused.value)
    assert refused.value.status == 403, message
    violated = message.split('violates PodSecurity "baseline:latest": ', 1)[1]
    assert sorted(re.split(r"(?<=\)), ", violated)) == [
        "host namespaces (hostPID=true, hostIPC=true)",
        'hostPath volumes (volume "mps")',
        'non-default capabilities (container "mps-daemon" must not include "SYS_ADMIN" in '
        "securityContext.capabilities.add)",
    ]
