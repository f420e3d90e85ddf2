"""Metrics and the admission log line, as wrappers around a review pipeline.

Each wrapper takes a ``ReviewPipeline`` and returns one with the same signature, so the
pipeline itself knows nothing about Prometheus or logging (as controller-runtime instruments
its webhooks with HTTP middleware). ``instrumented`` applies both: every admission is
counted, timed and logged as one JSON line, whatever its outcome.
"""

from __future__ import annotations

import logging
from time import perf_counter
from typing import Any

from webhook.server.admission import BodyReader, Endpoint, ReviewPipeline
from webhook.server.batched_log import ADMISSION_LOGGER
from webhook.server.metrics import AdmissionMetrics
from webhook.server.review import AdmissionResponse


def with_metrics(
    review: ReviewPipeline, metrics: AdmissionMetrics, endpoint: Endpoint
) -> ReviewPipeline:
    """Count each answer by outcome and observe its latency."""

    def measured(content_type: str, read_body: BodyReader) -> AdmissionResponse:
        started = perf_counter()
        response = review(content_type, read_body)
        metrics.observe_admission(endpoint, response.outcome, perf_counter() - started)
        return response

    return measured


def with_admission_log(review: ReviewPipeline, endpoint: Endpoint) -> ReviewPipeline:
    """Log one line per admission: uid, namespace, pod, decision, status, duration."""
    logger = logging.getLogger(ADMISSION_LOGGER)

    def logged(content_type: str, read_body: BodyReader) -> AdmissionResponse:
        started = perf_counter()
        response = review(content_type, read_body)
        level = logging.INFO if response.http_status < 400 else logging.WARNING
        if logger.isEnabledFor(level):
            fields = admission_fields(endpoint, response, perf_counter() - started)
            # makeRecord + handle is what ``logger.log`` does, less the walk up the stack
            # for the caller's file and line, which no admission line shows.
            record = logger.makeRecord(logger.name, level, __file__, 0, "admission", (), None)
            record.__dict__.update(fields)
            logger.handle(record)
        return response

    return logged


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


def instrumented(
    review: ReviewPipeline, metrics: AdmissionMetrics, endpoint: Endpoint
) -> ReviewPipeline:
    return with_admission_log(with_metrics(review, metrics, endpoint), endpoint)
