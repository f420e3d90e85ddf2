"""The webhook's sentences for what the compiled policies refuse about env (device variables,
hand-set limits), as CEL: taken from the core itself when compiling, by planning a pod with
placeholder names under a placeholder policy (``validate``, ``mutate``), and cut at the
placeholders into a concatenation of literals and the CEL values that stand for them. So
the compiled words are the webhook's, whatever it says, and a change of wording in the core
needs no change here (tests/e2e/test_compiled_policies.py compares them through the
apiserver).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Any

from webhook.compile.pod_cel import s
from webhook.constants import DRIVER_MEMORY_LIMIT_VAR, FRACTION_ANNOTATION
from webhook.core import load_policy_text, mutate, validate

# Placeholders: valid names, found nowhere else in the sentences.
POLICY = "zzpolicyzz"
CONTAINER = "zzcontainerzz"
VALUE = "zzvaluezz"
# The limit the placeholder policy plans: floor(0.5 x 77776 MiB), a number no sentence holds
# otherwise.
PLANNED = "38888"
_POLICY_TEXT = f"""
apiVersion: gpushare.io/v1alpha1
kind: GpuSharingPolicy
metadata: {{name: {POLICY}}}
spec:
  default: true
  mode: time-slicing
  gpuMemory: 77776Mi
  pools: [{{name: zzpoolzz, replicas: 2}}]
  enforcement: {{handSetLimits: deny, deviceVariables: deny}}
"""
_NAMESPACE = "zznamespacezz"


class CoreWordsError(RuntimeError):
    """The core did not refuse a placeholder pod as the compiler expects."""


def as_cel(text: str, values: Mapping[str, str]) -> str:
    """``text`` as a CEL concatenation, each placeholder (a key of ``values``) replaced by
    its CEL value."""
    pattern = "|".join(re.escape(key) for key in sorted(values, key=len, reverse=True))
    parts = re.split(f"({pattern})", text)
    return " + ".join(values[p] if p in values else s(p) for p in parts if p)


def _pod(env: list[dict[str, Any]], field: str, annotation: str | None) -> dict[str, Any]:
    container = {"name": CONTAINER, "image": "busybox", "env": env}
    spec: dict[str, Any] = {"containers": [container]}
    if field == "initContainers":
        spec = {
            "containers": [{"name": "app", "image": "busybox"}],
            "initContainers": spec["containers"],
        }
    metadata: dict[str, Any] = {"name": "p"}
    if annotation is not None:
        metadata["annotations"] = {FRACTION_ANNOTATION: annotation}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def _one_reason(reasons: tuple[str, ...], what: str) -> str:
    if len(reasons) != 1:
        raise CoreWordsError(f"the core gave {len(reasons)} reasons for {what}: {reasons}")
    return reasons[0]


@functools.cache
def device_sentence(variable: str, field: str) -> str:
    """The core's refusal of ``variable`` set by hand in a container of ``field``
    (containers, initContainers), with the placeholders."""
    pod = _pod([{"name": variable, "value": "0"}], field, None)
    verdict = validate(pod, _NAMESPACE, load_policy_text(_POLICY_TEXT))
    return _one_reason(verdict.reasons, f"{variable} in {field}")


@functools.cache
def hand_set_sentence(from_elsewhere: bool, planned: bool) -> str:
    """The core's refusal of a limit variable set by hand (``value`` the placeholder, or
    ``valueFrom``) where it plans its own value (the placeholder) or none (whole GPUs)."""
    entry: dict[str, Any] = {"name": DRIVER_MEMORY_LIMIT_VAR, "value": VALUE}
    if from_elsewhere:
        entry = {"name": DRIVER_MEMORY_LIMIT_VAR, "valueFrom": {"fieldRef": {"fieldPath": "x"}}}
    pod = _pod([entry], "containers", "0.5" if planned else "1")
    verdict = mutate(pod, _NAMESPACE, load_policy_text(_POLICY_TEXT))
    return _one_reason(verdict.reasons, f"{DRIVER_MEMORY_LIMIT_VAR} set by hand")
