# specrepro: `make all` regenerates every figure on the embedded engine,
# `make test` runs the test suite. Both create .venv by themselves.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PARAMS ?= params/default.yaml
export SPECREPRO_DATA_DIR ?= $(abspath ../shared/data)

.PHONY: all test browser venv clean-venv nb html report models serve FORCE

# The venv is rebuilt when the project's dependencies change, not when the
# package's code does (it is installed editable). Each stage says what it does and pip shows
# what it collects (measured on a 2-core machine: README, "Two commands").
$(STAMP): pyproject.toml
	@echo "creating $(VENV) (1-4 minutes on a 2-core machine, in three stages; pip lists what it collects)"
	$(PYTHON) -m venv $(VENV)
	@echo "[1/3] pip itself"
	$(PY) -m pip install --upgrade pip
	@echo "[2/3] CPU PyTorch 2.13.0 first, so that nothing below pulls a multi-GB CUDA build"
	$(PY) -m pip install torch==2.13.0
	@echo "[3/3] the project (editable) and its dependencies: the notebook stack, polars, the test tools"
	$(PY) -m pip install -e '.[dev]'
	@echo "$(VENV) is ready"
	touch $@

venv: $(STAMP)

# `make test` is what CI runs (.ci/run is `make test` and sets nothing of its own): the articles'
# text from ../shared/seeds where it exists (the published-text tests; without it they are one
# skip), no hub (the data come from SPECREPRO_DATA_DIR), and CI=1, under which the
# report-rendering tests fail rather than skip when Chromium is missing (`make test CI=` skips
# them instead); `browser` gets Chromium first. Each is a default: a variable set in the
# environment or on the command line wins.
# On two or more cores the tests run in pytest-xdist workers, one per core up to four, a test
# file per worker at a time (module fixtures are built once), in the order tests/conftest.py
# collects them (the files with a `slow` test first), not xdist's by test count: 1,062 s in one
# process against 659 s in two on this project's 2-core machine (2026-12-08), before the order.
# TEST_WORKERS=0 runs them in this process.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); [ $$n -gt 4 ] && n=4; [ $$n -lt 2 ] && n=0; echo $$n)
TEST_PARALLEL = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)
SEEDS_DIR := $(wildcard $(abspath ../shared/seeds))
ifneq ($(SEEDS_DIR),)
test: export SPECREPRO_SEEDS_DIR ?= $(SEEDS_DIR)
endif
test: export HF_HUB_OFFLINE ?= 1
test: export HF_DATASETS_OFFLINE ?= 1
test: export TOKENIZERS_PARALLELISM ?= false
test: export CI ?= 1
test: $(STAMP) browser
	$(PY) -m pytest -q $(TEST_PARALLEL)

# Headless Chromium for the report-rendering tests (tests/test_report_render.py finds
# `chromium` or `chromium-browser` on PATH). Present: nothing to do. Missing under CI (what
# `make test` sets): installed from Debian's packages where this is root with apt-get (a fresh
# machine here, and CI's), else one line says what to install and how to run without it.
browser:
	@if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then :; \
	elif [ -z "$$CI" ]; then \
	  echo "note: chromium is not installed: the report-rendering tests will skip"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing chromium (Debian's package) for the report-rendering tests: about a minute"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null \
	    || { echo "error: apt-get could not install chromium; install it, or run \`make test CI=\` to skip the report-rendering tests" >&2; exit 2; }; \
	else \
	  echo "error: the report-rendering tests need chromium: install it (as root: apt-get install chromium), or run \`make test CI=\` to skip them" >&2; exit 2; \
	fi

# --- the notebooks -------------------------------------------------------------------
# `make all` runs every notebook on $(PARAMS) (a suite) and writes figures/, results/,
# reports/<nb>.html and reports/index.html. A finding is its folder, findings/<nb>/ (its
# notebook.ipynb, study.yaml and claims.yaml). A notebook re-runs only when one of its
# inputs changed (its folder's files, any params file, the package's code and data, its
# study's stored results in this suite's results folder: another suite's, a smoke run's say,
# are not its inputs); it then replays stored cells and measures only missing ones.
# FRESH=1 measures every cell again. `make nb NB=<id>` runs one notebook regardless.
# The findings, in order, from their one registry (lib/specrepro/findings.py reads it alike).
NOTEBOOKS := $(shell sed -n 's/^- \([A-Za-z0-9][A-Za-z0-9_.-]*\).*/\1/p' findings/findings.yaml)
SUITE := $(basename $(notdir $(PARAMS)))
MODE := $(if $(FRESH),run,auto)
# The default suite's figures are the committed ones; other suites write beside them.
FIGURES ?= $(if $(filter default,$(SUITE)),figures,figures/$(SUITE))
REPORTS ?= $(if $(filter default,$(SUITE)),reports,reports/$(SUITE))
NB_STAMPS := .stamps/$(SUITE)
# The suite's results folder: its results_dir, relative to the suite file (../results where
# it names none, as params/schema.py reads it); a study's stores are <results>/<study = nb>/.
SUITE_RESULTS := $(abspath $(dir $(PARAMS))$(or $(shell sed -n 's/^results_dir:[[:space:]]*\([^[:space:]\#]*\).*/\1/p' $(PARAMS) 2>/dev/null),../results))
LIB_FILES := $(shell find lib/specrepro -name '*.py' -o -name '*.yaml' -o -name '*.csv')
PARAM_FILES := $(wildcard params/*.yaml params/studies/*.yaml params/profiles/*.yaml) \
	findings/findings.yaml
RUN_NB = $(PY) -m specrepro.analysis.render.notebooks run --params $(PARAMS) --mode $(MODE) \
	--figures-dir $(FIGURES) --reports-dir $(REPORTS)

all: $(STAMP) $(REPORTS)/index.html

# Notebooks that replay render side by side, one per core; a notebook that measures takes
# the machine to itself (analysis/render/notebooks.py: .stamps/machine.lock), since its engine and
# load generator are pinned to the cores and share the engine's port. Output streams (the
# venv's install, `make serve`, `make test`); a notebook's log alone is printed whole when it
# ends, so that two side by side do not interleave.
MAKEFLAGS += -j$(shell nproc 2>/dev/null || echo 1)
.SECONDEXPANSION:
# The drafters in the folders vLLM and SGLang load (git-ignored): the GPU suites' profiles
# name them, and a cell's identity holds their fingerprint, so replaying those suites' stored
# cells needs them here too. Written from models/embedded, again only when it changes.
DRAFTERS := build/engine-drafters/.exported
$(DRAFTERS): $(wildcard models/embedded/*/*.safetensors models/embedded/*/*.json) \
		lib/specrepro/tools/export/drafters.py $(STAMP)
	@echo "exporting the drafters into build/engine-drafters/ (the GPU suites' cells name their bytes; about 10 s, again only when models/embedded changes)"
	$(PY) -m specrepro.cli export-drafters --engine all
	@touch $@

# The NVFP4 target vLLM serves in the H200 suite's notebook 03 (git-ignored), likewise in its
# cells' identity; the exporter is deterministic (the same bytes on every machine).
NVFP4 := build/.nvfp4-target.exported
$(NVFP4): $(wildcard models/embedded/*.safetensors models/embedded/*.json) \
		lib/specrepro/tools/export/nvfp4.py $(STAMP)
	@echo "exporting the NVFP4 target into build/nvfp4-target/ (the H200 suite's notebook 03 names its bytes; about 10 s, again only when models/embedded changes)"
	$(PY) -m specrepro.cli export-nvfp4 --out build/nvfp4-target
	@touch $@

$(NB_STAMPS)/%.done: findings/%/notebook.ipynb findings/%/study.yaml findings/%/claims.yaml \
		$(PARAM_FILES) $(LIB_FILES) $(STAMP) $(DRAFTERS) $(NVFP4) \
		$$(shell find $(SUITE_RESULTS)/$$* -name '*.parquet' 2>/dev/null) \
		$(if $(FRESH),FORCE)
	@echo "$*: running ($(MODE), $(PARAMS))"
	@log=$$(mktemp); trap 'rm -f "$$log"' EXIT; \
	  $(RUN_NB) $* >"$$log" 2>&1; rc=$$?; cat "$$log"; exit $$rc
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
# Its log streams; once it listens it prints the base URL and the model id to send
# (`embedded`, the profiles' name; `models/embedded` is answered too).
serve: $(STAMP)
	$(PY) -m specrepro.cli serve $(if $(SC),--speculative-config '$(SC)') $(ARGS)

# Re-render the index from the executed notebooks already in $(REPORTS).
html report: $(STAMP)
	$(PY) -m specrepro.cli report --reports-dir $(REPORTS)

# Rebuild the embedded checkpoint (models/embedded) from a seed: corpus, tokenizer, target
# (recipe v3, whose own drafters are then replaced), the drafters in the layouts vLLM and
# SGLang load (recipes engine-layout and light-engine-layout: scripts/retrain_engine_layout.sh)
# and the model card's quality figures. The real recipes want a GPU (v3 467 s, the drafters
# ~9 and ~5 min on an H200); on a CPU use `$(PY) -m specrepro.tools.training --smoke`.
# Never a prerequisite of `all`: editing the package must not retrain the model.
CORPUS := build/corpus/corpus-v2.jsonl
models: $(STAMP)
	$(PY) -m specrepro.tools.training.corpus --prose-docs paragraphs --out $(CORPUS)
	$(PY) -m specrepro.tools.training --recipe v3 --corpus $(CORPUS) --out build/v3
	rm -rf models/embedded.new
	PATH=$(VENV)/bin:$$PATH scripts/retrain_engine_layout.sh drafters $(CORPUS) build/v3 models/embedded.new
	PATH=$(VENV)/bin:$$PATH scripts/retrain_engine_layout.sh light $(CORPUS) build/v3 models/embedded.new
	PATH=$(VENV)/bin:$$PATH scripts/retrain_engine_layout.sh quality $(CORPUS) build/v3 models/embedded.new
	rm -rf models/embedded && mv models/embedded.new models/embedded

FORCE:

clean-venv:
	rm -rf $(VENV)
