# make run  : venv, install, migrate, then daphne on $(HOST):$(PORT) in the foreground.
# make test : the same set-up, then the whole suite (python manage.py test -> pytest).
# make test-fast: only the in-process tier (no live server, Whisper, browser or deployment), under a minute.
# make lint : ruff (lint) and mypy, configured in pyproject.toml; no network beyond pip.
# make bench: the benchmarks in bench/, which write bench/RESULTS.md.
# make test-integrations: the Pipecat and LiveKit packages (integrations/) inside the real frameworks,
#   in a virtualenv of their own (.venv-integrations), against a live daphne; part of make test.

HOST ?= 127.0.0.1
PORT ?= 8000
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
INT_VENV := .venv-integrations
INT_PY := $(INT_VENV)/bin/python
export HOST PORT

.PHONY: run test test-fast test-integrations lint bench install install-dev system-test-deps test-services check-python migrate clean

# Python 3.11 or newer, checked before anything is installed (a 3.10 fails deep inside pip, on numpy).
# The venv's own interpreter once it exists, else $(PYTHON).
CHECKED_PYTHON = $(if $(wildcard $(PY)),$(PY),$(PYTHON))
check-python:
	@command -v $(CHECKED_PYTHON) >/dev/null 2>&1 || { \
	  echo "$(CHECKED_PYTHON) is not installed: this project needs Python 3.11 or newer (e.g. apt install python3.11 python3.11-venv), then: make $(or $(MAKECMDGOALS),run) PYTHON=python3.11" >&2; exit 1; }
	@$(CHECKED_PYTHON) -c 'import sys; sys.exit(sys.version_info[:2] < (3, 11))' || { \
	  echo "$(CHECKED_PYTHON) is $$($(CHECKED_PYTHON) --version 2>&1); this project needs Python 3.11 or newer. Install one (e.g. apt install python3.11 python3.11-venv) and run: make $(or $(MAKECMDGOALS),run) PYTHON=python3.11" >&2; exit 1; }

$(PY): | check-python
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(VENV)/.installed: $(PY) requirements.txt constraints.txt
	$(PY) -m pip install --quiet -r requirements.txt -c constraints.txt
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed requirements-dev.txt
	$(PY) -m pip install --quiet -r requirements-dev.txt -c constraints.txt
	touch $@

# Pipecat and LiveKit Agents pin their own dependencies: they get a virtualenv of their own.
$(INT_PY): | check-python
	$(PYTHON) -m venv $(INT_VENV)
	$(INT_PY) -m pip install --quiet --upgrade pip

$(INT_VENV)/.installed: $(INT_PY) integrations/requirements.txt integrations/constraints.txt \
		integrations/pipecat/pyproject.toml integrations/livekit/pyproject.toml
	$(INT_PY) -m pip install --quiet -r integrations/requirements.txt -c integrations/constraints.txt \
		-e integrations/pipecat -e integrations/livekit
	touch $@

# Debian packages the tests use (the README lists them): a real browser for the admin and the
# playground, redis-server for the fault tests, nginx and PostgreSQL for the deployment tier
# (tests/test_deploy.py), docker-compose to resolve docker/compose.yaml (tests/test_docker_files.py;
# no Docker engine needed).
SYSTEM_TEST_PACKAGES := chromium chromium-driver redis-server redis-tools nginx postgresql docker-compose
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

system-test-deps:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null && command -v redis-server >/dev/null && \
	  command -v docker-compose >/dev/null && command -v pg_isready >/dev/null && \
	  { command -v nginx >/dev/null || [ -x /usr/sbin/nginx ]; } || \
	  { $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $(SYSTEM_TEST_PACKAGES); }

# Redis and PostgreSQL on their usual local ports, started when they are not answering (.ci/services).
test-services: system-test-deps
	@bash .ci/services

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev test-services

migrate: install
	$(PY) manage.py migrate --noinput

run: check-python migrate
	exec $(PY) manage.py serve --host $(HOST) --port $(PORT)

test: check-python install-dev migrate
	$(PY) manage.py test
	$(MAKE) test-integrations

# The daphne these tests start runs on the server's venv; the frameworks run on their own.
test-integrations: $(VENV)/.installed $(INT_VENV)/.installed
	cd integrations && ../$(INT_PY) -m pytest -q

# The tiers are pytest markers (pytest.ini); tests/conftest.py refuses a module in the wrong tier.
# The in-process tier runs on every core (pytest-xdist); the live tiers do not: their servers need those cores.
test-fast: $(VENV)/.installed-dev migrate
	$(PY) -m pytest -q -n auto -m "not live and not heavy and not deploy"

lint: $(VENV)/.installed-dev
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy

bench: install-dev migrate
	$(PY) bench/ttfa.py --repeat 5
	$(PY) bench/audio_cost.py
	$(PY) bench/cancel.py
	$(PY) bench/upstream.py
	$(PY) bench/throughput.py
	$(PY) bench/handshake.py
	$(PY) bench/timestamps.py

clean:
	rm -rf $(VENV) $(INT_VENV) .pytest_cache .mypy_cache .ruff_cache
