"""The edge of the ``dra`` sharing mode: the ResourceClaimTemplates its pods name.

A mutating webhook must not create objects, and templates are namespaced, so the templates
the ``dra`` mode's pods reference are made outside admission: printed as manifests
(``gpushare dra-templates --namespace ...``) or kept in every matching namespace by the
reconciler here (``gpushare dra-templates --apply [--watch]``, with its probes and metrics in
``status``). It needs the Kubernetes client (``gpushare[cluster]``). Which templates a namespace
needs, and what each holds, is decided by the pure core (``namespace_templates``), the same
code the webhook names them with. docs/dra.md says why both exist.

This is the package's face: other packages import only the names below. Layout:
docs/architecture.md.
"""

from webhook.dra.reconciler import PassResult, TemplateApi, TemplateReconciler, run
from webhook.dra.status import DEFAULT_LISTEN_PORT, ReconcilerStatus, StatusServer, parse_listen

__all__ = [
    "DEFAULT_LISTEN_PORT",
    "PassResult",
    "ReconcilerStatus",
    "StatusServer",
    "TemplateApi",
    "TemplateReconciler",
    "parse_listen",
    "run",
]
