"""The pictures, read back: the SVG's text says the figures of the plan, its bars are as
tall as the GPUs needed, the packing picture has a row per GPU with each workload named,
PNGs have their size and pixels, and the same input gives the same bytes."""

from __future__ import annotations

import re
import struct
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from webhook.core import load_policies
from webhook.plan import plan
from webhook.plan.csv_input import read_table
from webhook.plan.outcome import SchemeOutcome
from webhook.plan.pictures import MAX_DRAWN_BINS, bar_chart, packing_picture

SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture
def results(policy_dir: Path, mix_csv: Path) -> list[SchemeOutcome]:
    return plan(read_table(str(mix_csv)), load_policies(policy_dir), gpus_per_node=4)


def texts(root: ET.Element) -> list[str]:
    return ["".join(t.itertext()).strip() for t in root.iter(f"{SVG}text")]


def group(root: ET.Element, gid: str) -> ET.Element:
    found = [g for g in root.iter(f"{SVG}g") if g.get("id") == gid]
    assert len(found) == 1, gid
    return found[0]


def height(element: ET.Element) -> float:
    """The vertical extent of the first path under ``element`` (a bar's rectangle)."""
    path = next(element.iter(f"{SVG}path")).get("d", "")
    numbers = [float(n) for n in re.findall(r"-?\d+(?:\.\d+)?", path)]
    ys = numbers[1::2]
    return max(ys) - min(ys)


def test_bar_chart_svg_says_the_plan(results: list[SchemeOutcome], tmp_path: Path) -> None:
    path = tmp_path / "chart.svg"
    bar_chart(results, path)
    root = ET.parse(path).getroot()
    words = texts(root)
    for result in results:
        assert result.scheme.name in words
    labels = [texts(group(root, f"label-{n}"))[0] for n in range(len(results))]
    assert labels == [str(r.gpus) for r in results]
    assert all(r.pods_served for r in results)
    heights = [height(group(root, f"gpus-{n}")) for n in range(len(results))]
    ratios = [h / r.gpus for h, r in zip(heights, results, strict=True)]
    assert max(ratios) == pytest.approx(min(ratios), rel=1e-3), "bars proportional to GPUs"
    one = height(group(root, "one-per-pod-0")) / heights[0]
    assert one == pytest.approx(results[0].one_gpu_per_pod / results[0].gpus, rel=1e-3)


def test_packing_svg_has_a_row_per_gpu(results: list[SchemeOutcome], tmp_path: Path) -> None:
    default = next(r for r in results if r.scheme.name == "default")
    path = tmp_path / "packing.svg"
    packing_picture(default, path)
    root = ET.parse(path).getroot()
    rows = [g.get("id") for g in root.iter(f"{SVG}g") if (g.get("id") or "").startswith("bin-")]
    bins = sum(pool.packing.bin_count for pool in default.pools)
    assert len(rows) == bins == 2 + 5 + 1  # ts-half, ts-quarter, one node of whole GPUs
    words = texts(root)
    assert "default/ts-quarter GPU 5" in words
    assert "default/whole GPUs node 1" in words
    assert "infer x4" in words and "big x2" in words
    assert f"default: {default.gpus} GPUs" in words


def test_packing_picture_draws_at_most_its_rows(policy_dir: Path, tmp_path: Path) -> None:
    table = tmp_path / "many.csv"
    table.write_text("name,fraction,count\nhalf,0.5,200\n")
    (result,) = plan(read_table(str(table)), load_policies(policy_dir), names=["default"])
    path = tmp_path / "many.svg"
    packing_picture(result, path)
    root = ET.parse(path).getroot()
    rows = [g for g in root.iter(f"{SVG}g") if (g.get("id") or "").startswith("bin-")]
    assert len(rows) == MAX_DRAWN_BINS
    assert f"default: 100 GPUs; {100 - MAX_DRAWN_BINS} more not drawn" in texts(root)


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_png_pictures(results: list[SchemeOutcome], tmp_path: Path) -> None:
    chart, packing = tmp_path / "chart.png", tmp_path / "packing.png"
    bar_chart(results, chart)
    packing_picture(results[0], packing)
    # figsize x 100 dpi: 1.6 per scheme + 1.5 inches wide, 3.6 high.
    assert png_size(chart) == (round((1.6 * len(results) + 1.5) * 100), 360)
    width, rows_height = png_size(packing)
    assert width == 900 and rows_height == round((1.2 + 0.32 * 8) * 100)
    from PIL import Image

    with Image.open(chart) as image:
        colours = image.convert("RGB").getcolors(maxcolors=1 << 16)
    assert colours is not None and len(colours) > 10, "more than a blank canvas"


def test_same_input_same_bytes(results: list[SchemeOutcome], tmp_path: Path) -> None:
    for suffix in (".svg", ".png"):
        first, second = tmp_path / f"a{suffix}", tmp_path / f"b{suffix}"
        bar_chart(results, first)
        bar_chart(results, second)
        assert first.read_bytes() == second.read_bytes()
        packing_picture(results[0], first)
        packing_picture(results[0], second)
        assert first.read_bytes() == second.read_bytes()


def test_other_suffixes_are_refused(results: list[SchemeOutcome], tmp_path: Path) -> None:
    from webhook.errors import GpushareError

    with pytest.raises(GpushareError, match=r"chart.jpg: pictures are .png or .svg files"):
        bar_chart(results, tmp_path / "chart.jpg")


def test_a_scheme_that_packs_nothing_says_why(policy_dir: Path, tmp_path: Path) -> None:
    """Every pod denied: the bar is labelled "none served", not "0"."""
    table = tmp_path / "odd.csv"
    table.write_text("name,fraction,count\nodd,0.7,3\n")
    results = plan(read_table(str(table)), load_policies(policy_dir), names=["default"])
    path = tmp_path / "chart.svg"
    bar_chart(results, path)
    assert texts(group(ET.parse(path).getroot(), "label-0")) == ["none served"]
