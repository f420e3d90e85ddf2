"""The CEL text helpers: globs and version patterns agree with the Python the webhook runs.

The patterns are RE2 for the apiserver; the forms used here (classes, groups, anchors,
``(?s:...)``) read the same in Python's ``re``, so they are checked against ``fnmatchcase``
and ``parse_version`` directly.
"""

from __future__ import annotations

import re
from fnmatch import fnmatchcase

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from webhook.compile import cel
from webhook.core.framework_images import TF_GROWTH, parse_version

PATTERNS = ("team-*", "ml-?", "[ab]*", "[!a]x", "*", "a.b", "x[", "infer-[0-9]", "**", "?")
NAMES = ("team-a", "ml-x", "ml-xy", "a", "bx", "ax", "zx", "a.b", "axb", "x[", "infer-7", "", "t")


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("name", NAMES)
def test_glob_regex_matches_what_fnmatch_matches(pattern: str, name: str) -> None:
    assert bool(re.search(cel.glob_regex(pattern), name)) == fnmatchcase(name, pattern)


@given(st.text(alphabet="ab-*?[]!.", max_size=6), st.text(alphabet="ab-.[]", max_size=6))
def test_glob_regex_agrees_with_fnmatch_on_generated_globs(pattern: str, name: str) -> None:
    try:
        cel.glob_regex(pattern)
    except ValueError:
        assume("-" in pattern)  # a reversed range: refused when compiling
        return
    assert bool(re.search(cel.glob_regex(pattern), name)) == fnmatchcase(name, pattern)


def test_globs_regex_is_any_of_them() -> None:
    union = cel.globs_regex(("team-*", "prod"))
    assert re.search(union, "team-a") and re.search(union, "prod")
    assert not re.search(union, "production")


TAGS = (
    "1.11.0-gpu",
    "1.12.0-gpu",
    "1.12.0rc1",
    "1.12rc0",
    "1.12",
    "1.2.0",
    "0.12.1",
    "2.17.0-gpu",
    "v1.11.3",
    "latest",
    "1.120.0",
    "01.11.0",
    "1.12.0.dev20180101",
    "1.13.0a0",
    "10.0",
    "1.11",
    "1.9.0-devel-gpu",
    "2.0.0b1",
    "nightly",
    "1.12.1rc0",
)


@pytest.mark.parametrize("tag", TAGS)
def test_version_below_regex_agrees_with_parse_version(tag: str) -> None:
    version = parse_version(tag)
    below = version is not None and version < TF_GROWTH.since
    assert bool(re.match(cel.version_below_regex(TF_GROWTH.since), tag)) == below


@given(
    st.integers(0, 3),
    st.integers(0, 20),
    st.one_of(st.none(), st.integers(0, 3)),
    st.sampled_from(["", "rc1", "a0", "b2", ".dev1", "-gpu"]),
)
def test_version_below_regex_on_generated_tags(
    major: int, minor: int, patch: int | None, suffix: str
) -> None:
    tag = f"{major}.{minor}" + ("" if patch is None else f".{patch}") + suffix
    version = parse_version(tag)
    below = version is not None and version < TF_GROWTH.since
    assert bool(re.match(cel.version_below_regex(TF_GROWTH.since), tag)) == below


def test_version_below_regex_refuses_what_it_cannot_write() -> None:
    with pytest.raises(ValueError, match=r"X\.Y\.0 releases"):
        cel.version_below_regex((2, 10, 1, 0))


def test_literals() -> None:
    assert cel.string('a"b\\c') == '"a\\"b\\\\c"'
    assert cel.double(1) == "1.0" and cel.double(0.05) == "0.05" and cel.double(1e-9) == "1e-09"
    assert cel.any_of([]) == "false" and cel.all_of([]) == "true"


def test_a_reversed_range_is_refused() -> None:
    with pytest.raises(ValueError, match=r"reversed range in \[z-a\]"):
        cel.glob_regex("team-[z-a]")
