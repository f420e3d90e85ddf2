"""The webhook service: AdmissionReview over HTTPS, served by gunicorn.

``review`` (the wire format), ``pod_shape`` (field types the core relies on), ``admission``
(scope rules, core call), ``request_body`` (capped reads), ``app`` (Flask routes, health,
metrics), ``policy_store`` (hot reload), ``tls`` (certificate reload), ``metrics``,
``json_logs``, ``settings`` (GPUSHARE_* variables), ``gunicorn_conf`` and ``wsgi`` (what
gunicorn loads), ``serve`` and ``commands`` (the ``gpushare serve``/``certs``/
``webhook-config`` commands).

This module imports nothing on purpose: gunicorn imports ``gunicorn_conf`` through it, and
``prometheus_client`` must not be imported before ``PROMETHEUS_MULTIPROC_DIR`` is set.
"""
