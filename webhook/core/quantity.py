"""Memory sizes in MiB: Kubernetes quantities ("10Gi", "512Mi", "16G") and the gpu-memory
annotation, where a number without a unit is MiB.

Policies write Kubernetes quantities, where a bare number is bytes. The annotation follows
KAI-Scheduler, which uses the same annotation names and reads ``gpu-memory: "2000"`` as
2000 MiB (KAI-Scheduler v0.13.0: ``docs/gpu-sharing/gpu-memory.yaml``, "in Mib";
``pkg/binder/plugins/gpusharing/gpu-request/gpu_request_validator.go`` parses it as a
positive integer; ``pkg/scheduler/api/node_info/node_info.go`` compares it with GPU
Feature Discovery's ``nvidia.com/gpu.memory``, which is MiB).
"""

from __future__ import annotations

import functools
import re
from decimal import Decimal, InvalidOperation

_UNITS: dict[str, int] = {
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
_QUANTITY = re.compile(r"^(?P<number>[0-9]+(?:\.[0-9]+)?)(?P<unit>Ki|Mi|Gi|Ti|k|K|M|G|T)?\Z")
_BARE_NUMBER = re.compile(r"^[0-9]+(?:\.[0-9]+)?\Z")
MIB = 2**20

ACCEPTED_FORMS = (
    'a size with a unit such as "10Gi", "512Mi" or "16G", or a whole number of MiB such as "8000"'
)


@functools.lru_cache(maxsize=1024)
def parse_memory_mib(text: str) -> float | None:
    """The size in MiB, or None when ``text`` is not a positive memory quantity."""
    match = _QUANTITY.match(text)
    if match is None:
        return None
    try:
        number = Decimal(match["number"])
    except InvalidOperation:  # pragma: no cover - the pattern admits only decimals
        return None
    size = number * _UNITS[match["unit"] or ""] / MIB
    if size <= 0:
        return None
    return float(size)


def is_bare_number(text: str) -> bool:
    """A number without a unit: MiB in the gpu-memory annotation, bytes in a policy."""
    return _BARE_NUMBER.match(text) is not None


@functools.lru_cache(maxsize=1024)
def parse_memory_ask_mib(text: str) -> float | None:
    """A gpu-memory annotation in MiB: a whole number is MiB, a quantity with a unit is
    read as Kubernetes reads it; None when it is neither (a bare "1.5", "0", "abc")."""
    if is_bare_number(text):
        return float(text) if text.isdigit() and int(text) > 0 else None
    return parse_memory_mib(text)
