# Two commands do all the set-up on a fresh clone: `make run` and `make test`.
# Both create the project-local virtualenv .venv (once) and install the project into it.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
ARGS   ?=
PYTEST_ARGS ?=

.PHONY: run test lint bench report clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e ".[test]"
	touch $(STAMP)

## Train the default model on a local emulated cluster (1 slice x 2 hosts x 2 CPU devices).
run: $(STAMP)
	$(BIN)/python -m orchestrator.main $(ARGS)

## The whole test suite (starts and stops its own Ray clusters, Pub/Sub emulator and servers).
test: $(STAMP)
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .

bench: $(STAMP)
	$(BIN)/python -m bench $(ARGS)

clean:
	rm -rf $(VENV) runs .pytest_cache
