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

.PHONY: run test test-fast test-integrations lint bench install install-dev system-test-deps migrate clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(VENV)/.installed: $(PY) requirements.txt constraints.txt
	$(PY) -m pip install --quiet -r requirements.txt -c constraints.txt
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed requirements-dev.txt
	$(PY) -m pip install --quiet -r requirements-dev.txt -c constraints.txt
	touch $@

# Pipecat and LiveKit Agents pin their own dependencies: they get a virtualenv of their own.
$(INT_PY):
	$(PYTHON) -m venv $(INT_VENV)
	$(INT_PY) -m pip install --quiet --upgrade pip

$(INT_VENV)/.installed: $(INT_PY) integrations/requirements.txt integrations/constraints.txt \
		integrations/pipecat/pyproject.toml integrations/livekit/pyproject.toml
	$(INT_PY) -m pip install --quiet -r integrations/requirements.txt -c integrations/constraints.txt \
		-e integrations/pipecat -e integrations/livekit
	touch $@

# Debian packages the tests use: a real browser for the admin, redis-server for the fault tests,
# nginx for the deployment tier (tests/test_deploy.py).
SYSTEM_TEST_PACKAGES := chromium chromium-driver redis-server nginx
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

system-test-deps:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null && command -v redis-server >/dev/null && \
	  { command -v nginx >/dev/null || [ -x /usr/sbin/nginx ]; } || \
	  { $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $(SYSTEM_TEST_PACKAGES); }

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev system-test-deps

migrate: install
	$(PY) manage.py migrate --noinput

run: migrate
	exec $(PY) manage.py serve --host $(HOST) --port $(PORT)

test: install-dev migrate
	$(PY) manage.py test
	$(MAKE) test-integrations

# The daphne these tests start runs on the server's venv; the frameworks run on their own.
test-integrations: $(VENV)/.installed $(INT_VENV)/.installed
	cd integrations && ../$(INT_PY) -m pytest -q

# The tiers are pytest markers (pytest.ini); tests/conftest.py refuses a module in the wrong tier.
test-fast: $(VENV)/.installed-dev migrate
	$(PY) -m pytest -q -m "not live and not heavy and not deploy"

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

clean:
	rm -rf $(VENV) $(INT_VENV) .pytest_cache .mypy_cache .ruff_cache
