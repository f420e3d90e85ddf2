"""One admission path (``/mutate`` or ``/validate``), from the HTTP request to its answer.

``AdmissionEndpoint.__call__`` is the whole request path, in the order it runs, as
controller-runtime's ``webhook/admission/http.go`` reads: ``read`` checks the Content-Type
and reads the body under its cap; the body waits for room to decode; ``review`` decodes the
AdmissionReview once, refuses a client without a certificate where one is required, lets
the decision (``admission.pod_handler``) answer and echoes the uid; ``answer`` counts,
times, logs and encodes. A patched pod whose policy counts shares adds them to its
namespace's showback counter, unless the request is a dry run (nothing is created). Every
step that fails answers there, with a message that says what to change; none raises.

A large body holds room in the worker's ``BodyBudget`` from decoding until its decoded form
is let go, so the memory of every review a worker works on at once is bounded together,
not one decode at a time.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from time import perf_counter
from typing import Any

from webhook.server.admission import Decide, Endpoint
from webhook.server.admission_log import ADMISSION_LOGGER, log_admission
from webhook.server.body_budget import BodyBudget
from webhook.server.metrics import AdmissionMetrics
from webhook.server.request_body import UnreadableBodyError, read_body
from webhook.server.review import (
    JSON_CONTENT_TYPE,
    AdmissionResponse,
    MalformedReviewError,
    decode_review,
    denied,
    encode_review,
    errored,
)

log = logging.getLogger("gpushare.server")

NO_CLIENT_CERTIFICATE = (
    "This webhook accepts admission requests only from clients with a certificate signed by "
    "its client CA (--client-ca). Configure the apiserver to present one: an "
    "AdmissionConfiguration whose kubeConfigFile names the client certificate "
    "(docs/reliability.md)."
)
HANDLER_FAILED = "The webhook failed to evaluate the pod; see its logs."
READ_FAILED = "The webhook failed to read the request; see its logs."
BUSY = "The webhook is busy decoding other large requests; try again."


@dataclass(frozen=True, slots=True)
class HttpAnswer:
    status: int
    body: bytes
    content_type: str = JSON_CONTENT_TYPE


class AdmissionEndpoint:
    def __init__(
        self,
        endpoint: Endpoint,
        decide: Decide,
        *,
        metrics: AdmissionMetrics,
        budget: BodyBudget,
        max_body_bytes: int,
        client_certificates: bool = False,
    ) -> None:
        self.endpoint = endpoint
        self.decide = decide
        self.metrics = metrics
        self.budget = budget
        self.max_body_bytes = max_body_bytes
        self.client_certificates = client_certificates
        self.logger = logging.getLogger(ADMISSION_LOGGER)
        self.too_large = (
            f"The request body is larger than {max_body_bytes} bytes; the apiserver never "
            "sends more than 3 MiB."
        )

    def __call__(self, environ: dict[str, Any]) -> HttpAnswer:
        started = perf_counter()
        body = self.read(environ)
        if isinstance(body, AdmissionResponse):
            return self.answer(body, started)
        # Decoded, a review takes about 20 times its size: large ones take turns, and the
        # decoded request (which the response keeps for the log line) is let go before the
        # next one may start.
        with self.budget.hold(len(body)) as admitted:
            response = self.review(body, environ) if admitted else errored(503, BUSY)
            del body
            answer = self.answer(response, started)
            del response
        return answer

    def read(self, environ: dict[str, Any]) -> bytes | AdmissionResponse:
        """The request body, or the answer that refuses the request before it is read."""
        content_type = environ.get("CONTENT_TYPE", "")
        if content_type != JSON_CONTENT_TYPE and not is_json(content_type):
            return errored(
                415, f"Content-Type must be {JSON_CONTENT_TYPE}, not {content_type or 'missing'!r}."
            )
        try:
            body = read_body(environ, self.max_body_bytes)
        except UnreadableBodyError as error:
            return errored(400, f"The request body could not be read ({error}).")
        except Exception:  # a bug in the reader
            log.exception("reading an admission request failed")
            return errored(500, READ_FAILED)
        return errored(413, self.too_large) if body is None else body

    def review(self, body: bytes, environ: dict[str, Any]) -> AdmissionResponse:
        """Decode once, check the client, decide, echo the uid."""
        try:
            request = decode_review(body)
        except MalformedReviewError as bad:
            return errored(bad.http_status, bad.message).complete(None, bad.uid)
        if self.client_certificates and environ.get("SSL_CLIENT_VERIFY") != "SUCCESS":
            return denied(403, [NO_CLIENT_CERTIFICATE]).complete(request)
        try:
            response = self.decide(request)
        except Exception:
            log.exception("admission failed", extra={"uid": request.uid})
            response = errored(500, HANDLER_FAILED)
        return response.complete(request)

    def answer(self, response: AdmissionResponse, started: float) -> HttpAnswer:
        """Count, time and log ``response``, and encode it."""
        seconds = perf_counter() - started
        self.metrics.observe_admission(self.endpoint, response.outcome, seconds)
        if response.milli_gpus is not None:
            request = response.request
            if request is not None and not request.dry_run:
                self.metrics.observe_admitted_share(
                    request.namespace, response.policy or "", response.milli_gpus
                )
        log_admission(self.logger, self.endpoint, response, seconds)
        return HttpAnswer(response.http_status, encode_review(response))


def is_json(content_type: str) -> bool:
    return content_type.partition(";")[0].strip().lower() == JSON_CONTENT_TYPE
