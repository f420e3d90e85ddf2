"""Inference servers that need several GPUs (tensor, pipeline, data parallelism, TGI shards)
against the GPUs the pod, or its LeaderWorkerSet group, gets: a denial (422) when too few,
a warning when a value is not literal, nothing for a single-GPU server."""

from __future__ import annotations

from typing import Any

import pytest

from webhook.constants import LWS_SIZE_ANNOTATION
from webhook.core.planning import UNPROCESSABLE, Denied, Planned, plan_pod
from webhook.core.policy.model import PolicySet
from webhook.core.server_parallelism import check_server_gpus, lws_group_size
from webhook.core.verdict import mutate

from .support import make_pod, policies_from, policy_doc, simple_policy

VLLM = "vllm/vllm-openai:v0.8.5"
SGLANG = "lmsysorg/sglang:v0.5.4-cu126"
TGI = "ghcr.io/huggingface/text-generation-inference:3.3.6"

TIME_SLICING = policies_from(simple_policy())
HAMI = policies_from(policy_doc("p", default=True, mode="hami"))
KAI = policies_from(policy_doc("p", default=True, mode="kai", kai={"queue": "q"}))


def _plan(
    container: dict[str, Any],
    annotations: dict[str, str] | None = None,
    policies: PolicySet = TIME_SLICING,
) -> Planned | Denied:
    pod = make_pod(
        annotations or {"gpu-fraction": "0.5"}, containers=[{"name": "srv", **container}]
    )
    decision = plan_pod(pod, "default", policies, explain=True)
    assert isinstance(decision, Planned | Denied), decision
    return decision


def _denial(container: dict[str, Any], **kwargs: Any) -> str:
    decision = _plan(container, **kwargs)
    assert isinstance(decision, Denied), decision
    assert decision.code == UNPROCESSABLE
    (reason,) = decision.reasons
    return reason


def _admitted(container: dict[str, Any], **kwargs: Any) -> Planned:
    decision = _plan(container, **kwargs)
    assert isinstance(decision, Planned), decision
    return decision


def _needs(container: dict[str, Any], pod_gpus: int = 1, group: int = 1) -> int | None:
    found = check_server_gpus(container, pod_gpus, group)
    return None if found is None else found.needs


# -- vLLM: every spelling its parser takes -----------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "found"),
    [
        (["--tensor-parallel-size", "2"], "--tensor-parallel-size 2"),
        (["--tensor-parallel-size=2"], "--tensor-parallel-size 2"),
        # FlexibleArgumentParser turns underscores into dashes
        (["--tensor_parallel_size", "2"], "--tensor_parallel_size 2"),
        (["-tp", "2"], "-tp 2"),
        (["-tp=2"], "-tp 2"),
        (["--pipeline-parallel-size", "2"], "--pipeline-parallel-size 2"),
        (["-pp", "2"], "-pp 2"),
        (["--pipeline_parallel_size=2"], "--pipeline_parallel_size 2"),
        # data parallelism multiplies the GPUs too (world_size_across_dp = TP x PP x DP)
        (["--data-parallel-size", "2"], "--data-parallel-size 2"),
        (["-dp", "2"], "-dp 2"),
        # the last setting wins, as in argparse
        (["-tp", "4", "--tensor-parallel-size", "2"], "--tensor-parallel-size 2"),
    ],
)
def test_vllm_flag_forms_need_two_gpus(flags: list[str], found: str) -> None:
    container = {"image": "python:3.12", "command": ["vllm", "serve", "m", *flags]}
    assert _needs(container) == 2
    reason = _denial(container)
    assert reason.startswith(
        f"container 'srv' starts vLLM (vllm serve) with {found} in command: it needs 2 GPUs, "
        'but gpu-fraction "0.5" gives the pod a share of one GPU: ask for 2 whole GPUs with '
        'gpu-fraction: "2", or lower'
    )


def test_vllm_degrees_multiply_and_say_where_each_was_found() -> None:
    container = {
        "image": "python:3.12",
        "command": ["/usr/bin/python3", "-m", "vllm.entrypoints.openai.api_server"],
        "args": ["--model", "m", "-tp", "2", "--pipeline_parallel_size=2", "-dp", "2"],
    }
    reason = _denial(container)
    assert reason.startswith(
        "container 'srv' starts vLLM (/usr/bin/python3 -m vllm.entrypoints.openai.api_server) "
        "with -tp 2 in args x --pipeline_parallel_size 2 in args x -dp 2 in args: it needs 8 GPUs"
    )
    assert 'gpu-fraction: "8"' in reason


def test_vllm_local_data_parallel_replicas_and_one_external_rank() -> None:
    base = ["vllm", "serve", "m", "-tp", "2", "--data-parallel-size", "4"]
    assert _needs({"command": base}) == 8
    # --data-parallel-size-local: the replicas on this node; --data-parallel-rank: one here.
    assert _needs({"command": [*base, "--data-parallel-size-local", "2"]}) == 4
    assert _needs({"command": [*base, "-dpl", "1"]}) == 2
    assert _needs({"command": [*base, "--data-parallel-rank", "3"]}) == 2


def test_the_vllm_image_entrypoint_with_args_only() -> None:
    reason = _denial({"image": VLLM, "args": ["--model", "m", "--tensor-parallel-size", "4"]})
    assert reason.startswith(
        f"container 'srv' starts vLLM, the entrypoint of {VLLM}, with "
        "--tensor-parallel-size 4 in args: it needs 4 GPUs"
    )


# -- shell scripts and variables ---------------------------------------------------------------


def test_a_server_in_a_sh_c_script() -> None:
    script = "pip install x && exec vllm serve m --tensor-parallel-size 2 --port 8000"
    reason = _denial({"image": "python:3.12", "command": ["sh", "-c", script]})
    assert reason.startswith(
        "container 'srv' starts vLLM from a shell script (exec vllm serve) with "
        "--tensor-parallel-size 2 in its shell script: it needs 2 GPUs"
    )
    # bash -c with the script in args
    container = {"image": "python:3.12", "command": ["bash", "-c"], "args": [script]}
    assert _needs(container) == 2


def test_variables_are_read_from_the_containers_literal_env() -> None:
    env = [{"name": "TP", "value": "2"}]
    shell = {"command": ["sh", "-c", "vllm serve m -tp ${TP}"], "env": env}
    assert "-tp ${TP} (= 2) in its shell script" in _denial({"image": "x", **shell})
    kubelet = {"command": ["vllm", "serve", "m", "-tp", "$(TP)"], "env": env}
    assert "-tp $(TP) (= 2) in command" in _denial({"image": "x", **kubelet})


@pytest.mark.parametrize(
    ("container", "value"),
    [
        ({"command": ["sh", "-c", "vllm serve m -tp $TP"]}, "$TP"),
        ({"command": ["vllm", "serve", "m", "--tensor-parallel-size", "{{ .Values.tp }}"]}, None),
        (
            {
                "command": ["vllm", "serve", "m", "-tp", "$(TP)"],
                "env": [
                    {"name": "TP", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "tp"}}}
                ],
            },
            "$(TP)",
        ),
    ],
)
def test_a_value_that_is_not_literal_is_a_warning_not_a_denial(
    container: dict[str, Any], value: str | None
) -> None:
    decision = _admitted({"image": "python:3.12", **container})
    (warning,) = [w for w in decision.warnings if "not checked" in w]
    assert warning.startswith("container 'srv': vLLM ")
    assert "is not a number: not checked against the pod's 1 GPU(s)" in warning
    if value is not None:
        assert f'"{value}"' in warning
    assert len(warning) < 120


def test_literal_values_alone_needing_too_many_are_denied_beside_an_unknown_one() -> None:
    # every value is at least 1, so -tp 4 needs 4 GPUs whatever $PP is
    container = {"image": "python:3.12", "command": ["sh", "-c", "vllm serve m -tp 4 -pp $PP"]}
    reason = _denial(container)
    assert "with -tp 4 in its shell script: it needs at least 4 GPUs" in reason


# -- SGLang and TGI ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "needs"),
    [
        (["--tp", "2"], 2),
        (["--tp-size", "2"], 2),
        (["--tensor-parallel-size=4"], 4),
        (["--tp", "2", "--pp-size", "2"], 4),
        (["--tp", "2", "--dp", "2"], 4),
        (["--tp", "2", "--dp-size", "2", "--enable-dp-attention"], 2),  # DP inside TP
        (["--pipeline-parallel-size", "2", "--data-parallel-size", "3"], 6),
    ],
)
def test_sglang_flags(flags: list[str], needs: int) -> None:
    container = {
        "image": SGLANG,
        "command": ["python3", "-m", "sglang.launch_server", "--model-path", "m", *flags],
    }
    assert _needs(container) == needs
    reason = _denial(container)
    assert reason.startswith(
        "container 'srv' starts SGLang (python3 -m sglang.launch_server) with "
    )
    assert f"it needs {needs} GPUs" in reason
    assert _needs({"command": ["sglang", "serve", "--model-path", "m", *flags]}) == needs


def test_tgi_num_shard_flag_and_env() -> None:
    flag = {"image": TGI, "args": ["--model-id", "m", "--num-shard", "2"]}
    assert _denial(flag).startswith(
        f"container 'srv' starts TGI, the entrypoint of {TGI}, with --num-shard 2 in args: "
        "it needs 2 GPUs"
    )
    env = {"image": TGI, "args": ["--model-id", "m"], "env": [{"name": "NUM_SHARD", "value": "2"}]}
    assert "with NUM_SHARD=2 in env: it needs 2 GPUs" in _denial(env)
    # clap: the flag wins over the env variable
    both = {**env, "args": ["--model-id", "m", "--num-shard", "1"]}
    assert _needs(both) is None
    # the launcher as the command, env set in a script before it
    script = {"image": "x", "command": ["sh", "-c", "NUM_SHARD=4 text-generation-launcher"]}
    assert _needs(script) == 4


def test_tgi_sharded_true_needs_at_least_two_gpus() -> None:
    reason = _denial({"image": TGI, "args": ["--sharded", "true"]})
    assert "with --sharded true in args: it needs at least 2 GPUs" in reason
    assert _needs({"image": TGI, "env": [{"name": "SHARDED", "value": "false"}]}) is None
    assert _needs({"image": TGI, "args": ["--sharded=true", "--num-shard", "3"]}) == 3


def test_tgi_memory_flag_is_not_sized() -> None:
    # TGI is found for its sharding only; --cuda-memory-fraction is not checked.
    decision = _admitted({"image": TGI, "args": ["--model-id", "m"]})
    assert decision.warnings == ()


# -- what the pod gets: whole GPUs, several devices, a group -----------------------------------


def test_whole_gpus_enough_and_not_enough() -> None:
    container = {"image": VLLM, "args": ["--model", "m", "-tp", "2"]}
    _admitted(container, annotations={"gpu-fraction": "2"})
    _admitted(container, annotations={"gpu-fraction": "4"})  # more than needed is fine
    reason = _denial(container, annotations={"gpu-fraction": "1"})
    assert reason == (
        f"container 'srv' starts vLLM, the entrypoint of {VLLM}, with -tp 2 in args: it "
        'needs 2 GPUs, but gpu-fraction "1" gives the pod 1 whole GPU: ask for 2 whole GPUs '
        'with gpu-fraction: "2", or lower the server\'s parallelism to fit.'
    )


def test_whole_gpus_above_the_policys_limit_are_not_offered() -> None:
    policies = policies_from(simple_policy(wholeGpus={"max": 2}))
    reason = _denial({"image": VLLM, "args": ["-tp", "4"]}, policies=policies)
    assert reason.endswith(
        ": lower the server's parallelism to fit (policy 'p' allows at most 2 whole GPUs; mode "
        "time-slicing gives a share of one GPU, so gpu-fraction-num-devices cannot help)."
    )
    assert "ask for 4 whole GPUs" not in reason


def test_a_share_on_several_devices_is_enough_where_the_mode_gives_it() -> None:
    container = {"image": VLLM, "args": ["--model", "m", "-tp", "2"]}
    both = {"gpu-fraction": "0.5", "gpu-fraction-num-devices": "2"}
    _admitted(container, annotations=both, policies=HAMI)
    reason = _denial(container, policies=HAMI)
    assert 'ask for 2 whole GPUs with gpu-fraction: "2", or keep the share on each of 2 GPUs ' in (
        reason
    )
    assert 'gpu-fraction-num-devices: "2"' in reason
    too_few = {"gpu-fraction": "0.5", "gpu-fraction-num-devices": "2"}
    reason = _denial({"image": VLLM, "args": ["-tp", "4"]}, annotations=too_few, policies=HAMI)
    assert (
        'gpu-fraction "0.5" with gpu-fraction-num-devices "2" gives the pod a share on each of '
        "2 GPUs" in reason
    )


def test_each_mode_gets_the_fix_it_can_give() -> None:
    container = {"image": VLLM, "args": ["-tp", "2"]}
    # time-slicing: one GPU per share, so num-devices cannot help
    assert "gpu-fraction-num-devices cannot help" in _denial(container)
    # KAI: num-devices, and whole GPUs as resources (it reads only shares below 1)
    reason = _denial(container, policies=KAI)
    assert "remove the annotation and ask for nvidia.com/gpu: 2 in the container's resources" in (
        reason
    )
    assert 'gpu-fraction-num-devices: "2"' in reason
    # gpu-memory asks are told the same
    reason = _denial(container, annotations={"gpu-memory": "10Gi"}, policies=HAMI)
    assert 'but gpu-memory "10Gi" gives the pod a share of one GPU' in reason


def test_a_leaderworkerset_group_counts_the_groups_gpus() -> None:
    script = (
        "bash multi-node-serving.sh leader --ray_cluster_size=$(LWS_GROUP_SIZE); "
        "python3 -m vllm.entrypoints.openai.api_server --port 8080 --model m "
        "--tensor-parallel-size 8 --pipeline_parallel_size 2"
    )
    container = {"image": VLLM, "command": ["sh", "-c", script]}
    group = {"gpu-fraction": "8", LWS_SIZE_ANNOTATION: "2"}
    decision = _admitted(container, annotations=group)
    assert any("its 2 pod(s) get 16" in line for line in decision.explanation)
    reason = _denial(container, annotations={"gpu-fraction": "4", LWS_SIZE_ANNOTATION: "2"})
    assert (
        f'it needs 16 GPUs, but gpu-fraction "4" gives each of the 2 pods ({LWS_SIZE_ANNOTATION} '
        '"2") 4 whole GPUs, 8 in all: ask for 8 whole GPUs with gpu-fraction: "8"' in reason
    )
    # without the group the same pod needs all 16 itself, more than the policy's 8
    reason = _denial(container, annotations={"gpu-fraction": "8"})
    assert reason.endswith("(policy 'p' allows at most 8 whole GPUs).")


def test_sglang_across_an_lws_group_reads_nnodes_from_the_group_size() -> None:
    # SGLang's own LWS example: --tp 2 over --nnodes $(LWS_GROUP_SIZE), one GPU per pod.
    container = {
        "image": SGLANG,
        "command": ["python3", "-m", "sglang.launch_server", "--model-path", "m", "--tp", "2"],
        "args": ["--nnodes", "$(LWS_GROUP_SIZE)", "--node-rank", "$(LWS_WORKER_INDEX)"],
    }
    _admitted(container, annotations={"gpu-fraction": "0.5", LWS_SIZE_ANNOTATION: "2"})
    # a literal --nnodes says the same
    literal = {**container, "args": ["--nnodes", "2"]}
    _admitted(literal)
    # without the annotation $(LWS_GROUP_SIZE) is unknown: a warning, not a denial
    decision = _admitted(container)
    assert any("--nnodes" in w and "not checked" in w for w in decision.warnings)


def test_lws_group_size_reading() -> None:
    assert lws_group_size({}) == 1
    assert lws_group_size({LWS_SIZE_ANNOTATION: "4"}) == 4
    assert lws_group_size({LWS_SIZE_ANNOTATION: "0"}) is None
    assert lws_group_size({LWS_SIZE_ANNOTATION: "four"}) is None
    decision = _admitted(
        {"image": VLLM, "args": ["-tp", "2"]},
        annotations={"gpu-fraction": "2", LWS_SIZE_ANNOTATION: "four"},
    )
    assert f'{LWS_SIZE_ANNOTATION} "four" is not a whole number: group size taken as 1' in (
        decision.warnings
    )


# -- what stays as it was ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "container",
    [
        {"image": VLLM, "args": ["--model", "m"]},
        {"image": VLLM, "args": ["--model", "m", "--tensor-parallel-size", "1"]},
        {"image": "python:3.12", "command": ["vllm", "serve", "m", "-pp", "1", "-dp", "1"]},
        {"image": "python:3.12", "command": ["python", "train.py", "--tensor-parallel-size", "8"]},
        {"image": "python:3.12", "command": ["sh", "-c", "echo -tp 4"]},
    ],
)
def test_single_gpu_servers_and_other_programs_are_unaffected(container: dict[str, Any]) -> None:
    assert check_server_gpus(container, 1) is None
    decision = _admitted(container)
    assert not any("GPU(s)" in w for w in decision.warnings)
    assert not any("needs" in line and "GPU(s)" in line for line in decision.explanation)


def test_a_plain_vllm_pod_is_admitted_as_before() -> None:
    pod = make_pod(
        {"gpu-fraction": "0.5"},
        containers=[{"name": "srv", "image": VLLM, "args": ["--model", "m"]}],
    )
    outcome = mutate(pod, "default", TIME_SLICING)
    assert outcome.allowed
    assert outcome.warnings == (
        "container 'srv': vLLM --gpu-memory-utilization defaults to 0.9, above the share 0.5: "
        "set it to 0.5 or lower",
    )


def test_the_webhook_answers_422_with_the_reason() -> None:
    pod = make_pod(
        {"gpu-fraction": "0.5"},
        containers=[{"name": "srv", "image": VLLM, "args": ["--model", "m", "-tp", "2"]}],
    )
    outcome = mutate(pod, "default", TIME_SLICING)
    assert not outcome.allowed
    assert outcome.code == 422
    assert "it needs 2 GPUs" in outcome.reasons[0]
