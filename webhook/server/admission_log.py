"""The admission log line: one JSON line per admission, whatever its outcome.

Fields: endpoint, uid, decision, status, duration, and from the decoded request namespace,
pod, kind (for a workload's template check), operation, dry run, policy and detail.
``batched_log`` writes the lines in batches.
"""

from __future__ import annotations

import logging
from typing import Any

from webhook.server.admission import Endpoint
from webhook.server.batched_log import ADMISSION_LOGGER
from webhook.server.review import AdmissionResponse

__all__ = ["ADMISSION_LOGGER", "admission_fields", "log_admission"]


def log_admission(
    logger: logging.Logger, endpoint: Endpoint, response: AdmissionResponse, seconds: float
) -> None:
    level = logging.INFO if response.http_status < 400 else logging.WARNING
    if not logger.isEnabledFor(level):
        return
    fields = admission_fields(endpoint, response, seconds)
    # makeRecord + handle is what ``logger.log`` does, less the walk up the stack for the
    # caller's file and line, which no admission line shows.
    record = logger.makeRecord(logger.name, level, __file__, 0, "admission", (), None)
    record.__dict__.update(fields)
    logger.handle(record)


def admission_fields(
    endpoint: Endpoint, response: AdmissionResponse, seconds: float
) -> dict[str, Any]:
    """The fields of an admission's log line."""
    fields: dict[str, Any] = {
        "endpoint": str(endpoint),
        "uid": response.uid,
        "decision": str(response.outcome),
        "status": response.http_status,
        "duration_ms": round(seconds * 1e6) / 1e3,
    }
    request = response.request
    if request is not None:
        fields["namespace"] = request.namespace
        fields["pod"] = request.pod_name
        if request.kind != "Pod":  # a workload's template check: "pod" is the workload's name
            fields["kind"] = request.kind
        fields["operation"] = request.operation
        if request.dry_run:
            fields["dry_run"] = True
    if response.policy:
        fields["policy"] = response.policy
    detail = response.detail
    if detail:
        fields["detail"] = detail
    return fields
