"""torch.compile in the embedded engine (`EngineConfig.compile`, `compile_scope`).

Design:
- Scope "step": the whole decode program or target forward goes through `torch.compile`
  (graphs.py wraps them); a drafter whose passes run outside that program (the staged path)
  is wrapped here (`CompiledProposer`).
- Scope "layer": every decoder layer of the target and of a drafter is compiled in place
  (`compile_layers`): the layers share one code object, so a deep model's compile time is
  one layer's.
- The recompile limit is raised (`allow_recompiles`): torch.compile keys its cache by code
  object, so every engine of a process shares one, and past dynamo's default of 8 it would
  silently run eagerly.
"""

from __future__ import annotations

import torch

from specrepro.embedded.model import DecoderLayer

# torch.compile keys its cache by code object: every engine's decode program shares one, and
# each (batch bucket, k) is a recompilation. Past dynamo's default limit (8) it silently runs
# eagerly, so a benchmark's later engines would be measured uncompiled.
RECOMPILE_LIMIT = 256


def allow_recompiles() -> None:
    """Raise dynamo's recompile limits to at least RECOMPILE_LIMIT (never lower them)."""
    dyn = torch._dynamo.config
    dyn.recompile_limit = max(dyn.recompile_limit, RECOMPILE_LIMIT)
    dyn.accumulated_recompile_limit = max(dyn.accumulated_recompile_limit, 4 * RECOMPILE_LIMIT)


def compile_layers(model, proposer=None) -> int:
    """Compile every decoder layer of the target and of a drafter in place (compile scope
    "layer"); returns how many. The layers share one code object and dynamo lifts their
    weights to inputs, so the compiled graph of one layer serves all of them: a 37-layer
    stand-in compiles one layer per input shape rather than the unrolled program. Shapes
    are automatic-dynamic (static first, symbolic once a second shape arrives), so varying
    prefill chunks do not compile one graph each. Names and state dicts are unchanged."""
    n = 0
    for module in (model, proposer):
        if not isinstance(module, torch.nn.Module):
            continue
        for m in module.modules():
            if isinstance(m, DecoderLayer):
                m.compile()
                n += 1
    return n


class CompiledProposer:
    """A drafter whose `propose` and `observe` run through `torch.compile` (compile=True).
    Drafters read lengths with `int(...)`, which splits their graphs; the pieces between
    still fuse. k is a Python int, so each draft length compiles once."""

    def __init__(self, inner):
        self.inner = inner
        self.propose = torch.compile(inner.propose, dynamic=True)
        self.observe = torch.compile(inner.observe, dynamic=True)

    def __getattr__(self, name):
        return getattr(self.inner, name)
