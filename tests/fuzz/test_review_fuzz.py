"""Hostile bytes through the whole WSGI app: every answer keeps the envelope's promises.

tests/server/test_fuzz.py replaces one value of a well-formed pod with arbitrary JSON and
sends well-formed request objects; this module goes below and around that: arbitrary
bytes, valid reviews truncated or with bytes flipped, inserted and cut, raw JSON tokens
the encoders never write (1e400, 400-digit integers, lone surrogate escapes, nesting past
the decoder's depth limit) at every field of the envelope and the pod, a wrong JSON type
or a missing value at every field in turn, duplicate keys, and Content-Types.

Every answer goes through ``support.check_answer``: never a 5xx, always an AdmissionReview
envelope, the uid echoed whenever ``request.uid`` is a readable string, and allowed (with
or without a patch) only where the core, asked directly, allows that pod with exactly that
patch, which must then apply to the pod.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from werkzeug.test import Client

from tests.long_runs import scaled

from .support import (
    JSON,
    PATHS,
    REVIEW_API_VERSION,
    WrongAnswerError,
    check_answer,
    fuzz_app,
    parsed,
    seed_pod,
    seed_review,
    seed_reviews,
    wrong_shapes,
)

# The long variants (GPUSHARE_LONG_TESTS=1) run far past the default 300 s timeout.
pytestmark = pytest.mark.timeout(scaled(300, 3600))
APP, POLICIES = fuzz_app()
SEEDS: tuple[dict[str, Any], ...] = (*seed_reviews(), *wrong_shapes())
SEED_BODIES: tuple[bytes, ...] = tuple(orjson.dumps(seed) for seed in SEEDS)
FUZZ_SETTINGS = settings(
    max_examples=scaled(250, 5000),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
PLACEHOLDER = "\x1fgpushare-fuzz-token\x1f"


def answer(path: str, body: bytes, content_type: str = JSON, *, record: bool = True) -> str:
    """POST through werkzeug's test client and check the answer; its kind."""
    return answered(path, body, content_type, record=record)[0]


def answered(
    path: str, body: bytes, content_type: str = JSON, *, record: bool = True
) -> tuple[str, dict[str, Any]]:
    """The answer's kind and its ``response`` object, once checked; ``record`` counts the
    kind in hypothesis' statistics (only inside a hypothesis test)."""
    response = Client(APP).post(path, data=body, content_type=content_type)
    kind = check_answer(
        path, body, response.status_code, response.get_data(), POLICIES, content_type
    )
    if record:
        event(f"{path} {kind}")
    return kind, orjson.loads(response.get_data())["response"]


def paths(value: Any, prefix: tuple[str | int, ...] = ()) -> Iterator[tuple[str | int, ...]]:
    """Every path to a value inside ``value`` (dict keys and list indexes), outermost first."""
    if isinstance(value, dict):
        for key, child in value.items():
            yield (*prefix, key)
            yield from paths(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield (*prefix, index)
            yield from paths(child, (*prefix, index))


def replaced(document: Any, path: tuple[str | int, ...], value: Any) -> Any:
    """A copy of ``document`` with the value at ``path`` replaced (deleted for ``DELETE``)."""
    copied = copy.deepcopy(document)
    parent = copied
    for step in path[:-1]:
        parent = parent[step]
    if value is DELETE:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return copied


DELETE = object()
# One value of each JSON type, and the edges of each: whatever the field expects, most of
# these are the wrong type for it.
WRONG_TYPES: tuple[Any, ...] = (
    DELETE,
    None,
    True,
    False,
    0,
    -1,
    1.5,
    2**63,
    "",
    "x",
    "0.5",
    [],
    [None],
    {},
    {"": None},
)

# Raw JSON text no encoder writes but a hostile client can: huge and odd numbers, escapes
# the decoder must refuse, nesting past its depth limit, bare tokens.
RAW_NUMBERS = st.sampled_from(
    [
        "1e400",
        "-1e400",
        "1" + "0" * 400,
        "-" + "9" * 40,
        "18446744073709551616",
        "9223372036854775808",
        "-9223372036854775809",
        "1.7976931348623157e309",
        "4.9e-325",
        "-0",
        "-0.0",
        "0.5e0",
        "5E-1",
        "NaN",
        "Infinity",
        "-Infinity",
        "0x10",
        "01",
        "+1",
        ".5",
        "1.",
    ]
) | st.integers(min_value=-(2**200), max_value=2**200).map(str)
RAW_STRINGS = st.one_of(
    st.text(max_size=40).map(json.dumps),  # lone surrogates as \udXXX
    st.text(alphabet="0123456789.-+eE%xXGgiMKk \t\u0660\u0665\uff10\uff15\u200b\u202e\u00a0").map(
        lambda text: json.dumps(text, ensure_ascii=False)
    ),
    st.sampled_from(
        [
            '"\\ud800"',
            '"\\udfff\\ud800"',
            '"\\u0000"',
            '"\x00"',
            '"\n"',
            '"\\x41"',
            '"\\u12"',
            '"' + "\u00e9" * 20_000 + '"',
            '"' + "a" * 100_000 + '"',
            '"\xff"',
        ]
    ),
)
NESTED = st.integers(min_value=1, max_value=1_500).flatmap(
    lambda depth: st.sampled_from(
        [
            "[" * depth + "]" * depth,
            '{"a":' * depth + "1" + "}" * depth,
            '[{"name":' * depth + '"x"' + "}]" * depth,
            "[" * depth,
        ]
    )
)
RAW_TOKENS = st.one_of(
    RAW_NUMBERS,
    RAW_STRINGS,
    NESTED,
    st.sampled_from(["{}", "[]", "[{}]", "null", "true", "false", "tru", "nul", '{"', "[1,", ","]),
)


@FUZZ_SETTINGS
@given(body=st.binary(max_size=4096), path=st.sampled_from(PATHS))
def test_arbitrary_bytes(body: bytes, path: str) -> None:
    kind = answer(path, body)
    assert kind == "rejected" or parsed(body) is not None


@FUZZ_SETTINGS
@given(data=st.data(), path=st.sampled_from(PATHS))
def test_damaged_reviews(data: st.DataObject, path: str) -> None:
    """Valid reviews truncated, with bytes flipped, inserted, cut or spliced in."""
    body = bytearray(data.draw(st.sampled_from(SEED_BODIES)))
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(body)))
        # Truncation leaves no JSON at all: drawn less often than the other kinds of damage.
        damage = data.draw(
            st.sampled_from(["truncate", "flip", "flip", "insert", "cut", "splice", "splice"])
        )
        if damage == "truncate":
            del body[at:]
        elif damage == "flip" and at < len(body):
            body[at] ^= data.draw(st.integers(1, 255))
        elif damage == "insert":
            body[at:at] = data.draw(st.binary(min_size=1, max_size=16))
        elif damage == "cut":
            del body[at : at + data.draw(st.integers(1, 64))]
        elif damage == "splice":
            body[at:at] = data.draw(RAW_TOKENS).encode("utf-8", "surrogatepass")
    answer(path, bytes(body))


@FUZZ_SETTINGS
@given(data=st.data(), path=st.sampled_from(PATHS), token=RAW_TOKENS)
def test_raw_tokens_at_any_field(data: st.DataObject, path: str, token: str) -> None:
    """A raw JSON token as the value of any field, of the envelope or of the pod."""
    seed = data.draw(st.sampled_from(SEEDS))
    where = data.draw(st.sampled_from(list(paths(seed))))
    text = orjson.dumps(replaced(seed, where, PLACEHOLDER)).decode()
    raw = token.encode("utf-8", "surrogatepass")
    body = text.replace(json.dumps(PLACEHOLDER), raw.decode("utf-8", "surrogatepass"), 1)
    answer(path, body.encode("utf-8", "surrogatepass"))


def test_every_field_with_every_wrong_type_or_missing() -> None:
    """Deterministic sweep: each field of two rich reviews, in turn, deleted or replaced by
    each of ``WRONG_TYPES``, through both endpoints (some 4,000 requests)."""
    ml_pod = seed_pod("0.3", **{"gpu-memory": "24Gi"})
    seeds = [seed_review(seed_pod(), "research"), seed_review(ml_pod, "ml-train")]
    kinds: dict[str, int] = {}
    failures: list[str] = []
    for seed in seeds:
        for where in paths(seed):
            for value in WRONG_TYPES:
                body = orjson.dumps(replaced(seed, where, value))
                for path in PATHS:
                    try:
                        kind = answer(path, body, record=False)
                    except AssertionError as error:
                        failures.append(f"{path} {where} = {value!r}: {error}")
                        continue
                    kinds[kind] = kinds.get(kind, 0) + 1
    assert not failures, "\n".join(failures[:10])
    # The sweep reaches every kind of answer, or it is not exercising the pipeline.
    assert set(kinds) == {"rejected", "denied", "allowed", "patched"}, kinds
    assert sum(kinds.values()) > 3_000, kinds


def _with_duplicate(body: str, key: str, value: str, first: bool) -> str:
    """``body`` with ``"key": value`` added again to the object that first holds ``key``."""
    marker = f'"{key}":'
    at = body.index(marker)
    if first:
        return body[:at] + f"{marker}{value}," + body[at:]
    # After the existing member: find its end by parsing from there.
    decoder = json.JSONDecoder()
    _, end = decoder.raw_decode(body, at + len(marker))
    return body[:end] + f",{marker}{value}" + body[end:]


DUPLICABLE = ("uid", "gpu-fraction", "namespace", "operation", "kind", "object", "request")


@FUZZ_SETTINGS
@given(
    seed=st.sampled_from(SEEDS),
    key=st.sampled_from(DUPLICABLE),
    value=RAW_TOKENS | st.sampled_from(['"other-uid"', '"0.75"', '"abc"', '"UPDATE"', '"2"']),
    first=st.booleans(),
    path=st.sampled_from(PATHS),
)
def test_duplicate_keys(seed: dict[str, Any], key: str, value: str, first: bool, path: str) -> None:
    """A key twice in one object: the webhook reads one value (the last, as orjson does)
    and answers consistently with it; the uid echoed is the one that value gives."""
    text = orjson.dumps(seed).decode()
    if f'"{key}":' not in text:
        return
    body = _with_duplicate(text, key, value, first).encode("utf-8", "surrogatepass")
    _, response = answered(path, body)
    if key == "uid" and parsed(body) is not None:
        try:
            duplicate = json.loads(value)
        except (ValueError, RecursionError):  # json nests less deep than orjson
            duplicate = None
        winner = seed["request"]["uid"] if first else duplicate
        assert response["uid"] == (winner if type(winner) is str else ""), response


CONTENT_TYPES = st.sampled_from(
    [
        JSON,
        "application/json; charset=utf-8",
        "APPLICATION/JSON",
        " application/json ;x=y",
        "application/json-patch+json",
        "application/yaml",
        "text/plain",
        "application/jsonx",
        "",
        "application/json\x00",
        "multipart/form-data; boundary=x",
    ]
)


@FUZZ_SETTINGS
@given(content_type=CONTENT_TYPES, seed=st.sampled_from(SEED_BODIES), path=st.sampled_from(PATHS))
def test_content_types(content_type: str, seed: bytes, path: str) -> None:
    kind = answer(path, seed, content_type)
    event(f"{content_type!r}: {kind}")


@pytest.mark.parametrize("depth", [1, 100, 254, 255, 256, 1023, 1024, 1025, 5000])
@pytest.mark.parametrize("field", ["annotations", "env", "volumes", "userInfo", "oldObject"])
def test_deep_nesting_inside_a_valid_review(field: str, depth: int) -> None:
    """Nesting around the decoder's (1024) and the encoder's (255) depth limits, at fields
    the core reads, copies or compares, and at fields it ignores."""
    nested = '{"a":' * depth + '"x"' + "}" * depth
    pod = seed_pod("0.5")
    targets = {
        "annotations": ("object", "metadata", "annotations", "example.com/x"),
        "env": ("object", "spec", "containers", 0, "env", 0, "valueFrom"),
        "volumes": ("object", "spec", "volumes", 0, "emptyDir"),
        "userInfo": ("userInfo",),
        "oldObject": ("oldObject",),
    }
    for namespace in ("research", "inference"):
        review = seed_review(copy.deepcopy(pod), namespace)
        where = targets[field]
        request = review["request"]
        body = orjson.dumps(replaced(request, where, PLACEHOLDER)).decode()
        body = body.replace(json.dumps(PLACEHOLDER), nested, 1)
        envelope = orjson.dumps({**review, "request": None}).decode()
        full = envelope.replace('"request":null', f'"request":{body}', 1).encode()
        for path in PATHS:
            kind = answer(path, full, record=False)
            if depth < 1000:  # orjson reads up to 1024 levels; this is well within
                assert kind != "rejected" or field == "annotations", (path, kind)


def _envelope(response: dict[str, Any]) -> bytes:
    return orjson.dumps(
        {"apiVersion": REVIEW_API_VERSION, "kind": "AdmissionReview", "response": response}
    )


def test_the_check_refuses_wrong_answers() -> None:
    """The judge of every fuzzed answer can fail: fabricated wrong answers are refused."""
    denied_pod = seed_review(seed_pod("abc"))
    good_pod = seed_review(seed_pod("0.5"))
    update = next(iter(wrong_shapes()))
    status = {"status": "Failure", "code": 400, "message": "x"}
    wrong = [
        ("/mutate", good_pod, 500, {"uid": "fuzz-uid", "allowed": False}),
        ("/mutate", good_pod, 200, {"uid": "other", "allowed": True}),
        ("/mutate", good_pod, 400, {"uid": "fuzz-uid", "allowed": True, "status": status}),
        ("/mutate", denied_pod, 200, {"uid": "fuzz-uid", "allowed": True}),
        ("/mutate", good_pod, 200, {"uid": "fuzz-uid", "allowed": True}),  # the core patches
        ("/validate", update, 200, {"uid": "fuzz-uid", "allowed": False, "status": status}),
        (
            "/mutate",
            good_pod,
            200,
            {"uid": "fuzz-uid", "allowed": True, "patchType": "JSONPatch", "patch": "W10="},
        ),
    ]
    for path, review, code, response in wrong:
        with pytest.raises(WrongAnswerError):
            check_answer(path, orjson.dumps(review), code, _envelope(response), POLICIES)
    # ... while the webhook's own answers to the same requests pass.
    for review in (denied_pod, good_pod, update):
        for path in PATHS:
            answer(path, orjson.dumps(review), record=False)
