"""The plan as pictures (matplotlib, Agg): GPUs needed per scheme, and which pods share
which GPU under one scheme. PNG or SVG by the file's suffix.

Reproducible: the same input gives the same bytes. Matplotlib writes a date and its version
into both formats and random ids into SVG unless told otherwise, so the metadata is fixed
(``metadata`` of ``savefig``), SVG ids come from a fixed ``svg.hashsalt``, the font is the
DejaVu Sans matplotlib ships, and SVG keeps text as ``<text>`` (``svg.fonttype: none``), so
the labels can be read back (the tests do) and searched.

Element ids (``gid``) name what a shape stands for: ``gpus-<n>`` the bar of the n-th scheme,
``bound-<n>`` and ``one-per-pod-<n>`` its markers, ``bin-<pool>-<b>`` a GPU (or node) row of
the packing picture, ``slot-<pool>-<b>-<k>`` the k-th workload's part of it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from webhook.errors import GpushareError
from webhook.plan.outcome import PoolOutcome, SchemeOutcome

MAX_DRAWN_BINS = 40  # rows of the packing picture; the rest are summed up in a line
SUFFIXES = (".png", ".svg")
_STYLE = {
    "svg.hashsalt": "gpushare-plan",
    "svg.fonttype": "none",
    "font.family": "DejaVu Sans",
    "font.size": 9,
    "path.simplify": False,
}
_COLORS = "tab20"


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError as error:
        raise GpushareError(
            "pictures need matplotlib: pip install 'gpushare[plots]' (or use -o html/json)"
        ) from error
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _metadata(path: Path) -> dict[str, Any]:
    if path.suffix == ".svg":
        return {"Date": None, "Creator": "gpushare plan"}
    return {"Software": "gpushare plan"}


def _save(figure: Any, path: Path) -> None:
    if path.suffix not in SUFFIXES:
        raise GpushareError(f"{path}: pictures are .png or .svg files; name it so")
    figure.savefig(path, metadata=_metadata(path), dpi=100)


def gid_token(text: str) -> str:
    """``text`` as a piece of an element id: letters, digits and dashes."""
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-") or "x"


def bar_chart(results: Sequence[SchemeOutcome], path: Path) -> None:
    """One bar per scheme: GPUs needed, its number on top; a tick for the lower bound and a
    hollow bar for one GPU per pod."""
    plt = _pyplot()
    with plt.rc_context(_STYLE):
        figure, axes = plt.subplots(figsize=(max(4.0, 1.6 * len(results) + 1.5), 3.6))
        names = [r.scheme.name for r in results]
        for index, result in enumerate(results):
            axes.bar(
                index,
                result.one_gpu_per_pod,
                width=0.7,
                fill=False,
                edgecolor="0.6",
                linestyle="--",
                gid=f"one-per-pod-{index}",
            )
            axes.bar(index, result.gpus, width=0.5, color="#4c72b0", gid=f"gpus-{index}")
            axes.hlines(
                result.lower_bound_gpus,
                index - 0.3,
                index + 0.3,
                colors="#c44e52",
                gid=f"bound-{index}",
            )
            axes.text(
                index,
                result.gpus,
                bar_label(result),
                ha="center",
                va="bottom",
                gid=f"label-{index}",
            )
        axes.set_xticks(range(len(results)), names, rotation=15, ha="right")
        axes.set_ylabel("GPUs")
        axes.set_title("GPUs needed per scheme (dashed: one GPU per pod; red: lower bound)")
        axes.set_ylim(0, max([1, *(r.one_gpu_per_pod for r in results)]) * 1.15)
        figure.tight_layout()
        _save(figure, path)
        plt.close(figure)


def bar_label(result: SchemeOutcome) -> str:
    """The number on a bar; a scheme that packs nothing says why instead of "0"."""
    if result.pods_served:
        return str(result.gpus)
    return "not modelled" if result.not_modelled else "none served"


def _rows(result: SchemeOutcome) -> tuple[list[tuple[PoolOutcome, int]], int]:
    rows = [(pool, b) for pool in result.pools for b in range(pool.packing.bin_count)]
    return rows[:MAX_DRAWN_BINS], max(0, len(rows) - MAX_DRAWN_BINS)


def packing_picture(result: SchemeOutcome, path: Path) -> None:
    """One row per GPU (per node for whole GPUs), each workload's part of it in its colour
    and name; rows past MAX_DRAWN_BINS are counted in the title."""
    plt = _pyplot()
    rows, hidden = _rows(result)
    labels = sorted({label for pool in result.pools for label in pool.sizes})
    with plt.rc_context(_STYLE):
        colours = plt.get_cmap(_COLORS)
        figure, axes = plt.subplots(figsize=(9.0, 1.2 + 0.32 * max(1, len(rows))))
        for row, (pool, b) in enumerate(rows):
            y = len(rows) - 1 - row
            token = gid_token(pool.group)
            axes.barh(y, 1.0, height=0.8, fill=False, edgecolor="0.3", gid=f"bin-{token}-{b}")
            left = 0.0
            for k, (label, count) in enumerate(pool.packing.bins[b]):
                width = count * pool.sizes[label][0] / pool.capacity[0]
                colour = colours(labels.index(label) % colours.N)
                axes.barh(
                    y,
                    width,
                    left=left,
                    height=0.8,
                    color=colour,
                    edgecolor="white",
                    gid=f"slot-{token}-{b}-{k}",
                )
                text = label if count == 1 else f"{label} x{count}"
                axes.text(
                    left + width / 2, y, text, ha="center", va="center", fontsize=7, clip_on=True
                )
                left += width
        axes.set_yticks(
            range(len(rows)),
            [
                f"{pool.group} {'node' if pool.node_bins else 'GPU'} {b + 1}"
                for pool, b in reversed(rows)
            ],
        )
        axes.set_xlim(0, 1)
        axes.set_xlabel("share of the GPU (of the node, for whole GPUs)")
        more = f"; {hidden} more not drawn" if hidden else ""
        axes.set_title(f"{result.scheme.name}: {result.gpus} GPUs{more}")
        figure.tight_layout()
        _save(figure, path)
        plt.close(figure)


def write_pictures(
    results: Sequence[SchemeOutcome], packing: SchemeOutcome, directory: Path
) -> list[Path]:
    """Both pictures, PNG and SVG, into ``directory``: the files written."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise GpushareError(f"--out {directory}: cannot make it: {error.strerror}") from error
    written = []
    for suffix in SUFFIXES:
        chart, picture = directory / f"plan-chart{suffix}", directory / f"plan-packing{suffix}"
        bar_chart(results, chart)
        packing_picture(packing, picture)
        written += [chart, picture]
    return written
