"""Policies: the YAML documents policy authors write, parsed once into frozen values.

Layout: docs/architecture.md.
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
