# The two commands a new user needs: `make run` (the broker) and `make test` (the suite).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PY     := $(BIN)/python
PIP    := $(PY) -m pip
DATA   ?= ./data
PYTEST_ARGS ?=

.PHONY: run test venv install install-test quick bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip setuptools wheel

venv: $(BIN)/python

# a plain (non-editable) install: twistd only discovers plugins/ through a real install
install: venv
	$(PIP) install --quiet .
	$(PY) -c "from twisted.plugin import IPlugin, getPlugins; list(getPlugins(IPlugin))"

install-test: venv
	$(PIP) install --quiet ".[test]"
	$(PY) -c "from twisted.plugin import IPlugin, getPlugins; list(getPlugins(IPlugin))"

run: install
	mkdir -p $(DATA)
	$(BIN)/twistd --nodaemon --pidfile= nsqd \
		--tcp-address=127.0.0.1:4150 --http-address=127.0.0.1:4151 \
		--https-address=127.0.0.1:4152 --data-path=$(DATA)

test: install-test
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# while editing: skip the slow soak/fault runs
quick: install-test
	$(BIN)/python -m pytest -m "not slow" $(PYTEST_ARGS)

bench: install
	$(PY) bench/bench_broker.py

clean:
	rm -rf $(VENV) build *.egg-info
