# The two commands a new user needs: `make run` (the broker) and `make test` (the suite).
# The virtualenv's interpreter: Debian's /usr/bin/python3 when it is there and can make one (Debian
# builds CPython with profile-guided optimisation: a replicated pair publishes about a fifth more
# single PUBs per second on it than on a plain source build such as pyenv's), else python3 on PATH;
# `make PYTHON=...` picks another (a virtualenv already made keeps its own: `make clean` first)
PYTHON ?= $(shell /usr/bin/python3 -c 'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 10))' \
                    >/dev/null 2>&1 && echo /usr/bin/python3 || echo python3)
VENV   ?= .venv
BIN    := $(VENV)/bin
PY     := $(BIN)/python
PIP    := $(PY) -m pip
DATA   ?= ./data
PYTEST_ARGS ?=
# `make run` addresses: `make run PORT_BASE=14150` moves all six ports (nsqd 14150/14151/14152,
# nsqlookupd 14160/14161, nsqadmin 14171); each address can also be given on its own
HOST        ?= 127.0.0.1
PORT_BASE   ?= 4150
port = $(shell echo $$(($(PORT_BASE) + $(1))))
NSQD_TCP_ADDRESS       ?= $(HOST):$(call port,0)
NSQD_HTTP_ADDRESS      ?= $(HOST):$(call port,1)
NSQD_HTTPS_ADDRESS     ?= $(HOST):$(call port,2)
LOOKUPD_TCP_ADDRESS    ?= $(HOST):$(call port,10)
LOOKUPD_HTTP_ADDRESS   ?= $(HOST):$(call port,11)
ADMIN_HTTP_ADDRESS     ?= $(HOST):$(call port,21)
# more flags for the daemons, e.g. `make run ARGS=--log-level=debug`
ARGS ?=
# the install is redone only when these change (a stamp file in the virtualenv)
SOURCES := setup.cfg pyproject.toml $(wildcard plugins/*.py) $(shell find nsqtw -type f -not -name '*.pyc' 2>/dev/null)
# Debian packages the test suite uses: Chromium for the admin UI's browser tests, Java for Spark,
# etcd for the tests of --etcd-endpoints
SYSTEM_PACKAGES := chromium chromium-driver default-jre-headless etcd-server

.PHONY: run run-nsqd test quick unit lint docs venv install install-test system-deps bench bench-spark clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip setuptools wheel

venv: $(BIN)/python

# a plain (non-editable) install: twistd only discovers plugins/ through a real install; redone
# only when a source changed since the last one (`make run` twice starts at once the second time)
install: $(VENV)/.installed

$(VENV)/.installed: $(BIN)/python $(SOURCES)
	$(PIP) install --quiet .
	$(PY) -c "from twisted.plugin import IPlugin, getPlugins; list(getPlugins(IPlugin))"
	touch $@

install-test: system-deps $(VENV)/.installed-test

# the test extras hold the same non-editable install, so they count for `make run` too
$(VENV)/.installed-test: $(BIN)/python $(SOURCES)
	$(PIP) install --quiet ".[test,spark]"
	$(PY) -c "from twisted.plugin import IPlugin, getPlugins; list(getPlugins(IPlugin))"
	touch $@ $(VENV)/.installed

system-deps:
	@missing=""; \
	command -v chromium >/dev/null 2>&1 || missing="$$missing chromium"; \
	command -v chromedriver >/dev/null 2>&1 || missing="$$missing chromium-driver"; \
	command -v java >/dev/null 2>&1 || missing="$$missing default-jre-headless"; \
	command -v etcd >/dev/null 2>&1 || missing="$$missing etcd-server"; \
	if [ -n "$$missing" ]; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			echo "installing Debian packages:$$missing"; \
			DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
			DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(SYSTEM_PACKAGES) >/dev/null; \
		else \
			echo "NOTE: missing$$missing (install with: sudo apt-get install$$missing);"; \
			echo "      the browser, Spark and etcd tests will be skipped and say why."; \
		fi; \
	fi

# nsqd (4150/4151), nsqlookupd (4160/4161) and nsqadmin (4171) in one process
run: install
	@mkdir -p $(DATA)/nsqadmin
	$(BIN)/twistd --reactor=nsqtw --nodaemon --pidfile= nsqtw \
		--tcp-address=$(NSQD_TCP_ADDRESS) --http-address=$(NSQD_HTTP_ADDRESS) \
		--https-address=$(NSQD_HTTPS_ADDRESS) --broadcast-address=$(HOST) --data-path=$(DATA) \
		--lookupd-tcp-listen=$(LOOKUPD_TCP_ADDRESS) --lookupd-http-listen=$(LOOKUPD_HTTP_ADDRESS) \
		--admin-history-path=$(DATA)/nsqadmin --admin-http-address=$(ADMIN_HTTP_ADDRESS) $(ARGS)

# nsqd alone, as `twistd nsqd`
run-nsqd: install
	@mkdir -p $(DATA)
	$(BIN)/twistd --reactor=nsqtw --nodaemon --pidfile= nsqd \
		--tcp-address=$(NSQD_TCP_ADDRESS) --http-address=$(NSQD_HTTP_ADDRESS) \
		--https-address=$(NSQD_HTTPS_ADDRESS) --data-path=$(DATA) $(ARGS)

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

# the Sphinx site (API reference and README.rst's sections as guides), warnings as errors, then the
# checks Sphinx does not make (docs/check_site.py: no en dash for a flag's "--", every public member
# documented, every HTTP endpoint in the HTTP API reference)
docs: venv
	$(PIP) install --quiet ".[docs,test]"  # autodoc imports the pytest plugin
	$(PY) -m sphinx -W --keep-going -b html docs docs/_build/html
	$(PY) docs/check_site.py docs/_build/html

# while editing: skip the slow soak/fault runs
quick: install-test
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

# the fastest loop: no real sockets, no Spark, no browser, no soak (StringTransport and task.Clock)
unit: install-test
	$(PY) -m pytest -m "not e2e and not slow and not spark and not browser" $(PYTEST_ARGS)

bench: install
	$(PY) bench/bench_broker.py

# the stats job against DuckDB on the same snapshots (duckdb is installed here only, never at run time)
bench-spark: install-test
	$(PIP) install --quiet ".[spark,bench]"
	$(PY) bench/spark_vs_duckdb.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info docs/_build
