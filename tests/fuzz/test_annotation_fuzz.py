"""Arbitrary annotation values: the reader refuses with its own problems, never raises,
and what it accepts is bounded.

The reader (``webhook.core.request`` and ``quantity``) is judged against a model written
here from the README: ``gpu-fraction`` is a plain decimal (ASCII digits, at most one
point), 0 < f < 1 a share, a whole number 1..1024 whole GPUs, at most 32 characters;
``gpu-memory`` is a whole number of MiB ("8000") or a positive Kubernetes quantity with a
binary or decimal unit ("10Gi", "16G"), while ``parse_memory_mib`` (policies) reads a
bare number as bytes, as Kubernetes does. The model uses exact fractions, so the reader's
floats are checked against exact values.
Then whole pods carrying arbitrary values of all three annotations go through
``mutate``: a planned pod records a share within the policy's bounds, a slot count within
the pool, and GPU resources that are small positive integers; a denial has short reasons.
"""

from __future__ import annotations

import json
import math
import re
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.long_runs import scaled
from webhook.constants import APPLIED_ANNOTATION, CONTAINER_ANNOTATION
from webhook.core import mutate, mutated_pod
from webhook.core.quantity import parse_memory_mib
from webhook.core.request import GpuRequest, RequestProblem, read_request

from .support import fuzz_app

# The long variants (GPUSHARE_LONG_TESTS=1) run far past the default 300 s timeout.
pytestmark = pytest.mark.timeout(scaled(300, 3600))
_, POLICIES = fuzz_app()
SETTINGS = settings(
    max_examples=scaled(600, 30000),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
MAX_LENGTH = 32
MAX_WHOLE = 1024
MAX_REASON_LENGTH = 400
_PLAIN = re.compile(r"(?:[0-9]+(?:\.[0-9]+)?|\.[0-9]+)", re.ASCII)
_UNITS = {
    "": 1,
    "k": 10**3,
    "K": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
}
_QUANTITY = re.compile(r"([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|k|K|M|G|T)?", re.ASCII)

# Text a hostile or careless author writes: near-decimals, unicode digits and spaces,
# signs, exponents, units, and plain garbage of every length.
NEAR_DECIMAL = st.text(
    alphabet="0123456789..-+eE%xX_, \t\n\u0660\u0665\u06f5\uff10\uff15\u200b\u00a0\u2024",
    max_size=40,
)
DIGITS = "0123456789"
# Built from pieces rather than st.from_regex, which costs more than the reader itself.
DECIMAL_LIKE = st.one_of(
    st.text(DIGITS, max_size=6),
    st.builds(
        lambda whole, point, decimals: whole + point + decimals,
        st.text(DIGITS, max_size=5),
        st.sampled_from([".", ".", "", ".."]),
        st.text(DIGITS, max_size=34),
    ),
)
SHARES = st.integers(1, 9999).map(lambda k: f"0.{k:04d}".rstrip("0")) | st.sampled_from(
    ["0.05", "0.1", "0.25", "0.3", "0.5", "0.9", "1", "2", "8", "9"]
)
# Within the bounds of every bundled policy (0.1..0.5).
PLANNABLE = st.integers(10, 50).map(lambda k: f"0.{k:02d}")
QUANTITY_LIKE = st.builds(
    lambda number, unit: number + unit,
    DECIMAL_LIKE | st.text(DIGITS, min_size=20, max_size=35),
    st.sampled_from(["Ki", "Mi", "Gi", "Ti", "k", "K", "M", "G", "T", "m", "Ei", "E", "", "gi"]),
)
VALUES = st.one_of(
    DECIMAL_LIKE,
    SHARES,
    QUANTITY_LIKE,
    NEAR_DECIMAL,
    st.text(max_size=60),
    st.sampled_from(["0", "0.0", "00", "1", "1.0", "1024", "1025", "0." + "0" * 29 + "1"]),
    st.text(alphabet=DIGITS, min_size=30, max_size=40),
)


def expected_fraction(text: str) -> Fraction | int | None:
    """The model: a share (exact), a whole count, or None where the text is refused."""
    if len(text) > MAX_LENGTH or not _PLAIN.fullmatch(text):
        return None
    value = Fraction(text)
    if value == 0:
        return None
    if value.denominator == 1:
        return int(value) if value <= MAX_WHOLE else None
    return value if value < 1 else None


def expected_quantity_mib(text: str) -> Fraction | None:
    """The model of a Kubernetes quantity (a policy's ``gpuMemory``): MiB, a bare number
    being bytes; None where it is no positive quantity. No length cap."""
    match = _QUANTITY.fullmatch(text)
    if match is None:
        return None
    mib = Fraction(match[1]) * _UNITS[match[2] or ""] / 2**20
    return mib if mib > 0 else None


def expected_memory_mib(text: str) -> Fraction | None:
    """The model of the ``gpu-memory`` annotation: at most 32 characters; a number without a
    unit is a whole number of MiB, above 0; else a quantity with a unit."""
    match = _QUANTITY.fullmatch(text)
    if len(text) > MAX_LENGTH or match is None:
        return None
    if not match[2]:
        whole = "." not in text and int(text) > 0
        return Fraction(int(text)) if whole else None
    return expected_quantity_mib(text)


def _problems_are_short_and_name(result: list[RequestProblem], annotation: str) -> None:
    assert result, "a refusal without a problem"
    for problem in result:
        assert isinstance(problem, RequestProblem)
        assert annotation in problem.message, problem.message
        assert len(problem.message) < MAX_REASON_LENGTH, problem.message


@SETTINGS
@given(text=VALUES)
def test_fraction_reader_accepts_exactly_plain_decimals_and_bounds_them(text: str) -> None:
    result = read_request({"gpu-fraction": text})
    expected = expected_fraction(text)
    if expected is None:
        assert isinstance(result, list), f"accepted {text!r}: {result}"
        _problems_are_short_and_name(result, "gpu-fraction")
        (problem,) = result
        assert text[:40] in problem.message, problem.message
        event("refused")
        return
    assert isinstance(result, GpuRequest), f"refused {text!r}: {result}"
    assert result.fraction_text == text
    assert result.memory_mib is None
    if isinstance(expected, int):
        assert result.whole_gpus == expected and result.fraction is None
        assert 1 <= result.whole_gpus <= MAX_WHOLE
        event("whole GPUs")
    else:
        assert result.whole_gpus is None and result.fraction is not None
        assert 0 < result.fraction <= 1, result.fraction  # a float may round up to 1.0
        assert math.isclose(result.fraction, float(expected), rel_tol=1e-15)
        event("share")


@SETTINGS
@given(text=VALUES)
def test_memory_reader_accepts_exactly_positive_sizes(text: str) -> None:
    uncapped = expected_quantity_mib(text)
    mib = parse_memory_mib(text)
    assert (mib is None) == (uncapped is None), (text, mib)
    if mib is not None and uncapped is not None:
        assert math.isclose(mib, float(uncapped), rel_tol=1e-12)
    expected = expected_memory_mib(text)
    result = read_request({"gpu-memory": text})
    if expected is None:
        assert isinstance(result, list), f"accepted {text!r}: {result}"
        _problems_are_short_and_name(result, "gpu-memory")
        event("refused")
        return
    assert isinstance(result, GpuRequest), f"refused {text!r}: {result}"
    assert result.memory_mib is not None and math.isfinite(result.memory_mib)
    assert result.memory_mib > 0
    assert math.isclose(result.memory_mib, float(expected), rel_tol=1e-12)
    event("size")


ANY_VALUE = st.one_of(
    VALUES,
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=2),
)


@SETTINGS
@given(
    annotations=st.dictionaries(
        st.sampled_from(["gpu-fraction", "gpu-memory", CONTAINER_ANNOTATION, "other"]),
        ANY_VALUE,
    )
)
def test_any_values_of_any_type_are_read_or_refused(annotations: dict[str, Any]) -> None:
    """Values of JSON types the server refuses before the core (numbers, lists) and Python
    values no JSON holds: the core reads each as its text, and never raises."""
    result = read_request(annotations)
    if isinstance(result, list):
        assert result
        for problem in result:
            assert 0 < len(problem.message) < MAX_REASON_LENGTH
        event("refused")
        return
    fraction, memory = annotations.get("gpu-fraction"), annotations.get("gpu-memory")
    if fraction is not None:
        assert expected_fraction(str(fraction)) is not None, fraction
    if memory is not None:
        assert expected_memory_mib(str(memory)) is not None, memory
        assert result.whole_gpus is None  # whole GPUs with gpu-memory are refused
    if result.fraction is not None:
        assert 0 < result.fraction <= 1
    event("read")


def _pod(annotations: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "annotations": annotations},
        "spec": {
            "initContainers": [{"name": "init", "image": "busybox"}],
            "containers": [{"name": "app", "image": "x"}, {"name": "side", "image": "y"}],
        },
    }


def _mostly(usual: st.SearchStrategy[Any], other: st.SearchStrategy[Any]) -> Any:
    """``usual`` three times in four, else ``other`` (one_of weighs its branches unevenly)."""
    return st.sampled_from([True, True, True, False]).flatmap(lambda pick: usual if pick else other)


@SETTINGS
@given(
    # Mostly plannable values, so that bounds are checked on many planned pods.
    fraction=_mostly(PLANNABLE | SHARES, st.none() | VALUES),
    memory=_mostly(st.none(), st.sampled_from(["8Gi", "24Gi", "2400Mi", "16G"]) | VALUES),
    container=_mostly(
        st.none() | st.just("app"), st.sampled_from(["side", "init", "", " "]) | st.text()
    ),
    namespace=st.sampled_from(["research", "ml-a", "inference", "kube-system"]),
)
def test_planned_pods_are_bounded_whatever_the_annotations(
    fraction: str | None, memory: str | None, container: str | None, namespace: str
) -> None:
    annotations = {
        key: value
        for key, value in (
            ("gpu-fraction", fraction),
            ("gpu-memory", memory),
            (CONTAINER_ANNOTATION, container),
        )
        if value is not None
    }
    pod = _pod(annotations)
    verdict = mutate(pod, namespace, POLICIES)
    if not verdict.allowed:
        assert verdict.code in (403, 422)
        assert verdict.reasons and all(0 < len(r) < MAX_REASON_LENGTH for r in verdict.reasons)
        event("denied")
        return
    if not verdict.patch:
        assert (fraction is None and memory is None) or namespace == "kube-system"
        event("untouched")
        return
    assert fraction is None or expected_fraction(fraction) is not None
    assert memory is None or expected_memory_mib(memory) is not None
    assert container in (None, "app", "side")
    planned = mutated_pod(pod, verdict.decision)  # type: ignore[arg-type]
    record = json.loads(planned["metadata"]["annotations"][APPLIED_ANNOTATION])
    policy = next(p for p in POLICIES.policies if p.name == record["policy"])
    target = next(c for c in planned["spec"]["containers"] if c["name"] == record["container"])
    limits = target["resources"]["limits"]
    assert target["resources"]["requests"] == limits
    assert planned["spec"]["initContainers"] == pod["spec"]["initContainers"]
    if record["mode"] == "whole-gpu":
        assert 1 <= record["gpus"] <= policy.whole_gpus.max
        assert limits[record["resource"]] == str(record["gpus"])
        event("whole")
        return
    share = float(record["fraction"])
    assert policy.min_fraction - 1e-4 <= share <= policy.max_fraction + 1e-4, record
    pool = next(p for p in policy.pools if p.name == record["pool"])
    assert 1 <= record["slots"] <= pool.replicas
    assert record["slots"] / pool.replicas + 1e-9 >= share
    assert limits[record["resource"]] == str(record["slots"])
    event(f"shared {record['mode']}")
