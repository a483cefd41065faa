# Dispatch: `make run` serves the app, `make test` runs the whole suite.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
HOST ?= 127.0.0.1
PORT ?= 8000

# Python 3.13 (or 3.12): from PATH, else from pyenv's versions.
FIND_PYTHON = for c in python3.13 python3.12 $$HOME/.pyenv/versions/3.13*/bin/python3.13 \
	$$HOME/.pyenv/versions/3.12*/bin/python3.12; do \
	  if command -v $$c >/dev/null 2>&1 && $$c -c 'import sys; assert sys.version_info >= (3, 12)' 2>/dev/null; \
	  then echo $$c; exit 0; fi; done; exit 1

.PHONY: run test lint bench chromium bubblewrap npm-packages clean

$(VENV)/.installed: requirements.txt requirements-dev.txt
	@if [ ! -x $(PY) ]; then \
	  py=$$($(FIND_PYTHON)) || { echo "Dispatch needs Python 3.13 or 3.12, and neither was found." >&2; \
	    echo "Install one (e.g. 'pyenv install 3.13') and run make again." >&2; exit 1; }; \
	  echo "Creating $(VENV) with $$py"; $$py -m venv $(VENV); fi
	$(PY) -m pip install -q --disable-pip-version-check -r requirements-dev.txt
	@touch $@

run: $(VENV)/.installed bubblewrap
	$(PY) manage.py migrate --noinput -v 0
	PATH=$(NPM_BIN):$$PATH $(PY) manage.py serve --host $(HOST) --port $(PORT)

# Browser tests drive Debian's Chromium; install it when it is missing (CI runs as root).
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then (apt-get update -qq && apt-get install -y -qq chromium >/dev/null); \
	  else echo "Chromium is missing: sudo apt-get install chromium" >&2; exit 1; fi; }

# The shell tool's sandbox (Linux) and its private network; installed like
# Chromium. Where that is not possible the app still runs, and its shell tool
# says why it refuses to (no bwrap) or that it shares the host's network.
bubblewrap:
	@{ command -v bwrap && command -v slirp4netns; } >/dev/null 2>&1 || { \
	  if [ "$$(uname -s)" = Linux ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    (apt-get update -qq && apt-get install -y -qq bubblewrap slirp4netns >/dev/null); \
	  else echo "bubblewrap (bwrap) or slirp4netns is missing: without bwrap the shell tool" \
	    "refuses to run, without slirp4netns its commands reach this host's loopback services;" \
	    "install them (sudo apt-get install bubblewrap slirp4netns); see the README's Security" \
	    "section." >&2; fi; }

# What the tests and `make run` take from npm, pinned, into an ignored folder, in one
# install, again only when the pins change: the external agents (chat/acp/; once
# installed `make run` offers them) and axe-core, which the accessibility tests inject
# into each page (tests/test_a11y.py). About 15 s and 350 MB (codex-acp is a static binary
# in a per-platform package). Without npm the tests of the agents skip and those of
# accessibility fail, saying so. The tests find the agents in NPM_BIN themselves: on the
# suite's PATH, the presets would show in every test's model list.
NPM_DIR := .npm-packages
NPM_BIN := $(CURDIR)/$(NPM_DIR)/node_modules/.bin
NPM_PINS := @zed-industries/claude-code-acp@0.16.2 @zed-industries/codex-acp@0.16.0 axe-core@4.14.1

npm-packages:
	@if [ "$$(cat $(NPM_DIR)/.pins 2>/dev/null)" != "$(NPM_PINS)" ]; then \
	  if command -v npm >/dev/null 2>&1; then \
	    echo "Installing $(NPM_PINS) into $(NPM_DIR)/"; \
	    rm -rf $(NPM_DIR) && mkdir -p $(NPM_DIR) && \
	    CI=true npm install --prefix $(NPM_DIR) --no-audit --no-fund --no-save \
	      --loglevel=error $(NPM_PINS) </dev/null && \
	    echo "$(NPM_PINS)" > $(NPM_DIR)/.pins; \
	  else echo "npm is missing: the external agents and axe-core are not installed;" \
	    "the agents' tests skip and the accessibility tests fail (install Node.js 20 or" \
	    "later with npm)." >&2; fi; fi

# The suite in parallel (pytest-xdist): much of it waits on servers, browsers and
# sockets, so four processes on two cores finish sooner than three or two. loadgroup:
# the modules tests/conftest.py groups (ONE_WORKER) share a worker, and what it starts
# once (the scaled cluster).
TEST_WORKERS ?= 4

test: $(VENV)/.installed chromium bubblewrap npm-packages
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

# mypy's Django plugin imports dispatch.settings, which makes its data dir and secret
# key: a throwaway one in mypy's cache, never the real one.
lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports --no-cache
	$(PY) -m lint.sizes
	DISPATCH_DATA_DIR=$(CURDIR)/.mypy_cache/django-data SECRET_KEY=type-check $(VENV)/bin/mypy

bench: $(VENV)/.installed chromium bubblewrap
	$(PY) -m bench

clean:
	rm -rf $(VENV) $(NPM_DIR) .pytest_cache .ruff_cache .hypothesis .mypy_cache
