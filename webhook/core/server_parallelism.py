"""Inference servers that need several GPUs: tensor, pipeline and data parallelism.

A vLLM server started with ``--tensor-parallel-size 2`` needs two GPUs and stops at start-up
when the pod gets a share of one. The GPU container's server is found as for its memory
flag (``inference_servers.find_server``: command, args, a ``sh -c`` script, or an image whose
entrypoint is the server; TGI's ``text-generation-launcher`` too), then the settings that
multiply its GPUs are read where the server reads them (the last flag wins as in argparse;
a flag wins over TGI's env, as in clap):

- vLLM: ``--tensor-parallel-size``/``-tp`` x ``--pipeline-parallel-size``/``-pp`` x
  ``--data-parallel-size``/``-dp`` (or ``--data-parallel-size-local``/``-dpl``, the replicas
  on this node; one replica with ``--data-parallel-rank``/``-dpn``); underscores too.
- SGLang: ``--tp-size``/``--tensor-parallel-size``/``--tp`` x ``--pp-size``/
  ``--pipeline-parallel-size`` x ``--dp-size``/``--data-parallel-size``/``--dp`` (not with
  ``--enable-dp-attention``, where data parallelism runs inside the tensor-parallel GPUs).
- TGI: ``--num-shard`` or env ``NUM_SHARD``; ``--sharded true`` (``SHARDED``) alone needs
  at least 2.

A server spanning several pods (vLLM and SGLang) counts their GPUs: the pods of its
LeaderWorkerSet group (``leaderworkerset.sigs.k8s.io/size``, which the LWS controller puts
on every pod of the group, and which a template checker puts on the pod it builds from an
LWS template), or ``--nnodes`` where that says more. ``$(VAR)`` (the kubelet's expansion) and,
in scripts, ``$VAR``/``${VAR}`` are read from the container's literal env and from
``LWS_GROUP_SIZE`` (the group size); any other value that is not a literal number
(``$TP``, ``{{ .Values.tp }}``) is a warning, never a denial. docs/frameworks.md cites the
servers' sources.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from webhook.constants import (
    DEVICES_ANNOTATION,
    FRACTION_ANNOTATION,
    LWS_GROUP_SIZE_VAR,
    LWS_SIZE_ANNOTATION,
    MEMORY_ANNOTATION,
    RAY_NODE_TYPE_LABEL,
)
from webhook.core.draft import PlanDraft, as_mapping
from webhook.core.inference_servers import (
    ALL_SERVERS,
    SGLANG,
    TGI,
    VLLM,
    Launch,
    Server,
    Token,
    find_server,
    server_images,
)
from webhook.core.modes import shares_several_gpus, whole_gpu_changes
from webhook.core.policy.model import InferenceServers
from webhook.core.request import GpuRequest, shown

DEFAULT_SERVER_IMAGES: Mapping[Server, Sequence[str]] = server_images(InferenceServers())

_KUBELET_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")
_SHELL_REF = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")
_WHERE = {"command": "command", "args": "args", "script": "its shell script", "env": "env"}

# The settings each server reads, every spelling its parser takes.
_VLLM_TP = ("--tensor-parallel-size", "--tensor_parallel_size", "-tp")
_VLLM_PP = ("--pipeline-parallel-size", "--pipeline_parallel_size", "-pp")
_VLLM_DP = ("--data-parallel-size", "--data_parallel_size", "-dp")
_VLLM_DP_LOCAL = ("--data-parallel-size-local", "--data_parallel_size_local", "-dpl")
_VLLM_DP_RANK = ("--data-parallel-rank", "--data_parallel_rank", "-dpn")
_SGLANG_TP = ("--tp-size", "--tensor-parallel-size", "--tp")
_SGLANG_PP = ("--pp-size", "--pipeline-parallel-size")
_SGLANG_DP = ("--dp-size", "--data-parallel-size", "--dp")
_NNODES = ("--nnodes",)


@dataclass(frozen=True)
class Setting:
    """One setting that multiplies the GPUs a server needs, as written and where."""

    name: str  # the spelling found, or the env variable
    text: str  # the value, variables read
    where: str  # "command", "args", "its shell script", "env"
    value: int | None  # None when not a literal whole number above 0
    written: str | None = None  # the value as written, where a variable was read
    at_least: bool = False  # TGI's --sharded true: at least this many

    def __str__(self) -> str:
        value = self.text if self.written is None else f"{self.written} (= {self.text})"
        joined = f"{self.name}={value}" if self.where == "env" else f"{self.name} {value}"
        return f"{joined} in {self.where}"


@dataclass(frozen=True)
class ServerGpus:
    """What a server's parallelism needs, and how many GPUs it gets (``check_server_gpus``)."""

    server: str
    how: str
    settings: tuple[Setting, ...]  # those with a literal value
    unknown: tuple[Setting, ...]  # values that are not literal numbers: not checked
    needs: int  # GPUs the literal settings need across the server's pods
    pods: int  # the pods it spans (group size, or --nnodes where larger)
    pods_from: str  # what says so ("" for one pod)
    nodes_unknown: Setting | None  # --nnodes written with a value that is not literal
    gets: int  # GPUs its pods get in all

    @property
    def short(self) -> bool:
        """Too few GPUs for certain: the literal settings alone need more (every value is at
        least 1), over a number of pods that is known."""
        return self.needs > self.gets and self.nodes_unknown is None


def lws_group_size(annotations: Mapping[str, Any]) -> int | None:
    """The pods of the pod's LeaderWorkerSet group, leader included (its
    ``leaderworkerset.sigs.k8s.io/size`` annotation); 1 outside a group, None when the
    annotation is not a whole number above 0."""
    raw = annotations.get(LWS_SIZE_ANNOTATION)
    if raw is None:
        return 1
    return _count(str(raw))


def _count(text: str) -> int | None:
    """A literal whole number above 0 (a few digits: longer is no GPU count)."""
    ok = len(text) <= 6 and text.isascii() and text.isdigit() and int(text) > 0
    return int(text) if ok else None


def check_server_gpus(
    container: Mapping[str, Any],
    pod_gpus: int,
    group_size: int = 1,
    images: Mapping[Server, Sequence[str]] = DEFAULT_SERVER_IMAGES,
) -> ServerGpus | None:
    """The GPUs the container's inference server needs against those its pods get
    (``pod_gpus`` each, ``group_size`` pods); None when it starts no server, or one that
    needs a single GPU. Pure: reads the container only."""
    launch = find_server(container, images, ALL_SERVERS)
    if launch is None:
        return None
    env = _literal_env(container, group_size)
    reader = _Reader(launch, env)
    if launch.server is TGI:
        settings, nodes = _tgi(reader), None
    else:
        settings, nodes = _vllm_or_sglang(launch.server, reader)
    known = tuple(s for s in settings if s.value is not None)
    unknown = tuple(s for s in settings if s.value is None)
    needs = math.prod(s.value or 1 for s in known)
    if needs <= 1 and not unknown:
        return None
    pods = group_size if launch.server is not TGI else 1  # TGI shards on one machine
    pods_from = f'{LWS_SIZE_ANNOTATION} "{pods}"' if pods > 1 else ""
    if nodes is not None and nodes.value is not None and nodes.value > pods:
        pods, pods_from = nodes.value, str(nodes)
    nodes_unknown = nodes if nodes is not None and nodes.value is None else None
    how = f"{launch.server.name} ({launch.how})"
    if launch.in_script:
        how = f"{launch.server.name} from {launch.how}"
    elif launch.how.startswith("the entrypoint"):
        how = f"{launch.server.name}, {launch.how},"
    return ServerGpus(
        launch.server.name,
        how,
        known,
        unknown,
        needs,
        pods,
        pods_from,
        nodes_unknown,
        pods * pod_gpus,
    )


def _literal_env(container: Mapping[str, Any], group_size: int) -> dict[str, str]:
    """The container's env with literal values; LWS_GROUP_SIZE from the group size, as the
    LWS pod webhook sets it from the same annotation."""
    env = {LWS_GROUP_SIZE_VAR: str(group_size)} if group_size > 1 else {}
    for entry in container.get("env") or ():
        item = as_mapping(entry)
        name, value = item.get("name"), item.get("value")
        if isinstance(name, str):
            env.pop(name, None)
            if isinstance(value, str) and "valueFrom" not in item and "$(" not in value:
                env[name] = value
    return env


class _Reader:
    """The settings of one launch: its flags (the last one wins), then env."""

    def __init__(self, launch: Launch, env: Mapping[str, str]) -> None:
        self.launch = launch
        self.env = dict(env)
        for token in launch.before:  # NAME=value before the program: env NAME=v, export
            name, equals, value = token.text.partition("=")
            if equals and name.isidentifier():
                self.env[name] = self._resolved(Token(token.field, token.index, value))

    def flag(self, spellings: Sequence[str]) -> Setting | None:
        found: Setting | None = None
        flags = self.launch.flags
        for position, token in enumerate(flags):
            name, equals, value = token.text.partition("=")
            if name not in spellings:
                continue
            if equals:
                found = self._setting(name, Token(token.field, token.index, value))
            elif position + 1 < len(flags):
                found = self._setting(name, flags[position + 1])
        return found

    def present(self, spelling: str) -> bool:
        return any(t.text == spelling for t in self.launch.flags)

    def env_var(self, name: str) -> Setting | None:
        if name not in self.env:
            return None
        return _parsed(name, self.env[name], "env")

    def _setting(self, name: str, token: Token) -> Setting:
        where = _WHERE.get(token.field, token.field)
        return _parsed(name, self._resolved(token), where, token.text)

    def _resolved(self, token: Token) -> str:
        text = _KUBELET_REF.sub(lambda m: self.env.get(m[1], m[0]), token.text)
        if token.field == "script":
            text = _SHELL_REF.sub(lambda m: self.env.get(m[1] or m[2], m[0]), text)
        return text


def _parsed(name: str, text: str, where: str, written: str | None = None) -> Setting:
    return Setting(name, text, where, _count(text), None if written == text else written)


def _vllm_or_sglang(server: Server, reader: _Reader) -> tuple[list[Setting], Setting | None]:
    if server is VLLM:
        tp, pp = reader.flag(_VLLM_TP), reader.flag(_VLLM_PP)
        local = reader.flag(_VLLM_DP_LOCAL)
        data = local or (None if reader.flag(_VLLM_DP_RANK) else reader.flag(_VLLM_DP))
    else:
        assert server is SGLANG
        tp, pp = reader.flag(_SGLANG_TP), reader.flag(_SGLANG_PP)
        within = reader.present("--enable-dp-attention")
        data = None if within else reader.flag(_SGLANG_DP)
    return [s for s in (tp, pp, data) if s is not None], reader.flag(_NNODES)


def _tgi(reader: _Reader) -> list[Setting]:
    shards = reader.flag(("--num-shard",)) or reader.env_var("NUM_SHARD")
    if shards is not None:
        return [shards]
    sharded = reader.flag(("--sharded",)) or reader.env_var("SHARDED")
    if sharded is not None and sharded.text == "true":
        # (Some(true), None): every visible GPU, and an error with fewer than 2.
        return [Setting(sharded.name, "true", sharded.where, 2, sharded.written, at_least=True)]
    return []


def refuse_short_server(draft: PlanDraft, request: GpuRequest, pod_gpus: int) -> str | None:
    """Planning's side of ``check_server_gpus``: the denial when the GPU container's server
    needs more GPUs than the pod's group gets, a warning where a value is not literal, and
    the explanation line. ``pod_gpus``: whole GPUs asked, or the devices a share is on."""
    group = lws_group_size(draft.annotations)
    images = server_images(draft.policy.inference_servers)
    found = check_server_gpus(draft.container, pod_gpus, group or 1, images)
    if found is None:
        return None
    where = f"container {draft.container_name!r}: {found.server}"
    if group is None:
        draft.warnings.append(
            f"{LWS_SIZE_ANNOTATION} {shown(str(draft.annotations[LWS_SIZE_ANNOTATION]))} is "
            "not a whole number: group size taken as 1"
        )
    if draft.explaining:
        settings = " x ".join(str(s) for s in (*found.settings, *found.unknown))
        draft.explanation.append(
            f"inference server: container {draft.container_name!r}: {found.how} with "
            f"{settings} needs {'at least ' if found.unknown else ''}{found.needs} GPU(s); "
            f"its {found.pods} pod(s) get {found.gets}"
        )
    if found.short and RAY_NODE_TYPE_LABEL in draft.labels:
        # On a KubeRay cluster the server's workers may run on other pods' GPUs: the whole
        # cluster is checked where it is written (group_gpus), not one pod of it.
        draft.warnings.append(
            f"{where} needs {found.needs} GPUs: on a Ray cluster its workers' GPUs count "
            "(checked with the RayCluster)"
        )
        return None
    if found.short:
        return _denial(draft, request, found, pod_gpus)
    unsure = found.unknown[0] if found.unknown else found.nodes_unknown
    if unsure is not None and (found.unknown or found.needs > found.gets):
        draft.warnings.append(
            f"{where} {unsure.name} {shown(unsure.text)} is not a number: "
            f"not checked against the pod's {pod_gpus} GPU(s)"
        )
    return None


def _denial(draft: PlanDraft, request: GpuRequest, found: ServerGpus, pod_gpus: int) -> str:
    settings = " x ".join(str(s) for s in found.settings)
    least = "at least " if found.unknown or any(s.at_least for s in found.settings) else ""
    gets = _gpus(request, pod_gpus)
    if found.pods > 1:
        gets = f"each of the {found.pods} pods ({found.pods_from}) {gets}, {found.gets} in all"
    else:
        gets = f"the pod {gets}"
    return (
        f"container {draft.container_name!r} starts {found.how} with {settings}: it needs "
        f"{least}{found.needs} GPUs, but {_asked(request)} gives {gets}: "
        f"{_fixes(draft, request, math.ceil(found.needs / found.pods))}."
    )


def _asked(request: GpuRequest) -> str:
    if request.fraction_text is not None:
        asked = f'{FRACTION_ANNOTATION} "{request.fraction_text}"'
    else:
        asked = f'{MEMORY_ANNOTATION} "{request.memory_text}"'
    if request.devices > 1:
        asked += f' with {DEVICES_ANNOTATION} "{request.devices}"'
    return asked


def _gpus(request: GpuRequest, pod_gpus: int) -> str:
    if request.is_whole:
        return f"{pod_gpus} whole GPU" + ("s" if pod_gpus > 1 else "")
    return "a share of one GPU" if pod_gpus == 1 else f"a share on each of {pod_gpus} GPUs"


def _fixes(draft: PlanDraft, request: GpuRequest, per_pod: int) -> str:
    """What the pod can ask for instead (``per_pod`` GPUs each), as the policy's mode
    allows: whole GPUs, the share on several GPUs, or less parallelism."""
    policy = draft.policy
    options: list[str] = []
    notes: list[str] = []
    if per_pod > policy.whole_gpus.max:
        notes.append(f"policy {policy.name!r} allows at most {policy.whole_gpus.max} whole GPUs")
    elif isinstance(whole_gpu_changes(policy, per_pod), str):
        options.append(
            f"remove the annotation and ask for nvidia.com/gpu: {per_pod} in the container's "
            f"resources (mode {policy.mode.value} takes whole GPUs as resources)"
        )
    else:
        options.append(f'ask for {per_pod} whole GPUs with {FRACTION_ANNOTATION}: "{per_pod}"')
    if not request.is_whole:
        if shares_several_gpus(policy):
            options.append(
                f'keep the share on each of {per_pod} GPUs with {DEVICES_ANNOTATION}: "{per_pod}"'
            )
        else:
            notes.append(
                f"mode {policy.mode.value} gives a share of one GPU, so {DEVICES_ANNOTATION} "
                "cannot help"
            )
    options.append("lower the server's parallelism to fit")
    return ", or ".join(options) + (f" ({'; '.join(notes)})" if notes else "")
