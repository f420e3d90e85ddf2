#!/usr/bin/env python3
"""Check gpushare's framework knobs against real framework installs (no GPU needed).

Each interpreter given must have the framework installed (a throwaway venv, never the
project's): the script runs it with the env gpushare would set and reports whether the
framework accepts it. docs/frameworks.md shows how the venvs were made and what came out.

    python scripts/check_framework_knobs.py --torch /tmp/venv-torch29/bin/python \
        --torch /tmp/venv-torch210/bin/python --jax /tmp/venv-jax/bin/python

PyTorch: a CUDA build on a machine without a GPU never initializes its caching allocator,
but ``torch.cuda.memory._set_allocator_settings("")`` makes it parse its allocator config
(read from the environment on first use) exactly as allocator init does, so an unknown key
raises there. JAX: the CUDA plugin's ``initialize()`` reads the memory variables when JAX
discovers its backends, with or without a GPU, and logs what it raises.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping

_TORCH_PROBE = """
import warnings
warnings.simplefilter("ignore")
import torch
print("version", torch.__version__)
try:
    torch.cuda.memory._set_allocator_settings("")
    print("result accepted")
except Exception as error:
    print("result refused", type(error).__name__, str(error).splitlines()[0])
"""

_JAX_PROBE = """
import logging, io
stream = io.StringIO()
logging.getLogger("jax._src.xla_bridge").addHandler(logging.StreamHandler(stream))
import jax, jaxlib
print("version", jax.__version__, "jaxlib", jaxlib.__version__)
jax.devices()
errors = [l for l in stream.getvalue().splitlines() if l.startswith("ValueError")]
print("result", "refused " + errors[-1] if errors else "accepted")
"""

TORCH_CASES: tuple[Mapping[str, str], ...] = (
    {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
    {"PYTORCH_CUDA_ALLOC_CONF": "per_process_memory_fraction:0.5"},
    {"PYTORCH_ALLOC_CONF": "per_process_memory_fraction:0.5"},
    {"PYTORCH_CUDA_ALLOC_CONF": "no_such_key:1"},
    {"PYTORCH_ALLOC_CONF": "bad_a:1", "PYTORCH_CUDA_ALLOC_CONF": "bad_b:1"},
)
JAX_CASES: tuple[Mapping[str, str], ...] = (
    {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.48"},
    {"XLA_CLIENT_MEM_FRACTION": "0.48"},
    {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.48", "XLA_CLIENT_MEM_FRACTION": "0.48"},
)
_CLEARED = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF")


def probe(python: str, code: str, env: Mapping[str, str]) -> tuple[str, str]:
    """(version line, result line) of one run of ``code`` under ``env``."""
    base = {k: v for k, v in os.environ.items() if k not in _CLEARED and not k.startswith("XLA_")}
    done = subprocess.run(
        [python, "-c", code],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    lines = done.stdout.splitlines()
    version = next((line[8:] for line in lines if line.startswith("version ")), "?")
    result = next((line[7:] for line in lines if line.startswith("result ")), None)
    if result is None:
        result = "failed: " + (done.stderr.strip().splitlines() or ["no output"])[-1]
    return version, result


def checks(torch: list[str], jax: list[str]) -> Iterator[tuple[str, str, str]]:
    """(framework version, env, result) for every interpreter and case."""
    for pythons, code, cases in ((torch, _TORCH_PROBE, TORCH_CASES), (jax, _JAX_PROBE, JAX_CASES)):
        for python in pythons:
            for env in cases:
                version, result = probe(python, code, env)
                yield version, " ".join(f"{k}={v}" for k, v in env.items()), result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--torch", action="append", default=[], help="python with torch")
    parser.add_argument("--jax", action="append", default=[], help="python with jax + plugin")
    args = parser.parse_args(argv)
    if not args.torch and not args.jax:
        parser.error("give at least one --torch or --jax interpreter")
    for version, env, result in checks(args.torch, args.jax):
        print(f"{version:<28} {env:<80} {result}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
