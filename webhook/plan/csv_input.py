"""Workloads from a CSV table: ``name,fraction,memory,count`` (and optionally ``namespace``).

For a mix that lives in a spreadsheet rather than in manifests. The header names the
columns, in any order; ``name`` and ``count`` are required, and each row gives a
``fraction`` (the gpu-fraction annotation's value, e.g. 0.25 or 2), a ``memory`` (the
gpu-memory annotation's, e.g. 20Gi), or both. Each row becomes a pod annotated as a
developer would annotate it, so the core reads the values exactly as the webhook does and
a bad value is denied with the webhook's own reason.

Bounded like every reader here: 8 MiB, 100,000 rows, 1,000,000 pods a row and in all, 256
characters a cell; a row that breaks the format is refused with its line number and what to
write instead.
"""

from __future__ import annotations

import csv
import io
import sys
from pathlib import Path

from webhook.constants import FRACTION_ANNOTATION, MEMORY_ANNOTATION
from webhook.errors import ManifestError
from webhook.plan.workload import Workload

MAX_BYTES = 8 * 1024 * 1024
MAX_ROWS = 100_000
MAX_PODS = 1_000_000
MAX_CELL = 256
COLUMNS = ("name", "fraction", "memory", "count", "namespace")
IMAGE = "registry.k8s.io/pause:3.10"  # a stand-in: no framework env, nothing to size


def read_text(path: str) -> tuple[str, str]:
    """The file's text (``-``: stdin) and the name errors use; bounded to MAX_BYTES."""
    if path == "-":
        data = sys.stdin.buffer.read(MAX_BYTES + 1)
        name = "<stdin>"
    else:
        try:
            with Path(path).open("rb") as handle:
                data = handle.read(MAX_BYTES + 1)
        except OSError as error:
            raise ManifestError(f"{path}: cannot read: {error.strerror or error}") from error
        name = path
    if len(data) > MAX_BYTES:
        raise ManifestError(f"{name}: larger than {MAX_BYTES // 2**20} MiB; split the table")
    try:
        return data.decode("utf-8-sig"), name
    except UnicodeDecodeError as error:
        raise ManifestError(f"{name}: not UTF-8 text (byte {error.start})") from error


def _header(row: list[str], name: str) -> dict[str, int]:
    columns = [cell.strip().lower() for cell in row]
    unknown = [c for c in columns if c not in COLUMNS]
    if unknown:
        raise ManifestError(
            f"{name}:1: unknown column {unknown[0]!r}; the columns are {', '.join(COLUMNS)}"
        )
    missing = [c for c in ("name", "count") if c not in columns]
    if missing or not {"fraction", "memory"} & set(columns):
        need = missing[0] if missing else "fraction or memory"
        raise ManifestError(
            f"{name}:1: the header has no {need} column; write e.g. name,fraction,memory,count"
        )
    return {column: index for index, column in enumerate(columns)}


def _count(text: str, where: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= MAX_PODS:
        raise ManifestError(f"{where}: count {text!r} is not a whole number from 1 to {MAX_PODS:,}")
    return int(text)


def _pod(name: str, namespace: str, fraction: str, memory: str) -> dict[str, object]:
    annotations = {}
    if fraction:
        annotations[FRACTION_ANNOTATION] = fraction
    if memory:
        annotations[MEMORY_ANNOTATION] = memory
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
        "spec": {"containers": [{"name": "main", "image": IMAGE}]},
    }


def parse_table(text: str, name: str, namespace: str | None = None) -> list[Workload]:
    """The rows as workloads; ``ManifestError`` names the first bad line and the fix."""
    rows = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(rows, None)
        if header is None:
            raise ManifestError(f"{name}: empty; write a header: name,fraction,memory,count")
        columns = _header(header, name)
        workloads: list[Workload] = []
        total = 0
        for row in rows:
            line = rows.line_num
            where = f"{name}:{line}"
            if not any(cell.strip() for cell in row):
                continue
            workload = _row(row, columns, where, namespace)
            total += workload.count
            workloads.append(workload)
            if len(workloads) > MAX_ROWS or total > MAX_PODS:
                raise ManifestError(
                    f"{where}: more than {MAX_ROWS:,} rows or {MAX_PODS:,} pods; split the table"
                )
    except csv.Error as error:
        raise ManifestError(f"{name}:{rows.line_num}: not CSV: {error}") from error
    if not workloads:
        raise ManifestError(f"{name}: no rows after the header")
    return workloads


def _row(row: list[str], columns: dict[str, int], where: str, namespace: str | None) -> Workload:
    if len(row) != len(columns):
        raise ManifestError(f"{where}: {len(row)} cells, but the header has {len(columns)}")
    if any(len(cell) > MAX_CELL for cell in row):
        raise ManifestError(f"{where}: a cell is longer than {MAX_CELL} characters")

    def cell(column: str) -> str:
        return row[columns[column]].strip() if column in columns else ""

    name = cell("name")
    if not name:
        raise ManifestError(f"{where}: the name is empty; give each row a name")
    fraction, memory = cell("fraction"), cell("memory")
    if not fraction and not memory:
        raise ManifestError(f"{where}: {name!r} gives neither fraction nor memory; give one")
    where_ns = namespace or cell("namespace") or "default"
    return Workload(
        name=name,
        namespace=where_ns,
        document=_pod(name, where_ns, fraction, memory),
        count=_count(cell("count"), where),
        source=where,
    )


def read_table(path: str, namespace: str | None = None) -> list[Workload]:
    text, name = read_text(path)
    return parse_table(text, name, namespace)
