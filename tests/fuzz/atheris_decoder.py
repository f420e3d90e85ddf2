"""Coverage-guided fuzzing of the admission path with atheris (libFuzzer for Python).

Bytes go through the whole WSGI app, as the apiserver's requests do: body reading,
``decode_review``, the pod handler, the core's planning and patch, ``encode_review``.
Every answer is judged by ``tests.fuzz.support.check_answer`` (never a 5xx, always an
AdmissionReview envelope, the uid echoed where readable, allowed only where the core
allows that pod with that very patch); a broken promise or an exception is a crash, which
libFuzzer writes to ``crash-<sha1>`` (``-artifact_prefix``) and exits non-zero.

The first byte of an input picks the endpoint (even: /mutate, odd: /validate); the rest is
the body. The ``webhook`` package is instrumented, so libFuzzer keeps the inputs that
reach new branches of it.

    python tests/fuzz/atheris_decoder.py -runs=100000
    python tests/fuzz/atheris_decoder.py -max_total_time=600 CORPUS_DIR
    python tests/fuzz/atheris_decoder.py crash-<sha1>          # replay one input

Without a corpus directory, ``$TMPDIR/gpushare-atheris/corpus`` is used (and kept, so a
later run goes on from it). An empty corpus directory is seeded with valid reviews (every
bundled policy, each kind of annotation, a few requests that are no pod CREATE);
``-dict=`` defaults to a dictionary of AdmissionReview and pod tokens.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # run as a script: make ``tests`` and ``webhook`` importable
    sys.path.insert(0, str(REPO))

import atheris  # noqa: E402

with atheris.instrument_imports(include=["webhook"]):
    import orjson

    from tests.fuzz.support import (
        PATHS,
        check_answer,
        fuzz_app,
        post,
        seed_reviews,
        wrong_shapes,
    )

APP, POLICIES = fuzz_app()
DICTIONARY_TOKENS = (
    *(
        f'"{word}"'
        for word in (
            "apiVersion",
            "admission.k8s.io/v1",
            "kind",
            "AdmissionReview",
            "request",
            "uid",
            "group",
            "version",
            "resource",
            "subResource",
            "Pod",
            "pods",
            "operation",
            "CREATE",
            "UPDATE",
            "namespace",
            "name",
            "dryRun",
            "object",
            "metadata",
            "labels",
            "annotations",
            "gpu-fraction",
            "gpu-memory",
            "gpu-fraction-container-name",
            "gpushare.io/applied",
            "kubernetes.io/config.mirror",
            "spec",
            "containers",
            "initContainers",
            "image",
            "env",
            "value",
            "valueFrom",
            "envFrom",
            "volumeMounts",
            "mountPath",
            "resources",
            "limits",
            "requests",
            "nvidia.com/gpu",
            "nvidia.com/gpu.shared",
            "nodeSelector",
            "nvidia.com/gpu.replicas",
            "tolerations",
            "volumes",
            "gpushare-mps-pipe",
            "hostIPC",
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
            "PYTORCH_CUDA_ALLOC_CONF",
            "research",
            "ml-train",
            "inference",
            "kube-system",
            "0.5",
            "0.25",
            "0.1",
            "2",
            "1024",
            "24Gi",
            "8Gi",
            "main",
            "sidecar",
            "fetch",
        )
    ),
    "null",
    "true",
    "false",
    "1e400",
    "-0",
    "18446744073709551616",
    '"\\ud800"',
    "{",
    "}",
    "[",
    "]",
    ":",
    ",",
)


def _dictionary_line(token: str) -> str:
    """A libFuzzer dictionary entry: the token in double quotes, escaped byte by byte."""
    escaped = "".join(
        chr(byte) if 32 <= byte < 127 and chr(byte) not in '"\\' else f"\\x{byte:02x}"
        for byte in token.encode()
    )
    return f'"{escaped}"'


def seed(corpus: Path) -> None:
    """Valid reviews as the corpus to start from, each for both endpoints."""
    for index, review in enumerate([*seed_reviews(), *wrong_shapes()]):
        body = orjson.dumps(review)
        for selector in range(len(PATHS)):
            (corpus / f"seed-{index:03d}-{selector}").write_bytes(bytes([selector]) + body)


def test_one_input(data: bytes) -> None:
    path = PATHS[data[0] % len(PATHS)] if data else PATHS[0]
    body = data[1:]
    status, answer = post(APP, path, body)
    check_answer(path, body, status, answer, POLICIES)


def libfuzzer_arguments(argv: list[str], scratch: Path) -> list[str]:
    """``argv`` with a seeded corpus, a dictionary and a per-input timeout where not given."""
    arguments = list(argv)
    options = [a for a in arguments[1:] if a.startswith("-")]
    inputs = [Path(a) for a in arguments[1:] if not a.startswith("-")]
    if not inputs:
        corpus = scratch / "corpus"
        corpus.mkdir(exist_ok=True)
        arguments.append(str(corpus))
        inputs = [corpus]
    if inputs[0].is_dir() and not any(inputs[0].iterdir()):
        seed(inputs[0])
    if not any(option.startswith("-dict=") for option in options):
        dictionary = scratch / "admission.dict"
        partial = scratch / f".admission.dict.{os.getpid()}"  # runs side by side never
        partial.write_text("\n".join(map(_dictionary_line, DICTIONARY_TOKENS)) + "\n")
        partial.replace(dictionary)  # see half a dictionary
        arguments.append(f"-dict={dictionary}")
    if not any(option.startswith("-timeout=") for option in options):
        arguments.append("-timeout=10")  # one request taking 10 s is a hang
    return arguments


def main() -> None:
    # The app logs every admission and every failure; the check judges each answer, so the
    # log lines (and the time to format them) are not needed here.
    logging.disable(logging.CRITICAL)
    # libFuzzer ends the process with exit(), which runs no Python clean-up: one folder
    # that every run reuses, rather than a new temporary folder per run.
    scratch = Path(tempfile.gettempdir()) / "gpushare-atheris"
    scratch.mkdir(exist_ok=True)
    atheris.Setup(libfuzzer_arguments(sys.argv, scratch), test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
