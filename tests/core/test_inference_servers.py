"""Inference servers sized by flags: vLLM --gpu-memory-utilization, SGLang --mem-fraction-static.

Found in command/args in every form their parsers take; above the share (or absent: the
server's default) is a warning, or set to the share under ``inferenceServers.memory: set``.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import jsonpatch
import pytest

from webhook.core.planning import Planned
from webhook.core.policy.model import PolicySet
from webhook.core.verdict import mutate, mutated_pod, validate

from .support import make_pod, policies_from, simple_policy

VLLM_IMAGE = "vllm/vllm-openai:v0.6.3"
SGLANG_IMAGE = "lmsysorg/sglang:v0.5.4-cu126"


def _policies(memory: str = "warn") -> PolicySet:
    # 2% headroom: a 0.5 share leaves 0.48 for the server, a 0.25 share 0.23.
    return policies_from(
        simple_policy(headroom="2%", fraction={"min": 0.05}, inferenceServers={"memory": memory})
    )


def _run(
    container: dict[str, Any], memory: str = "warn", fraction: str = "0.5"
) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The GPU container as admitted, and the warnings; checks the patch and idempotence."""
    pod = make_pod({"gpu-fraction": fraction}, containers=[{"name": "srv", **container}])
    policies = _policies(memory)
    outcome = mutate(pod, "x", policies)
    assert outcome.allowed, outcome.reasons
    assert outcome.decision is not None
    result = mutated_pod(pod, outcome.decision)
    assert jsonpatch.apply_patch(copy.deepcopy(pod), outcome.patch) == result
    assert mutate(result, "x", policies).patch == []
    assert validate(result, "x", policies).allowed
    assert all(len(w) < 120 for w in outcome.warnings)
    return result["spec"]["containers"][0], outcome.warnings


WARN = "container 'srv': {} {} {} {}, above the share 0.48: set it to 0.48 or lower"


@pytest.mark.parametrize(
    ("container", "warning"),
    [
        # vllm serve, flag and value apart
        (
            {
                "image": "python:3.12",
                "command": ["vllm", "serve", "m", "--gpu-memory-utilization", "0.9"],
            },
            WARN.format("vLLM", "--gpu-memory-utilization", "is", "0.9"),
        ),
        # the module form, --flag=value, a path to the interpreter
        (
            {
                "image": "python:3.12",
                "command": ["/usr/bin/python3", "-m", "vllm.entrypoints.openai.api_server"],
                "args": ["--model", "m", "--gpu-memory-utilization=0.95"],
            },
            WARN.format("vLLM", "--gpu-memory-utilization", "is", "0.95"),
        ),
        # underscores and the later alias; the last setting wins as in argparse
        (
            {
                "image": "python:3.12",
                "command": ["vllm", "serve", "m", "--gpu_memory_utilization", "0.3"],
                "args": ["--device-memory-utilization", "0.7"],
            },
            WARN.format("vLLM", "--gpu-memory-utilization", "is", "0.7"),
        ),
        # the vLLM image's entrypoint is the server: args alone, flag absent -> default 0.9
        (
            {"image": VLLM_IMAGE, "args": ["--model", "m"]},
            WARN.format("vLLM", "--gpu-memory-utilization", "defaults to", "0.9"),
        ),
        # v0.20.0 and later default to 0.92
        (
            {"image": "vllm/vllm-openai:v0.20.1", "args": ["--model", "m"]},
            WARN.format("vLLM", "--gpu-memory-utilization", "defaults to", "0.92"),
        ),
        (
            {
                "image": SGLANG_IMAGE,
                "command": ["python3", "-m", "sglang.launch_server"],
                "args": ["--model-path", "m", "--mem-fraction-static", "0.85"],
            },
            WARN.format("SGLang", "--mem-fraction-static", "is", "0.85"),
        ),
        (
            {"image": SGLANG_IMAGE, "command": ["sglang", "serve", "--model-path", "m"]},
            WARN.format("SGLang", "--mem-fraction-static", "defaults to", "0.88"),
        ),
    ],
)
def test_a_server_asking_more_than_its_share_is_warned_about(
    container: dict[str, Any], warning: str
) -> None:
    after, warnings = _run(container)
    assert warnings == (warning,)
    assert after == {"name": "srv", **container, "resources": after["resources"]}


@pytest.mark.parametrize(
    "container",
    [
        {"image": VLLM_IMAGE, "args": ["--model", "m", "--gpu-memory-utilization", "0.48"]},
        {"image": VLLM_IMAGE, "args": ["--model", "m", "--gpu-memory-utilization=0.2"]},
        {
            "image": SGLANG_IMAGE,
            "command": ["python3", "-m", "sglang.launch_server", "--mem-fraction-static", "0.4"],
        },
        # not a server: a vLLM image whose command runs something else, and a plain image
        {
            "image": VLLM_IMAGE,
            "command": ["python3", "bench.py"],
            "args": ["--gpu-memory-utilization", "0.9"],
        },
        {"image": "python:3.12", "args": ["--gpu-memory-utilization", "0.9"]},
    ],
)
def test_servers_within_their_share_and_other_programs_are_left_alone(
    container: dict[str, Any],
) -> None:
    assert _run(container)[1] == ()


def test_an_unreadable_value_is_warned_about_and_left_alone() -> None:
    container = {"image": VLLM_IMAGE, "args": ["--gpu-memory-utilization", "lots"]}
    after, warnings = _run(container, memory="set")
    assert after["args"] == container["args"]
    assert warnings == ("container 'srv': vLLM --gpu-memory-utilization 'lots' is not a number",)


def test_ignore_leaves_every_server_alone() -> None:
    assert _run({"image": VLLM_IMAGE, "args": ["--model", "m"]}, memory="ignore")[1] == ()


# -- inferenceServers.memory: set --------------------------------------------------------------


@pytest.mark.parametrize(
    ("container", "field", "expected", "warnings"),
    [
        (
            {"image": VLLM_IMAGE, "args": ["--model", "m", "--gpu-memory-utilization", "0.9"]},
            "args",
            ["--model", "m", "--gpu-memory-utilization", "0.48"],
            ("container 'srv': vLLM --gpu-memory-utilization set to 0.48, the share (was 0.9)",),
        ),
        (
            {"image": VLLM_IMAGE, "args": ["--gpu_memory_utilization=0.9", "--model", "m"]},
            "args",
            ["--gpu_memory_utilization=0.48", "--model", "m"],
            ("container 'srv': vLLM --gpu-memory-utilization set to 0.48, the share (was 0.9)",),
        ),
        # absent: appended to the args the entrypoint gets
        (
            {"image": VLLM_IMAGE, "args": ["--model", "m"]},
            "args",
            ["--model", "m", "--gpu-memory-utilization", "0.48"],
            (),
        ),
        # in the command: replaced there
        (
            {
                "image": "python:3.12",
                "command": ["vllm", "serve", "m", "--gpu-memory-utilization", "0.9"],
            },
            "command",
            ["vllm", "serve", "m", "--gpu-memory-utilization", "0.48"],
            ("container 'srv': vLLM --gpu-memory-utilization set to 0.48, the share (was 0.9)",),
        ),
        # a command and no args: args created
        (
            {
                "image": SGLANG_IMAGE,
                "command": ["python3", "-m", "sglang.launch_server", "--model-path", "m"],
            },
            "args",
            ["--mem-fraction-static", "0.48"],
            (),
        ),
    ],
)
def test_set_gives_the_server_its_share(
    container: dict[str, Any], field: str, expected: list[str], warnings: tuple[str, ...]
) -> None:
    after, said = _run(container, memory="set")
    assert after[field] == expected
    assert said == warnings


def test_set_keeps_a_smaller_value_the_user_chose() -> None:
    container = {"image": VLLM_IMAGE, "args": ["--gpu-memory-utilization", "0.3"]}
    after, warnings = _run(container, memory="set")
    assert after["args"] == container["args"]
    assert warnings == ()


def test_set_does_not_rewrite_shell_scripts_but_warns() -> None:
    script = "pip install x && exec vllm serve m --gpu-memory-utilization 0.9"
    container = {"image": "python:3.12", "command": ["bash", "-c", script]}
    after, warnings = _run(container, memory="set")
    assert after["command"] == container["command"]
    assert "args" not in after
    assert warnings == (
        "container 'srv': vLLM --gpu-memory-utilization is 0.9, above the share 0.48: set it "
        "in its shell script",
    )


def test_two_vllm_pods_on_one_gpu_do_not_both_ask_for_ninety_percent() -> None:
    # Two half-GPU pods land on the two slots of one replicas-2 GPU: each gets its share.
    shares = []
    for name in ("a", "b"):
        after, _ = _run({"image": VLLM_IMAGE, "args": ["--model", name]}, memory="set")
        shares.append(float(after["args"][-1]))
    assert shares == [0.48, 0.48]
    assert sum(shares) <= 1.0


def test_whole_gpus_are_not_shared_so_the_server_is_left_alone() -> None:
    pod = make_pod(
        {"gpu-fraction": "1"}, containers=[{"name": "srv", "image": VLLM_IMAGE, "args": ["m"]}]
    )
    outcome = mutate(pod, "x", _policies("set"))
    assert outcome.allowed
    assert outcome.warnings == ()
    assert not any(op["path"].endswith("/args") or "/args/" in op["path"] for op in outcome.patch)


def test_explain_says_what_was_found_and_done() -> None:
    pod = make_pod(
        {"gpu-fraction": "0.5"}, containers=[{"name": "srv", "image": VLLM_IMAGE, "args": ["m"]}]
    )
    outcome = mutate(pod, "x", _policies("set"), explain=True)
    assert isinstance(outcome.decision, Planned)
    lines = [x for x in outcome.decision.explanation if x.startswith("inference server")]
    assert lines == [
        "inference server: container 'srv': vLLM --gpu-memory-utilization via the entrypoint of "
        f"{VLLM_IMAGE}: set to 0.48, the share (was 0.9 (vLLM's default); "
        "inferenceServers.memory: set)"
    ]


# -- sized against the pod's limits and what CUDA reports under them -----------------------------

GPU_MIB = 81920  # gpuMemory 80Gi; headroom 2% = ceil(1638.4) = 1639Mi


def _limited(container: dict[str, Any], memory: str = "warn", **spec: Any) -> Any:
    """``mutate`` of a half-GPU pod under an 80Gi pool with the given spec fields."""
    policies = policies_from(
        simple_policy(
            headroom="2%",
            gpuMemory="80Gi",
            fraction={"min": 0.05},
            inferenceServers={"memory": memory},
            **spec,
        )
    )
    pod = make_pod({"gpu-fraction": "0.5"}, containers=[{"name": "srv", **container}])
    outcome = mutate(pod, "x", policies, explain=True)
    assert outcome.allowed, outcome.reasons
    assert outcome.decision is not None
    result = mutated_pod(pod, outcome.decision)
    assert mutate(result, "x", policies).patch == []
    assert all(len(w) < 120 for w in outcome.warnings)
    assert isinstance(outcome.decision, Planned)
    notes = [x for x in outcome.decision.explanation if x.startswith("inference server")]
    # The placement warning of `require` pods is the driver limit's (test_driver_limits.py).
    warnings = tuple(w for w in outcome.warnings if not w.startswith("runs only on nodes"))
    return result["spec"]["containers"][0], warnings, notes


REQUIRE = {"enforcement": {"driverMemoryLimit": "require"}}


def test_under_require_the_flag_is_a_fraction_of_the_driver_limit() -> None:
    # CUDA reports the 40960Mi limit as total: floor((40960 - 1639) / 40960, 1/1000) = 0.959,
    # so vLLM's default 0.9 (36864Mi) fits, where 0.48 would leave half the share unused.
    after, warnings, notes = _limited({"image": VLLM_IMAGE, "args": ["m"]}, **REQUIRE)
    assert warnings == () and after["args"] == ["m"]
    assert notes[0].endswith(
        "at most floor((40960Mi driver limit - 1639Mi headroom) / 40960Mi, what CUDA reports "
        "as total under the driver limit (driverMemoryLimit: require)) = 0.959"
    )
    _, warnings, _ = _limited(
        {"image": VLLM_IMAGE, "args": ["m", "--gpu-memory-utilization", "0.97"]}, **REQUIRE
    )
    assert warnings == (
        "container 'srv': vLLM --gpu-memory-utilization is 0.97, above 0.959 of its 40960Mi "
        "limit: set it to 0.959 or lower",
    )
    after, _, _ = _limited(
        {"image": VLLM_IMAGE, "args": ["m", "--gpu-memory-utilization=0.97"]}, "set", **REQUIRE
    )
    assert after["args"] == ["m", "--gpu-memory-utilization=0.959"]


def test_the_reserved_memory_shrinks_the_limit_and_the_flag() -> None:
    # limit floor(0.5 x (81920 - 2048)) = 39936Mi; require: (39936 - 1639) / 39936 -> 0.958.
    reserved = {"driverMemoryLimit": "require", "reservedMemory": {"default": "2Gi"}}
    after, _, _ = _limited({"image": VLLM_IMAGE, "args": ["m"]}, "set", enforcement=reserved)
    assert after["args"] == ["m"]  # 0.9 fits
    # auto: the node may not apply it, so CUDA may report the whole GPU: sized against it.
    # (39936 - 1639) / 81920 = 0.4674... -> 0.467, below 0.48 - 2048 / 2 / 81920.
    after, _, notes = _limited(
        {"image": VLLM_IMAGE, "args": ["m"]},
        "set",
        enforcement={**reserved, "driverMemoryLimit": "auto"},
    )
    assert after["args"] == ["m", "--gpu-memory-utilization", "0.467"]
    assert "/ 81920Mi, the whole GPU, so that it fits whether CUDA reports the GPU" in notes[0]


def test_sized_against_the_whole_gpu_it_never_asks_more_than_its_limit() -> None:
    # auto, no reservation: limit 40960Mi; 0.48 x 81920 = 39321.6Mi > 40960 - 1639 = 39321Mi.
    after, _, _ = _limited({"image": VLLM_IMAGE, "args": ["m"]}, "set")
    (value,) = after["args"][-1:]
    assert value == "0.479"
    assert math.ceil(float(value) * GPU_MIB) <= 40960 - 1639
    # ... and whatever CUDA reports, the server starts: what it asks of a 40960Mi total is
    # below the free memory there once the CUDA context (within the headroom) is taken.
    assert math.ceil(float(value) * 40960) <= 40960 - 1639


def test_under_mps_the_whole_gpu_even_with_require() -> None:
    # The MPS pinned limit's effect on cudaMemGetInfo is not documented: sized against the GPU.
    after, _, notes = _limited({"image": VLLM_IMAGE, "args": ["m"]}, "set", mode="mps", **REQUIRE)
    assert after["args"][-1] == "0.479"
    assert "(40960Mi MPS limit - 1639Mi headroom) / 81920Mi, the whole GPU" in notes[0]
