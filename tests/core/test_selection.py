"""Which policy governs a pod: exclusions, priority, specificity, name, then the default."""

from __future__ import annotations

from typing import Any

import pytest

from webhook.core.policy.model import PolicySet
from webhook.core.policy.selection import namespace_excluded, select_policy
from webhook.core.verdict import mutate

from .support import make_pod, policies_from, policy_doc

POOLS = [{"name": "half", "replicas": 2}]


def _policy(name: str, namespaces: list[str] | None = None, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"mode": "time-slicing", "pools": POOLS, **spec}
    if namespaces is not None:
        body["match"] = {"namespaces": namespaces, **body.get("match", {})}
    return policy_doc(name, **body)


def _winner(
    policies: PolicySet, namespace: str, labels: dict[str, str] | None = None
) -> str | None:
    policy = select_policy(policies, namespace, labels).policy
    return None if policy is None else policy.name


def test_higher_priority_wins_over_a_more_specific_match() -> None:
    policies = policies_from(
        _policy("exact", ["team-a"], priority=1),
        _policy("glob", ["team-*"], priority=5),
    )
    assert _winner(policies, "team-a") == "glob"


def test_same_priority_the_most_specific_namespace_pattern_wins() -> None:
    policies = policies_from(
        _policy("all", ["*"]),
        _policy("glob", ["team-*"]),
        _policy("exact", ["team-a"]),
    )
    assert _winner(policies, "team-a") == "exact"
    assert _winner(policies, "team-b") == "glob"
    assert _winner(policies, "other") == "all"


def test_pod_labels_add_to_specificity_and_must_all_match() -> None:
    policies = policies_from(
        _policy("team", ["team-a"]),
        _policy("team-gpu", ["team-a"], match={"podLabels": {"gpu": "a100", "tier": "prod"}}),
    )
    assert _winner(policies, "team-a", {"gpu": "a100", "tier": "prod", "x": "y"}) == "team-gpu"
    assert _winner(policies, "team-a", {"gpu": "a100"}) == "team"
    assert _winner(policies, "team-a") == "team"


def test_ties_are_broken_by_name_never_by_file_order() -> None:
    documents = [_policy("bravo", ["team-*"]), _policy("alpha", ["team-*"])]
    assert _winner(policies_from(*documents), "team-x") == "alpha"
    assert _winner(policies_from(*reversed(documents)), "team-x") == "alpha"


def test_default_applies_only_when_no_policy_matches() -> None:
    policies = policies_from(
        _policy("fallback", default=True, priority=100),
        _policy("team", ["team-*"]),
    )
    assert _winner(policies, "team-a") == "team"
    assert _winner(policies, "research") == "fallback"
    selection = select_policy(policies, "research")
    assert selection.reason == (
        "no policy names namespace 'research', so the default policy 'fallback' (test.yaml) applies"
    )


def test_highest_priority_default_wins_among_defaults() -> None:
    policies = policies_from(
        _policy("low", default=True, priority=1),
        _policy("high", default=True, priority=2),
    )
    assert _winner(policies, "anything") == "high"
    assert select_policy(policies, "anything").others == ("low: default with lower priority",)


def test_no_match_and_no_default_selects_nothing_and_says_why() -> None:
    policies = policies_from(_policy("team", ["team-*"]))
    selection = select_policy(policies, "research")
    assert selection.policy is None
    assert selection.reason == "no policy matches namespace 'research' and none is default"
    assert selection.others == ("team: matches namespaces ['team-*'], not 'research'",)


@pytest.mark.parametrize(
    "namespace", ["kube-system", "kube-public", "kube-node-lease", "gpushare-system"]
)
def test_default_excluded_namespaces_are_never_selected(namespace: str) -> None:
    policies = policies_from(_policy("everything", ["*"], default=True))
    selection = select_policy(policies, namespace)
    assert selection.policy is None
    assert selection.reason == f"namespace {namespace!r} is excluded from GPU sharing"


def test_kube_system_stays_excluded_when_settings_leave_it_out() -> None:
    settings = {
        "apiVersion": "gpushare.io/v1alpha1",
        "kind": "GpuSharingSettings",
        "metadata": {"name": "settings"},
        "spec": {"excludeNamespaces": ["sandbox-*"]},
    }
    policies = policies_from(settings, _policy("everything", ["*"], default=True))
    assert namespace_excluded(policies, "kube-system")
    assert namespace_excluded(policies, "sandbox-1")
    assert not namespace_excluded(policies, "kube-public")
    assert _winner(policies, "kube-public") == "everything"
    assert _winner(policies, "kube-system") is None


def test_policy_exclude_namespaces_leaves_the_namespace_to_others() -> None:
    policies = policies_from(
        _policy("teams", ["team-*"], match={"excludeNamespaces": ["team-legacy"]}),
        _policy("fallback", default=True),
    )
    assert _winner(policies, "team-new") == "teams"
    selection = select_policy(policies, "team-legacy")
    assert selection.policy is not None and selection.policy.name == "fallback"
    assert "teams: excludes namespace 'team-legacy' (pattern 'team-legacy')" in selection.others


def test_default_excluding_a_namespace_does_not_govern_it() -> None:
    policies = policies_from(_policy("fallback", default=True, match={"excludeNamespaces": ["ci"]}))
    assert _winner(policies, "ci") is None
    assert _winner(policies, "dev") == "fallback"


def test_losers_are_listed_with_the_reason_they_lost() -> None:
    policies = policies_from(
        _policy("fallback", default=True),
        _policy("glob", ["team-*"]),
        _policy("exact", ["team-a"]),
        _policy("other", ["ops"]),
    )
    selection = select_policy(policies, "team-a")
    assert selection.policy is not None and selection.policy.name == "exact"
    assert selection.reason == (
        "policy 'exact' (test.yaml) matches namespace 'team-a' through ['team-a'] with priority 0"
    )
    assert set(selection.others) == {
        "glob: also matches but loses on priority/specificity/name to exact",
        "fallback: default policy, not used because a policy matches",
        "other: matches namespaces ['ops'], not 'team-a'",
    }


def test_mutation_in_an_excluded_namespace_is_untouched_with_a_warning() -> None:
    policies = policies_from(_policy("everything", ["*"], default=True))
    pod = make_pod({"gpu-fraction": "0.5"})
    outcome = mutate(pod, "kube-system", policies)
    assert outcome.allowed
    assert outcome.patch == []
    assert outcome.warnings == (
        "gpu-fraction ignored: namespace 'kube-system' is excluded from GPU sharing",
    )


def test_pod_labels_select_the_policy_during_mutation() -> None:
    policies = policies_from(
        _policy("fallback", default=True),
        _policy(
            "a100",
            ["*"],
            match={"podLabels": {"gpu": "a100"}},
            pools=[{"name": "q", "replicas": 4}],
        ),
    )
    pod = make_pod({"gpu-fraction": "0.25"})
    assert mutate(pod, "x", policies).policy == "fallback"
    pod["metadata"]["labels"] = {"gpu": "a100"}
    assert mutate(pod, "x", policies).policy == "a100"
