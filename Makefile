# make run  : venv, install, migrate, then daphne on $(HOST):$(PORT) in the foreground.
# make test : the same set-up, then the whole suite (python manage.py test -> pytest).
# make bench: the benchmarks in bench/, which write bench/RESULTS.md.

HOST ?= 127.0.0.1
PORT ?= 8000
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
export HOST PORT

.PHONY: run test bench install install-dev system-test-deps migrate clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(VENV)/.installed: $(PY) requirements.txt constraints.txt
	$(PY) -m pip install --quiet -r requirements.txt -c constraints.txt
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed requirements-dev.txt
	$(PY) -m pip install --quiet -r requirements-dev.txt -c constraints.txt
	touch $@

# Debian packages the tests use: a real browser for the admin, redis-server for the fault tests.
SYSTEM_TEST_PACKAGES := chromium chromium-driver redis-server
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

system-test-deps:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null && command -v redis-server >/dev/null || \
	  { $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $(SYSTEM_TEST_PACKAGES); }

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev system-test-deps

migrate: install
	$(PY) manage.py migrate --noinput

run: migrate
	exec $(PY) manage.py serve --host $(HOST) --port $(PORT)

test: install-dev migrate
	$(PY) manage.py test

bench: install-dev migrate
	$(PY) bench/ttfa.py --repeat 5
	$(PY) bench/audio_cost.py
	$(PY) bench/cancel.py
	$(PY) bench/upstream.py
	$(PY) bench/throughput.py
	$(PY) bench/handshake.py

clean:
	rm -rf $(VENV) .pytest_cache
