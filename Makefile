# One Makefile for people and CI alike: `make help` lists the targets.
.DEFAULT_GOAL := help
SHELL := /bin/bash

VENV := .venv
BIN := $(VENV)/bin
# Installed once per change of pyproject.toml.
STAMP := $(VENV)/.installed
# python3.11 when it runs (a pyenv shim may exist without the version), else python3.
PYTHON ?= $(shell for p in python3.11 python3; do \
	$$p -c 'import sys' >/dev/null 2>&1 && { echo $$p; break; }; done)

.PHONY: help venv browser up test test-unit test-faults lint fmt bench clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) \
		| awk 'BEGIN {FS = ":.*## "}; {printf "  \033[36m%-10s\033[0m %s\n", $$1, $$2}'

venv: $(STAMP) ## create .venv and install the package with its dev extras

$(STAMP): pyproject.toml
	@test -n "$(PYTHON)" || { echo "python3 not found" >&2; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

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

up: venv ## run everything on this machine (embedded Redis, api, worker, beat)
	$(BIN)/switchboard up

test: venv browser ## run every test layer
	$(BIN)/pytest -q

test-unit: venv ## run the unit layer only (seconds)
	$(BIN)/pytest -q -m unit

test-faults: venv ## kill -9 workers, restart Redis, the api and beat under load (minutes)
	$(BIN)/pytest -q -m faults

lint: venv ## ruff lint, ruff format check, mypy --strict
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

fmt: venv ## fix lint where safe and format the code
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

bench: venv ## run the benchmark suite; figures in bench/results/*.json
	$(BIN)/switchboard bench --out bench/results

clean: ## remove caches and build output (keeps .venv and the .switchboard data dir)
	rm -rf .pytest_cache .mypy_cache .ruff_cache .hypothesis build dist
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +
