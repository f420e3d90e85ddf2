# syntax=docker/dockerfile:1
# The gpushare image: the admission webhook (gunicorn serving webhook.server over TLS) by
# default, and `gpushare mps-daemon` / `gpushare certs` with another command.
#
#   docker build -t gpushare:0.1.0 .                  # stock python slim base (a registry)
#   scripts/image                                     # no registry: a base from the Debian
#                                                     # mirror, built with buildah (docs/deploying.md)
#   docker run --rm -p 8443:8443 -v "$PWD/certs:/etc/gpushare/tls:ro" gpushare:0.1.0
#
# BASE is any image with a Python 3.11+ interpreter as `python3` that has the venv module
# (python:3.11-slim-bookworm, or Debian with python3 and python3-venv). Both stages use it:
# the virtual environment built in the first is copied into the second, and its interpreter
# link must point at the same python3 there.
#
# Settings are GPUSHARE_* variables (webhook/server/settings.py), the same ones
# `gpushare serve` passes to gunicorn. Mount the TLS Secret (tls.crt, tls.key) at
# /etc/gpushare/tls and, to replace the bundled policies, a ConfigMap at
# /etc/gpushare/policies; both are reloaded when Kubernetes updates the mount.
# With readOnlyRootFilesystem, mount an emptyDir at /tmp (Prometheus multiprocess files and
# the workers' shared last-good policies).

# Fully qualified: buildah and podman refuse or ask about short names, depending on their
# registries.conf.
ARG BASE=docker.io/library/python:3.11-slim-bookworm

# The dependencies: a virtual environment in a stage of its own, so a source change
# rebuilds in seconds (buildah bud --layers, docker build) instead of downloading them again
# and copying them into the image anew. Every one ships binary wheels for linux
# amd64/arm64: no compiler in any stage, and pip fails loudly if that ever changes.
FROM ${BASE} AS dependencies
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
RUN python3 -m venv /opt/gpushare
WORKDIR /src
COPY pyproject.toml ./
RUN python3 -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))' > /tmp/requirements.txt \
    && /opt/gpushare/bin/pip install --only-binary=:all: --requirement /tmp/requirements.txt

# The project, installed under its own prefix (bin/, lib/pythonX.Y/site-packages/) so the
# image takes just its files; scripts point at /opt/gpushare/bin/python.
FROM dependencies AS project
COPY README.md ./
COPY webhook ./webhook
RUN /opt/gpushare/bin/pip install --no-deps --prefix /opt/project .

# What the image runs: the dependencies without the installers.
FROM dependencies AS runtime
RUN /opt/gpushare/bin/python -m pip uninstall --yes --quiet pip setuptools

FROM ${BASE}
COPY --from=runtime /opt/gpushare /opt/gpushare
COPY --from=project /opt/project/ /opt/gpushare/
COPY policies/ /etc/gpushare/policies/

# MALLOC_ARENA_MAX: glibc's per-thread heaps would keep a large request's memory spread
# out after it is done (webhook/cli/serve.py sets the same for `gpushare serve`).
ENV PATH=/opt/gpushare/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    GPUSHARE_HOST=0.0.0.0 \
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
