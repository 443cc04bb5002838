# The two commands a new user needs: `make run` (the broker) and `make test` (the suite).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PY     := $(BIN)/python
PIP    := $(PY) -m pip
DATA   ?= ./data
PYTEST_ARGS ?=
# Debian packages the test suite uses: Chromium for the admin UI's browser tests, Java for Spark
SYSTEM_PACKAGES := chromium chromium-driver default-jre-headless

.PHONY: run run-nsqd test quick lint docs venv install install-test system-deps bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip setuptools wheel

venv: $(BIN)/python

# a plain (non-editable) install: twistd only discovers plugins/ through a real install
install: venv
	$(PIP) install --quiet .
	$(PY) -c "from twisted.plugin import IPlugin, getPlugins; list(getPlugins(IPlugin))"

install-test: venv system-deps
	$(PIP) install --quiet ".[test,spark]"
	$(PY) -c "from twisted.plugin import IPlugin, getPlugins; list(getPlugins(IPlugin))"

system-deps:
	@missing=""; \
	command -v chromium >/dev/null 2>&1 || missing="$$missing chromium"; \
	command -v chromedriver >/dev/null 2>&1 || missing="$$missing chromium-driver"; \
	command -v java >/dev/null 2>&1 || missing="$$missing default-jre-headless"; \
	if [ -n "$$missing" ]; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			echo "installing Debian packages:$$missing"; \
			DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
			DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(SYSTEM_PACKAGES) >/dev/null; \
		else \
			echo "NOTE: missing$$missing (install with: sudo apt-get install$$missing);"; \
			echo "      the browser tests and the Spark tests will be skipped and say why."; \
		fi; \
	fi

# nsqd (4150/4151), nsqlookupd (4160/4161) and nsqadmin (4171) in one process
run: install
	mkdir -p $(DATA)
	$(BIN)/twistd --reactor=nsqtw --nodaemon --pidfile= nsqtw \
		--tcp-address=127.0.0.1:4150 --http-address=127.0.0.1:4151 --https-address=127.0.0.1:4152 \
		--broadcast-address=127.0.0.1 --data-path=$(DATA) \
		--lookupd-tcp-listen=127.0.0.1:4160 --lookupd-http-listen=127.0.0.1:4161 \
		--admin-http-address=127.0.0.1:4171

# nsqd alone, as `twistd nsqd`
run-nsqd: install
	mkdir -p $(DATA)
	$(BIN)/twistd --reactor=nsqtw --nodaemon --pidfile= nsqd \
		--tcp-address=127.0.0.1:4150 --http-address=127.0.0.1:4151 \
		--https-address=127.0.0.1:4152 --data-path=$(DATA)

test: install-test
	$(PY) -m pytest $(PYTEST_ARGS)

# ruff and mypy (configured in pyproject.toml), and no `type: ignore` without a reason after it
lint: venv
	$(PIP) install --quiet ".[test,spark,lint]"
	@status=0; \
	$(BIN)/ruff check . || status=1; \
	$(BIN)/mypy || status=1; \
	if grep -rnE "type: ignore(\[[^]]*\])?[[:space:]]*$$" nsqtw tests plugins bench; then \
		echo "a type: ignore needs a reason comment after it"; status=1; fi; \
	exit $$status

# the Sphinx site (API reference and README.rst's sections as guides), warnings as errors
docs: venv
	$(PIP) install --quiet ".[docs]"
	$(PY) -m sphinx -W --keep-going -b html docs docs/_build/html

# while editing: skip the slow soak/fault runs
quick: install-test
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

bench: install
	$(PY) bench/bench_broker.py

clean:
	rm -rf $(VENV) build *.egg-info docs/_build docs/guide
