"""Inference servers sized by flags: vLLM --gpu-memory-utilization, SGLang --mem-fraction-static.

Found in command/args in every form their parsers take; above the share (or absent: the
server's default) is a warning, or set to the share under ``inferenceServers.memory: set``.
"""

from __future__ import annotations

import copy
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
