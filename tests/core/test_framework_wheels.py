"""Opt-in: the knob gates of ``framework_images`` against real PyTorch and JAX installs.

Skipped unless ``GPUSHARE_FRAMEWORK_PYTHONS`` names interpreters of throwaway venvs, e.g.
``torch=/tmp/venv-torch29/bin/python,torch=/tmp/venv-torch210/bin/python,jax=/tmp/venv-jax/bin/python``
(docs/frameworks.md says how to make them: CUDA wheels from PyPI, no GPU needed). The wheels
are large and downloaded, so the default test run stays fast and offline.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from types import ModuleType

import pytest

from webhook.core.framework_images import TORCH_FRACTION, parse_version

from .support import REPO_ROOT

PYTHONS = [
    tuple(item.split("=", 1))
    for item in os.environ.get("GPUSHARE_FRAMEWORK_PYTHONS", "").split(",")
    if "=" in item
]
pytestmark = pytest.mark.skipif(not PYTHONS, reason="set GPUSHARE_FRAMEWORK_PYTHONS to run")


def _script() -> ModuleType:
    path = Path(REPO_ROOT / "scripts" / "check_framework_knobs.py")
    spec = importlib.util.spec_from_file_location("check_framework_knobs", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("python", [p for kind, p in PYTHONS if kind == "torch"])
def test_pytorch_parses_the_fraction_key_exactly_from_the_gated_version(python: str) -> None:
    script = _script()
    text, result = script.probe(
        python, script._TORCH_PROBE, {"PYTORCH_CUDA_ALLOC_CONF": "per_process_memory_fraction:0.5"}
    )
    version = parse_version(text)
    assert version is not None, text
    assert (result == "accepted") is (version >= TORCH_FRACTION.since), (text, result)
    _, unknown = script.probe(python, script._TORCH_PROBE, {"PYTORCH_CUDA_ALLOC_CONF": "x_y:1"})
    assert unknown.startswith("refused"), "PyTorch refuses unknown allocator keys"


@pytest.mark.parametrize("python", [p for kind, p in PYTHONS if kind == "jax"])
def test_jax_takes_the_one_fraction_name_gpushare_sends_but_not_both(python: str) -> None:
    script = _script()
    old = {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.48"}
    text, result = script.probe(python, script._JAX_PROBE, old)
    assert result == "accepted", (text, result)
    jaxlib = parse_version(text.split("jaxlib ")[-1])
    assert jaxlib is not None, text
    _, both = script.probe(python, script._JAX_PROBE, {**old, "XLA_CLIENT_MEM_FRACTION": "0.48"})
    assert both.startswith("refused") is (jaxlib >= (0, 4, 33, 0)), (text, both)
