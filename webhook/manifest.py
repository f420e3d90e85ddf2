"""Reading a Pod manifest (YAML or JSON, a file or stdin) for the offline CLI."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from webhook.errors import ManifestError


def read_pod(source: str) -> dict[str, Any]:
    """The single Pod in ``source`` ("-" for stdin); ``ManifestError`` says what is wrong."""
    name = "<stdin>" if source == "-" else source
    try:
        text = sys.stdin.read() if source == "-" else Path(source).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ManifestError(f"{name}: cannot be read: {error}") from error
    try:
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as error:
        raise ManifestError(f"{name}: is neither valid YAML nor JSON: {error}") from error
    if len(documents) != 1:
        raise ManifestError(
            f"{name}: holds {len(documents)} documents; pass exactly one Pod manifest."
        )
    pod = documents[0]
    if not isinstance(pod, dict) or pod.get("kind") != "Pod":
        kind = pod.get("kind") if isinstance(pod, dict) else type(pod).__name__
        raise ManifestError(
            f"{name}: is a {kind!s}, not a Pod; pass a manifest with kind: Pod "
            "(for a Deployment, its spec.template as a Pod)."
        )
    if not isinstance(pod.get("spec"), dict):
        raise ManifestError(f"{name}: the Pod has no spec; add spec.containers.")
    return pod
