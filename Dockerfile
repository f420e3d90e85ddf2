# syntax=docker/dockerfile:1
# The gpushare admission webhook: gunicorn serving webhook.server over TLS.
#
#   docker build -t gpushare .
#   docker run --rm -p 8443:8443 -v "$PWD/certs:/etc/gpushare/tls:ro" gpushare
#
# Settings are GPUSHARE_* variables (webhook/server/settings.py), the same ones
# `gpushare serve` passes to gunicorn. Mount the TLS Secret (tls.crt, tls.key) at
# /etc/gpushare/tls and, to replace the bundled policies, a ConfigMap at
# /etc/gpushare/policies; both are reloaded when Kubernetes updates the mount.
# With readOnlyRootFilesystem, mount an emptyDir at /tmp (Prometheus multiprocess files).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY webhook ./webhook
# Every dependency ships binary wheels for linux amd64/arm64, so no compiler is needed
# here either; `pip wheel` fails loudly if that ever changes.
RUN pip wheel --wheel-dir /wheels --only-binary=:all: .

FROM ${PYTHON_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    pip install --no-index --find-links=/wheels gpushare \
    && mkdir -p /etc/gpushare/tls
COPY policies/ /etc/gpushare/policies/

# MALLOC_ARENA_MAX: glibc's per-thread heaps would keep a large request's memory spread
# out after it is done (webhook/server/serve.py sets the same for `gpushare serve`).
ENV GPUSHARE_HOST=0.0.0.0 \
    GPUSHARE_PORT=8443 \
    GPUSHARE_TLS_CERT=/etc/gpushare/tls/tls.crt \
    GPUSHARE_TLS_KEY=/etc/gpushare/tls/tls.key \
    GPUSHARE_POLICIES=/etc/gpushare/policies \
    GPUSHARE_WORKERS=2 \
    PROMETHEUS_MULTIPROC_DIR=/tmp/gpushare-metrics \
    MALLOC_ARENA_MAX=2

# Numeric, so runAsNonRoot can verify it without an /etc/passwd entry.
USER 65532:65532
EXPOSE 8443
# gunicorn drains in-flight requests on SIGTERM (GPUSHARE_GRACEFUL_TIMEOUT_SECONDS).
STOPSIGNAL SIGTERM
ENTRYPOINT ["gunicorn", "--config", "python:webhook.server.gunicorn_conf", "webhook.server.wsgi:app"]
