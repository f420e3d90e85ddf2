"""What a policy adds to every pod it mutates: ``inject`` env, labels and annotations, and
``tolerations``."""

from __future__ import annotations

from webhook.core.container_env import apply_env
from webhook.core.draft import PlanDraft
from webhook.core.modes import EnvSetting
from webhook.core.plan_memos import plan_memos
from webhook.core.policy.model import Policy


def _env_settings(policy: Policy) -> tuple[EnvSetting, ...]:
    return tuple(
        EnvSetting(name, value, derivation="policy inject.env") for name, value in policy.inject.env
    )


def apply_injections(draft: PlanDraft) -> None:
    policy = draft.policy
    inject = policy.inject
    if inject.env:
        memo = plan_memos(draft.policies).inject_env
        apply_env(draft, memo.get_or_compute(id(policy), _env_settings, policy))
    for key, value in inject.labels.items():
        draft.edits.set(("metadata", "labels", key), value)
        if draft.explaining:
            draft.explanation.append(f"label {key}={value} (policy inject.labels)")
    for key, value in inject.annotations.items():
        draft.edits.set(("metadata", "annotations", key), value)
        if draft.explaining:
            draft.explanation.append(f"annotation {key}={value} (policy inject.annotations)")
    tolerations = draft.spec.get("tolerations") or []
    for toleration in inject.tolerations:
        if dict(toleration) not in tolerations:
            # A copy per plan (planned pods must not share dicts); tolerations are flat.
            draft.edits.append(("spec", "tolerations"), dict(toleration))
            if draft.explaining:
                draft.explanation.append(f"toleration {dict(toleration)} (policy tolerations)")
