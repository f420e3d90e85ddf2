"""The switch for long load, fuzz and fault variants: ``GPUSHARE_LONG_TESTS=1``.

CI runs every suite at a bounded size; the same tests run longer (more examples, more
requests, more rounds) when the variable is set, e.g. ``GPUSHARE_LONG_TESTS=1 scripts/test
tests/fuzz``. Tests pick their size with ``scaled``.
"""

from __future__ import annotations

import os

LONG = os.environ.get("GPUSHARE_LONG_TESTS") == "1"


def scaled(in_ci: int, long: int) -> int:
    """``long`` when the long variants are switched on, else ``in_ci``."""
    return long if LONG else in_ci
