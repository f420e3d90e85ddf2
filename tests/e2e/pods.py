"""Small pod manifests the e2e tests create."""

from __future__ import annotations

from typing import Any

from harness.registration import PAUSE_IMAGE
from webhook.constants import FRACTION_ANNOTATION


def annotated_pod(name: str, fraction: str = "0.5", **extra: Any) -> dict[str, Any]:
    """A small annotated pod (TensorFlow image: the policy adds its memory knobs)."""
    container: dict[str, Any] = {
        "name": "main",
        "image": "tensorflow/tensorflow:2.17.0-gpu",
        "command": ["python", "/app/serve.py"],
        **extra,
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": {FRACTION_ANNOTATION: fraction}},
        "spec": {"containers": [container]},
    }


def plain_pod(name: str, **extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "plain"}},
        "spec": {"containers": [{"name": "main", "image": PAUSE_IMAGE, **extra}]},
    }
