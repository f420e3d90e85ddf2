"""``remembered_mutate``: one plan answers the replicas of a template.

Pods made from one template (a Deployment's or a Job's replicas, a burst of the same
notebook) reach admission identical but for ``metadata.name``, and ``mutate`` never reads
the name (tests/core/test_verdict_memo.py holds that for the golden corpus and for
generated pods). So the webhook remembers each verdict, per policy set, by namespace and
the pod's JSON without its name: planning costs about 90 us per pod, a remembered verdict
about 2 us (bench/README.md has the end-to-end figures).

The key is the pod's exact JSON: equal bytes are equal pods (no hash stands in for them),
and a pod written in another key order only misses. It is bounded: a pod over
``MAX_KEY_BYTES`` is planned every time, and a set's memo starts over past
``VERDICTS_LIMIT`` entries (``BoundedMemo``), so pods nobody repeats cost one plan each and
a few MiB at most. The verdict is shared, so only a caller that reads it may use this one
(the webhook encodes it); the CLI and the other edges call ``mutate``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from webhook.core.memo import BoundedMemo, PerObject
from webhook.core.policy.model import PolicySet
from webhook.core.verdict import Verdict, mutate

# An ordinary pod is 1-4 KiB of JSON.
MAX_KEY_BYTES = 16 * 1024
# Only JSON's own types make a key: a date or a subclass raises rather than being written
# as the string or number it would then be indistinguishable from.
_JSON_ONLY = (
    orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_DATACLASS
    | orjson.OPT_PASSTHROUGH_SUBCLASS
)
VERDICTS_LIMIT = 256

_VERDICTS: PerObject[BoundedMemo[tuple[str, bytes], Verdict]] = PerObject(
    lambda: BoundedMemo(VERDICTS_LIMIT)
)


def name_free_key(pod: Mapping[str, Any]) -> bytes | None:
    """The pod's JSON with ``metadata.name`` left out; None when it is larger than
    ``MAX_KEY_BYTES`` or not plain JSON (a YAML date, a key that is not a string, a
    subclass); the webhook's pods, decoded from JSON, always are."""
    metadata = pod.get("metadata")
    if type(metadata) is dict and "name" in metadata:
        pod = {**pod, "metadata": {k: v for k, v in metadata.items() if k != "name"}}
    try:
        key = orjson.dumps(pod, option=_JSON_ONLY)
    except TypeError:  # orjson.JSONEncodeError is one
        return None
    return key if len(key) <= MAX_KEY_BYTES else None


def remembered_mutate(pod: Mapping[str, Any], namespace: str, policies: PolicySet) -> Verdict:
    """``mutate``'s verdict, the same object for every pod that differs only by name.
    Read it; never change it."""
    key = name_free_key(pod)
    if key is None:
        return mutate(pod, namespace, policies)
    memo = _VERDICTS.of(policies)
    return memo.get_or_compute((namespace, key), mutate, pod, namespace, policies)


def remembered_count(policies: PolicySet) -> int:
    """How many verdicts are remembered for ``policies`` (for tests and bounds)."""
    return len(_VERDICTS.of(policies))
