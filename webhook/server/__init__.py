"""The webhook service: AdmissionReview over HTTPS, a Flask app served by gunicorn.

A request takes one path: ``app`` (Flask routes, body cap) → ``instrument`` (metrics and the
admission log line, wrapped around) → ``admission`` (decode once with ``review``, check the
pod's field types with ``pod_shape``, call the core, complete the response) → ``review``'s
one encoder. Around it: ``policy_store`` (hot reload), ``tls`` (certificate reload),
``metrics``, ``settings`` (the ``GPUSHARE_*`` variables), ``gunicorn_conf`` and ``wsgi``
(what gunicorn loads), ``serve`` and ``commands`` (``gpushare serve``/``certs``/
``webhook-config``).

This module imports nothing on purpose: gunicorn imports ``gunicorn_conf`` through it, and
``prometheus_client`` must not be imported before ``PROMETHEUS_MULTIPROC_DIR`` is set.
"""
