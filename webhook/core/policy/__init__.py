"""Policies: the YAML documents policy authors write, parsed once into frozen values.

``model`` holds the values, ``schema`` the JSON Schema of the documents, ``loader`` turns
files into a ``PolicySet`` (or a ``PolicyError`` naming file and YAML path) with ``build``
(document -> values) and ``rules`` (what a policy must follow), ``selection`` picks the
policy that governs a pod.
"""

from webhook.core.policy.loader import load_policies, load_policy_text
from webhook.core.policy.model import (
    Frameworks,
    MpsDaemonSettings,
    MpsSettings,
    Policy,
    PolicySet,
    Pool,
)
from webhook.core.policy.selection import Selection, select_policy

__all__ = [
    "Frameworks",
    "MpsDaemonSettings",
    "MpsSettings",
    "Policy",
    "PolicySet",
    "Pool",
    "Selection",
    "load_policies",
    "load_policy_text",
    "select_policy",
]
