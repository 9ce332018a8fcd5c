"""The embedded engine's proposers (drafters), one module per method, and their registry.

Design:
- `PROPOSERS` maps each method the embedded engine serves to its proposer class, keyed by the
  class's own `method`; its keys are `specrepro.speculative.EMBEDDED_METHODS`, and the ones
  built from trained weights (`DrafterConfig`, checkpoint folders) are
  `specrepro.speculative.MODEL_METHODS`. The import fails if either drifts from the contract.
- Modules: `base` (the `Proposer` API, `DrafterConfig`, the shared target head, the draft
  loop), `mtp` (MTP head), `dflash` (block drafter), `draft_model` (independent small model),
  `ngram` (prompt lookup, no weights).
- A model proposer is built from its config (`build_proposer`, random weights) or loaded
  from a checkpoint (`checkpoint.load_proposer`); `ngram` from the speculative config
  (`make_ngram`).
"""

from __future__ import annotations

from torch import nn

from specrepro.embedded.model import Qwen3Model
from specrepro.embedded.proposers.base import DrafterConfig, Proposer, SharedTarget, greedy
from specrepro.embedded.proposers.dflash import BlockDrafter
from specrepro.embedded.proposers.draft_model import DraftModel
from specrepro.embedded.proposers.mtp import MTPHead
from specrepro.embedded.proposers.ngram import NgramProposer, make_ngram
from specrepro.speculative import EMBEDDED_METHODS, MODEL_METHODS

PROPOSERS = {cls.method: cls for cls in (MTPHead, BlockDrafter, DraftModel, NgramProposer)}
if tuple(PROPOSERS) != EMBEDDED_METHODS or tuple(
        m for m, cls in PROPOSERS.items() if issubclass(cls, Proposer)) != MODEL_METHODS:
    raise ImportError(f"proposer registry {list(PROPOSERS)} does not match "
                      f"specrepro.speculative (EMBEDDED_METHODS {EMBEDDED_METHODS}, "
                      f"MODEL_METHODS {MODEL_METHODS})")


def build_proposer(cfg: DrafterConfig, target: Qwen3Model) -> Proposer:
    """A fresh (randomly initialised) drafter of `cfg` for `target`."""
    prop = PROPOSERS[cfg.method](cfg, target.config, target)
    for name, p in prop.named_parameters():
        if name.endswith("norm.weight"):
            nn.init.ones_(p)
        else:
            nn.init.normal_(p, std=0.02)
    return prop


__all__ = ["PROPOSERS", "BlockDrafter", "DraftModel", "DrafterConfig", "MTPHead",
           "NgramProposer", "Proposer", "SharedTarget", "build_proposer", "greedy",
           "make_ngram"]
