"""Arbitrary input never escapes the envelope: every answer is JSON echoing what it can."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from werkzeug.test import Client

from webhook.policy_store import PolicyStore
from webhook.server.app import WebhookApp, create_app

from .support import BUNDLED_POLICIES, annotated_pod, review

# One app for all examples: hypothesis reruns the test body, not function-scoped fixtures.
APP: WebhookApp = create_app(PolicyStore.loaded(BUNDLED_POLICIES))

JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=20,
)
POD_KEYS = st.sampled_from(
    ["metadata", "spec", "annotations", "containers", "resources", "limits", "env", "name"]
)


def mangled(value: Any, data: st.DataObject) -> Any:
    """The pod with one value somewhere replaced by arbitrary JSON."""
    if isinstance(value, dict) and value and data.draw(st.booleans()):
        key = data.draw(st.sampled_from(sorted(value)))
        return {**value, key: mangled(value[key], data)}
    if isinstance(value, list) and value and data.draw(st.booleans()):
        index = data.draw(st.integers(0, len(value) - 1))
        return [*value[:index], mangled(value[index], data), *value[index + 1 :]]
    return data.draw(JSON_VALUES)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_mangled_pods_get_an_enveloped_answer(data: st.DataObject) -> None:
    payload = review(mangled(annotated_pod(), data), uid="fuzz")
    for path in ("/mutate", "/validate"):
        response = Client(APP).post(path, json=payload)
        assert response.status_code in (200, 400), response.get_data(as_text=True)
        body = response.get_json()
        assert body["apiVersion"] == "admission.k8s.io/v1"
        assert body["response"]["uid"] == "fuzz"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    request=st.dictionaries(
        st.sampled_from(["uid", "kind", "object", "operation", "namespace", "dryRun", "resource"]),
        JSON_VALUES,
    )
)
def test_arbitrary_requests_get_a_clean_answer(request: dict[str, Any]) -> None:
    payload = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    response = Client(APP).post(
        "/mutate", data=json.dumps(payload), content_type="application/json"
    )
    assert response.status_code in (200, 400)
    assert response.get_json()["apiVersion"] == "admission.k8s.io/v1"
