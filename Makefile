# Two entry points for users: `make demo` and `make test`. Both build .venv from nothing on a fresh machine
# and do nothing more when it is already up to date.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The CPU build of torch; a bare `torch` requirement would pull a multi-GB CUDA build.
TORCH_PIN := torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(STAMP): pyproject.toml Makefile | $(BIN)/python
	$(BIN)/python -m pip install -q '$(TORCH_PIN)' -e '.[dev]'
	touch $@

demo: $(STAMP)
	$(BIN)/python examples/hello_world/demo.py

test: $(STAMP)
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks examples

bench: $(STAMP)
	$(BIN)/python benchmarks/run.py

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache .ruff_cache
