# syntax=docker/dockerfile:1
# The gpushare images, two targets of one Dockerfile:
#
#   admission (the default, the last stage)  the admission webhook: gunicorn serving
#       webhook.server over TLS. Without the Kubernetes client: the service never talks to
#       the API (its pods mount no token), and the client is 126 MB of the image.
#   cluster  the same plus the Kubernetes client (the extra gpushare[cluster]), for the
#       commands that talk to the API: `gpushare certs --in-cluster` (the chart's certgen
#       Jobs), `dra-templates --apply --watch`, `share-capacity`, `mps-daemon`. Its
#       ENTRYPOINT is `gpushare`; the manifests name the command.
#
#   docker build -t gpushare:0.1.0 .                              # stock base (a registry)
#   docker build --target cluster -t gpushare-cluster:0.1.0 .
#   scripts/image [--cluster]                  # no registry: a base from the Debian mirror,
#                                              # built with buildah (docs/deploying.md)
#   docker run --rm -p 8443:8443 -v "$PWD/certs:/etc/gpushare/tls:ro" gpushare:0.1.0
#
# Both architectures, amd64 and arm64 (Grace Hopper nodes run the MPS daemon), as one
# manifest list per image; nothing here is specific to either: the base is a multi-arch
# index, and every dependency is a binary wheel for both (pip refuses to compile). On an
# amd64 builder the arm64 RUN steps run under qemu-user-static (binfmt_misc):
#
#   buildah build --platform linux/amd64,linux/arm64 --manifest gpushare:0.1.0 .
#   buildah build --platform linux/amd64,linux/arm64 --target cluster \
#       --manifest gpushare-cluster:0.1.0 .
#   buildah manifest push --all gpushare:0.1.0 docker://registry.example.com/gpushare:0.1.0
#
# BASE is any image with a Python 3.11+ interpreter as `python3` that has the venv module
# (python:3.11-slim-bookworm, or Debian with python3 and python3-venv). Every stage uses it:
# the virtual environment built in the first is copied into the last, and its interpreter
# link must point at the same python3 there. It is pinned by digest, so a rebuild gets the
# same base whatever the tag points at later: the digest of the multi-arch index (each
# platform's image is resolved from it). Refresh it deliberately, for security updates:
#   skopeo inspect --raw docker://docker.io/library/python:3.11-slim-bookworm | sha256sum
# (or `crane digest`, `docker buildx imagetools inspect`). scripts/image passes the base it
# builds from the Debian mirror by its image ID, the digest of its configuration.
#
# Settings are GPUSHARE_* variables (webhook/server/settings.py), the same ones
# `gpushare serve` passes to gunicorn. Mount the TLS Secret (tls.crt, tls.key) at
# /etc/gpushare/tls and, to replace the bundled policies, a ConfigMap at
# /etc/gpushare/policies; both are reloaded when Kubernetes updates the mount.
# With readOnlyRootFilesystem, mount an emptyDir at /tmp (Prometheus multiprocess files and
# the workers' shared last-good policies).
#
# The base's shell (/bin/sh) stays: nothing in the pods uses it (the preStop hook is the
# kubelet's sleep action, probes are HTTP), but removing it from a Debian base is not
# something this file pretends to do. Its pip does not stay (the last stages remove it).

# Fully qualified: buildah and podman refuse or ask about short names, depending on their
# registries.conf.
ARG BASE=docker.io/library/python:3.11-slim-bookworm@sha256:2e32f7d302adc1c37428355c1e646897c0c53f4fd60b6a551245fb90ee129f91

# The dependencies: a virtual environment in a stage of its own, so a source change
# rebuilds in seconds (buildah bud --layers, docker build) instead of downloading them again
# and copying them into the image anew. Every one ships binary wheels for linux
# amd64/arm64: no compiler in any stage, and pip fails loudly if that ever changes.
# The admission service's: [project] dependencies of pyproject.toml, no extra.
FROM ${BASE} AS dependencies
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
RUN python3 -m venv /opt/gpushare
WORKDIR /src
COPY pyproject.toml ./
RUN python3 -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))' > /tmp/requirements.txt \
    && /opt/gpushare/bin/pip install --only-binary=:all: --requirement /tmp/requirements.txt

# ... and the extra `cluster` on top: the Kubernetes client.
FROM dependencies AS cluster-dependencies
RUN python3 -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["cluster"]))' > /tmp/cluster.txt \
    && /opt/gpushare/bin/pip install --only-binary=:all: --requirement /tmp/requirements.txt --requirement /tmp/cluster.txt

# The project, installed under its own prefix (bin/, lib/pythonX.Y/site-packages/) so the
# images take just its files; scripts point at /opt/gpushare/bin/python.
FROM dependencies AS project
COPY README.md ./
COPY webhook ./webhook
RUN /opt/gpushare/bin/pip install --no-deps --prefix /opt/project .

# What the images run: the dependencies without the installers.
FROM dependencies AS runtime
RUN /opt/gpushare/bin/python -m pip uninstall --yes --quiet pip setuptools

FROM cluster-dependencies AS cluster-runtime
RUN /opt/gpushare/bin/python -m pip uninstall --yes --quiet pip setuptools

# What both images share: the base without its own installer (the stock python image
# carries pip, setuptools and wheel in /usr/local; a Debian base has none, or Debian's,
# which is removed the same way), then the settings.
FROM ${BASE} AS image
RUN if python3 -c 'import pip' 2>/dev/null; then \
        python3 -m pip uninstall --yes --quiet --break-system-packages pip setuptools wheel; \
    fi
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
# Numeric, so runAsNonRoot can verify it without an /etc/passwd entry. (The MPS daemon's
# DaemonSet runs it as root: it needs CAP_SYS_ADMIN for the GPUs' compute mode.)
USER 65532:65532
STOPSIGNAL SIGTERM

# The cluster image: certgen Jobs, the DRA template reconciler, share-capacity, the MPS
# daemon. Each manifest names its command (`gpushare certs --in-cluster ...`).
FROM image AS cluster
COPY --from=cluster-runtime /opt/gpushare /opt/gpushare
COPY --from=project /opt/project/ /opt/gpushare/
COPY policies/ /etc/gpushare/policies/
ENTRYPOINT ["gpushare"]
CMD ["--help"]

# The admission image (the default target): the webhook, and the offline commands
# (`gpushare serve`, `webhook-config`, `certs --out`, `mutate`, ...).
FROM image AS admission
COPY --from=runtime /opt/gpushare /opt/gpushare
COPY --from=project /opt/project/ /opt/gpushare/
COPY policies/ /etc/gpushare/policies/
EXPOSE 8443
# gunicorn drains in-flight requests on SIGTERM (GPUSHARE_GRACEFUL_TIMEOUT_SECONDS).
ENTRYPOINT ["gunicorn", "--config", "python:webhook.server.gunicorn_conf", "webhook.server.wsgi:app"]
