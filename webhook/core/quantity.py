"""Memory quantities as Kubernetes writes them ("10Gi", "512Mi", "16G"), in MiB."""

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
MIB = 2**20

ACCEPTED_FORMS = 'a positive size such as "10Gi", "512Mi" or "16G"'


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
