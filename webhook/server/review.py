"""AdmissionReview v1 on the wire: decode a request once, encode every answer one way.

Owns the envelope rules of admission.k8s.io/v1: the response echoes ``request.uid`` and
``apiVersion``/``kind`` on every path, errors included; ``patch`` and ``patchType`` come
together or not at all; warnings stay under 120 characters.

Every answer is one ``AdmissionResponse``, built by four named constructors as in
controller-runtime's admission package: ``allowed`` (no change), ``patched`` (allowed with a
JSON Patch), ``denied`` (HTTP 200 with ``allowed: false``: a policy violation, which rejects
the pod whatever the failurePolicy) and ``errored`` (HTTP 4xx/5xx: the apiserver counts a
failed call and its failurePolicy decides). ``complete`` fills in what comes from the request
(the uid) in one place, and ``encode_review`` is the one encoder.
"""

from __future__ import annotations

import binascii
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
    404: "NotFound",
    405: "MethodNotAllowed",
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


# Slotted, not frozen: both are built on every admission, where frozen dataclasses cost
# several times more to construct. Treat them as immutable all the same.
@dataclass(slots=True)
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
    # The stored object an UPDATE replaces (workload templates: was the template touched?).
    old_object: Mapping[str, Any] | None = None

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
        metadata = self.object.get("metadata") if self.object else None
        if type(metadata) is dict:
            for key in ("name", "generateName"):
                value = metadata.get(key)
                if type(value) is str and value:
                    return value
        return ""


class MalformedReviewError(Exception):
    """The body is not a usable AdmissionReview; becomes a 4xx ``errored`` response."""

    def __init__(self, http_status: int, message: str, uid: str = "") -> None:
        super().__init__(message)
        self.http_status = http_status
        self.message = message
        self.uid = uid


def _string(mapping: dict[str, Any], key: str, uid: str, where: str) -> str:
    value = mapping.get(key)
    if type(value) is str:
        return value
    if value is None:
        return ""
    raise MalformedReviewError(
        400, f"{where}.{key} must be a string, not {_type_name(value)}.", uid
    )


def _object(mapping: dict[str, Any], key: str, uid: str, where: str) -> dict[str, Any]:
    value = mapping.get(key)
    if type(value) is dict:
        return value
    if value is None:
        return {}
    raise MalformedReviewError(
        400, f"{where}.{key} must be an object, not {_type_name(value)}.", uid
    )


def _type_name(value: Any) -> str:
    kind = type(value)
    return {dict: "object", str: "string", bool: "boolean", list: "array"}.get(kind, kind.__name__)


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        review = orjson.loads(body)
    except orjson.JSONDecodeError as error:
        if not body.strip():
            raise MalformedReviewError(
                400, "The request body is empty; send an admission.k8s.io/v1 AdmissionReview."
            ) from None
        raise MalformedReviewError(400, f"The request body is not valid JSON: {error}.") from None
    if type(review) is not dict:
        raise MalformedReviewError(
            400, "The request body must be a JSON object (an AdmissionReview)."
        )
    return review


def decode_review(body: bytes) -> AdmissionRequest:
    """Parse an AdmissionReview v1 body, or raise ``MalformedReviewError`` saying what is wrong.

    Runs on every admission: the checks are written for the well-formed case to cost next to
    nothing on top of ``orjson.loads`` (no per-field helpers beyond a type test).
    """
    review = _json_object(body)
    request = review.get("request")
    uid = request.get("uid") if type(request) is dict else None
    if type(uid) is not str:
        uid = ""
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
    if type(request) is not dict:
        raise MalformedReviewError(400, "AdmissionReview.request must be an object.")
    if not uid:
        raise MalformedReviewError(400, "AdmissionReview.request.uid must be a non-empty string.")
    gvk = _object(request, "kind", uid, "request")
    resource = _object(request, "resource", uid, "request")
    obj, old = request.get("object"), request.get("oldObject")
    for key, value in (("object", obj), ("oldObject", old)):
        if value is not None and type(value) is not dict:
            raise MalformedReviewError(400, f"request.{key} must be an object.", uid)
    dry_run = request.get("dryRun")
    if dry_run is not None and type(dry_run) is not bool:
        raise MalformedReviewError(
            400, f"request.dryRun must be a boolean, not {_type_name(dry_run)}.", uid
        )
    return AdmissionRequest(
        uid,
        _string(gvk, "group", uid, "request.kind"),
        _string(gvk, "version", uid, "request.kind"),
        _string(gvk, "kind", uid, "request.kind"),
        _string(resource, "resource", uid, "request.resource"),
        _string(request, "subResource", uid, "request"),
        _string(request, "operation", uid, "request"),
        _string(request, "namespace", uid, "request"),
        _string(request, "name", uid, "request"),
        dry_run is True,
        obj,
        old,
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


@dataclass(slots=True)
class AdmissionResponse:
    """The one answer type: what the handler decided plus what HTTP, metrics and logs need.

    ``request`` and ``uid`` are set by ``complete``; ``policy`` names the policy that decided,
    for the admission log; ``milli_gpus`` is the share a patched pod holds in thousandths of a
    GPU, where its policy counts shares (the applied record's ``milliGpus``), for the
    per-namespace showback counter.
    """

    allowed: bool
    outcome: Outcome
    http_status: int = 200
    patch: Sequence[Mapping[str, Any]] = ()
    warnings: Sequence[str] = ()
    code: int = 200
    message: str = ""
    policy: str | None = None
    uid: str = ""
    request: AdmissionRequest | None = None
    milli_gpus: int | None = None

    def complete(self, request: AdmissionRequest | None, uid: str = "") -> AdmissionResponse:
        """Tie the response to its request: the uid every AdmissionReview answer echoes."""
        self.request = request
        self.uid = request.uid if request is not None else uid
        return self

    @property
    def detail(self) -> str:
        """What the admission log says besides the outcome."""
        return f"{len(self.patch)} ops" if self.patch else self.message


def allowed(
    warnings: Sequence[str] = (), *, outcome: Outcome = Outcome.ALLOWED, policy: str | None = None
) -> AdmissionResponse:
    return AdmissionResponse(True, outcome, warnings=warnings, policy=policy)


def patched(
    patch: Sequence[Mapping[str, Any]],
    warnings: Sequence[str] = (),
    policy: str | None = None,
    *,
    milli_gpus: int | None = None,
) -> AdmissionResponse:
    if not patch:
        return allowed(warnings, policy=policy)
    return AdmissionResponse(
        True,
        Outcome.PATCHED,
        patch=patch,
        warnings=warnings,
        policy=policy,
        milli_gpus=milli_gpus,
    )


def denied(
    code: int, reasons: Sequence[str], warnings: Sequence[str] = (), policy: str | None = None
) -> AdmissionResponse:
    message = " ".join(reasons) or "The pod breaks the GPU-sharing policy."
    return AdmissionResponse(
        False, Outcome.DENIED, code=code, message=message, warnings=warnings, policy=policy
    )


def errored(http_status: int, message: str) -> AdmissionResponse:
    """An HTTP error whose body is still an AdmissionReview (echoing the uid where known)."""
    outcome = Outcome.REJECTED if http_status < 500 else Outcome.ERROR
    return AdmissionResponse(
        False, outcome, http_status=http_status, code=http_status, message=message
    )


def encode_review(response: AdmissionResponse) -> bytes:
    """The AdmissionReview body for ``response``: the only place answers are serialized."""
    body: dict[str, Any] = {"uid": response.uid, "allowed": response.allowed}
    if response.patch:
        body["patchType"] = "JSONPatch"
        body["patch"] = binascii.b2a_base64(orjson.dumps(response.patch), newline=False).decode()
    if not response.allowed:
        body["status"] = {
            "status": "Failure",
            "code": response.code,
            "reason": REASONS_BY_CODE.get(
                response.code, "Forbidden" if response.http_status < 400 else "InternalError"
            ),
            "message": response.message,
        }
    if response.warnings:
        body["warnings"] = clean_warnings(response.warnings)
    return orjson.dumps({"apiVersion": API_VERSION, "kind": KIND, "response": body})
