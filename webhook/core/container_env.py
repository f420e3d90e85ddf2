"""The env of the container that gets the GPU: which settings are added, kept or enforced.

A setting the container does not have is appended once. One it has is kept as the user set
it, unless the setting is enforced (MPS hard limits, the driver memory limit, the daemon's
pipe directory, the merged PyTorch allocator config): then every entry of that name, a
``valueFrom`` one too, gets the planned value, or, for a limit under the policy's
``enforcement.handSetLimits: deny``, the pod is refused (``hand_set_env``).

Entries go into ``env``, never ``envFrom``: an explicit ``env`` entry takes precedence over
the same key from ``envFrom`` (Kubernetes, "Define Environment Variables for a Container":
env overrides envFrom), so gpushare's limits also win over a ConfigMap's or Secret's keys.
"""

from __future__ import annotations

from collections.abc import Sequence

from webhook.constants import LIMIT_VARS, MPS_PIPE_DIRECTORY_VAR
from webhook.core.draft import PlanDraft, as_mapping
from webhook.core.edits import Path
from webhook.core.hand_set_env import refuse_hand_set_limits
from webhook.core.modes import EnvSetting

# Replacing these user values changes what the workload may use: say so in a warning.
_WARNED_WHEN_OVERWRITTEN = frozenset((*LIMIT_VARS, MPS_PIPE_DIRECTORY_VAR))


def apply_env(draft: PlanDraft, settings: Sequence[EnvSetting]) -> None:
    """Plan ``settings`` into the container's env, in order."""
    env = draft.container.get("env") or []
    if env:
        refuse_hand_set_limits(draft, settings)
    env_path: Path = (*draft.container_path, "env")
    positions: dict[str, list[int]] = {}
    for position, entry in enumerate(env):
        positions.setdefault(str(as_mapping(entry).get("name")), []).append(position)
    for setting in settings:
        found = positions.get(setting.name)
        if not found:
            _add(draft, env_path, setting)
        elif setting.enforced:
            _enforce(draft, env, env_path, found, setting)
        elif draft.explaining:
            draft.explanation.append(f"env {setting.name}: kept the value the user set")


def _add(draft: PlanDraft, env_path: Path, setting: EnvSetting) -> None:
    if setting.name in draft.env_added:
        return
    draft.env_added.add(setting.name)
    draft.edits.append(env_path, {"name": setting.name, "value": setting.value})
    if draft.explaining:
        draft.explanation.append(f"env {setting.name}={setting.value} ({setting.derivation})")


def _enforce(
    draft: PlanDraft,
    env: Sequence[object],
    env_path: Path,
    positions: Sequence[int],
    setting: EnvSetting,
) -> None:
    wanted = {"name": setting.name, "value": setting.value}
    for position in positions:
        if env[position] != wanted:
            draft.edits.replace_item(env_path, position, wanted)
            if setting.name in _WARNED_WHEN_OVERWRITTEN:
                draft.warnings.append(
                    f"{setting.name} in {draft.container_name!r} set to {setting.value} "
                    "by policy (user value replaced)"
                )
    if draft.explaining:
        draft.explanation.append(
            f"env {setting.name}={setting.value} ({setting.derivation}; enforced)"
        )


def explain_frameworks(draft: PlanDraft, notes: Sequence[str]) -> None:
    """Per container, which framework env was added or skipped and why."""
    image = draft.container.get("image")
    for note in notes:
        draft.explanation.append(
            f"frameworks: container {draft.container_name!r} ({image}): {note}"
        )
    for container in draft.spec.get("containers") or ():
        name = str(as_mapping(container).get("name"))
        if name != draft.container_name:
            draft.explanation.append(
                f"frameworks: container {name!r}: no framework env (it gets no GPU)"
            )
