"""The in-process transformers peer's engine facts (the peer itself is harness/transformers_peer.py).

Design: `TransformersAdapter` is what the runner asks about an arm whose profile says
`engine: transformers`: it is served inside the harness process (`in_process`: nothing to
launch, no HTTP, no /metrics, so `metrics` is None and no counters are read), its CPUs are
the harness's own (`why_unpinned`), its version is the installed library's, and its
acceptance counts are the ones the peer derives per request (`peer.peer_counts`). Its
requests are made in-process, under the default (vLLM's) request features. peer.py, which
imports torch and transformers, is imported only when one of these is asked for.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from specrepro.harness.engines.base import Counts, EngineAdapter, EngineError
from specrepro.harness.promtext import SpecCounters
from specrepro.harness.records import RequestRecord
from specrepro.params import Profile


class TransformersAdapter(EngineAdapter):
    """The in-process transformers peer: no server, no argv, acceptance from its own counts."""

    kind = "transformers"
    what = "the in-process transformers peer"
    launches = False
    in_process = True
    local_model = True  # the embedded checkpoint's folder (peer.py)
    why_unpinned = ("in-process transformers peer: the engine runs inside the harness "
                    "process, so there is no separate engine process to pin")

    def render_argv(self, profile: Profile, source: str | Path | None = None) -> list[str]:
        raise EngineError(f"profile {profile.name!r}: engine {profile.engine!r} is not an HTTP "
                          "server; it runs in-process (harness/transformers_peer.py)")

    def load(self, profile: Profile, root: Path) -> Any:
        """The loaded peer (peer.TransformersPeer)."""
        from specrepro.harness.transformers_peer import TransformersPeer

        return TransformersPeer(profile, root).load()

    def known_version(self) -> str | None:
        from specrepro.harness.transformers_peer import version

        return version()

    def acceptance(self, delta: SpecCounters | None, records: Sequence[RequestRecord],
                   warnings: list[str], k: int | None = None) -> Counts | None:
        from specrepro.harness.transformers_peer import peer_counts

        c = peer_counts(records)
        if c is None:
            return None
        return (c["num_drafts"], c["num_draft_tokens"], c["num_accepted_tokens"],
                c["accepted_per_pos"])
