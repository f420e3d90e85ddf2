"""GPU operators' published manifests adopted as a user adopts them: the GPU request taken
out of the container and a ``gpu-fraction`` put where the template's pods take their
annotations from.

Written from docs/workload-kinds-facts.md and nothing of gpushare's (not its kind table,
webhook/core/workload_kinds.yaml, nor its pod builder), so tests using it check the product
against the projects' documented behaviour rather than against itself:

- where each kind keeps its pod templates, and what sits there (``SITES``; the section of the
  facts sheet is cited beside each kind);
- which container of a template the pods run the GPU code in, by the name the pod will give
  it (a KServe model or framework section becomes ``kserve-container``, an Argo container
  or script template ``main``);
- where the template's pods take their annotations from: a PodTemplateSpec's
  ``metadata.annotations``, a KServe component's ``annotations``, an Argo template's
  ``metadata.annotations``, the Notebook's own ``metadata.annotations``, an
  LLMInferenceService workload's ``annotations`` (``spec`` or ``spec.prefill``).

A count of 1 becomes ``gpu-fraction: "0.5"`` (a share), a count N > 1 ``gpu-fraction: "N"``
(N whole GPUs).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

GPU = "nvidia.com/gpu"
FRACTION = "gpu-fraction"
REQUEST_ANNOTATIONS = ("gpu-fraction", "gpu-memory")

PodPath = tuple[str | int, ...]

# What sits at a site (docs/workload-kinds-facts.md names these).
POD_TEMPLATE = "PodTemplateSpec"
POD_SPEC = "PodSpec"  # the owner (or a field of it) gives the pods their annotations
KSERVE = "KServe component"
ARGO = "Argo template"

# facts §9: a predictor's model and framework sections, each an inline container that
# becomes the serving container; ExplainerSpec's art likewise.
KSERVE_SECTIONS = (
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
KSERVE_CONTAINER = "kserve-container"  # facts §9 (KS pkg/constants/constants.go L493)
ARGO_MAIN = "main"  # facts §11 (AW workflowpod.go L142-145)


@dataclass(frozen=True)
class Site:
    """Where a kind keeps pod templates: a dotted path, ``*`` for every list item or map
    value; ``holder`` is, for a PodSpec, the object whose ``annotations`` the pods take."""

    path: str
    shape: str = POD_TEMPLATE
    holder: str = ""

    @property
    def steps(self) -> tuple[str, ...]:
        return tuple(self.path.split("."))


def _ray(prefix: str, submitter: bool = False) -> tuple[Site, ...]:
    sites = [
        Site(f"{prefix}.headGroupSpec.template"),
        Site(f"{prefix}.workerGroupSpecs.*.template"),
    ]
    if submitter:
        sites.append(Site("spec.submitterPodTemplate"))
    return tuple(sites)


_ARGO = (Site("spec.templates.*", ARGO),)
_RUNTIME = (Site("spec.template.spec.replicatedJobs.*.template.spec.template"),)
_KSERVE = (
    Site("spec.predictor", KSERVE),
    Site("spec.transformer", KSERVE),
    Site("spec.explainer", KSERVE),
)

# (API group, kind) -> its pod templates.
SITES: dict[tuple[str, str], tuple[Site, ...]] = {
    # §1-§3 KubeRay: head and worker groups (PodTemplateSpecs), a RayJob's submitter.
    ("ray.io", "RayCluster"): _ray("spec"),
    ("ray.io", "RayJob"): _ray("spec.rayClusterSpec", submitter=True),
    ("ray.io", "RayService"): _ray("spec.rayClusterConfig"),
    # §4 training-operator v1: a map of replica specs, each with a PodTemplateSpec.
    ("kubeflow.org", "PyTorchJob"): (Site("spec.pytorchReplicaSpecs.*.template"),),
    ("kubeflow.org", "TFJob"): (Site("spec.tfReplicaSpecs.*.template"),),
    ("kubeflow.org", "MPIJob"): (Site("spec.mpiReplicaSpecs.*.template"),),
    ("kubeflow.org", "XGBoostJob"): (Site("spec.xgbReplicaSpecs.*.template"),),
    ("kubeflow.org", "PaddleJob"): (Site("spec.paddleReplicaSpecs.*.template"),),
    ("kubeflow.org", "MXJob"): (Site("spec.mxReplicaSpecs.*.template"),),
    ("kubeflow.org", "JAXJob"): (Site("spec.jaxReplicaSpecs.*.template"),),
    # §5 Trainer v2: the runtimes' JobSet templates; a TrainJob has none of its own.
    ("trainer.kubeflow.org", "TrainingRuntime"): _RUNTIME,
    ("trainer.kubeflow.org", "ClusterTrainingRuntime"): _RUNTIME,
    ("trainer.kubeflow.org", "TrainJob"): (),
    # §6 Notebook: a PodSpec; the pods take the Notebook's own annotations.
    ("kubeflow.org", "Notebook"): (Site("spec.template.spec", POD_SPEC, "metadata"),),
    # §7 LeaderWorkerSet.
    ("leaderworkerset.x-k8s.io", "LeaderWorkerSet"): (
        Site("spec.leaderWorkerTemplate.leaderTemplate"),
        Site("spec.leaderWorkerTemplate.workerTemplate"),
    ),
    # §8 JobSet: a Job template's pod template per replicated Job.
    ("jobset.x-k8s.io", "JobSet"): (Site("spec.replicatedJobs.*.template.spec.template"),),
    # §9 KServe InferenceService: components with pod spec fields inline.
    ("serving.kserve.io", "InferenceService"): _KSERVE,
    # §10 LLMInferenceService: PodSpecs; a workload's own `annotations` reach its pods.
    ("serving.kserve.io", "LLMInferenceService"): (
        Site("spec.template", POD_SPEC, "spec"),
        Site("spec.worker", POD_SPEC, "spec"),
        Site("spec.prefill.template", POD_SPEC, "spec.prefill"),
        Site("spec.prefill.worker", POD_SPEC, "spec.prefill"),
    ),
    # §11 Argo Workflows: the templates of a WorkflowSpec.
    ("argoproj.io", "Workflow"): _ARGO,
    ("argoproj.io", "WorkflowTemplate"): _ARGO,
    ("argoproj.io", "ClusterWorkflowTemplate"): _ARGO,
    ("argoproj.io", "CronWorkflow"): (Site("spec.workflowSpec.templates.*", ARGO),),
}


def group_kind(document: Mapping[str, Any]) -> tuple[str, str]:
    return str(document.get("apiVersion", "")).rpartition("/")[0], str(document.get("kind"))


def value_at(document: Any, path: PodPath) -> Any:
    """The value at a concrete path; None where a step is missing."""
    value = document
    for step in path:
        if isinstance(value, dict) and isinstance(step, str):
            value = value.get(step)
        elif isinstance(value, list) and isinstance(step, int) and 0 <= step < len(value):
            value = value[step]
        else:
            return None
    return value


def expand(document: Any, steps: tuple[str, ...], path: PodPath = ()) -> Iterator[PodPath]:
    """The concrete paths ``steps`` reaches in ``document`` (``*``: every item or value)."""
    if not steps:
        yield path
        return
    here = value_at(document, path)
    step, rest = steps[0], steps[1:]
    if step == "*":
        if isinstance(here, list):
            for index in range(len(here)):
                yield from expand(document, rest, (*path, index))
        elif isinstance(here, dict):
            for key in here:
                yield from expand(document, rest, (*path, key))
    elif isinstance(here, dict) and here.get(step) is not None:
        yield from expand(document, rest, (*path, step))


@dataclass(frozen=True)
class GpuContainer:
    """A container asking for ``nvidia.com/gpu``, as a user adopting gpushare finds it."""

    site: Site
    template: PodPath  # the template (PodTemplateSpec, PodSpec, component, Argo template)
    container: PodPath  # the container (or KServe section / Argo container) itself
    name: str  # the container's name in the pods the controller makes
    count: int  # the GPUs it asks for
    annotations: PodPath  # the annotations the template's pods take

    @property
    def fraction(self) -> str:
        return fraction_for(self.count)

    @property
    def exact(self) -> bool:
        """Written as the pods' own template (so gpushare can show it as admitted)."""
        return self.site.shape == POD_TEMPLATE


def fraction_for(count: int) -> str:
    """What a user writes for ``count`` GPUs: a share of one for 1, N whole GPUs for N."""
    return "0.5" if count == 1 else str(count)


def _count(container: Mapping[str, Any]) -> int | None:
    resources = container.get("resources")
    if not isinstance(resources, dict):
        return None
    counts = {
        int(str(values[GPU]))
        for key in ("limits", "requests")
        if isinstance(values := resources.get(key), dict) and GPU in values
    }
    if not counts:
        return None
    assert len(counts) == 1, f"limits and requests disagree on {GPU}: {resources}"
    return counts.pop()


def containers_of(document: Any, site: Site, template: PodPath) -> Iterator[tuple[PodPath, str]]:
    """Each container of the template (its path) and the name its pods give it."""
    value = value_at(document, template)
    if not isinstance(value, dict):
        return
    if site.shape == POD_TEMPLATE:
        listed: PodPath = (*template, "spec", "containers")
    elif site.shape == POD_SPEC:
        listed = (*template, "containers")
    elif site.shape == KSERVE:
        sections = [s for s in KSERVE_SECTIONS if isinstance(value.get(s), dict)]
        for section in sections:
            yield (*template, section), KSERVE_CONTAINER
        listed = (*template, "containers")
        containers = value_at(document, listed)
        if sections or not isinstance(containers, list):
            if isinstance(containers, list):
                for index, item in enumerate(containers):
                    yield (*listed, index), str(item.get("name", ""))
            return
        # facts §9: a custom predictor's only (or unnamed) first container, and a custom
        # transformer's first, is renamed kserve-container.
        transformer = template[-1] == "transformer"
        for index, item in enumerate(containers):
            renamed = index == 0 and (transformer or len(containers) == 1 or not item.get("name"))
            yield (*listed, index), KSERVE_CONTAINER if renamed else str(item.get("name", ""))
        return
    else:  # ARGO
        for key in ("container", "script"):
            if isinstance(value.get(key), dict):
                yield (*template, key), ARGO_MAIN
        listed = (*template, "containerSet", "containers")
    containers = value_at(document, listed)
    if isinstance(containers, list):
        for index, item in enumerate(containers):
            yield (*listed, index), str(item.get("name", ""))


def annotations_path(document: Any, site: Site, template: PodPath) -> PodPath:
    """Where the pods of the template at ``template`` take their annotations from."""
    if site.shape in (POD_TEMPLATE, ARGO):
        return (*template, "metadata", "annotations")
    if site.shape == KSERVE:
        return (*template, "annotations")
    return (*site.holder.split("."), "annotations")


def templates(document: Mapping[str, Any]) -> list[tuple[Site, PodPath]]:
    """Every pod template the document holds, by the facts sheet (none for other kinds)."""
    found = []
    for site in SITES.get(group_kind(document), ()):
        found += [(site, path) for path in expand(document, site.steps)]
    return found


def gpu_containers(document: Mapping[str, Any]) -> list[GpuContainer]:
    """Every container of the document's pod templates asking for ``nvidia.com/gpu``."""
    found = []
    for site, template in templates(document):
        for path, name in containers_of(document, site, template):
            container = value_at(document, path)
            count = _count(container) if isinstance(container, dict) else None
            if count is not None:
                holder = annotations_path(document, site, template)
                found.append(GpuContainer(site, template, path, name, count, holder))
    return found


def set_at(document: Any, path: PodPath, value: Any) -> None:
    """Put ``value`` at ``path``, making the objects on the way."""
    parent = document
    for step in path[:-1]:
        parent = parent[int(step)] if isinstance(parent, list) else parent.setdefault(step, {})
    parent[path[-1]] = value


def annotate(document: Any, holder: PodPath, value: str, key: str = FRACTION) -> None:
    """``key: value`` in the annotations at ``holder`` (made where missing)."""
    annotations = value_at(document, holder)
    if not isinstance(annotations, dict):
        annotations = {}
        set_at(document, holder, annotations)
    annotations[key] = value


def drop_gpu(container: dict[str, Any]) -> None:
    """``nvidia.com/gpu`` out of the container's limits and requests (emptied maps too)."""
    resources = container["resources"]
    for key in ("limits", "requests"):
        values = resources.get(key)
        if isinstance(values, dict):
            values.pop(GPU, None)
            if not values:
                del resources[key]
    if not resources:
        del container["resources"]


def adopt(document: dict[str, Any]) -> list[GpuContainer]:
    """Adopt the document in place: each GPU container loses its ``nvidia.com/gpu`` and its
    template's pods get the ``gpu-fraction`` for that count; the containers adopted."""
    adopted = gpu_containers(document)
    holders = [g.annotations for g in adopted]
    assert len(set(holders)) == len(holders), f"two GPU containers share annotations: {holders}"
    for gpu in adopted:
        drop_gpu(value_at(document, gpu.container))
        annotate(document, gpu.annotations, gpu.fraction)
    return adopted


def adopted_copy(document: Mapping[str, Any]) -> tuple[dict[str, Any], list[GpuContainer]]:
    copied = copy.deepcopy(dict(document))
    return copied, adopt(copied)


def request_annotations(document: Any) -> int:
    """How many gpu-fraction / gpu-memory annotations the document carries anywhere."""
    if isinstance(document, dict):
        own = document.get("annotations")
        found = sum(1 for key in REQUEST_ANNOTATIONS if key in own) if isinstance(own, dict) else 0
        return found + sum(request_annotations(v) for v in document.values())
    if isinstance(document, list):
        return sum(request_annotations(item) for item in document)
    return 0


def share(document: dict[str, Any], template: PodPath, index: int = 0) -> GpuContainer:
    """Give the pods of the template at ``template`` half a GPU in its ``index``-th container
    (for published samples that ask for none): the annotation, as a user would add it."""
    (site,) = [site for site, path in templates(document) if path == template]
    path, name = list(containers_of(document, site, template))[index]
    gpu = GpuContainer(site, template, path, name, 1, annotations_path(document, site, template))
    annotate(document, gpu.annotations, gpu.fraction)
    return gpu
