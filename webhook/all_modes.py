"""``gpushare mutate --all-modes`` / ``explain --all-modes``: the same documents under every
configured policy, one sharing scheme after another, so an author can compare schemes
before moving a namespace from one to another (issue 12).

Each policy of the set is tried alone, as the default for every namespace (its match is
ignored; the set's excluded namespaces still hold), and each verdict comes from the same
core the webhook runs. For each scheme the output says what the pod gets (the JSON Patch,
compactly), what the scheme isolates and what must run on the nodes (the mode's profile).

Exit codes as for mutate/explain, per document across schemes: 3 when some document is
denied under every scheme, else 0.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from webhook.constants import APPLIED_ANNOTATION
from webhook.core import Match, ModeProfile, Policy, PolicySet, mode_profile
from webhook.manifest import Document
from webhook.offline import DENIED, Checked, check_documents, report

# A patch value longer than this is cut in the text view (the JSON view has it whole).
_SHOWN_VALUE = 240


@dataclass(frozen=True)
class SchemeView:
    """The documents' verdicts under one policy tried alone."""

    policy: Policy
    profile: ModeProfile
    checked: list[Checked]


def alone(policy: Policy, policies: PolicySet) -> PolicySet:
    """A set holding only ``policy``, governing every namespace the set does not exclude."""
    everywhere = replace(policy, default=True, priority=0, match=Match())
    return PolicySet(
        (everywhere,), excluded_namespaces=policies.excluded_namespaces, sources=policies.sources
    )


def check_all_modes(
    documents: Sequence[Document],
    policies: PolicySet,
    namespace: str | None = None,
    *,
    explain: bool = False,
) -> list[SchemeView]:
    """Every document under each policy of ``policies``, in the set's order."""
    return [
        SchemeView(
            policy,
            mode_profile(policy),
            check_documents(documents, alone(policy, policies), namespace, explain=explain),
        )
        for policy in policies.policies
    ]


def exit_code(views: Sequence[SchemeView]) -> int:
    """3 when some document is denied under every scheme, else 0."""
    if not views:
        return 0
    count = len(views[0].checked)
    for index in range(count):
        if all(view.checked[index].verdict == DENIED for view in views):
            return 3
    return 0


def heading(view: SchemeView) -> list[str]:
    """The scheme's name, what it isolates and what its nodes need."""
    policy, profile = view.policy, view.profile
    return [
        f"policy {policy.name!r} (mode {policy.mode.value}, scheduler {profile.scheduler})",
        f"isolation: {profile.isolation}",
        f"nodes need: {profile.node_requirements}",
    ]


def gets(item: Checked) -> list[str]:
    """What the document gets under one scheme: its patch, one operation a line."""
    lines = []
    for operation in item.patch:
        path = str(operation.get("path", ""))
        if path.endswith(APPLIED_ANNOTATION.replace("/", "~1")):
            continue  # the record of all the rest
        value = json.dumps(operation.get("value"), sort_keys=True, separators=(",", ":"))
        if len(value) > _SHOWN_VALUE:
            value = value[: _SHOWN_VALUE - 1] + "…"
        lines.append(f"{operation.get('op')} {path} {value}")
    return lines


def verdict_lines(item: Checked) -> list[str]:
    """One document under one scheme, for the text views."""
    if item.verdict == DENIED:
        return ["denied:", *(f"  - {reason}" for reason in item.reasons)]
    if not item.patch:
        return [f"untouched ({item.note or 'nothing to change'})"]
    return ["gets:", *(f"  {line}" for line in gets(item))] + [
        f"warning: {warning}" for warning in item.warnings
    ]


def json_report(views: Sequence[SchemeView], kind: str, *, with_result: bool) -> dict[str, Any]:
    """``-o json``: one report per scheme, each as ``offline.report`` makes it."""
    return {
        "apiVersion": "gpushare.io/v1alpha1",
        "kind": kind,
        "schemes": [
            {
                "policy": view.policy.name,
                "mode": view.policy.mode.value,
                "scheduler": view.profile.scheduler,
                "isolation": view.profile.isolation,
                "nodeRequirements": view.profile.node_requirements,
                "report": report(view.checked, "Report", with_result=with_result),
            }
            for view in views
        ],
    }


def print_mutate(views: Sequence[SchemeView], output: str) -> int:
    """``mutate --all-modes``: each scheme's heading as YAML comments, then the documents as
    admitted under it (denied ones as comments), schemes separated by ``---``."""
    import sys

    import yaml

    if output == "json":
        print(json.dumps(json_report(views, "MutateAllModesReport", with_result=True), indent=2))
        return exit_code(views)
    for number, view in enumerate(views):
        if number:
            print("---")
        for line in heading(view):
            print(f"# {line}")
        admitted = []
        for item in view.checked:
            for warning in item.warnings:
                print(f"{item.label}: warning ({view.policy.name}): {warning}", file=sys.stderr)
            if item.verdict == DENIED:
                print(f"# {item.label}: denied:")
                for reason in item.reasons:
                    print(f"#   - {reason}")
            else:
                admitted.append(item.result)
        if admitted:
            print(yaml.safe_dump_all(admitted, sort_keys=False), end="")
    return exit_code(views)


def print_explain(views: Sequence[SchemeView], output: str) -> int:
    """``explain --all-modes``: per document, what it gets under each scheme."""
    if output == "json":
        print(json.dumps(json_report(views, "ExplainAllModesReport", with_result=True), indent=2))
        return exit_code(views)
    count = len(views[0].checked) if views else 0
    for index in range(count):
        if index:
            print()
        first = views[0].checked[index]
        print(f"{first.label} ({first.document.source}:{first.document.line})")
        for view in views:
            lines = heading(view)
            print(f"- {lines[0]}")
            for line in [*lines[1:], *verdict_lines(view.checked[index])]:
                print(f"    {line}")
    return exit_code(views)
