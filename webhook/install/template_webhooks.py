"""The validating webhooks that check workloads' pod templates at ``kubectl apply``.

One webhook per match condition: a matchCondition must hold for every kind its rules match,
and kinds keep their templates in different places, so kinds share a webhook only where
their conditions are the same (Deployment, StatefulSet, DaemonSet, ReplicaSet, Job and
ReplicationController, all ``spec.template``). The kinds and their templates come from the
core's table (``webhook.core.workload_kinds``, and the policy settings' own kinds), the same
one the CLI, ``plan`` and the webhook read.

A condition sends an object when any of its templates carries a request annotation where
its pods will take it from (a PodTemplateSpec's ``metadata.annotations``, a KServe
component's ``annotations``, an Argo template's ``metadata.annotations`` or the workflow's
``podMetadata``), or when the object's own metadata does (its pods take it from there for
some kinds; for the others gpushare warns that it does nothing there). Every step is guarded
by ``has()`` (a missing field is an evaluation error, which the failurePolicy would decide);
``[*]`` steps become ``exists`` over a list's items, ``.*`` over a map's keys.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from webhook.constants import KUEUE_QUEUE_LABEL, REQUEST_ANNOTATIONS
from webhook.core import Shape, TemplateSite, WorkloadKind
from webhook.install.policy_facts import cel_string

WORKLOAD_OPERATIONS = ["CREATE", "UPDATE"]
WEBHOOK_SUFFIX = ".gpushare.io"
# The built-in kinds' webhook that existing installations know by name.
SPEC_TEMPLATE_WEBHOOK = "workloads.gpushare.io"
_ITEM_VARIABLES = ("a", "b", "c", "d")
# The mutating twins of the template webhooks, for workloads Kueue manages: their templates
# get the share their pods will hold (webhook.core.workload_quota), so Kueue charges it.
KUEUE_WEBHOOK_NAME = "kueue.gpushare.io"
KUEUE_CONDITION_NAME = "managed-by-kueue"
KUEUE_CONDITION = (
    f"has(object.metadata.labels) && {cel_string(KUEUE_QUEUE_LABEL)} in object.metadata.labels"
)


@dataclass(frozen=True)
class TemplateWebhook:
    """One validating webhook for the workload kinds that share ``expression``."""

    name: str
    expression: str
    kinds: tuple[WorkloadKind, ...]

    def rules(self, operations: Sequence[str]) -> list[dict[str, object]]:
        """One rule per API group, version set and scope, resources in table order."""
        rules: dict[tuple[str, tuple[str, ...], bool], list[str]] = {}
        for kind in self.kinds:
            key = (kind.group, kind.versions, kind.cluster_scoped)
            rules.setdefault(key, []).append(kind.resource)
        return [
            {
                "apiGroups": [group],
                "apiVersions": list(versions),
                "operations": list(operations),
                "resources": resources,
                "scope": "Cluster" if cluster else "Namespaced",
            }
            for (group, versions, cluster), resources in rules.items()
        ]


def _annotated(annotations: str) -> str:
    tests = " || ".join(f"{cel_string(key)} in {annotations}" for key in REQUEST_ANNOTATIONS)
    return f"({tests})"


def _guarded(base: str, steps: Sequence[str], inner: str, depth: int = 0) -> str:
    """``inner`` (a test on the value at ``base.steps``), every step guarded by has();
    ``[*]`` and ``*`` steps iterate with ``exists``."""
    guards: list[str] = []
    current = base
    for index, step in enumerate(steps):
        if step in ("[*]", "*"):
            variable = _ITEM_VARIABLES[depth % len(_ITEM_VARIABLES)] + str(depth)
            element = variable if step == "[*]" else f"{current}[{variable}]"
            rest = _guarded(element, steps[index + 1 :], inner, depth + 1)
            return " && ".join([*guards, f"{current}.exists({variable}, {rest})"])
        current = f"{current}.{step}"
        guards.append(f"has({current})")
    return " && ".join([*guards, inner.replace("@", current)])


def site_expression(site: TemplateSite) -> str | None:
    """True where the template carries a request annotation its pods take (or the object
    its pods take their annotations from does); None for a template whose pods take their
    annotations from the owner alone."""
    if site.metadata_from:
        steps = [*site.metadata_from, "annotations"]
    elif site.shape is Shape.POD_TEMPLATE and not site.owner_metadata:
        steps = [*site.path, "metadata", "annotations"]
    elif site.shape is Shape.KSERVE_COMPONENT:
        steps = [*site.path, "annotations"]
    elif site.shape is Shape.ARGO_TEMPLATE:
        steps = [*site.path, "metadata", "annotations"]
    else:
        return None
    return _guarded("object", steps, _annotated("@"))


def kind_expression(kind: WorkloadKind) -> str:
    """The kind's condition: any template annotated, or the object's own metadata."""
    parts = [_guarded("object", ["metadata", "annotations"], _annotated("@"))]
    for site in kind.sites:
        expression = site_expression(site)
        if expression is not None:
            parts.append(expression)
        if site.shape is Shape.ARGO_TEMPLATE:  # the workflow's podMetadata, under the list
            workflow = [step for step in site.path[:-2]]
            parts.append(
                _guarded("object", [*workflow, "podMetadata", "annotations"], _annotated("@"))
            )
    unique = list(dict.fromkeys(parts))
    return " || ".join(f"({part})" for part in unique)


def template_webhooks(kinds: Sequence[WorkloadKind]) -> list[TemplateWebhook]:
    """The webhooks for ``kinds``: those with equal conditions share one, in table order."""
    grouped: dict[str, list[WorkloadKind]] = {}
    for kind in kinds:
        grouped.setdefault(kind_expression(kind), []).append(kind)
    webhooks = []
    taken: set[str] = set()
    for expression, members in grouped.items():
        first = members[0]
        if any(k.kind == "Deployment" and k.group == "apps" for k in members):
            name = SPEC_TEMPLATE_WEBHOOK
        else:
            name = first.resource + WEBHOOK_SUFFIX
            if name in taken:
                name = f"{first.resource}.{first.group}{WEBHOOK_SUFFIX}"
        taken.add(name)
        webhooks.append(TemplateWebhook(name, expression, tuple(members)))
    return webhooks


def webhook_entries(kinds: Sequence[WorkloadKind]) -> list[dict[str, object]]:
    """The webhooks for ``kinds`` as the Helm chart lists them (name, rules, expression):
    its ``files/workload-webhooks.yaml`` and ``webhook.extraWorkloadWebhooks``."""
    return [
        {"name": w.name, "rules": w.rules(WORKLOAD_OPERATIONS), "expression": w.expression}
        for w in template_webhooks(kinds)
    ]
