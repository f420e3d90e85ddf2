"""The edge of the ``dra`` sharing mode: the ResourceClaimTemplates its pods name.

A mutating webhook must not create objects, and templates are namespaced, so the templates
the ``dra`` mode's pods reference are made here, outside admission: printed as manifests
(``gpushare dra-templates --namespace ...``) or kept in every matching namespace by the
reconciler (``gpushare dra-templates --apply [--watch]``). Which templates a namespace
needs, and what each holds, is decided by the pure core (``webhook.core.modes.dra``), the
same code the webhook names them with. docs/dra.md says why both exist.
"""
