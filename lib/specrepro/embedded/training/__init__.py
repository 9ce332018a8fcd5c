"""Training the embedded checkpoint from a seed: corpus, tokenizer, target, drafters, card.

Design: a run is data plus a pipeline of plain functions, one concept a module.
- `corpus.py`: the deterministic training corpus (math, code, prose) with held-out splits,
  built once into a hashed file (`python -m specrepro.embedded.training.corpus`).
- `recipes.py`: `Recipe` and `RECIPES`, every size and budget of a run, with the
  measurements that chose them.
- `loops.py`: target pre-training, self-distillation data, drafter training.
- `quality.py`: the model card's figures (perplexity, acceptance by position, repetition),
  measured through the engine's `Proposer` API.
- `card.py`: `MODEL_CARD.md` text.
- `cli.py`: `specrepro train` / `python -m specrepro.embedded.training`, which runs the
  pipeline and writes the checkpoint (or, with `--from`, adds drafters to one).

The package imports torch, numpy, tokenizers, safetensors, jinja2, pyyaml only (the H200
that trains the model lacks the analysis stack). This `__init__` imports nothing, so the
corpus builder runs without torch.
"""
