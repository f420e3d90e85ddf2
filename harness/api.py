"""Talking to the apiserver where the generated client falls short.

`create_pod()` keeps what the client drops by default: the raw JSON the apiserver stored
and its `Warning` headers. The other helpers read an error's Status message, create a
namespace idempotently and turn a client model back into the API's JSON.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException


@dataclass(frozen=True)
class Admitted:
    """A pod as the apiserver returned it (raw JSON) and the warnings it sent along."""

    pod: dict[str, Any]
    warnings: list[str]


_WARNING = re.compile(r'^\d{3} \S+ "(?P<text>(?:[^"\\]|\\.)*)"')


def parse_warnings(values: Sequence[str]) -> list[str]:
    """Texts of `Warning: 299 - "text"` headers (RFC 7234 warn-code, agent, quoted text)."""
    texts = []
    for value in values:
        match = _WARNING.match(value)
        if match is None:
            raise AssertionError(f"unexpected Warning header: {value!r}")
        texts.append(re.sub(r"\\(.)", r"\1", match.group("text")))
    return texts


def create_pod(
    api: k8s.ApiClient, namespace: str, pod: Mapping[str, Any], *, dry_run: bool = False
) -> Admitted:
    """POST the pod as raw JSON and keep what the client models drop: the body and warnings.

    Goes through the client's own request path (auth, TLS, the urllib3 pool) but not its
    generated `create_namespaced_pod`: since v35 that validates a dict body against pydantic
    models, which refuse JSON the apiserver accepts (a quantity written as the integer 1).
    The models also never surface the apiserver's `Warning` headers (kubectl prints them as
    `Warning: ...` on stderr); the raw response carries them. Non-2xx raises ApiException,
    as the generated method would.
    """
    query: list[tuple[str, str]] = [("dryRun", "All")] if dry_run else []
    method, url, headers, body, post = api.param_serialize(
        "POST",
        "/api/v1/namespaces/{namespace}/pods",
        path_params={"namespace": namespace},
        query_params=query,
        header_params={"Content-Type": "application/json", "Accept": "application/json"},
        body=dict(pod),
        auth_settings=["BearerToken"],
    )
    response = api.call_api(method, url, headers, body, post)
    data: bytes = response.read()  # type: ignore[no-untyped-call]
    if not 200 <= response.status <= 299:
        raise ApiException.from_response(http_resp=response, body=None, data=None)
    return Admitted(json.loads(data), parse_warnings(response.headers.getlist("Warning")))


def status_message(exc: ApiException) -> str:
    """The `message` of the Status the apiserver answered an error with."""
    try:
        status = json.loads(exc.body or "")
    except json.JSONDecodeError:
        return str(exc.body)
    return str(status.get("message", exc.body))


def ensure_namespace(core: k8s.CoreV1Api, name: str) -> None:
    """Create namespace `name` unless it exists (nothing deletes namespaces here)."""
    try:
        core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name)))
    except ApiException as exc:
        if exc.status != 409:
            raise


def as_json(api: k8s.ApiClient, obj: object) -> dict[str, Any]:
    """A client model as the API serves it (camelCase keys, unset fields absent)."""
    data: dict[str, Any] = api.sanitize_for_serialization(obj)  # type: ignore[no-untyped-call]
    return data
