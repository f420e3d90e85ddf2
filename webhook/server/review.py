"""AdmissionReview v1 on the wire: decode a request once, build every kind of answer.

Owns the envelope rules (DESIGN.md section 2): the response echoes ``request.uid`` and
``admission.k8s.io/v1``/``AdmissionReview`` on every path, errors included; ``patch`` and
``patchType`` come together or not at all; warnings stay under 120 characters.

Answers are ``Reply`` values built by four named constructors, as in controller-runtime:
``allowed`` (no change), ``patched`` (allowed with a JSON Patch), ``denied`` (HTTP 200 with
``allowed: false``: a policy violation, which rejects the pod whatever the failurePolicy)
and ``errored`` (HTTP 4xx/5xx: the apiserver counts it as a failed call and its
failurePolicy decides).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import orjson

API_VERSION = "admission.k8s.io/v1"
KIND = "AdmissionReview"
JSON_CONTENT_TYPE = "application/json"
# Kubernetes: "warnings longer than 120 characters may be truncated"; keep each under it.
MAX_WARNING_LENGTH = 119
MAX_WARNINGS = 16

REASONS_BY_CODE = {
    400: "BadRequest",
    403: "Forbidden",
    413: "RequestEntityTooLarge",
    415: "UnsupportedMediaType",
    422: "Invalid",
    500: "InternalError",
    503: "ServiceUnavailable",
}


class Outcome(StrEnum):
    """What became of a request, as metrics and logs label it."""

    ALLOWED = "allowed"
    PATCHED = "patched"
    DENIED = "denied"
    SKIPPED = "skipped"
    REJECTED = "rejected"  # the request itself was malformed (HTTP 4xx)
    ERROR = "error"  # we failed (HTTP 5xx)


@dataclass(frozen=True)
class Reply:
    """An HTTP answer: status, JSON body, and what it means for metrics and logs."""

    http_status: int
    body: bytes
    outcome: Outcome
    uid: str = ""
    detail: str = ""


@dataclass(frozen=True)
class AdmissionRequest:
    """The fields of ``AdmissionReview.request`` the webhook acts on, decoded once."""

    uid: str
    group: str
    version: str
    kind: str
    resource: str
    sub_resource: str
    operation: str
    namespace: str
    name: str
    dry_run: bool
    object: Mapping[str, Any] | None

    @property
    def is_pod_create(self) -> bool:
        return (
            self.operation == "CREATE"
            and self.group == ""
            and self.kind == "Pod"
            and self.resource == "pods"
            and not self.sub_resource
        )

    @property
    def pod_name(self) -> str:
        """The pod's name, or its generateName prefix (pods of a Deployment have no name yet)."""
        if self.name:
            return self.name
        metadata = (self.object or {}).get("metadata")
        if isinstance(metadata, Mapping):
            for key in ("name", "generateName"):
                value = metadata.get(key)
                if isinstance(value, str) and value:
                    return value
        return ""


class MalformedReviewError(Exception):
    """The body is not a usable AdmissionReview; becomes a 4xx ``errored`` reply."""

    def __init__(self, http_status: int, message: str, uid: str = "") -> None:
        super().__init__(message)
        self.http_status = http_status
        self.message = message
        self.uid = uid


def _field(mapping: Mapping[str, Any], key: str, kind: type, uid: str, where: str) -> Any:
    value = mapping.get(key)
    if value is None:
        return kind()
    if not isinstance(value, kind):
        raise MalformedReviewError(
            400, f"{where}.{key} must be a {_type_name(kind)}, not {_type_name(type(value))}.", uid
        )
    return value


def _type_name(kind: type) -> str:
    return {dict: "object", str: "string", bool: "boolean", list: "array"}.get(kind, kind.__name__)


def decode_review(body: bytes) -> AdmissionRequest:
    """Parse an AdmissionReview v1 body, or raise ``MalformedReviewError`` saying what is wrong."""
    if not body.strip():
        raise MalformedReviewError(
            400, "The request body is empty; send an admission.k8s.io/v1 AdmissionReview."
        )
    try:
        review = orjson.loads(body)
    except orjson.JSONDecodeError as error:
        raise MalformedReviewError(400, f"The request body is not valid JSON: {error}.") from None
    if not isinstance(review, dict):
        raise MalformedReviewError(
            400, "The request body must be a JSON object (an AdmissionReview)."
        )
    request = review.get("request")
    uid = ""
    if isinstance(request, dict) and isinstance(request.get("uid"), str):
        uid = request["uid"]
    api_version, kind = review.get("apiVersion"), review.get("kind")
    if api_version != API_VERSION or kind != KIND:
        raise MalformedReviewError(
            400,
            f"Expected apiVersion {API_VERSION} kind {KIND}, got apiVersion {api_version!r} "
            f"kind {kind!r}; list v1 in the webhook's admissionReviewVersions.",
            uid,
        )
    if request is None:
        raise MalformedReviewError(400, "The AdmissionReview has no request.")
    if not isinstance(request, dict):
        raise MalformedReviewError(400, "AdmissionReview.request must be an object.")
    if not uid:
        raise MalformedReviewError(400, "AdmissionReview.request.uid must be a non-empty string.")
    where = "request"
    gvk = _field(request, "kind", dict, uid, where)
    obj = request.get("object")
    if obj is not None and not isinstance(obj, dict):
        raise MalformedReviewError(400, "request.object must be an object.", uid)
    return AdmissionRequest(
        uid=uid,
        group=_field(gvk, "group", str, uid, "request.kind"),
        version=_field(gvk, "version", str, uid, "request.kind"),
        kind=_field(gvk, "kind", str, uid, "request.kind"),
        resource=_field(
            _field(request, "resource", dict, uid, where), "resource", str, uid, "request.resource"
        ),
        sub_resource=_field(request, "subResource", str, uid, where),
        operation=_field(request, "operation", str, uid, where),
        namespace=_field(request, "namespace", str, uid, where),
        name=_field(request, "name", str, uid, where),
        dry_run=_field(request, "dryRun", bool, uid, where),
        object=obj,
    )


def clean_warnings(warnings: Sequence[str]) -> list[str]:
    """Warnings as the apiserver wants them: printable, each under 120 characters."""
    cleaned = []
    for warning in warnings[:MAX_WARNINGS]:
        text = "".join(ch if ch.isprintable() else " " for ch in str(warning)).strip()
        if len(text) > MAX_WARNING_LENGTH:
            text = text[: MAX_WARNING_LENGTH - 3].rstrip() + "..."
        if text:
            cleaned.append(text)
    return cleaned


def _envelope(response: dict[str, Any]) -> bytes:
    return orjson.dumps({"apiVersion": API_VERSION, "kind": KIND, "response": response})


def allowed(uid: str, warnings: Sequence[str] = (), outcome: Outcome = Outcome.ALLOWED) -> Reply:
    response: dict[str, Any] = {"uid": uid, "allowed": True}
    if warnings:
        response["warnings"] = clean_warnings(warnings)
    return Reply(200, _envelope(response), outcome, uid)


def patched(uid: str, patch: Sequence[Mapping[str, Any]], warnings: Sequence[str] = ()) -> Reply:
    if not patch:
        return allowed(uid, warnings)
    response: dict[str, Any] = {
        "uid": uid,
        "allowed": True,
        "patchType": "JSONPatch",
        "patch": base64.b64encode(orjson.dumps(patch)).decode("ascii"),
    }
    if warnings:
        response["warnings"] = clean_warnings(warnings)
    return Reply(200, _envelope(response), Outcome.PATCHED, uid, f"{len(patch)} ops")


def denied(uid: str, code: int, reasons: Sequence[str], warnings: Sequence[str] = ()) -> Reply:
    message = " ".join(reasons) or "The pod breaks the GPU-sharing policy."
    response: dict[str, Any] = {
        "uid": uid,
        "allowed": False,
        "status": {
            "status": "Failure",
            "code": code,
            "reason": REASONS_BY_CODE.get(code, "Forbidden"),
            "message": message,
        },
    }
    if warnings:
        response["warnings"] = clean_warnings(warnings)
    return Reply(200, _envelope(response), Outcome.DENIED, uid, message)


def errored(http_status: int, message: str, uid: str = "") -> Reply:
    """An HTTP error whose body is still an AdmissionReview echoing ``uid`` where known."""
    response = {
        "uid": uid,
        "allowed": False,
        "status": {
            "status": "Failure",
            "code": http_status,
            "reason": REASONS_BY_CODE.get(http_status, "InternalError"),
            "message": message,
        },
    }
    outcome = Outcome.REJECTED if http_status < 500 else Outcome.ERROR
    return Reply(http_status, _envelope(response), outcome, uid, message)
