# Two commands do all the set-up on a fresh clone: `make run` and `make test`.
# Both create the project-local virtualenv .venv (once) and install the project into it.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
ARGS   ?=
PYTEST_ARGS ?=
# Two pytest-xdist workers, one test file at a time each (a file's Ray cluster starts once): one
# after another, the Ray tests leave the cores idle part of the time (docs/development.md).
# 0 = everything in one process.
TEST_WORKERS ?= 2
CLUSTER_ARGS ?= --slices 2 --hosts-per-slice 2 --devices-per-host 2

.PHONY: run test lint bench report clean cluster cluster-down

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	@# a current pip first: the one a venv ships checks every wheel of every release against
	@# this platform's tags, slowly (docs/development.md)
	$(BIN)/pip install --quiet --disable-pip-version-check --upgrade "pip>=25.1"
	$(BIN)/pip install --quiet --disable-pip-version-check -e ".[test]"
	touch $(STAMP)

## Train the default model on a local emulated cluster (1 slice x 2 hosts x 2 CPU devices).
run: $(STAMP)
	$(BIN)/python -m orchestrator.main $(ARGS)

## The whole test suite (starts and stops its own Ray clusters, Pub/Sub emulator and servers).
test: $(STAMP)
	@# bytecode first: with PYTHONDONTWRITEBYTECODE set, each of the suite's processes would
	@# compile the project's modules again (docs/development.md)
	$(BIN)/python -m compileall -q orchestrator workers policies bench examples tests > /dev/null
	@# .pytest-junit.xml: each test's seconds (`python -m tests.support.units .pytest-junit.xml`
	@# turns them into tests/durations.json, the order the workers take the files in)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder \
	  --junit-xml=.pytest-junit.xml $(PYTEST_ARGS)

## A local Ray cluster whose nodes look like TPU hosts, token auth on (README "Try it locally").
cluster: $(STAMP)
	$(BIN)/python -m orchestrator.cluster up $(CLUSTER_ARGS)

## Stop everything `make cluster` started.
cluster-down: $(STAMP)
	$(BIN)/python -m orchestrator.cluster down

lint: $(STAMP)
	$(BIN)/ruff check .

bench: $(STAMP)
	$(BIN)/python -m bench $(ARGS)

clean:
	rm -rf $(VENV) runs .pytest_cache
