"""The plan as one HTML page: the table, the details, and both pictures inline as SVG.

A file people can open or attach without a viewer for PNGs. Built from the same outcomes as
the table and pictures; every piece of input text is escaped. The pictures need
matplotlib (the ``plots`` extra); without it the page says so and carries the text alone.
"""

from __future__ import annotations

import html
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from webhook.errors import GpushareError
from webhook.plan.outcome import SchemeOutcome
from webhook.plan.pictures import bar_chart, packing_picture
from webhook.plan.report import details, table


def _svg(draw: Callable[..., None], *args: object) -> str:
    with tempfile.TemporaryDirectory(prefix="gpushare-plan-") as scratch:
        path = Path(scratch) / "picture.svg"
        draw(*args, path)
        text = path.read_text(encoding="utf-8")
    return text[text.index("<svg") :]  # no XML prolog inside HTML


def page(results: Sequence[SchemeOutcome], packing: SchemeOutcome) -> str:
    try:
        pictures = _svg(bar_chart, results) + "\n" + _svg(packing_picture, packing)
    except GpushareError as error:
        pictures = f"<p>{html.escape(str(error))}</p>"
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8"><title>gpushare plan</title>',
            "<style>body{font-family:sans-serif;margin:2em} pre{background:#f6f6f6;"
            "padding:1em;overflow-x:auto}</style></head><body>",
            "<h1>gpushare plan</h1>",
            f"<pre>{html.escape(table(results))}</pre>",
            f"<pre>{html.escape(details(results))}</pre>",
            pictures,
            "</body></html>",
            "",
        ]
    )
