"""What every compiled document shares: the API version, the pods they match, their labels;
how the CEL names the plan's variables (``V``) and writes string literals; which resources are
GPUs."""

from __future__ import annotations

from typing import Any

from webhook.compile import cel
from webhook.constants import KNOWN_GPU_RESOURCES, MIG_RESOURCE_PREFIX
from webhook.core import Policy, PolicySet

API_VERSION = "admissionregistration.k8s.io/v1"
V = "variables."
# Where the mutating policy writes why it left a pod alone ("422 ..." or "403 ...", the
# webhook's status code and its reasons); the validating policy denies the pod with it. A
# user cannot get a pod past a policy with it: the mutating policy removes it from every pod
# it mutates and writes it on every pod it refuses; written by hand (with the label below)
# on a pod no policy governs, it only refuses that pod.
DENIAL_ANNOTATION = "gpushare.io/denied"
# And a label of the same key on a refused pod: the validating policy's objectSelector
# picks those pods out without CEL, so an admitted pod costs it nothing (a matchCondition
# would convert every pod for CEL, in the apiserver, on the path of every create).
DENIAL_LABEL = DENIAL_ANNOTATION


def s(text: str) -> str:
    """A CEL string literal."""
    return cel.string(text)


def gpu_resource_test(policies: PolicySet, key: str) -> str:
    """``container_resources.is_gpu_resource`` of the CEL string ``key``."""
    names = sorted(KNOWN_GPU_RESOURCES | policies.gpu_resource_names)
    return f"({key} in {cel.strings(names)} || {key}.startsWith({s(MIG_RESOURCE_PREFIX)}))"


def match_constraints() -> dict[str, Any]:
    return {
        "resourceRules": [
            {
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "operations": ["CREATE"],
                "resources": ["pods"],
            }
        ],
        "matchPolicy": "Equivalent",
    }


def policy_labels(policy: Policy) -> dict[str, str]:
    return {"app.kubernetes.io/name": "gpushare", "gpushare.io/policy": policy.name}
