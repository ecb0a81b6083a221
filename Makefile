# make demo | make test | make bench: each sets up .venv (and system packages) first.
SHELL := /bin/bash
.DEFAULT_GOAL := venv

VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
# Re-install only when the package description, the native sources or the set of Python files
# change (the editable install maps the files it saw; a folder's mtime changes when one is added).
STAMP := $(VENV)/.cuvil-installed
NATIVE := $(shell find native -type f 2>/dev/null)
PKG_DIRS := $(shell find cuvil cuvil_explorer -type d -not -name __pycache__ 2>/dev/null)
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)

.PHONY: venv sysdeps demo test bench

venv: $(STAMP)

$(PY):
	python3 -m venv $(VENV)

# torch first and exactly 2.13.0 (a CPU build on this machine's disk; any other version
# downloads gigabytes); then the build backend, so the editable install builds without isolation
# and keeps its CMake tree in build/ between installs.
$(STAMP): pyproject.toml $(NATIVE) $(PKG_DIRS) | $(PY)
	$(PIP) install torch==2.13.0
	$(PY) -c "import tomllib; print('\\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['build-system']['requires']))" \
	  | xargs -d '\n' $(PIP) install cmake ninja
	$(PIP) install --no-build-isolation -e '.[test,explorer,bench]'
	# jsonschema builds a lark grammar at import when rfc3987-syntax is present: ~5 s per Jupyter process
	$(PIP) uninstall -y rfc3987-syntax lark
	touch $@

# graphviz's dot (explorer graphs), Chromium (browser tests) and a C++ compiler (native build).
sysdeps:
	@missing=""; \
	command -v dot >/dev/null || missing="$$missing graphviz"; \
	[ -x /usr/bin/chromium ] || missing="$$missing chromium"; \
	command -v g++ >/dev/null || missing="$$missing g++"; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  $(SUDO) apt-get update && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y $$missing; \
	fi

demo: sysdeps venv
	$(PY) -m cuvil.demo

# Runs every suite even when an earlier one fails; fails if any did.
test: sysdeps venv
	@status=0; \
	$(PY) -m pytest tests --cov=cuvil --cov-report=term || status=$$?; \
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/lit -v tests/filecheck || status=$$?; \
	exit $$status

bench: venv
	$(PY) -m benchmarks.run
	$(PY) -m benchmarks.gemm_efficiency
	$(PY) -m benchmarks.explorer_cell
	$(PY) -m benchmarks.compile_time
	$(PY) -m benchmarks.decode
	$(PY) -m benchmarks.generate
