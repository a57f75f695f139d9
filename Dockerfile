# syntax=docker/dockerfile:1
#
# One image for every metagpu entry point: `metagpu webhook | device-plugin |
# agent | certs | mutate` and `mgctl`. Build it with `make image` (Docker,
# Podman or buildah; see docs/install.md, "Building the image").
#
# The base is pinned by its full tag (Python patch release + Debian release),
# not by digest: a digest cannot be resolved or checked on the machines this
# repository is built and tested on (no registry access). Pin the digest in
# your own build pipeline (e.g. Renovate's docker digest pinning) if your
# policy requires it; the tag keeps the Dockerfile readable and reviewable.
#
# Any Debian-style Python 3.11+ image with python3 -m venv works as the base:
# `make image` on a machine without registry access builds one from Debian's
# packages (scripts/image_base.sh) and passes it as PYTHON_IMAGE. Nothing below
# relies on the official image's layout: everything metagpu installs lives in
# its own virtual environment, /opt/metagpu/venv, whatever the base's Python
# prefix (/usr/local or /usr) and whether or not it is marked EXTERNALLY-MANAGED.
ARG PYTHON_IMAGE=python:3.11.14-slim-trixie

# ---------------------------------------------------------------- build stage
# Builds the metagpu wheel and installs it with its dependencies, pinned by
# constraints.txt, into the virtual environment. Everything this stage needs
# to build (pip's build backend, caches, the source tree) stays here.
FROM ${PYTHON_IMAGE} AS build

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_ROOT_USER_ACTION=ignore \
    VIRTUAL_ENV=/opt/metagpu/venv
ENV PATH=${VIRTUAL_ENV}/bin:${PATH}

WORKDIR /src
RUN python3 -m venv "${VIRTUAL_ENV}"

# Dependencies first, from the metadata alone, so a change of source reuses
# this (largest) layer. Every dependency comes from PyPI as a binary wheel
# (--only-binary), so no compiler is needed and none is installed.
# pip trusts the certifi bundle it ships; behind a TLS-intercepting proxy pass
# the proxy's CA as the optional build secret `pip-ca` (make image passes the
# host's bundle). A secret is mounted for one step and never lands in a layer.
COPY pyproject.toml constraints.txt ./
RUN --mount=type=secret,id=pip-ca \
    if [ -s /run/secrets/pip-ca ]; then export PIP_CERT=/run/secrets/pip-ca; fi \
 && python3 -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" > requirements.txt \
 && python3 -m pip install --only-binary=:all: --constraint constraints.txt --requirement requirements.txt

# The source: whatever .dockerignore lets through (its allow-list names the
# packages, in one place). The wheel is built once, then installed without
# touching its (already installed) dependencies. pip, setuptools and wheel
# leave the environment afterwards: nothing in the running image installs.
COPY . .
RUN --mount=type=secret,id=pip-ca \
    if [ -s /run/secrets/pip-ca ]; then export PIP_CERT=/run/secrets/pip-ca; fi \
 && python3 -m pip wheel --no-deps --wheel-dir /wheels . \
 && python3 -m pip install --no-deps /wheels/metagpu-*.whl \
 && python3 -m pip check \
 && python3 -m pip uninstall --yes pip setuptools wheel

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
    PYTHONUNBUFFERED=1 \
    PATH=/opt/metagpu/venv/bin:${PATH}

# The base image's own pip, setuptools and wheel (the official image has them,
# Debian's python3 does not) are installers and build tools that nothing in the
# running image uses; removing them leaves less to patch and less to misuse.
# A fixed numeric UID/GID (65532, the "nonroot" convention), so Kubernetes can
# verify runAsNonRoot without an /etc/passwd lookup. The device plugin and agent
# override it with runAsUser: 0 in their pod spec (they write kubelet dirs).
# This layer depends on the base alone, so it is reused across source changes.
RUN if python3 -m pip --version >/dev/null 2>&1; then \
        python3 -m pip uninstall --yes pip setuptools wheel; \
    fi \
 && groupadd --system --gid 65532 metagpu \
 && useradd --system --uid 65532 --gid 65532 --no-create-home \
        --home-dir /nonexistent --shell /usr/sbin/nologin metagpu

# Only the virtual environment: no source, no wheels, no build backend, no pip.
# The .pyc files pip compiled at install time come along, so a read-only root
# filesystem costs nothing at start-up. Its python3 links to the base's
# interpreter at the same path as in the build stage (same base).
COPY --from=build /opt/metagpu/venv /opt/metagpu/venv
USER 65532:65532

ENTRYPOINT ["metagpu"]
CMD ["--help"]
