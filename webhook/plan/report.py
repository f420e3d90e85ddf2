"""The plan in words: a side-by-side table for the terminal and the ``-o json`` report.

Both are built from the same ``SchemeOutcome``s, so the table, the JSON and the pictures
never disagree. The table has one column per scheme and one row per figure; below it, per
scheme, the pods that cannot be served with the core's own reasons, the bound each
pool's packing holds, and, where the input has quotas on GPU shares, whether each holds
what the scheme's workloads ask of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from webhook.plan.capacity import WHOLE_GPU_MODE
from webhook.plan.outcome import NotServed, PoolOutcome, SchemeOutcome
from webhook.plan.quota_fit import QuotaFit

REPORT_API_VERSION = "gpushare.io/v1alpha1"
MIB_PER_GIB = 1024


def _gib(mib: float | None) -> str:
    return "unknown" if mib is None else f"{mib / MIB_PER_GIB:.0f} GiB"


def _isolation(result: SchemeOutcome, field: str) -> str:
    """The shared modes' isolation (whole GPUs are isolated by construction)."""
    shared = [iso for mode, iso in result.isolation if mode != WHOLE_GPU_MODE]
    values = {getattr(iso, field) for iso in shared or [iso for _, iso in result.isolation]}
    return " / ".join(sorted(values)) or "-"


def _rows(results: Sequence[SchemeOutcome]) -> list[tuple[str, list[str]]]:
    return [
        ("mode", [r.scheme.mode for r in results]),
        ("pods served", [f"{r.pods_served}" for r in results]),
        ("GPUs needed", [f"{r.gpus}" for r in results]),
        ("  lower bound", [f"{r.lower_bound_gpus}" for r in results]),
        ("  one GPU per pod", [f"{r.one_gpu_per_pod}" for r in results]),
        ("nodes needed", [f"{r.nodes}" for r in results]),
        ("compute idle", [f"{r.idle_gpus:.2f} GPUs" if r.pools else "-" for r in results]),
        ("memory idle", [_gib(r.idle_memory_mib) if r.pools else "-" for r in results]),
        ("memory isolation", [_isolation(r, "memory") for r in results]),
        ("compute cap", [_isolation(r, "compute") for r in results]),
        ("fault domain", [_isolation(r, "fault_domain") for r in results]),
        ("pods not served", [f"{sum(i.pods for i in r.denied)}" for r in results]),
        ("pods not modelled", [f"{sum(i.pods for i in r.not_modelled)}" for r in results]),
        *(
            [("quotas exceeded", [_exceeded(r.quotas) for r in results])]
            if any(r.quotas for r in results)
            else []
        ),
    ]


def _exceeded(fits: Sequence[QuotaFit]) -> str:
    return f"{sum(not fit.fits for fit in fits)} of {len(fits)}"


def gpus(milli: int) -> str:
    """Thousandths of a GPU as GPUs: 2500 -> 2.5."""
    whole, part = divmod(milli, 1000)
    return f"{whole}.{part:03d}".rstrip("0").rstrip(".") if part else str(whole)


def _quota_line(fit: QuotaFit) -> str:
    quota = fit.quota
    used = "" if quota.used is None else f", used {gpus(quota.used)}"
    held = f", {gpus(quota.held_now)} of it by these pods" if quota.held_now else ""
    verdict = "fits" if fit.fits else f"does not fit, {gpus(fit.short)} short"
    hard = "nominal" if quota.kind == "ClusterQueue" else "hard"
    return (
        f"  quota {quota.label}: asks {gpus(fit.demand)} GPUs of shares, room "
        f"{gpus(quota.room)} ({hard} {gpus(quota.hard)}{used}{held}): {verdict}"
    )


def table(results: Sequence[SchemeOutcome]) -> str:
    """Columns of at most 30 characters; longer cells wrap onto the next lines."""
    width = 30
    rows = [("", [r.scheme.name for r in results]), *_rows(results)]
    head = max(len(name) for name, _ in rows) + 2
    lines = []
    for name, cells in rows:
        wrapped = [_wrap(cell, width) for cell in cells]
        for depth in range(max(len(w) for w in wrapped)):
            label = name if depth == 0 else ""
            parts = [(w[depth] if depth < len(w) else "").ljust(width) for w in wrapped]
            lines.append((label.ljust(head) + "  ".join(parts)).rstrip())
    return "\n".join(lines)


def _wrap(text: str, width: int) -> list[str]:
    lines: list[str] = []
    for word in text.split(" "):
        if lines and len(lines[-1]) + 1 + len(word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return lines or [""]


def details(results: Sequence[SchemeOutcome]) -> str:
    """Per scheme: each pool's packing and bound, then the pods not served and why."""
    lines: list[str] = []
    for result in results:
        lines.append(f"{result.scheme.name}:")
        for pool in result.pools:
            lines.append(
                f"  {pool.group}: {_count(pool.pods, 'pod')} on {_count(pool.gpus, 'GPU')}, "
                f"{_count(pool.nodes, 'node')} of {pool.gpus_per_node} GPUs (lower bound "
                f"{pool.lower_bound_gpus}; {pool.bound})"
            )
        for heading, items in (
            ("not served", result.denied),
            ("not modelled", result.not_modelled),
        ):
            for item in items:
                lines.append(
                    f"  {heading}: {item.workload} ({_count(item.pods, 'pod')}): {item.reasons[0]}"
                )
                lines += [f"    {reason}" for reason in item.reasons[1:]]
        if result.untouched:
            pods = sum(item.pods for item in result.untouched)
            lines.append(f"  untouched by gpushare: {pods} pods (no annotation or excluded)")
        for fit in result.quotas:
            lines.append(_quota_line(fit))
            if not fit.fits:
                lines += [f"    {name}: {gpus(milli)}" for name, milli in fit.charged[:3]]
                if len(fit.charged) > 3:
                    lines.append(f"    and {len(fit.charged) - 3} more workloads")
            if fit.quota.note:
                lines.append(f"    ({fit.quota.note})")
    return "\n".join(lines)


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


def _not_served(items: Sequence[NotServed]) -> list[dict[str, Any]]:
    return [{"workload": i.workload, "pods": i.pods, "reasons": list(i.reasons)} for i in items]


def _quota_json(fit: QuotaFit) -> dict[str, Any]:
    quota = fit.quota
    return {
        "kind": quota.kind,
        "name": quota.name,
        "namespaces": list(quota.namespaces),
        "source": quota.source,
        "hardMilliGpus": quota.hard,
        "usedMilliGpus": quota.used,
        "heldNowMilliGpus": quota.held_now,
        "roomMilliGpus": quota.room,
        "demandMilliGpus": fit.demand,
        "fits": fit.fits,
        "shortMilliGpus": fit.short,
        "charged": [{"workload": name, "milliGpus": milli} for name, milli in fit.charged],
        **({"note": quota.note} if quota.note else {}),
    }


def _pool_json(pool: PoolOutcome) -> dict[str, Any]:
    return {
        "pool": pool.group,
        "unit": pool.unit,
        "capacity": list(pool.capacity),
        "gpusPerNode": pool.gpus_per_node,
        "binsAreNodes": pool.node_bins,
        "pods": pool.pods,
        "gpus": pool.gpus,
        "nodes": pool.nodes,
        "lowerBoundGpus": pool.lower_bound_gpus,
        "bound": pool.bound,
        "bins": [
            [{"workload": label, "pods": count} for label, count in contents]
            for contents in pool.packing.bins
        ],
    }


def as_json(results: Sequence[SchemeOutcome]) -> dict[str, Any]:
    """``-o json``: the same figures as the table, and each bin's contents."""
    schemes = []
    for r in results:
        schemes.append(
            {
                "scheme": r.scheme.name,
                "mode": r.scheme.mode,
                "podsServed": r.pods_served,
                "gpus": r.gpus,
                "lowerBoundGpus": r.lower_bound_gpus,
                "oneGpuPerPod": r.one_gpu_per_pod,
                "nodes": r.nodes,
                "idleGpus": round(r.idle_gpus, 4),
                "idleMemoryMiB": None if r.idle_memory_mib is None else round(r.idle_memory_mib),
                "isolation": {
                    mode: {
                        "memory": iso.memory,
                        "compute": iso.compute,
                        "faultDomain": iso.fault_domain,
                    }
                    for mode, iso in r.isolation
                },
                "pools": [_pool_json(pool) for pool in r.pools],
                "denied": _not_served(r.denied),
                "notModelled": _not_served(r.not_modelled),
                "untouched": _not_served(r.untouched),
                "quotas": [_quota_json(fit) for fit in r.quotas],
            }
        )
    return {"apiVersion": REPORT_API_VERSION, "kind": "PlanReport", "schemes": schemes}
