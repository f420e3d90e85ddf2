"""Golden files leave out the applied record's ``policyVersion``; tests fill it in.

The version is a digest of the policy's spec (``Policy.version``), so it changes with every
edit of a policy file. Expected files record everything else; ``with_policy_versions`` adds
the version of the policy each record names, and the tests then compare exactly.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson

from webhook.constants import APPLIED_ANNOTATION
from webhook.core import load_policies


def with_policy_versions(document: Any, policies_path: Path) -> Any:
    """``document`` (changed in place) with every applied record's ``policyVersion``."""
    versions = {policy.name: policy.version for policy in load_policies(policies_path).policies}
    _fill(document, versions)
    return document


def _fill(node: Any, versions: dict[str, str]) -> None:
    if isinstance(node, list):
        for item in node:
            _fill(item, versions)
        return
    if not isinstance(node, dict):
        return
    applied = node.get(APPLIED_ANNOTATION)
    if isinstance(applied, str):
        record = json.loads(applied)
        if "policyVersion" not in record and record.get("policy") in versions:
            record["policyVersion"] = versions[record["policy"]]
            node[APPLIED_ANNOTATION] = orjson.dumps(record, option=orjson.OPT_SORT_KEYS).decode()
    for value in node.values():
        _fill(value, versions)
