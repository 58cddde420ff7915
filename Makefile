# Two entry points for users: `make demo` and `make test`. Both build .venv from nothing on a fresh machine
# and do nothing more when it is already up to date.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The CPU build of torch, named with its local version: with `torch==2.13.0` alone, pip's resolver may settle on
# the multi-GB CUDA build of the same release while it backtracks through other packages (the S3 stack), and
# that build's triton crashes next to TensorFlow. Override for another platform: make test TORCH_PIN=torch==2.13.0
TORCH_PIN ?= torch==2.13.0+cpu
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# setup.py builds the compiled modules (the C files below) in place; a change to one re-installs.
$(STAMP): pyproject.toml setup.py src/petastorm/shuffle/_kernel.c src/petastorm/codecs/_png_rows.c Makefile | $(BIN)/python
	$(BIN)/python -m pip install -q '$(TORCH_PIN)' -e '.[dev]'
	touch $@

demo: $(STAMP)
	$(BIN)/python examples/demo.py

test: lint
	$(BIN)/python -m pytest -q

# ruff (style, imports, docstrings of the public modules) and mypy (types of the whole package).
lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/mypy src/petastorm

bench: $(STAMP)
	$(BIN)/python benchmarks/run.py

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache .ruff_cache src/petastorm/*.so src/petastorm/shuffle/*.so src/petastorm/codecs/*.so
