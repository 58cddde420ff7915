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

# `make test-floors`: the oldest releases pyproject.toml declares (ci/floors.txt), on the oldest Python it allows, in
# .venv-floors. FLOOR_PYTHON is a Python 3.10: python3.10 on PATH, else pyenv's; without one the packages' floors
# are tested on $(PYTHON) and the Python floor is not (the floor pins have wheels for Python 3.10 and 3.11).
FLOOR_PYTHON ?= $(or $(shell python3.10 -c 'import sys; print(sys.executable)' 2>/dev/null),$(lastword $(sort \
	$(wildcard $(or $(shell pyenv root 2>/dev/null),$(HOME)/.pyenv)/versions/3.10*/bin/python3.10))),$(PYTHON))
FLOOR_VENV := .venv-floors
FLOOR_BIN := $(FLOOR_VENV)/bin
FLOOR_STAMP := $(FLOOR_VENV)/.installed
# What each floor concerns: numpy, pyarrow and pandas every reading, writing and codec test; torch its loaders;
# pyspark the Spark tests (on the machine's Java). Slow tests, other frameworks' adapters and Spark Connect (pyspark
# 3.5 ships no Connect server: it fetches one from Maven) are left to `make test`.
FLOOR_CORE_TESTS := tests/model tests/plan tests/execution tests/reading tests/storage tests/compat
FLOOR_PYTEST := $(FLOOR_BIN)/python -m pytest -q -p no:cacheprovider
FLOOR_NO_PYTHON := test-floors: no Python 3.10 found (set FLOOR_PYTHON to one): the Python floor is NOT tested, \
	only the packages' floors, on $(FLOOR_PYTHON)
FLOOR_VERSIONS := import sys, numpy, pyarrow, pandas, torch, pyspark; print('test-floors: Python', \
	sys.version.split()[0], *(f'{m.__name__} {m.__version__}' for m in (numpy, pyarrow, pandas, torch, pyspark)))

.PHONY: demo test test-floors lint bench clean azurite

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# setup.py builds the compiled modules (the C files below) in place; a change to one re-installs.
$(STAMP): pyproject.toml setup.py src/petastorm/shuffle/_kernel.c src/petastorm/codecs/_png_rows.c Makefile | $(BIN)/python
	$(BIN)/python -m pip install -q '$(TORCH_PIN)' -e '.[dev]'
	touch $@

demo: $(STAMP)
	$(BIN)/python examples/demo.py

test: lint azurite
	$(BIN)/python -m pytest -q

# ruff (style, imports, docstrings of the public modules) and mypy (types of the whole package).
lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/mypy src/petastorm

# Azurite, the Azure Blob Storage emulator the Azure tests start (tests/support/cloud_emulators.py), from the npm
# registry into .tools/ (3.35.0: later releases need a newer Node than ours). Without npm this says so and the Azure
# tests skip, saying why.
AZURITE_VERSION := 3.35.0
AZURITE := .tools/azurite/node_modules/.bin/azurite-blob

azurite: $(AZURITE)

$(AZURITE):
	@if command -v npm >/dev/null; then \
		npm install --silent --no-audit --no-fund --prefix .tools/azurite azurite@$(AZURITE_VERSION); \
	else echo 'azurite: npm not found: the Azure tests will be skipped (install Node.js and npm to run them)'; fi

$(FLOOR_BIN)/python:
	@$(FLOOR_PYTHON) -c 'import sys; sys.exit(sys.version_info[:2] != (3, 10))' || echo "$(FLOOR_NO_PYTHON)"
	$(FLOOR_PYTHON) -m venv $(FLOOR_VENV)
	$(FLOOR_BIN)/python -m pip install -q --upgrade pip

# --no-cache-dir: torch 2.1's CUDA wheels are about 2.5 GB; cached, they would take that much disk a second time.
$(FLOOR_STAMP): ci/floors.txt pyproject.toml setup.py src/petastorm/shuffle/_kernel.c src/petastorm/codecs/_png_rows.c Makefile | $(FLOOR_BIN)/python
	$(FLOOR_BIN)/python -m pip install -q --no-cache-dir -r ci/floors.txt -e '.[image,torch,spark]'
	touch $@

test-floors: $(FLOOR_STAMP)
	@$(FLOOR_BIN)/python -c "$(FLOOR_VERSIONS)"
	$(FLOOR_PYTEST) $(FLOOR_CORE_TESTS) -m 'not spark and not slow'
	$(FLOOR_PYTEST) tests/adapters -m 'not spark and not slow' -k 'torch or pytorch'
	$(FLOOR_PYTEST) tests -m 'spark and not tf and not slow' -k 'not connect' --ignore=tests/project \
		--ignore=tests/reliability

bench: $(STAMP)
	$(BIN)/python benchmarks/run.py

clean:
	rm -rf $(VENV) $(FLOOR_VENV) .tools build src/*.egg-info .pytest_cache .ruff_cache src/petastorm/*.so src/petastorm/shuffle/*.so src/petastorm/codecs/*.so
