"""The webhook service: AdmissionReview over HTTPS, a WSGI app served by gunicorn.

This is the package's face: other packages import only the names in ``__all__``. Layout:
docs/architecture.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

# This module imports nothing when it runs, on purpose: gunicorn imports ``gunicorn_conf``
# through it, and ``prometheus_client`` must not be imported before gunicorn_conf has set
# ``PROMETHEUS_MULTIPROC_DIR``. So the names below are looked up only when first asked for
# (PEP 562, module ``__getattr__``), each from the module that defines it; the imports under
# TYPE_CHECKING give type checkers the same names and never run.
if TYPE_CHECKING:
    from webhook.server.settings import (
        DEFAULT_HOST,
        ENV_PREFIX,
        ServeSettings,
        SettingsError,
        environ_settings,
    )
    from webhook.server.tls import build_server_context

# What gunicorn loads, as `gpushare serve` and the container image name it.
GUNICORN_CONFIG = "python:webhook.server.gunicorn_conf"
WSGI_APP = "webhook.server.wsgi:app"

_LAZY = {
    "DEFAULT_HOST": "webhook.server.settings",
    "ENV_PREFIX": "webhook.server.settings",
    "ServeSettings": "webhook.server.settings",
    "SettingsError": "webhook.server.settings",
    "environ_settings": "webhook.server.settings",
    "build_server_context": "webhook.server.tls",
}

__all__ = [
    "DEFAULT_HOST",
    "ENV_PREFIX",
    "GUNICORN_CONFIG",
    "WSGI_APP",
    "ServeSettings",
    "SettingsError",
    "build_server_context",
    "environ_settings",
]


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:  # a submodule not imported yet, or no such name
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
