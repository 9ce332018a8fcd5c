# specrepro: `make all` regenerates every figure on the embedded engine,
# `make test` runs the test suite. Both create .venv by themselves.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PARAMS ?= params/default.yaml
export SPECREPRO_DATA_DIR ?= $(abspath ../shared/data)

.PHONY: all test venv clean-venv nb html report models serve FORCE

# The venv is rebuilt when the project's dependencies change, not when the
# package's code does (it is installed editable).
$(STAMP): pyproject.toml
	@echo "creating $(VENV): pip installs CPU PyTorch 2.13.0 and the project's dependencies quietly (about 3 minutes)"
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# CPU PyTorch first, so that nothing below pulls a multi-GB CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

venv: $(STAMP)

# `make test` is what CI runs (.ci/run calls it and sets nothing of its own): the articles' text
# from ../shared/seeds where it exists (the published-text tests; without it they are one skip),
# no hub (the data come from SPECREPRO_DATA_DIR), and CI=1, under which the report-rendering
# tests fail rather than skip when Chromium is missing (`make test CI=` skips them instead).
# Each is a default: a variable set in the environment or on the command line wins.
SEEDS_DIR := $(wildcard $(abspath ../shared/seeds))
ifneq ($(SEEDS_DIR),)
test: export SPECREPRO_SEEDS_DIR ?= $(SEEDS_DIR)
endif
test: export HF_HUB_OFFLINE ?= 1
test: export HF_DATASETS_OFFLINE ?= 1
test: export TOKENIZERS_PARALLELISM ?= false
test: export CI ?= 1
test: $(STAMP)
	$(PY) -m pytest -q

# --- the notebooks -------------------------------------------------------------------
# `make all` runs every notebook on $(PARAMS) (a suite) and writes figures/, results/,
# reports/<nb>.html and reports/index.html. A notebook re-runs only when one of its
# inputs changed (the notebook, any params file, the package's code and data, its
# study's stored results); it then replays stored cells and measures only missing ones.
# FRESH=1 measures every cell again. `make nb NB=<id>` runs one notebook regardless.
# The findings, in order, from their one registry (lib/specrepro/findings.py reads it alike).
NOTEBOOKS := $(shell sed -n 's/^- \([A-Za-z0-9][A-Za-z0-9_.-]*\).*/\1/p' lib/specrepro/findings.yaml)
SUITE := $(basename $(notdir $(PARAMS)))
MODE := $(if $(FRESH),run,auto)
# The default suite's figures are the committed ones; other suites write beside them.
FIGURES ?= $(if $(filter default,$(SUITE)),figures,figures/$(SUITE))
REPORTS ?= $(if $(filter default,$(SUITE)),reports,reports/$(SUITE))
NB_STAMPS := .stamps/$(SUITE)
LIB_FILES := $(shell find lib/specrepro -name '*.py' -o -name '*.yaml' -o -name '*.csv')
PARAM_FILES := $(wildcard params/*.yaml params/studies/*.yaml params/profiles/*.yaml)
RUN_NB = $(PY) -m specrepro.analysis.notebooks run --params $(PARAMS) --mode $(MODE) \
	--figures-dir $(FIGURES) --reports-dir $(REPORTS)

all: $(STAMP) $(REPORTS)/index.html

# Notebooks that replay render side by side, one per core; a notebook that measures takes
# the machine to itself (analysis/notebooks.py: .stamps/machine.lock), since its engine and
# load generator are pinned to the cores and share the engine's port.
MAKEFLAGS += -j$(shell nproc 2>/dev/null || echo 1) --output-sync=target
.SECONDEXPANSION:
# The drafters in the folders vLLM and SGLang load (git-ignored): the GPU suites' profiles
# name them, and a cell's identity holds their fingerprint, so replaying those suites' stored
# cells needs them here too. Written from models/embedded, again only when it changes.
DRAFTERS := build/engine-drafters/.exported
$(DRAFTERS): $(wildcard models/embedded/*/*.safetensors models/embedded/*/*.json) \
		lib/specrepro/embedded/export.py $(STAMP)
	@echo "exporting the drafters into build/engine-drafters/ (the GPU suites' cells name their bytes; about 10 s, again only when models/embedded changes)"
	$(PY) -m specrepro.cli export-drafters --engine all
	@touch $@

# The NVFP4 target vLLM serves in the H200 suite's notebook 03 (git-ignored), likewise in its
# cells' identity; the exporter is deterministic (the same bytes on every machine).
NVFP4 := build/.nvfp4-target.exported
$(NVFP4): $(wildcard models/embedded/*.safetensors models/embedded/*.json) \
		lib/specrepro/embedded/export_nvfp4.py $(STAMP)
	@echo "exporting the NVFP4 target into build/nvfp4-target/ (the H200 suite's notebook 03 names its bytes; about 10 s, again only when models/embedded changes)"
	$(PY) -m specrepro.cli export-nvfp4 --out build/nvfp4-target
	@touch $@

$(NB_STAMPS)/%.done: notebooks/%.ipynb $(PARAM_FILES) $(LIB_FILES) $(STAMP) $(DRAFTERS) $(NVFP4) \
		$$(shell find results -path '*/$$*/*' -name '*.parquet' 2>/dev/null) \
		$(if $(FRESH),FORCE)
	$(RUN_NB) $*
	@mkdir -p $(@D) && touch $@

$(REPORTS)/index.html: $(NOTEBOOKS:%=$(NB_STAMPS)/%.done)
	$(PY) -m specrepro.cli report --reports-dir $(REPORTS)

nb: $(STAMP) $(DRAFTERS) $(NVFP4)
	@test -n "$(NB)" || { echo "usage: make nb NB=<notebook id> [PARAMS=params/<suite>.yaml]"; exit 2; }
	$(RUN_NB) $(NB)
	@mkdir -p $(NB_STAMPS) && touch $(NB_STAMPS)/$(NB).done
	$(PY) -m specrepro.cli report --reports-dir $(REPORTS)

# The embedded engine's OpenAI-compatible server on models/embedded, port 8000: SC is its
# --speculative-config (quoted here), ARGS any other flags (`specrepro serve --help`), e.g.
# make serve SC='{"method": "dflash", "num_speculative_tokens": 7}' ARGS='--port 8001'
serve: $(STAMP)
	$(PY) -m specrepro.cli serve $(if $(SC),--speculative-config '$(SC)') $(ARGS)

# Re-render the index from the executed notebooks already in $(REPORTS).
html report: $(STAMP)
	$(PY) -m specrepro.cli report --reports-dir $(REPORTS)

# Rebuild the embedded checkpoint (models/embedded) from a seed: corpus, tokenizer, target
# (recipe v3, whose own drafters are then replaced), the drafters in the layouts vLLM and
# SGLang load (recipes engine-layout and light-engine-layout: scripts/retrain_engine_layout.sh)
# and the model card's quality figures. The real recipes want a GPU (v3 467 s, the drafters
# ~9 and ~5 min on an H200); on a CPU use `$(PY) -m specrepro.embedded.training --smoke`.
# Never a prerequisite of `all`: editing the package must not retrain the model.
CORPUS := build/corpus/corpus-v2.jsonl
models: $(STAMP)
	$(PY) -m specrepro.embedded.training.corpus --prose-docs paragraphs --out $(CORPUS)
	$(PY) -m specrepro.embedded.training --recipe v3 --corpus $(CORPUS) --out build/v3
	rm -rf models/embedded.new
	PATH=$(VENV)/bin:$$PATH scripts/retrain_engine_layout.sh drafters $(CORPUS) build/v3 models/embedded.new
	PATH=$(VENV)/bin:$$PATH scripts/retrain_engine_layout.sh light $(CORPUS) build/v3 models/embedded.new
	PATH=$(VENV)/bin:$$PATH scripts/retrain_engine_layout.sh quality $(CORPUS) build/v3 models/embedded.new
	rm -rf models/embedded && mv models/embedded.new models/embedded

FORCE:

clean-venv:
	rm -rf $(VENV)
