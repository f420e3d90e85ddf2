"""The real service with the core's decision replaced by a precomputed one (attribution only).

Everything the service does per request runs: TLS, Flask, body cap, AdmissionReview
decoding, the response with its base64 patch, metrics, the JSON log line. Only
``webhook.core.mutate`` is skipped; it returns the outcome computed once for the first
benchmark pod. Run by ``admission_bench.py --attribute`` to split the gap to the floor into
"transport" (this app) and "core" (the rest).
"""

from __future__ import annotations

from typing import Any

from bench.admission_bench import realistic_pods
from webhook.core import PolicySet, Verdict, load_policies, mutate
from webhook.server import admission
from webhook.server.app import create_app_from_settings
from webhook.server.settings import ServeSettings

_settings = ServeSettings.from_environ()
_OUTCOME = mutate(realistic_pods()[0], "ml-team", load_policies(_settings.policies))


def precomputed(pod: Any, namespace: str, policies: PolicySet) -> Verdict:
    return _OUTCOME


admission.CORE_DECISIONS[admission.Endpoint.MUTATE] = precomputed
app = create_app_from_settings(_settings)
