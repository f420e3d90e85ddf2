"""What a developer asked for: the gpu-fraction / gpu-memory annotations, read strictly.

Anything but a plain decimal is refused with a sentence that names the value and says what
is accepted; "1e-9", "50%", "nan" and friends never reach the planner. ``gpu-memory`` is a
whole number of MiB ("8000", as KAI-Scheduler reads it) or a quantity with a unit ("10Gi",
"16G"); see ``quantity``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal

from webhook.constants import (
    CONTAINER_ANNOTATION,
    DEVICES_ANNOTATION,
    FRACTION_ANNOTATION,
    MEMORY_ANNOTATION,
    REQUEST_ANNOTATIONS,
)
from webhook.core.quantity import ACCEPTED_FORMS, is_bare_number, parse_memory_ask_mib

# Plain decimals only: no sign, no exponent, no percent, at most one point.
_DECIMAL = re.compile(r"^(?:[0-9]+(?:\.[0-9]+)?|\.[0-9]+)\Z")
# Real values are a few characters ("0.25", "2", "80Gi"); a longer one is refused before any
# arithmetic, which on a value of thousands of digits would be slow or overflow.
MAX_VALUE_LENGTH = 32
# More GPUs than any node has; larger counts are refused here, not by the policy's limit.
MAX_WHOLE_GPUS = 1024
_SHOWN_LENGTH = 40


@dataclass(frozen=True)
class GpuRequest:
    """A parsed request: a share of one GPU, a memory slice, or whole GPUs."""

    fraction: float | None = None
    fraction_text: str | None = None
    memory_mib: float | None = None
    memory_text: str | None = None
    whole_gpus: int | None = None
    container_name: str | None = None
    # gpu-fraction-num-devices: the share on each of this many GPUs.
    devices: int = 1

    @property
    def is_whole(self) -> bool:
        return self.whole_gpus is not None


@dataclass(frozen=True)
class RequestProblem:
    """Why the annotations cannot be read."""

    message: str


def has_gpu_request(annotations: Mapping[str, str]) -> bool:
    return any(key in annotations for key in REQUEST_ANNOTATIONS)


def read_request(annotations: Mapping[str, object]) -> GpuRequest | list[RequestProblem]:
    """Parse the annotations; a list of problems when any of them is malformed."""
    problems: list[RequestProblem] = []
    fraction: float | None = None
    fraction_text: str | None = None
    whole: int | None = None
    memory: float | None = None
    memory_text: str | None = None

    raw_fraction = annotations.get(FRACTION_ANNOTATION)
    if raw_fraction is not None:
        fraction_text = str(raw_fraction)
        parsed = _parse_fraction(fraction_text)
        if isinstance(parsed, RequestProblem):
            problems.append(parsed)
        elif isinstance(parsed, int):
            whole = parsed
        else:
            fraction = parsed

    raw_memory = annotations.get(MEMORY_ANNOTATION)
    if raw_memory is not None:
        memory_text = str(raw_memory)
        parsed_memory = _parse_memory(memory_text)
        if isinstance(parsed_memory, RequestProblem):
            problems.append(parsed_memory)
        else:
            memory = parsed_memory

    if whole is not None and memory_text is not None:
        problems.append(
            RequestProblem(
                f'{FRACTION_ANNOTATION} "{fraction_text}" asks for whole GPUs, which cannot be '
                f"combined with {MEMORY_ANNOTATION} {shown(memory_text)}: remove one of the two."
            )
        )

    container_name = _read_container_name(annotations, problems)
    devices = _read_devices(annotations, whole is not None, problems)
    if problems:
        return problems
    return GpuRequest(
        fraction=fraction,
        fraction_text=fraction_text,
        memory_mib=memory,
        memory_text=memory_text,
        whole_gpus=whole,
        container_name=container_name,
        devices=devices,
    )


def _read_devices(
    annotations: Mapping[str, object], whole: bool, problems: list[RequestProblem]
) -> int:
    """gpu-fraction-num-devices as KAI-Scheduler reads it: a whole number above 0, the share
    on each of that many GPUs (``gpu_request_validator.go``: ParseUint, > 0)."""
    raw = annotations.get(DEVICES_ANNOTATION)
    if raw is None:
        return 1
    text = str(raw)
    if len(text) > MAX_VALUE_LENGTH or not text.isascii() or not text.isdigit() or int(text) == 0:
        problems.append(
            RequestProblem(
                f"{DEVICES_ANNOTATION} {shown(text)} is not a whole number above 0: write the "
                'number of GPUs that each get the share, such as "2".'
            )
        )
        return 1
    count = int(text)
    if count > MAX_WHOLE_GPUS:
        problems.append(
            RequestProblem(
                f'{DEVICES_ANNOTATION} "{text}" asks for more GPUs than any node has: ask for '
                f"at most {MAX_WHOLE_GPUS}."
            )
        )
    elif whole and count > 1:
        problems.append(
            RequestProblem(
                f'{DEVICES_ANNOTATION} "{text}" gives a share on several GPUs, but '
                f"{FRACTION_ANNOTATION} asks for whole GPUs: remove {DEVICES_ANNOTATION} or "
                "ask for a share below 1."
            )
        )
    return count


def _read_container_name(
    annotations: Mapping[str, object], problems: list[RequestProblem]
) -> str | None:
    container = annotations.get(CONTAINER_ANNOTATION)
    container_name = None if container is None else str(container)
    if container_name is not None and not container_name.strip():
        problems.append(
            RequestProblem(
                f"{CONTAINER_ANNOTATION} is empty: name one of the pod's containers, or remove "
                "the annotation to use the first container."
            )
        )
    return container_name


@functools.lru_cache(maxsize=1024)  # pods repeat a handful of values; results are immutable
def _parse_fraction(text: str) -> float | int | RequestProblem:
    accepted = (
        'use a decimal between 0 and 1 such as "0.5" for a share of one GPU, '
        'or a whole number such as "1" or "2" for whole GPUs.'
    )
    if len(text) > MAX_VALUE_LENGTH:
        return RequestProblem(
            f"{FRACTION_ANNOTATION} {shown(text)} is longer than {MAX_VALUE_LENGTH} characters: "
            f"{accepted}"
        )
    if not _DECIMAL.match(text):
        return RequestProblem(f'{FRACTION_ANNOTATION} "{text}" is not a plain decimal: {accepted}')
    value = Decimal(text)
    if value == 0:
        return RequestProblem(f'{FRACTION_ANNOTATION} "{text}" asks for no GPU: {accepted}')
    if value == value.to_integral_value():
        if value > MAX_WHOLE_GPUS:
            return RequestProblem(
                f'{FRACTION_ANNOTATION} "{text}" asks for more GPUs than any node has: ask for '
                f"at most {MAX_WHOLE_GPUS} (and what your policy allows)."
            )
        return int(value)
    if value > 1:
        return RequestProblem(
            f'{FRACTION_ANNOTATION} "{text}" is more than one GPU but not a whole number: '
            f"{accepted}"
        )
    return float(value)


def _parse_memory(text: str) -> float | RequestProblem:
    """MiB of a gpu-memory value: "8000" is MiB (as in KAI-Scheduler), "10Gi" a quantity."""
    mib = parse_memory_ask_mib(text) if len(text) <= MAX_VALUE_LENGTH else None
    if mib is not None:
        return mib
    if len(text) <= MAX_VALUE_LENGTH and is_bare_number(text):
        if not text.strip("0."):
            return RequestProblem(
                f'{MEMORY_ANNOTATION} "{text}" asks for no GPU memory: use {ACCEPTED_FORMS}.'
            )
        return RequestProblem(
            f'{MEMORY_ANNOTATION} "{text}" has no unit: a number without a unit is MiB and must '
            f'be whole, such as "8000" (8000 MiB); for GiB write "{text}Gi".'
        )
    return RequestProblem(
        f"{MEMORY_ANNOTATION} {shown(text)} is not a memory size: use {ACCEPTED_FORMS}."
    )


def shown(text: str) -> str:
    """``text`` quoted for a message, cut short when it is long."""
    if len(text) <= _SHOWN_LENGTH:
        return f'"{text}"'
    return f'"{text[:_SHOWN_LENGTH]}..." ({len(text)} characters)'
