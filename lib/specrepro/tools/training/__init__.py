"""Training the embedded checkpoint from a seed: corpus, tokenizer, target, drafters, card.

Tooling (`specrepro.tools`), beside the engine rather than in it: training uses the
embedded engine's model, drafters, tokenizer and checkpoint format (`specrepro.embedded`) to
make `models/embedded`, which the engine then only loads; the engine imports nothing from
here, so it stays the part a reader reads to see how speculative decoding is served.

Design: a run is data plus a pipeline of plain functions, one concept a module.
- `corpus.py`: the deterministic training corpus (math, code, prose) with held-out splits,
  built once into a hashed file (`python -m specrepro.tools.training.corpus`).
- `recipes.py`: `Recipe` and `RECIPES`, every size and budget of a run, with the
  measurements that chose them.
- `loops.py`: target pre-training, self-distillation data, drafter training.
- `quality.py`: the model card's figures (perplexity, acceptance by position, repetition),
  measured through the engine's `Proposer` API.
- `card.py`: `MODEL_CARD.md` text.
- `cli.py`: `specrepro train` / `python -m specrepro.tools.training`, which runs the
  pipeline and writes the checkpoint (or, with `--from`, adds drafters to one).

The package imports torch, numpy, tokenizers, safetensors, jinja2, pyyaml and of the project
`embedded`, `data` and `metrics` only (the H200 that trains the model lacks the analysis
stack; tests/test_boundaries.py holds it to that). This `__init__` and `specrepro.tools`'
import nothing, so the corpus builder runs without torch.
"""
