"""The pod a controller makes from one of a workload's templates (``workload_kinds``).

gpushare answers a workload with the verdict its pods would get, so it builds each pod as
the controller would: the template's metadata and spec, in the workload's namespace, named
and labelled as the table says (the controller's labels win over the template's, as
controllers overwrite them). Shapes other than a PodTemplateSpec are built from what their
controllers are documented to do (sources: docs/workload-kinds-facts.md):

- ``PodSpec`` (Notebook, LLMInferenceService, a TrainJob's override): the spec as it is; the
  owner's labels and annotations are the pod's.
- ``KServeComponent``: an InferenceService's predictor (transformer, explainer) inlines pod
  spec fields next to KServe's own. A model or framework section (``model``, ``pytorch``,
  ``huggingface``, ...) becomes the serving container ``kserve-container``, first, and the
  component's ``containers`` follow (a custom transformer's first container, and a custom
  predictor's only or unnamed one, is renamed ``kserve-container``); the ISVC's labels and
  annotations, then the component's own ``labels`` and ``annotations``, are the pod's. The
  ServingRuntime's container is merged in by KServe and is not known here.
- ``ArgoTemplate``: a template with ``container``, ``script`` or ``containerSet`` makes a
  pod whose containers are Argo's ``wait`` and then the main one(s) (``main`` for container
  and script); its metadata is the workflow's ``podMetadata`` under the template's own
  ``metadata``; nodeSelector, tolerations, affinity, scheduler and priority come from the
  template, else from the workflow's spec. Other templates (steps, dag, resource, suspend)
  make no pod of the user's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from webhook.core.draft import as_mapping
from webhook.core.object_paths import value_at
from webhook.core.workload_kinds import Shape, TemplateAt, WorkloadKind, formatted

KSERVE_CONTAINER = "kserve-container"
# A component's sections that become the serving container (v1beta1 PredictorSpec's model
# and framework specs, each an embedded corev1.Container; ExplainerSpec's art).
KSERVE_CONTAINER_SECTIONS = (
    "model",
    "sklearn",
    "xgboost",
    "tensorflow",
    "pytorch",
    "triton",
    "onnx",
    "huggingface",
    "pmml",
    "lightgbm",
    "paddle",
    "art",
)
# A component's own fields (ComponentExtensionSpec and the rest): not pod spec fields.
KSERVE_COMPONENT_FIELDS = frozenset(
    {
        *KSERVE_CONTAINER_SECTIONS,
        "minReplicas",
        "maxReplicas",
        "scaleTarget",
        "scaleMetric",
        "scaleMetricType",
        "autoScaling",
        "containerConcurrency",
        "timeout",
        "canaryTrafficPercent",
        "logger",
        "batcher",
        "labels",
        "annotations",
        "deploymentStrategy",
        "workerSpec",
        "storageUris",
    }
)
# A model section's fields that are KServe's, not the container's.
_MODEL_FIELDS = frozenset(
    {"modelFormat", "runtime", "storageUri", "runtimeVersion", "protocolVersion", "storage"}
)
ARGO_MAIN = "main"
ARGO_WAIT = "wait"
_ARGO_POD_FIELDS = (
    "nodeSelector",
    "tolerations",
    "affinity",
    "schedulerName",
    "priorityClassName",
    "securityContext",
    "hostNetwork",
    "runtimeClassName",
    "serviceAccountName",
)


def owner_name(document: Mapping[str, Any]) -> str:
    metadata = as_mapping(document.get("metadata"))
    return str(metadata.get("name") or metadata.get("generateName") or "")


def template_pod(
    document: Mapping[str, Any], kind: WorkloadKind, at: TemplateAt, namespace: str
) -> dict[str, Any] | None:
    """The pod made from the template at ``at``; None where the template makes no pod of
    the user's (an Argo steps template) or is not an object."""
    if not isinstance(at.value, dict):
        return None
    site = at.site
    if site.shape is Shape.POD_TEMPLATE:
        metadata = dict(as_mapping(at.value.get("metadata")))
        spec: Any = at.value.get("spec")
    elif site.shape is Shape.POD_SPEC:
        metadata, spec = {}, at.value
    elif site.shape is Shape.KSERVE_COMPONENT:
        metadata, spec = _kserve_component(at.value, at.path[-1] == "transformer")
    else:
        built = _argo_template(document, at)
        if built is None:
            return None
        metadata, spec = built
    owner = as_mapping(document.get("metadata"))
    name = owner_name(document)
    labels: dict[str, Any] = {}
    annotations: dict[str, Any] = {}
    if site.owner_metadata:
        labels.update(as_mapping(owner.get("labels")))
        annotations.update(as_mapping(owner.get("annotations")))
    if site.metadata_from:
        holder = as_mapping(value_at(document, site.metadata_from, at.bound))
        labels.update(as_mapping(holder.get("labels")))
        annotations.update(as_mapping(holder.get("annotations")))
    labels.update(as_mapping(metadata.get("labels")))
    annotations.update(as_mapping(metadata.get("annotations")))
    labels.update({k: formatted(v, document, name, at) for k, v in site.labels})
    annotations.update({k: formatted(v, document, name, at) for k, v in site.annotations})
    metadata.pop("name", None)
    metadata["namespace"] = namespace
    if name:
        metadata["generateName"] = formatted(site.pod_name, document, name, at)
    if labels:
        metadata["labels"] = labels
    if annotations:
        metadata["annotations"] = annotations
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": spec if spec is not None else {},
    }


def _kserve_component(
    component: Mapping[str, Any], transformer: bool
) -> tuple[dict[str, Any], dict[str, Any]]:
    spec = {k: v for k, v in component.items() if k not in KSERVE_COMPONENT_FIELDS}
    serving = [
        _serving_container(component[section])
        for section in KSERVE_CONTAINER_SECTIONS
        if isinstance(component.get(section), dict)
    ]
    containers = component.get("containers")
    if serving:
        spec["containers"] = [serving[0], *(containers if isinstance(containers, list) else ())]
    elif isinstance(containers, list) and containers and isinstance(containers[0], dict):
        # KServe renames a custom transformer's first container, and a custom predictor's
        # when it is the only one or has no name (predictor_custom.go, transformer_custom.go).
        first = containers[0]
        if transformer or len(containers) == 1 or not first.get("name"):
            spec["containers"] = [{**first, "name": KSERVE_CONTAINER}, *containers[1:]]
    metadata: dict[str, Any] = {}
    for key in ("labels", "annotations"):
        if isinstance(component.get(key), dict):
            metadata[key] = component[key]
    return metadata, spec


def _serving_container(section: Mapping[str, Any]) -> dict[str, Any]:
    container = {k: v for k, v in section.items() if k not in _MODEL_FIELDS}
    container["name"] = KSERVE_CONTAINER
    return container


def _argo_template(
    document: Mapping[str, Any], at: TemplateAt
) -> tuple[dict[str, Any], dict[str, Any]] | None:
    template = at.value
    if isinstance(template.get("container"), dict):
        mains = [{**template["container"], "name": ARGO_MAIN}]
    elif isinstance(template.get("script"), dict):
        script = {k: v for k, v in template["script"].items() if k != "source"}
        mains = [{**script, "name": ARGO_MAIN}]
    elif isinstance(as_mapping(template.get("containerSet")).get("containers"), list):
        mains = list(template["containerSet"]["containers"])
    else:
        return None
    # The workflow's spec holds the templates: the path ends in ``templates[i]``.
    workflow = as_mapping(value_at(document, at.path[:-2]))
    spec: dict[str, Any] = {"containers": [{"name": ARGO_WAIT}, *mains]}
    for key in _ARGO_POD_FIELDS:
        value = template.get(key, workflow.get(key))
        if value is not None:
            spec[key] = value
    pod_metadata = as_mapping(workflow.get("podMetadata"))
    own = as_mapping(template.get("metadata"))
    metadata = {
        key: {**as_mapping(pod_metadata.get(key)), **as_mapping(own.get(key))}
        for key in ("labels", "annotations")
    }
    return metadata, spec
