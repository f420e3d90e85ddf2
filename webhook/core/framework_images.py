"""What a container image says about the framework in it: which framework (image globs), which
version (read from the image reference alone), and the first release that reads each knob.

The webhook pulls no image, so a version comes from the reference: the tag of an official
image, NVIDIA's monthly NGC tag through NVIDIA's release notes, or a version the policy
declares for its own images (``frameworks.<name>.versions``). Everything else is unknown.
docs/frameworks.md cites each version below and shows how it was measured on real wheels.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase

# A release as comparable numbers (major, minor, patch, 0); a pre-release ("2.10.0a0") ends
# in -1 and sorts below its release: main before a release branch may or may not hold a
# change of that release.
Version = tuple[int, int, int, int]

TENSORFLOW = "tensorflow"
JAX = "jax"
PYTORCH = "pytorch"

# Images whose framework is known when a policy lists none (frameworks.<name>.images).
DEFAULT_IMAGES: Mapping[str, tuple[str, ...]] = {
    TENSORFLOW: (
        "tensorflow/tensorflow:*",
        "nvcr.io/nvidia/tensorflow:*",
        "jupyter/tensorflow-notebook:*",
        "quay.io/jupyter/tensorflow-notebook:*",
        "kubeflownotebookswg/jupyter-tensorflow*",
    ),
    JAX: ("ghcr.io/nvidia/jax:*", "nvcr.io/nvidia/jax:*"),
    PYTORCH: (
        "pytorch/pytorch:*",
        "nvcr.io/nvidia/pytorch:*",
        "jupyter/pytorch-notebook:*",
        "quay.io/jupyter/pytorch-notebook:*",
        "kubeflownotebookswg/jupyter-pytorch*",
    ),
}


@dataclass(frozen=True)
class Knob:
    """One setting gpushare may send to a framework, and the first release that reads it."""

    framework: str
    name: str
    since: Version
    # True where a release before ``since`` refuses the setting, so an image whose version is
    # unknown must not get it; plain variables are only ignored by releases that predate them.
    breaks_older: bool


# TensorFlow reads it with getenv since 1.12.0 (measured in the tensorflow-gpu wheels: absent
# from 1.11.0's libtensorflow_framework.so, present in 1.12.0's and in 2.21.0's).
TF_GROWTH = Knob(TENSORFLOW, "TF_FORCE_GPU_ALLOW_GROWTH", (1, 12, 0, 0), breaks_older=False)
# jaxlib's xla_client.py reads both with os.getenv in every jaxlib on PyPI (0.4.13 and later,
# checked 0.4.20 to 0.10.2); the newer XLA_CLIENT_MEM_FRACTION is read from jaxlib 0.4.33 on,
# which refuses the two together (see frameworks.py), so gpushare sends only the older name.
JAX_FRACTION = Knob(JAX, "XLA_PYTHON_CLIENT_MEM_FRACTION", (0, 4, 0, 0), breaks_older=False)
JAX_PREALLOCATE = Knob(JAX, "XLA_PYTHON_CLIENT_PREALLOCATE", (0, 4, 0, 0), breaks_older=False)
# per_process_memory_fraction in PYTORCH_CUDA_ALLOC_CONF / PYTORCH_ALLOC_CONF: pytorch#161035,
# first released in 2.10.0; 2.9.1 and older raise "Unrecognized CachingAllocator option".
TORCH_FRACTION = Knob(PYTORCH, "per_process_memory_fraction", (2, 10, 0, 0), breaks_older=True)


_VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?(?:(a|b|rc|\.dev)\d*)?")
_NGC_TAG = re.compile(r"^(\d\d)\.(\d\d)(?:-|$)")

# NGC PyTorch containers are built from PyTorch's main branch. Release 25.12 is "based on
# 2.10.0a0+b4e4ee81d3" (NVIDIA PyTorch release notes, rel-25-12), and monthly releases only
# move forward, so every tag up to 25.12 holds 2.10.0a0 or older. Later tags: unknown until
# NVIDIA's notes for them are read and added here.
_NGC_PYTORCH_LAST_KNOWN = (25, 12)
_NGC_PYTORCH_UP_TO_LAST: Version = (2, 10, 0, -1)


@dataclass(frozen=True)
class ImageVersion:
    """A framework version read from an image reference; ``version`` None when unknown."""

    version: Version | None
    # Where the version came from, or why it is unknown, for explain lines and warnings.
    source: str


def parse_version(text: str) -> Version | None:
    """``2.10.0``, ``v0.6.3``, ``2.17.0-gpu``, ``2.10.0a0+abc`` -> numbers; None if not one."""
    match = _VERSION.match(text)
    if match is None:
        return None
    return (int(match[1]), int(match[2]), int(match[3] or 0), -1 if match[4] else 0)


def format_version(version: Version) -> str:
    text = ".".join(str(n) for n in version[:3])
    return f"{text}a0" if version[3] < 0 else text


def normalized(image: str) -> str:
    """Docker Hub's implicit names made explicit the short way: ``docker.io/library/x`` -> ``x``."""
    for prefix in ("docker.io/", "index.docker.io/", "registry-1.docker.io/"):
        if image.startswith(prefix):
            image = image[len(prefix) :]
            break
    return image.removeprefix("library/")


def split_reference(image: str) -> tuple[str, str]:
    """(repository, tag) of a normalized reference; the tag is "" for digest-only or none."""
    name = normalized(image).split("@", 1)[0]
    repository, colon, tag = name.rpartition(":")
    if not colon or "/" in tag:  # no tag, or the colon was a registry port
        return name, ""
    return repository, tag


def matches(image: str, globs: Iterable[str]) -> str | None:
    """The first glob matching the image as written or normalized (``repo:*`` also matches
    ``repo@sha256:...``); None if none does."""
    short = normalized(image)
    repository, tag = split_reference(image)
    pinned = f"{repository}:{tag}"
    forms = (image, short, pinned)
    return next((g for g in globs if any(fnmatchcase(f, g) for f in forms)), None)


def image_version(
    framework: str, image: str, declared: Iterable[tuple[str, str]] = ()
) -> ImageVersion:
    """The framework version of ``image``: declared by the policy, else read from the tag."""
    for glob, text in declared:
        if matches(image, (glob,)):
            return ImageVersion(parse_version(text), f"declared for {glob!r} by the policy")
    repository, tag = split_reference(image)
    if not tag:
        return ImageVersion(None, "the image has no tag to read a version from")
    official = {TENSORFLOW: "tensorflow/tensorflow", PYTORCH: "pytorch/pytorch"}
    if repository == official.get(framework):
        version = parse_version(tag)
        if version is not None:
            return ImageVersion(version, f"tag {tag} of {repository}")
    if framework == PYTORCH and repository == "nvcr.io/nvidia/pytorch":
        return _ngc_pytorch(tag)
    return ImageVersion(None, f"no {framework} version can be read from {image!r}")


def _ngc_pytorch(tag: str) -> ImageVersion:
    match = _NGC_TAG.match(tag)
    if match is None:
        return ImageVersion(None, f"NGC tag {tag!r} is not a YY.MM release")
    if (int(match[1]), int(match[2])) > _NGC_PYTORCH_LAST_KNOWN:
        return ImageVersion(None, f"NGC {tag} is newer than the releases gpushare knows")
    return ImageVersion(_NGC_PYTORCH_UP_TO_LAST, f"NGC {tag} holds PyTorch 2.10.0a0 or older")


# Representative references, past and future, to tell at load time whether an image glob
# can match anything but too old a version (a glob is not enumerable, these tags are).
def known_references(framework: str) -> tuple[str, ...]:
    if framework != PYTORCH:
        return ()
    releases = [f"{m}.{n}.{p}" for m, n, p in _PYTORCH_RELEASES]
    ngc = [f"{y:02d}.{m:02d}" for y in range(19, 30) for m in range(1, 13)]
    return (
        *(f"pytorch/pytorch:{r}-cuda12.1-cudnn8-runtime" for r in releases),
        *(f"pytorch/pytorch:{r}" for r in releases),
        *(f"nvcr.io/nvidia/pytorch:{t}-py3" for t in ngc),
    )


# PyTorch releases 1.0 to 2.15 are on PyPI (pip index versions torch); later ones stand for
# the future.
_PYTORCH_RELEASES = (
    *((1, n, p) for n in range(14) for p in range(3)),
    *((2, n, p) for n in range(30) for p in range(3)),
    *((3, n, p) for n in range(10) for p in range(3)),
)
