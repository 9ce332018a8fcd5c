"""Tooling: the programs that make what the runtime reads, kept apart from the runtime.

The runtime is what a measurement runs: the embedded engine (`specrepro.embedded`), the
harness, the analysis and the results store. The tooling makes their inputs, once, on a
maintainer's machine, the GPU box or a `make` rule, never while a cell is measured:

- `extract_engine_cli/`: the flag extractor. It reads vLLM's and SGLang's wheels statically
  and writes the lists of flags each version accepts
  (`harness/engine_cli/<engine>-<version>.json`, the runtime's data, read by
  `harness/flags.py`); `scripts/extract_engine_cli.py` runs it.
- `training/`: training the embedded checkpoint (`models/embedded`) from a seed: corpus,
  tokenizer, target, drafters, model card (`specrepro train`,
  `python -m specrepro.tools.training`).
- `export/`: the exporters, which rewrite the trained checkpoint into the folders the real
  engines load (`specrepro export-drafters`, `export-nvfp4`, `export-standin`).

"Tooling" in the sense of a compiler's toolchain beside its runtime library: the runtime
never needs it to run, and it may use the runtime (the trainer drives the engine's model and
drafters, the exporters read its checkpoints). The arrow points one way:
`tests/test_boundaries.py` gives the tooling rows of its own and lets no runtime layer
import `specrepro.tools`. `training/` and `export/` run on the GPU image, so they import only
what the embedded engine may (never polars, papermill, datasets, pydantic, pandas). This
`__init__` imports nothing.
"""
