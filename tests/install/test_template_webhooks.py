"""The workload-template webhooks' match conditions, evaluated by a CEL interpreter over
every kind in the table: an object annotated where its pods take the annotation from is
sent, one annotated nowhere is not, and no object, however sparse, makes a condition fail
(an evaluation error would be the failurePolicy's to decide)."""

from __future__ import annotations

import copy
from typing import Any

import celpy
import pytest

from webhook.core import (
    Shape,
    TemplateSite,
    WorkloadKind,
    builtin_kinds,
    check_workload,
    load_policy_text,
)
from webhook.install.template_webhooks import kind_expression, template_webhooks
from webhook.install.webhook_config import WORKLOAD_OPERATIONS

KINDS = builtin_kinds()
IDS = [k.kind for k in KINDS]
ANNOTATION = {"gpu-fraction": "0.5"}


def holds(expression: str, document: dict[str, Any]) -> bool:
    environment = celpy.Environment()
    program = environment.program(environment.compile(expression))
    result = program.evaluate({"object": celpy.json_to_cel(document)})
    assert not isinstance(result, celpy.CELEvalError), (expression, result)
    return bool(result)


def _set(document: dict[str, Any], steps: list[str], value: Any) -> None:
    """``value`` at ``steps`` in ``document``: a list of one item for ``[*]``, a map with
    the key ``Worker`` for ``*``."""
    current: Any = document
    for index, step in enumerate(steps):
        last = index == len(steps) - 1
        nxt: Any = value if last else ([] if steps[index + 1] == "[*]" else {})
        if step == "[*]":
            if not current:
                current.append({} if not last else value)
            current = current[0]
            continue
        key = "Worker" if step == "*" else step
        if last:
            current[key] = value
        else:
            current = current.setdefault(key, nxt)


def annotated_at(site: TemplateSite) -> dict[str, Any]:
    """An object whose one template of ``site`` carries the annotation where its pods take
    it from (docs/workload-kinds-facts.md)."""
    document: dict[str, Any] = {"metadata": {"name": "w"}}
    path = list(site.path)
    if site.shape is Shape.POD_TEMPLATE and not site.metadata_from and not site.owner_metadata:
        _set(document, [*path, "metadata", "annotations"], dict(ANNOTATION))
    elif site.shape is Shape.KSERVE_COMPONENT:
        _set(document, [*path, "annotations"], dict(ANNOTATION))
    elif site.shape is Shape.ARGO_TEMPLATE:
        _set(document, [*path, "metadata", "annotations"], dict(ANNOTATION))
        _set(document, [*path, "container"], {"image": "i"})
    elif site.metadata_from:
        _set(document, [*site.metadata_from, "annotations"], dict(ANNOTATION))
    else:
        document["metadata"]["annotations"] = dict(ANNOTATION)
    if site.shape is not Shape.ARGO_TEMPLATE:
        inner = [*path, "spec"] if site.shape is Shape.POD_TEMPLATE else path
        _set(document, [*inner, "containers"], [{"name": "c", "image": "i"}])
    return document


@pytest.mark.parametrize("kind", KINDS, ids=IDS)
def test_each_template_annotated_where_its_pods_read_it_is_sent(kind: WorkloadKind) -> None:
    expression = kind_expression(kind)
    policies = load_policy_text(
        "apiVersion: gpushare.io/v1alpha1\nkind: GpuSharingPolicy\nmetadata: {name: p}\n"
        "spec: {default: true, mode: time-slicing, resourceName: nvidia.com/gpu.shared,\n"
        "  pools: [{name: half, replicas: 2}]}\n"
    )
    for site in kind.sites:
        document = annotated_at(site)
        assert holds(expression, document), (kind.kind, site.where, document)
        # The core reads the same place: the template is planned, not untouched.
        checked = check_workload(document, kind, "ml", policies)
        assert checked is not None, (kind.kind, site.where)
        decided = [t for t in checked.templates if t.at.site.path == site.path]
        assert decided and all(t.pod.policy == "p" for t in decided), (site.where, checked)


@pytest.mark.parametrize("kind", KINDS, ids=IDS)
def test_objects_annotated_nowhere_are_not_sent_and_never_fail_a_condition(
    kind: WorkloadKind,
) -> None:
    expression = kind_expression(kind)
    sparse: list[dict[str, Any]] = [{}, {"metadata": {}}, {"metadata": {"name": "x"}, "spec": {}}]
    for site in kind.sites:
        document = annotated_at(site)
        plain = copy.deepcopy(document)
        plain["metadata"].pop("annotations", None)
        text = str(plain)
        if "gpu-fraction" in text:  # only the template's own annotations: drop them
            plain = _without_annotations(plain)
        sparse.append(plain)
        # Every prefix of the site's path present but empty.
        for cut in range(1, len(site.path)):
            partial: dict[str, Any] = {}
            steps = list(site.path[:cut])
            if steps[-1] in ("[*]", "*"):
                continue
            _set(partial, steps, [] if site.path[cut] == "[*]" else {})
            sparse.append(partial)
    for document in sparse:
        assert not holds(expression, document), (kind.kind, document)
    owner = {"metadata": {"annotations": dict(ANNOTATION)}}
    assert holds(expression, owner)  # sent: the annotation is warned about, or read


def _without_annotations(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_annotations(v) for k, v in value.items() if k != "annotations"}
    if isinstance(value, list):
        return [_without_annotations(item) for item in value]
    return value


def test_kinds_share_a_webhook_only_where_their_conditions_are_equal() -> None:
    webhooks = template_webhooks(KINDS)
    names = [w.name for w in webhooks]
    assert len(set(names)) == len(names)
    for webhook in webhooks:
        assert {kind_expression(k) for k in webhook.kinds} == {webhook.expression}
        for rule in webhook.rules(WORKLOAD_OPERATIONS):
            assert rule["operations"] == WORKLOAD_OPERATIONS
    spec_template = next(w for w in webhooks if w.name == "workloads.gpushare.io")
    assert {k.kind for k in spec_template.kinds} == {
        "Deployment",
        "StatefulSet",
        "DaemonSet",
        "ReplicaSet",
        "Job",
        "ReplicationController",
    }
    cluster = [
        rule
        for w in webhooks
        for rule in w.rules(WORKLOAD_OPERATIONS)
        if rule["scope"] == "Cluster"
    ]
    assert {r for rule in cluster for r in rule["resources"]} == {  # type: ignore[attr-defined]
        "clustertrainingruntimes",
        "clusterworkflowtemplates",
    }
