"""The webhook service: AdmissionReview over HTTPS, a WSGI app served by gunicorn.

A request takes one path: ``app`` (routes) → ``instrument`` (metrics and the admission log
line, wrapped around; ``batched_log`` writes the lines) → ``admission`` (``request_body``
reads the body under its cap, ``review`` decodes it once, ``pod_shape`` checks the field
types the core reads, the core decides, the response is completed) → ``review``'s one
encoder. Around it: ``policy_store`` (hot reload), ``tls`` (certificate reload),
``metrics``, ``settings`` (the ``GPUSHARE_*`` variables), ``gunicorn_conf`` and ``wsgi``
(what gunicorn loads), ``serve`` and ``commands`` (``gpushare serve``/``certs``/
``webhook-config``).

This module imports nothing on purpose: gunicorn imports ``gunicorn_conf`` through it, and
``prometheus_client`` must not be imported before ``PROMETHEUS_MULTIPROC_DIR`` is set.
"""
