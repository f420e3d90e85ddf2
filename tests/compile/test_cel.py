"""The CEL text helpers: globs and version patterns agree with the Python the webhook runs.

The patterns are RE2 for the apiserver; the forms used here (classes, groups, anchors,
``(?s:...)``) read the same in Python's ``re``, so they are checked against ``fnmatchcase``
and ``parse_version`` directly.
"""

from __future__ import annotations

import re
from fnmatch import fnmatchcase

import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from webhook.compile import cel
from webhook.core.framework_images import TF_GROWTH, matches, parse_version, split_reference

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


# Image references with every part the normalisation reads: Docker Hub's registry names,
# library/, a registry port, tags, digests, and the official TensorFlow repository.
IMAGE_PARTS = st.lists(
    st.sampled_from(
        [
            "docker.io/",
            "index.docker.io/",
            "registry-1.docker.io/",
            "library/",
            "localhost:5000/",
            "tensorflow/tensorflow",
            "nvcr.io/nvidia/jax",
            ":",
            "@sha256:ab",
            "1.11.0",
            "2.17.0-gpu",
            "1.12rc0",
            "v1.9",
            "/",
            "@",
            "x",
            "\n",
        ]
    ),
    max_size=6,
).map("".join)
IMAGE_GLOBS = st.sampled_from(
    [
        "tensorflow/tensorflow:*",
        "nvcr.io/nvidia/jax:*",
        "library/x*",
        "*x",
        "x:[0-9]*",
        "tensorflow/tensorflow",
        "?x:*",
        "docker.io/x*",
        "*",
    ]
)


@given(IMAGE_GLOBS, IMAGE_PARTS)
def test_an_image_a_glob_matches_holds_its_piece(glob: str, image: str) -> None:
    """The compiled policies test the piece first and skip the glob when it is missing."""
    if matches(image, (glob,)) is not None:
        assert cel.glob_piece(glob) in image


def test_glob_pieces() -> None:
    assert cel.glob_piece("nvcr.io/nvidia/jax:*") == "nvcr.io/nvidia/jax"
    assert cel.glob_piece("kubeflownotebookswg/jupyter-tensorflow*") == (
        "kubeflownotebookswg/jupyter-tensorflow"
    )
    assert cel.glob_piece("team-[ab]cdefgh*") == "team-"
    assert cel.glob_piece("*") == "" and cel.glob_piece("[") == ""


@given(IMAGE_PARTS)
@example("docker.io/library/tensorflow/tensorflow:1.11.0@sha256:ab")
@example("tensorflow/tensorflow:1.11.0@sha256:ab\n")
@example("library/library/tensorflow/tensorflow:1.11.0")
@example("tensorflow/tensorflow:1.11.0/x")
@example("tensorflow/tensorflow:2.17.0:1.11.0")
def test_official_repository_regexes_read_the_reference_as_split_reference(image: str) -> None:
    repository, tag = split_reference(image)
    official = "tensorflow/tensorflow"
    below = cel.version_below_regex(TF_GROWTH.since)
    expected = repository == official and bool(re.match(below, tag))
    below_as_written = cel.official_repository_regex(official, below)
    tagged = cel.official_tagged_regex(official)
    got = bool(re2_search(below_as_written, image)) and bool(re2_search(tagged, image))
    assert got == expected


def re2_search(pattern: str, text: str) -> re.Match[str] | None:
    """RE2's ``$`` is the end of the text; Python's also matches before a final newline."""
    return re.search(pattern[:-1] + r"\Z" if pattern.endswith("$") else pattern, text)


def test_official_repository_regex_wants_a_start_anchor_only() -> None:
    with pytest.raises(ValueError, match="anchored at its start only"):
        cel.official_repository_regex("tensorflow/tensorflow", "^1$")


def test_literals() -> None:
    assert cel.string('a"b\\c') == '"a\\"b\\\\c"'
    assert cel.double(1) == "1.0" and cel.double(0.05) == "0.05" and cel.double(1e-9) == "1e-09"
    assert cel.any_of([]) == "false" and cel.all_of([]) == "true"


def test_a_reversed_range_is_refused() -> None:
    with pytest.raises(ValueError, match=r"reversed range in \[z-a\]"):
        cel.glob_regex("team-[z-a]")
