"""What gpushare should do to a pod, predicted offline, made comparable with what the
apiserver actually admitted.

`predict()` is `gpushare mutate` of one pod; `as_admitted()` and `webhook_input()` put a
pod through the apiserver's own decoding and defaulting (no webhook involved), so a
prediction and an admitted pod can be compared field for field.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

from harness.api import create_pod
from harness.cli import CliError, gpushare


@dataclass(frozen=True)
class Prediction:
    """What `gpushare mutate` says about a pod: the admitted pod, or the denial reasons."""

    pod: dict[str, Any] | None
    warnings: tuple[str, ...]
    denied: tuple[str, ...]


def predict(
    pod: Mapping[str, Any], policies: Path, namespace: str, *, in_process: bool = True
) -> Prediction:
    """`gpushare mutate -o json` of `pod` in `namespace` with `policies` (exit 3: denied):
    the one entry of its report.

    In process by default: the same `webhook.cli.main` the `gpushare` script runs, with the
    same arguments, without starting an interpreter for every pod; `in_process=False` runs
    the command in a subprocess.
    """
    with tempfile.TemporaryDirectory(prefix="gpushare-predict-") as scratch:
        manifest = Path(scratch) / "pod.json"
        manifest.write_text(json.dumps(pod))
        argv = [
            "mutate",
            f"--file={manifest}",
            f"--policies={policies}",
            f"--namespace={namespace}",
            "--output=json",
        ]
        if in_process:
            code, stdout, stderr = _run_cli_in_process(argv)
        else:
            result = gpushare(*argv, check=False)
            code, stdout, stderr = result.returncode, result.stdout, result.stderr
    if code not in (0, 3):
        raise CliError(f"gpushare mutate exited {code}\n{stderr}")
    (entry,) = json.loads(stdout)["documents"]
    denied = entry["verdict"] == "denied"
    return Prediction(
        None if denied else entry["result"],
        tuple(entry["warnings"]),
        tuple(entry["reasons"]) if denied else (),
    )


def _run_cli_in_process(argv: Sequence[str]) -> tuple[int, str, str]:
    from webhook.cli import main

    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main(list(argv))
    return code, stdout.getvalue(), stderr.getvalue()


# Where the apiserver's defaulting alone (no webhook: kube-system is excluded by the
# registration's namespaceSelector) turns a predicted pod into what storage would hold.
NORMALIZE_NAMESPACE = "kube-system"
SERVER_SET_METADATA = ("uid", "creationTimestamp", "resourceVersion", "managedFields", "generation")


def as_admitted(api: k8s.ApiClient, pod: dict[str, Any]) -> dict[str, Any]:
    """`pod` as the apiserver would store it, by a server-side dry run in kube-system.

    The webhook never sees kube-system, so this is the apiserver's decoding and defaulting
    only (imagePullPolicy, terminationMessagePath, quantity canonical forms, ...): the
    offline prediction made comparable, field for field, with a pod that went through the
    webhook.
    """
    expected = copy.deepcopy(pod)
    expected["metadata"]["namespace"] = NORMALIZE_NAMESPACE
    expected["metadata"]["name"] = f"expected-{uuid.uuid4().hex[:8]}"
    expected["metadata"].pop("generateName", None)
    return create_pod(api, NORMALIZE_NAMESPACE, expected, dry_run=True).pod


def webhook_input(api: k8s.ApiClient, pod: dict[str, Any]) -> dict[str, Any]:
    """The pod as the mutating webhook receives it: decoded and defaulted by the apiserver.

    Defaulting matters: limits without requests get requests copied from them, and the
    DefaultTolerationSeconds plugin (which runs before webhooks) appends its tolerations.
    Name and namespace are the original ones; fields the apiserver sets only when storing
    (uid, timestamps, status) are dropped, as the webhook never sees them.
    """
    defaulted = as_admitted(api, pod)
    metadata = defaulted["metadata"]
    for key in SERVER_SET_METADATA:
        metadata.pop(key, None)
    for key in ("namespace", "name"):
        metadata.pop(key, None)
    for key in ("namespace", "name", "generateName"):
        if key in pod["metadata"]:
            metadata[key] = pod["metadata"][key]
    defaulted.pop("status", None)
    return defaulted
