"""Policy hot reload: a good version replaces the old, a bad one is refused and reported."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from werkzeug.test import Client

from webhook.policy_store import PolicyStore, ReloadResult
from webhook.server.app import create_app
from webhook.server.metrics import AdmissionMetrics

from .support import BUNDLED_POLICIES, wait_until


def renamed_policy(text: str, name: str) -> str:
    return text.replace("name: default\n", f"name: {name}\n", 1)


def counting_store(path: Path) -> tuple[PolicyStore, list[bool]]:
    calls: list[bool] = []
    store = PolicyStore.loaded(path, on_reload=lambda ok, policies: calls.append(ok))
    return store, calls


def test_unchanged_files_are_not_reloaded(policy_dir: Path) -> None:
    store, calls = counting_store(policy_dir)
    assert store.refresh() is ReloadResult.UNCHANGED
    assert calls == []
    assert store.status().reloads_ok == 0


def test_good_change_is_loaded(policy_dir: Path) -> None:
    store, calls = counting_store(policy_dir)
    file = policy_dir / "default.yaml"
    file.write_text(renamed_policy(file.read_text(), "renamed"))
    assert store.refresh() is ReloadResult.LOADED
    assert store.policies is not None
    assert [p.name for p in store.policies.policies] == ["renamed"]
    assert calls == [True]
    assert store.status().reloads_ok == 1


def test_bad_change_is_refused_and_last_good_keeps_serving(policy_dir: Path) -> None:
    store, calls = counting_store(policy_dir)
    good = store.policies
    (policy_dir / "broken.yaml").write_text(
        "apiVersion: gpushare.io/v1alpha1\nkind: GpuSharingPolicy\nmetadata: {name: x}\n"
        "spec: {mode: nonsense}\n"
    )
    assert store.refresh() is ReloadResult.REFUSED
    assert store.policies is good
    status = store.status()
    assert status.loaded
    assert status.last_failure is not None
    assert any("broken.yaml" in problem for problem in status.last_failure.problems)
    assert calls == [False]
    # The same bad version is reported once, not on every poll.
    assert store.refresh() is ReloadResult.UNCHANGED
    assert calls == [False]
    assert status.reloads_failed == 1
    # Fixing it loads it and clears the error.
    (policy_dir / "broken.yaml").unlink()
    file = policy_dir / "default.yaml"
    file.write_text(renamed_policy(file.read_text(), "fixed"))
    assert store.refresh() is ReloadResult.LOADED
    assert store.status().last_failure is None
    assert calls == [False, True]


def test_removed_directory_is_refused(policy_dir: Path) -> None:
    store, calls = counting_store(policy_dir)
    shutil.rmtree(policy_dir)
    assert store.refresh() is ReloadResult.REFUSED
    assert store.policies is not None
    assert calls == [False]


def test_configmap_symlink_swap_is_reloaded(tmp_path: Path) -> None:
    """kubelet updates a ConfigMap volume by pointing ``..data`` at a new directory."""
    mount = tmp_path / "mount"
    first = mount / "..2026_01_01_00_00_00.000000001"
    first.mkdir(parents=True)
    shutil.copy(BUNDLED_POLICIES / "default.yaml", first / "default.yaml")
    (mount / "..data").symlink_to(first.name)
    (mount / "default.yaml").symlink_to("..data/default.yaml")
    store, calls = counting_store(mount)
    assert store.policies is not None

    second = mount / "..2026_01_01_00_01_00.000000002"
    second.mkdir()
    (second / "default.yaml").write_text(
        renamed_policy((first / "default.yaml").read_text(), "swapped")
    )
    staging = mount / "..data_tmp"
    staging.symlink_to(second.name)
    os.replace(staging, mount / "..data")
    shutil.rmtree(first)
    assert store.refresh() is ReloadResult.LOADED
    assert [p.name for p in store.policies.policies] == ["swapped"]
    assert calls == [True]


def test_first_load_failure_leaves_store_not_ready(tmp_path: Path) -> None:
    empty = tmp_path / "none"
    empty.mkdir()
    store, calls = counting_store(empty)
    assert store.policies is None
    status = store.status()
    assert not status.loaded and status.last_failure is not None
    assert "no .yaml" in status.last_failure.problems[0]
    assert calls == []  # the first load is not a reload
    shutil.copy(BUNDLED_POLICIES / "default.yaml", empty / "default.yaml")
    assert store.refresh() is ReloadResult.LOADED
    assert store.policies is not None


def test_polling_thread_picks_up_changes(policy_dir: Path) -> None:
    store, calls = counting_store(policy_dir)
    store.start_polling(0.02)
    try:
        file = policy_dir / "default.yaml"
        file.write_text(renamed_policy(file.read_text(), "polled"))
        assert wait_until(lambda: calls == [True], timeout=10)
    finally:
        store.stop_polling()


def test_readyz_and_metrics_show_a_refused_reload(policy_dir: Path) -> None:
    metrics = AdmissionMetrics()
    store = PolicyStore.loaded(
        policy_dir,
        on_reload=lambda ok, policies: metrics.observe_policy_reload(
            ok, len(policies.policies) if policies else None
        ),
    )
    client = Client(create_app(store, metrics=metrics))
    (policy_dir / "default.yaml").write_text("apiVersion: [\n")
    store.refresh()
    response = client.get("/readyz")
    assert response.status_code == 200  # the last good version still serves
    policies = response.get_json()["policies"]
    assert policies["reloads_failed"] == 1 and policies["last_reload_failed_at"] is not None
    text = client.get("/metrics").get_data(as_text=True)
    assert 'gpushare_policy_reloads_total{result="failed"} 1.0' in text


@pytest.mark.parametrize("name", ["notes.txt", ".hidden.yaml.swp"])
def test_files_the_loader_ignores_do_not_trigger_reloads(policy_dir: Path, name: str) -> None:
    store, calls = counting_store(policy_dir)
    (policy_dir / name).write_text("anything")
    assert store.refresh() is ReloadResult.UNCHANGED
    assert calls == []


def test_a_new_store_serves_the_last_good_version_a_sibling_kept(
    policy_dir: Path, tmp_path: Path
) -> None:
    last_good = tmp_path / "run" / "last-good.json"
    last_good.parent.mkdir()
    first = PolicyStore.loaded(policy_dir, last_good=last_good)
    assert first.policies is not None and last_good.is_file()
    (policy_dir / "default.yaml").write_text("kind: GpuSharingPolicy\nspec: [\n")

    replacement = PolicyStore.loaded(policy_dir, last_good=last_good)
    assert replacement.policies is not None
    assert [p.name for p in replacement.policies.policies] == ["default"]
    status = replacement.status()
    assert status.loaded and status.last_failure is not None  # readyz still says why

    unrelated = PolicyStore.loaded(policy_dir)  # no shared file: nothing to fall back to
    assert unrelated.policies is None


def test_a_corrupt_last_good_file_is_not_served(policy_dir: Path, tmp_path: Path) -> None:
    last_good = tmp_path / "last-good.json"
    last_good.write_text('[["default.yaml", "not: [a policy"]]')
    (policy_dir / "default.yaml").write_text("kind: GpuSharingPolicy\nspec: [\n")
    assert PolicyStore.loaded(policy_dir, last_good=last_good).policies is None
