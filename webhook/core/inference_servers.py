"""Inference servers that size themselves from a flag, not from env: vLLM's
``--gpu-memory-utilization`` and SGLang's ``--mem-fraction-static``.

Both take a fraction of what CUDA reports, whoever else runs on the GPU (vLLM: 0.9 by
default, 0.92 from v0.20.0; SGLang: computed from the GPU's memory when absent), so two
servers sharing a GPU must not both keep the default. The largest value that fits the pod
(``server_budget``) is a fraction of the whole GPU, or of the pod's driver limit where CUDA
is known to report that limit as total (``driverMemoryLimit: require``). The GPU container's
command and args are read for the server (``vllm serve``, ``python -m
vllm.entrypoints.openai.api_server``, ``sglang serve``, ``python -m sglang.launch_server``;
with no command, images whose entrypoint is the server) and its flag (``--flag value`` or
``--flag=value``, the last one wins as in argparse). A value above that, or none, is a
warning (``inferenceServers.memory: warn``), or the flag is set to it in the container's
args (``set``: replaced where it is, appended when absent). A server started from a shell
script is only warned about: gpushare does not rewrite scripts. docs/frameworks.md cites the
flags and defaults.

The launch detection here (``find_server``) is shared with ``server_parallelism``, which
also recognizes TGI's ``text-generation-launcher`` and checks the GPUs a server's
parallelism needs.
"""

from __future__ import annotations

import functools
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from webhook.core.draft import PlanDraft
from webhook.core.framework_images import matches, parse_version, split_reference
from webhook.core.memo import BoundedMemo
from webhook.core.placement import Placement, format_fraction
from webhook.core.policy.model import InferenceServers, ServerMemory
from webhook.core.server_budget import ServerBudget, server_budget


@dataclass(frozen=True)
class Server:
    name: str
    flag: str
    # Every spelling its parser takes (vLLM's parser also takes underscores; the
    # --device-memory-utilization alias exists from v0.31.0).
    spellings: tuple[str, ...]
    # (program, subcommand) and python modules that start it.
    programs: tuple[tuple[str, str], ...]
    modules: tuple[str, ...]
    default_images: tuple[str, ...]
    # Programs that are the server themselves, no subcommand (text-generation-launcher).
    launchers: tuple[str, ...] = ()


VLLM = Server(
    "vLLM",
    "--gpu-memory-utilization",
    (
        "--gpu-memory-utilization",
        "--gpu_memory_utilization",
        "--device-memory-utilization",
        "--device_memory_utilization",
    ),
    (("vllm", "serve"),),
    ("vllm.entrypoints.openai.api_server", "vllm.entrypoints.api_server"),
    ("vllm/vllm-openai", "vllm/vllm-openai:*"),
)
SGLANG = Server(
    "SGLang",
    "--mem-fraction-static",
    ("--mem-fraction-static",),
    (("sglang", "serve"),),
    ("sglang.launch_server",),
    (),
)
# Hugging Face text-generation-inference: its image's entrypoint (tgi-entrypoint.sh) runs
# ``text-generation-launcher "$@"``. Its memory flag is not sized by gpushare (not in
# SERVERS); it is found for its sharding (server_parallelism).
TGI = Server(
    "TGI",
    "--cuda-memory-fraction",
    ("--cuda-memory-fraction",),
    (),
    (),
    (
        "ghcr.io/huggingface/text-generation-inference",
        "ghcr.io/huggingface/text-generation-inference:*",
    ),
    ("text-generation-launcher",),
)
# The servers whose memory flag is sized; every server gpushare recognizes.
SERVERS = (VLLM, SGLANG)
ALL_SERVERS = (VLLM, SGLANG, TGI)


@dataclass(frozen=True)
class Token:
    field: str  # "command", "args" or "script"
    index: int
    text: str


@dataclass(frozen=True)
class Launch:
    """A server found in the container, where its flags start, and how it was started."""

    server: Server
    flags: tuple[Token, ...]
    how: str
    in_script: bool
    # What comes before the server's program (``env NUM_SHARD=2``, the script's words).
    before: tuple[Token, ...] = ()


def find_server(
    container: Mapping[str, Any],
    images: Mapping[Server, Sequence[str]],
    servers: Sequence[Server] = SERVERS,
) -> Launch | None:
    """The inference server (one of ``servers``) the container starts, if any."""
    command = [str(t) for t in container.get("command") or ()]
    args = [str(t) for t in container.get("args") or ()]
    tokens = [Token("command", i, t) for i, t in enumerate(command)]
    tokens += [Token("args", i, t) for i, t in enumerate(args)]
    for position, token in enumerate(tokens):
        found = _started_at(tokens, position, servers)
        if found is not None:
            return found
        if " " in token.text.strip():
            script = _script_launch(token.text, servers)
            if script is not None:
                return script
    if command:
        return None
    image = str(container.get("image", ""))
    for server in servers:
        patterns = tuple(images[server])
        if _ENTRYPOINTS.get_or_compute((image, patterns), _is_entrypoint, image, patterns):
            return Launch(server, tuple(tokens), f"the entrypoint of {image}", False)
    return None


def _is_entrypoint(image: str, patterns: tuple[str, ...]) -> bool:
    return matches(image, patterns) is not None


# Whether an image's entrypoint is a server, by image and patterns: every pod without a
# command asks (twice: its memory flag, its parallelism), and a workload's pods share it.
_ENTRYPOINTS: BoundedMemo[tuple[str, tuple[str, ...]], bool] = BoundedMemo()


def _started_at(tokens: Sequence[Token], position: int, servers: Sequence[Server]) -> Launch | None:
    word = tokens[position].text
    following = tokens[position + 1].text if position + 1 < len(tokens) else None
    program = word.rsplit("/", 1)[-1]
    before = tuple(tokens[:position])
    for server in servers:
        if program in server.launchers:
            how = " ".join(t.text for t in tokens[max(0, position - 1) : position + 1])
            return Launch(server, tuple(tokens[position + 1 :]), how, False, before)
        if following is not None and (
            (program, following) in server.programs
            or (word == "-m" and following in server.modules)
        ):
            how = " ".join(t.text for t in tokens[max(0, position - 1) : position + 2])
            return Launch(server, tuple(tokens[position + 2 :]), how, False, before)
    return None


def _script_launch(script: str, servers: Sequence[Server]) -> Launch | None:
    try:
        words = shlex.split(script)
    except ValueError:
        return None
    tokens = [Token("script", i, w) for i, w in enumerate(words)]
    for position in range(len(tokens)):
        found = _started_at(tokens, position, servers)
        if found is not None:
            how = f"a shell script ({found.how})"
            return Launch(found.server, found.flags, how, True, found.before)
    return None


def flag_value(launch: Launch) -> tuple[Token, str | None, str] | None:
    """The last setting of the server's flag: (token holding the value, the spelling when
    written as ``--flag=value`` else None, the value); None when absent."""
    found: tuple[Token, str | None, str] | None = None
    flags = launch.flags
    for position, token in enumerate(flags):
        name, equals, value = token.text.partition("=")
        if name not in launch.server.spellings:
            continue
        if equals:
            found = (token, name, value)
        elif position + 1 < len(flags):
            found = (flags[position + 1], None, flags[position + 1].text)
    return found


def default_fraction(server: Server, image: str) -> tuple[float, str]:
    """What the server takes without the flag, and how to say it."""
    if server is SGLANG:
        return 0.88, "SGLang's default, computed from the GPU's memory (about 0.88)"
    repository, tag = split_reference(image)
    version = parse_version(tag) if repository == "vllm/vllm-openai" else None
    if version is not None and version >= (0, 20, 0, 0):
        return 0.92, "vLLM's default from v0.20.0"
    return 0.9, "vLLM's default"


@functools.lru_cache(maxsize=256)
def server_images(settings: InferenceServers) -> dict[Server, Sequence[str]]:
    """Images whose entrypoint is each server: the policy's lists, else the built-in ones."""
    return {
        VLLM: VLLM.default_images if settings.vllm_images is None else settings.vllm_images,
        SGLANG: SGLANG.default_images if settings.sglang_images is None else settings.sglang_images,
        TGI: TGI.default_images,
    }


def size_inference_server(draft: PlanDraft, placement: Placement) -> None:
    """Check (or set) the GPU container's server memory flag against its share."""
    settings = draft.policy.inference_servers
    if settings.memory is ServerMemory.IGNORE:
        return
    launch = find_server(draft.container, server_images(settings))
    if launch is None:
        return
    budget = server_budget(draft.policies, draft.policy, placement)
    if isinstance(budget, str):
        return  # the framework knobs refuse that share already
    _Sizing(draft, launch, budget).apply(settings.memory)


class _Sizing:
    """One server's flag against one share."""

    def __init__(self, draft: PlanDraft, launch: Launch, budget: ServerBudget) -> None:
        self.draft = draft
        self.launch = launch
        self.budget = budget
        self.share = budget.share
        self.share_text = format_fraction(budget.share)
        server = launch.server
        self.where = f"container {draft.container_name!r}: {server.name} {server.flag}"
        # What the value is measured against, in the warnings.
        self.against = (
            f"{self.share_text} of its {budget.limit_mib}Mi limit"
            if budget.against_limit
            else f"the share {self.share_text}"
        )

    def apply(self, memory: ServerMemory) -> None:
        found = flag_value(self.launch)
        image = str(self.draft.container.get("image", ""))
        if found is None:
            asked, said = default_fraction(self.launch.server, image)
        else:
            said = "set in the container"
            try:
                asked = float(found[2])
            except ValueError:
                self._note(f"{found[2]!r} is not a number; not checked")
                self.draft.warnings.append(f"{self.where} {found[2]!r} is not a number")
                return
        if self.budget.limit_mib is not None:
            self._note(f"at most {self.budget.derivation}")
        if asked <= self.share + 1e-9:
            self._note(f"{asked:g} ({said}) fits {self.against}")
            return
        if memory is ServerMemory.WARN or self.launch.in_script:
            self._note(f"{asked:g} ({said}) is above {self.against}: warned")
            verb = "defaults to" if found is None else "is"
            fix = (
                "in its shell script" if self.launch.in_script else f"to {self.share_text} or lower"
            )
            self.draft.warnings.append(
                f"{self.where} {verb} {asked:g}, above {self.against}: set it {fix}"
            )
            return
        self._set(found, f"{asked:g} ({said})")

    def _set(self, found: tuple[Token, str | None, str] | None, was: str) -> None:
        container = self.draft.container_path
        if found is None:
            path = (*container, "args")
            self.draft.edits.append(path, self.launch.server.flag)
            self.draft.edits.append(path, self.share_text)
        else:
            token, spelling, _ = found
            value = self.share_text if spelling is None else f"{spelling}={self.share_text}"
            self.draft.edits.replace_item((*container, token.field), token.index, value)
            self.draft.warnings.append(
                f"{self.where} set to {self.share_text}, the share (was {found[2]})"
            )
        self._note(f"set to {self.share_text}, the share (was {was}; inferenceServers.memory: set)")

    def _note(self, text: str) -> None:
        if self.draft.explaining:
            self.draft.explanation.append(
                f"inference server: {self.where} via {self.launch.how}: {text}"
            )
