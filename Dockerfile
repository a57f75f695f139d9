# syntax=docker/dockerfile:1
#
# One image for every metagpu entry point: `metagpu webhook | device-plugin |
# agent | certs | mutate` and `mgctl`. Build it with `make image` (needs a
# container engine; see docs/install.md).
#
# The base is pinned by its full tag (Python patch release + Debian release),
# not by digest: a digest cannot be resolved or checked on the machines this
# repository is built and tested on (no registry access). Pin the digest in
# your own build pipeline (e.g. Renovate's docker digest pinning) if your
# policy requires it; the tag keeps the Dockerfile readable and reviewable.
ARG PYTHON_IMAGE=python:3.11.14-slim-trixie

# ---------------------------------------------------------------- build stage
# Builds the metagpu wheel and installs it with its dependencies, pinned by
# constraints.txt, into /install (a --prefix tree). Everything this stage needs
# to build (pip's build backend, caches, the source tree) stays here.
FROM ${PYTHON_IMAGE} AS build

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1

WORKDIR /src
# Metadata first, so a source change does not invalidate anything before it.
COPY pyproject.toml constraints.txt README.md ./
COPY plugin/ plugin/
COPY webhook/ webhook/
COPY certs/ certs/
COPY metagpu/ metagpu/

# The wheel is built once, then installed from the local wheel directory; every
# dependency comes from PyPI as a binary wheel (--only-binary), so no compiler
# is needed and none is installed.
RUN pip wheel --no-deps --wheel-dir /wheels . \
 && pip install --prefix=/install --no-warn-script-location \
        --only-binary=:all: --constraint constraints.txt /wheels/metagpu-*.whl

# ---------------------------------------------------------------- final stage
FROM ${PYTHON_IMAGE}

# Re-declared to read the global default inside this stage (for the base label).
ARG PYTHON_IMAGE
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="metagpu" \
      org.opencontainers.image.description="Fractional GPU sharing for Kubernetes: admission webhook, device plugin, node agent and mgctl" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="https://github.com/metagpu/metagpu" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="${PYTHON_IMAGE}"

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1

# Only the installed tree: no source, no wheels, no build backend. The .pyc files
# pip compiled at install time come along, so a read-only root filesystem costs
# nothing at start-up.
COPY --from=build /install /usr/local

# The base image's pip, setuptools and wheel are installers and build tools that
# nothing in the running image uses; removing them leaves less to patch and less
# to misuse. (pip reports "not installed" for any the base no longer ships.)
# A fixed numeric UID/GID (65532, the "nonroot" convention), so Kubernetes can
# verify runAsNonRoot without an /etc/passwd lookup. The device plugin and agent
# override it with runAsUser: 0 in their pod spec (they write kubelet dirs).
RUN python -m pip uninstall --yes pip setuptools wheel \
 && groupadd --system --gid 65532 metagpu \
 && useradd --system --uid 65532 --gid 65532 --no-create-home \
        --home-dir /nonexistent --shell /usr/sbin/nologin metagpu
USER 65532:65532

ENTRYPOINT ["metagpu"]
CMD ["--help"]
