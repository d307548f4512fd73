# One Makefile for people and CI alike: `make help` lists the targets.
.DEFAULT_GOAL := help
SHELL := /bin/bash

VENV := .venv
BIN := $(VENV)/bin
# Installed once per change of pyproject.toml.
STAMP := $(VENV)/.installed
# `make up EXTRAS=otel` adds the package's optional extras to what `up` installs.
EXTRAS ?=
RUNTIME_STAMP := $(VENV)/.installed-runtime$(if $(EXTRAS),-$(EXTRAS))
# python3.11 when it runs (a pyenv shim may exist without the version), else python3.
PYTHON ?= $(shell for p in python3.11 python3; do \
	$$p -c 'import sys' >/dev/null 2>&1 && { echo $$p; break; }; done)

.PHONY: help venv upgrade browser up test test-unit test-latest test-faults lint fmt bench clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) \
		| awk 'BEGIN {FS = ":.*## "}; {printf "  \033[36m%-10s\033[0m %s\n", $$1, $$2}'

venv: $(STAMP) ## create .venv and install the package with its dev extras

# Everything is compiled to bytecode as it is installed (pip does so by default, uv when
# asked), so a process starts on .pyc files even where PYTHONDONTWRITEBYTECODE is set
# (CI images, containers): without them each api or worker start compiles its imports
# again, about 15 s instead of 7 s here. A module edited later is compiled as it loads.
# uv installs in seconds what pip takes a minute for; pip installs uv itself from the
# package index and is the fallback when uv cannot be had or cannot install. uv reads
# neither pip.conf nor PIP_* variables, so pip's index settings are passed to it, and it
# picks the best version across all of them as pip does (uv's default takes a package
# from the first index that has it, so a local mirror holding old versions would win).
# PIP_INDEX_OF: pip's index settings (of the venv in $(1)) as uv's flags, in the bash
# array `index`.
PIP_INDEX_OF = conf=$$($(1)/python -m pip config list 2>/dev/null); index=(); \
	for opt in index-url extra-index-url find-links; do \
		vals=$$(sed -n "s/^:env:\.$$opt='\(.*\)'$$/\1/p" <<<"$$conf"); \
		[ -n "$$vals" ] || vals=$$(sed -n "s/^\(global\|install\)\.$$opt='\(.*\)'$$/\2/p" <<<"$$conf"); \
		for val in $$vals; do index+=("--$$opt" "$$val"); done; \
	done
PIP_INDEX = $(call PIP_INDEX_OF,$(BIN))
# What development and CI install: every package pinned (`make upgrade` refreshes it).
# Users installing the package get pyproject.toml's ranges.
LOCK := constraints.txt

# INSTALL: create .venv if needed and install the package with the extras in $(1) ('' for
# the runtime alone), pinned by $(LOCK).
define INSTALL
	@test -n "$(PYTHON)" || { echo "python3 not found" >&2; exit 1; }
	@test -x $(BIN)/python || { echo "==> creating $(VENV) with $(PYTHON)"; $(PYTHON) -m venv $(VENV); }
	@echo "==> installing uv into $(VENV) (pip)"
	@$(PIP_INDEX); \
	if $(BIN)/python -m pip install --progress-bar off uv \
		&& echo "==> installing switchboard$(1), pinned by $(LOCK) (uv pip install)" \
		&& $(BIN)/uv pip install --python $(BIN)/python --index-strategy unsafe-best-match \
			--compile-bytecode "$${index[@]}" -c $(LOCK) -e '.$(1)'; then :; \
	else \
		echo "==> uv could not install: installing with pip instead (slower)"; \
		$(BIN)/python -m pip install --progress-bar off -c $(LOCK) -e '.$(1)'; \
	fi
	@echo "==> compiling switchboard's own modules to bytecode"
	@$(BIN)/python -m compileall -q -j 0 src >/dev/null
endef

# The service alone (`make up`): the runtime dependencies, no development tools.
$(RUNTIME_STAMP): pyproject.toml $(LOCK)
	$(call INSTALL,$(if $(EXTRAS),[$(EXTRAS)]))
	@touch $(RUNTIME_STAMP)
	@echo "==> $(VENV) is ready to run the service"

# Everything the tests, lint and bench need: the runtime and the dev extras.
$(STAMP): pyproject.toml $(LOCK)
	$(call INSTALL,[dev])
	@touch $(STAMP) $(VENV)/.installed-runtime
	@echo "==> $(VENV) is ready"

upgrade: $(STAMP) ## refresh $(LOCK): the newest releases within pyproject.toml's ranges
	@$(PIP_INDEX); \
	$(BIN)/uv pip compile pyproject.toml --extra dev --universal --python-version 3.11 \
		--index-strategy unsafe-best-match "$${index[@]}" --upgrade \
		--custom-compile-command "make upgrade" -o $(LOCK)
	@echo "==> $(LOCK) refreshed: 'git diff $(LOCK)' shows what moved; 'make test' tries it"

browser: ## install Debian's Chromium (the console tests drive it) unless it is there
	@test -x /usr/bin/chromium || { \
		if [ "$$(id -u)" = 0 ]; then sudo=""; \
		elif command -v sudo >/dev/null; then sudo=sudo; \
		else echo "/usr/bin/chromium is missing: run 'apt-get install chromium' as root" >&2; \
			exit 1; fi; \
		command -v apt-get >/dev/null || { \
			echo "/usr/bin/chromium is missing and apt-get is not here: install Chromium" \
				"so that /usr/bin/chromium exists" >&2; exit 1; }; \
		$$sudo apt-get update -q && $$sudo apt-get install -y -q chromium; }

up: $(RUNTIME_STAMP) ## run everything on this machine (embedded Redis, api, worker, beat; installs the runtime only)
	$(BIN)/switchboard up

# `make test` runs the multi-process suites (scale, faults: mostly waiting on processes they
# start, each on ports and dirs of its own) beside the other layers, in a second pytest; the
# scale suite with the store cut into 8 slot groups (each step on one hash slot, checked),
# so its bursts, kills, partitions and failovers cross groups as on a Redis Cluster.
SLOW_SUITES = scale or faults
SCALE_SLOT_GROUPS ?= 8
# The other layers mostly wait (on processes starting, sweeps, timeouts): pytest-xdist runs
# them in this many processes, each test file whole in one of them (--dist loadfile), at a
# lower CPU priority than the scale and fault suites, whose bursts and kills are timed.
TEST_PROCS ?= 2

test: venv browser ## run every test layer (the scale and fault suites beside the others)
	@tmp=$$(mktemp -d /tmp/switchboard-test.XXXXXX); \
	echo "==> the $(SLOW_SUITES) suites run beside the others; their log: $$tmp/slow.log"; \
	( $(BIN)/pytest -q -p no:cacheprovider -m faults --basetemp=$$tmp/faults; f=$$?; \
	  $(BIN)/pytest -q -p no:cacheprovider -m scale --slot-groups $(SCALE_SLOT_GROUPS) \
		--basetemp=$$tmp/scale; s=$$?; exit $$(( f | s )) ) > $$tmp/slow.log 2>&1 & slow=$$!; \
	nice -n 10 $(BIN)/pytest -q -m "not ($(SLOW_SUITES))" -n $(TEST_PROCS) --dist loadfile \
		--basetemp=$$tmp/rest; rest=$$?; \
	echo "==> waiting for the $(SLOW_SUITES) suites"; wait $$slow; slowrc=$$?; \
	cat $$tmp/slow.log; rm -rf $$tmp; \
	echo "==> other layers: exit $$rest; $(SLOW_SUITES): exit $$slowrc"; \
	test $$rest -eq 0 && test $$slowrc -eq 0

test-unit: venv ## run the unit layer only (seconds)
	$(BIN)/pytest -q -m unit

# The newest releases within pyproject.toml's ranges, as a user's `pip install` gets them,
# in a venv of their own (the lock is not used): a breaking upstream release shows here the
# day it lands, before `make upgrade` takes it into the lock.
LATEST := .venv-latest
test-latest: ## the unit and integration layers against the newest releases (no lock)
	@test -x $(LATEST)/bin/python || $(PYTHON) -m venv $(LATEST)
	@$(LATEST)/bin/python -m pip install --progress-bar off -q uv
	@$(call PIP_INDEX_OF,$(LATEST)/bin); \
	$(LATEST)/bin/uv pip install --python $(LATEST)/bin/python --index-strategy unsafe-best-match \
		--upgrade "$${index[@]}" -e '.[dev]'
	@$(LATEST)/bin/python -m pip list --format=freeze 2>/dev/null \
		| grep -iE '^(pydantic-ai-slim|openai|redis|celery|kombu|mcp|fastapi)==' \
		| tr '\n' ' '; echo
	$(LATEST)/bin/pytest -q -m "unit or integration" -n $(TEST_PROCS) --dist loadfile

test-faults: venv ## kill -9 workers, restart Redis, the api and beat under load (minutes)
	$(BIN)/pytest -q -m faults

lint: venv ## ruff lint, ruff format check, mypy --strict, import layers (lint-imports)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

fmt: venv ## fix lint where safe and format the code
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# Three runs of every scenario, each figure the median run's. Exit 1: a scenario could not
# run or failed a check; 4: every figure is sound but a target was missed.
bench: venv ## run the benchmark suite three times: median figures and anchors in bench/results
	$(BIN)/switchboard bench --repeat 3 --out bench/results

clean: ## remove caches and build output (keeps .venv and the .switchboard data dir)
	rm -rf .pytest_cache .mypy_cache .ruff_cache .hypothesis build dist
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +
