# Strata: the two commands of the README are `make demo` and `make test`; both set up first.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STRATA := $(VENV)/bin/strata

.PHONY: setup test demo compose-test protos lint infra-up infra-down clean

# The virtual environment at .venv/ with Strata installed in editable mode and the dev tools.
setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 10))' || { echo "Python >= 3.10 is required"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $@

test: setup
	$(PY) -m pytest -q

demo: setup
	$(STRATA) demo

# compose.yaml for real on this machine: images built from Debian packages (no registry), podman
# serving the Docker API, the whole stack up on the CPU (compose.cpu.yaml). Root; docs/deploy.md.
compose-test: setup
	$(PY) deploy/compose_check.py

protos: setup
	$(PY) scripts/gen_protos.py

lint: setup
	$(VENV)/bin/ruff check .

infra-up: setup
	$(STRATA) infra up

infra-down: setup
	$(STRATA) infra down

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache *.egg-info
