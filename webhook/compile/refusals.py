"""What the compiler refuses, and what it compiles without: each a sentence naming the policy
field and why.

A refusal stops the compilation (the admin keeps the webhook for that policy set); a note
says what the compiled policies do not do that the webhook does (its admission warnings), and
is printed beside the output. The rules here decide; ``mutating``/``validating`` assume them.
"""

from __future__ import annotations

from dataclasses import dataclass

from webhook.compile.cel import glob_regex
from webhook.constants import LIMIT_VARS, MPS_PIPE_DIRECTORY_VAR
from webhook.core import (
    JAX_FRACTION,
    JAX_PREALLOCATE,
    TF_GROWTH,
    HandSetLimits,
    Mode,
    Policy,
    PolicySet,
    ServerMemory,
)
from webhook.errors import GpushareError

# The sharing modes the compiler knows; any other (a scheme added to the webhook later) is
# refused by name, never guessed at.
COMPILED_MODES = frozenset({Mode.TIME_SLICING, Mode.MPS, Mode.MPS_DAEMON})

_ENFORCED_NAMES = frozenset((*LIMIT_VARS, MPS_PIPE_DIRECTORY_VAR))
_FRAMEWORK_NAMES = frozenset((TF_GROWTH.name, JAX_FRACTION.name, JAX_PREALLOCATE.name))


@dataclass(frozen=True)
class Refusal:
    """Why one policy cannot be compiled: ``<source>: policy <name>: spec.<field>: <why>``."""

    policy: str
    source: str
    field: str
    why: str

    def __str__(self) -> str:
        return f"{self.source}: policy {self.policy!r}: spec.{self.field}: {self.why}"


class CompileRefusedError(GpushareError):
    """The policy set holds something CEL admission policies cannot do as the webhook does."""

    def __init__(self, refusals: list[Refusal]) -> None:
        self.refusals = refusals
        super().__init__("\n".join(str(r) for r in refusals))


def _refuse(policy: Policy, field: str, why: str) -> Refusal:
    return Refusal(policy.name, policy.source, field, why)


def refusals(policies: PolicySet) -> list[Refusal]:
    """Everything in ``policies`` the compiler cannot express; empty when it compiles."""
    found: list[Refusal] = []
    for pattern in sorted(policies.excluded_namespaces):
        try:
            glob_regex(pattern)
        except ValueError as error:
            source = policies.sources[0] if policies.sources else "settings"
            found.append(
                Refusal("(settings)", source, "excludeNamespaces", f"{error}: write low-high")
            )
    for policy in policies.policies:
        found += _policy_refusals(policy)
    return found


def _policy_refusals(policy: Policy) -> list[Refusal]:
    found: list[Refusal] = []
    mode = str(getattr(policy.mode, "value", policy.mode))
    if policy.mode not in COMPILED_MODES:
        found.append(
            _refuse(
                policy,
                "mode",
                f"mode {mode!r} has no compiled form (only time-slicing, mps and mps-daemon "
                "compile): keep the webhook for this policy",
            )
        )
    if policy.frameworks.pytorch.memory_fraction:
        found.append(
            _refuse(
                policy,
                "frameworks.pytorch.memoryFraction",
                "per_process_memory_fraction goes only into images whose PyTorch version is "
                "known (NGC monthly tags through NVIDIA's release notes, declared versions) and "
                "is merged key by key into the user's allocator config: keep the webhook, or "
                "set it to false",
            )
        )
    if policy.inference_servers.memory is ServerMemory.SET:
        found.append(
            _refuse(
                policy,
                "inferenceServers.memory",
                "'set' rewrites vLLM/SGLang flags in the container's command and args, which "
                "needs shell-like parsing CEL does not offer: use 'warn' or 'ignore', or keep "
                "the webhook",
            )
        )
    for name, _ in policy.inject.env:
        if name in _ENFORCED_NAMES or name in _FRAMEWORK_NAMES:
            found.append(
                _refuse(
                    policy,
                    "inject.env",
                    f"{name} is also set by the sharing mode or the framework knobs; the "
                    "compiled env merge keeps one setting per name: remove it from inject.env",
                )
            )
    for field, patterns in (
        ("match.namespaces", policy.match.namespaces),
        ("match.excludeNamespaces", policy.match.exclude_namespaces),
    ):
        for pattern in patterns:
            try:
                glob_regex(pattern)
            except ValueError as error:
                found.append(_refuse(policy, field, f"{error}: write the range low-high"))
    found += _quota_refusals(policy)
    if len({name for name, _ in policy.inject.env}) != len(policy.inject.env):
        found.append(_refuse(policy, "inject.env", "a name appears twice: keep one"))
    return found


def _quota_refusals(policy: Policy) -> list[Refusal]:
    found: list[Refusal] = []
    for field, on in (
        ("quota.shareResource", policy.quota.share_resource),
        ("quota.showbackLabels", policy.quota.showback_labels),
    ):
        if on:
            found.append(
                _refuse(
                    policy,
                    field,
                    "the compiled policies do not write gpushare.io/milligpu (the share's "
                    "resource, labels and record) nor charge Kueue-managed templates: keep the "
                    "webhook for this policy, or set it to false",
                )
            )
    return found


def notes(policies: PolicySet) -> list[str]:
    """What the compiled policies leave out that the webhook does: admission warnings only."""
    found: list[str] = []
    for policy in policies.policies:
        if policy.enforcement.hand_set_limits is HandSetLimits.DENY:
            found.append(
                f"{policy.source}: policy {policy.name!r}: spec.enforcement.handSetLimits: deny: "
                "a limit value set by hand that holds control characters other than newline, "
                "tab and carriage return is quoted otherwise than the webhook quotes it in the "
                "refusal (the pod is refused alike)"
            )
        if policy.inference_servers.memory is ServerMemory.WARN:
            found.append(
                f"{policy.source}: policy {policy.name!r}: spec.inferenceServers.memory: warn: "
                "the compiled policies do not read vLLM/SGLang flags and give no warning about "
                "them (the webhook does)"
            )
    if policies.policies:
        found.append(
            "compiled policies give no admission warnings for skipped framework knobs, "
            "replaced MPS or driver limits, the enforcing nodes a pod is placed on, small bare "
            "gpu-memory numbers or a GPU container guessed among several (the webhook does); "
            "the pods they admit are the same"
        )
        found.append(
            "compiled policies do not read an inference server's tensor, pipeline or data "
            "parallelism (vLLM, SGLang, TGI): a pod whose server needs more GPUs than it asks "
            "for is admitted (the webhook denies it)"
        )
        found.append(
            "compiled policies do not compare the GPU model a pod already selects (its "
            "nodeSelector or required node affinity) with the memory it asks for or the "
            "labels they add: a pod that can never schedule is admitted (the webhook denies it)"
        )
    return found
