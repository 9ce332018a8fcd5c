"""An arm's running engine for the runner: the HTTP handle or the in-process peer, where it
runs (CPU placement), how it is started, and the version an earlier session recorded.

Design: `ArmEngine` is what a cell measures against, whatever serves it: a launched or
attached engine (`engine_handle.EngineHandle`) or the in-process transformers peer, and
`adapter` the engine's adapter (harness/engines/) whose facts apply to its cells. One launch may
serve arms of several studies (launch_plan.launch_groups): each study sees it through a copy
naming its own arm (`dataclasses.replace(engine, arm=...)`), and only the launch's own
object stops it. `placement_for` plans the CPU split under a study's placement policy,
`session_placement` is the manifest's summary of the arms' placements, and
`known_version` lets an arm whose cells are all stored be skipped without a launch.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specrepro import identity
from specrepro.harness import cpu_placement, engine_http, engines, power
from specrepro.harness.engine_handle import EngineHandle
from specrepro.harness.engines.base import EngineAdapter
from specrepro.params import ResolvedArm
from specrepro.store import ResultStore


@dataclass
class ArmEngine:
    """The running engine of one arm: an HTTP handle or the in-process peer."""

    arm: ResolvedArm
    handle: EngineHandle | None = None
    peer: Any = None  # peer.TransformersPeer
    peer_placement: cpu_placement.Placement | None = None  # the peer's (the handle keeps its own)

    @property
    def placement(self) -> cpu_placement.Placement | None:
        return self.peer_placement if self.peer is not None else self.handle.placement

    @property
    def profile(self):
        return self.arm.resolved

    @property
    def version(self) -> str | None:
        return self.peer.version() if self.peer is not None else self.handle.version

    @property
    def adapter(self) -> EngineAdapter:
        """Whose metric names, request features and acceptance source apply: the engine
        that answers on the handle (an attached URL's, found behind it), else the
        profile's (the in-process peer)."""
        if self.handle is not None:
            return self.handle.served_by
        return engines.engine(self.profile.engine)

    @property
    def pid(self) -> int | None:
        if self.peer is not None:
            return power.current_pid()
        return self.handle.process.pid if self.handle.process is not None else None

    def alive(self) -> bool:
        if self.peer is not None:
            return True
        if not self.handle.alive():
            return False
        path = self.handle.served_by.ready_path
        return engine_http.http_get(self.handle.url + path, timeout=5.0)[0] != 0

    def scrape(self) -> str | None:
        return None if self.peer is not None else self.handle.metrics_text()

    def describe(self) -> dict:
        p = self.profile
        info = {"arm": self.arm.name, "profile": p.name, "profile_file": p.source,
                "profile_hash": identity.profile_hash(p), "engine": p.engine,
                "version": self.version, "flags": p.flags,
                "speculative": p.speculative.model_dump(mode="json") if p.speculative else None,
                "placement": self.placement.record() if self.placement else None}
        if self.handle is not None:
            h = self.handle
            info.update(url=h.url, argv=h.argv, attached=h.attached,
                        log=str(h.log_path) if h.log_path else None,
                        kv_pool_tokens=h.startup.kv_pool_tokens,
                        max_concurrency=h.startup.max_concurrency, startup=h.startup.record(),
                        warnings=h.warnings)
        return info

    def stop(self) -> None:
        if self.handle is not None:
            self.handle.stop()


def placement_for(arm: ResolvedArm, policy: str,
                  cpus: tuple[int, ...] | None) -> cpu_placement.Placement:
    """The arm's CPU placement under the study's policy (cpu_placement.plan_placement)."""
    profile = arm.resolved
    adapter = engines.engine(profile.engine)
    if adapter.why_unpinned:  # attached, or in-process
        return cpu_placement.plan_placement(policy, cpus, None, why_not=adapter.why_unpinned)
    return cpu_placement.plan_placement(policy, cpus, adapter.cpu_threads(profile))


def log_name(arm: ResolvedArm) -> str:
    """An arm's engine log in a store's logs/ (`.log` while it runs, `.log.gz` after): one
    per arm and profile, since arms that share a profile (the block drafter at 3 and 5
    drafts) may run at once (`--arm`) and each launch parses its own lines."""
    return f"{arm.name}--{arm.resolved.name}.log"


def start_engine(arm: ResolvedArm, log_dir: Path, root: Path,
                 placement: cpu_placement.Placement | None = None,
                 pid_dir: Path | None = None, port: int | None = None) -> ArmEngine:
    """The arm's engine started (its pid file in pid_dir: lifecycle.engines_dir), or the
    in-process peer loaded. `port`: where a launched engine listens instead of its
    profile's (engines side by side, engine_pool.py); the arm keeps its resolved profile,
    whose identity the cells carry."""
    profile = arm.resolved
    if port is not None and port != profile.port:
        profile = profile.model_copy(update={"port": port})
    adapter = engines.engine(profile.engine)
    if adapter.in_process:
        return ArmEngine(arm, peer=adapter.load(profile, root), peer_placement=placement)
    return ArmEngine(arm, handle=engines.launch(profile, log_dir, profile.source, placement,
                                                log_name=log_name(arm).removesuffix(".log"),
                                                pid_dir=pid_dir))


def session_placement(placements: dict[str, cpu_placement.Placement]) -> dict:
    """The manifest session's `placement`: the arms' common record, or the first pinned
    arm's with the arms placed otherwise named in the note."""
    if not placements:
        return {"engine_cpus": [], "client_cpus": [], "pinned": False,
                "note": "no engine was started in this session"}
    records = {arm: p.record() for arm, p in placements.items()}
    base = next((r for r in records.values() if r["pinned"]), next(iter(records.values())))
    others = [f"arm {arm!r}: {r['note']}" for arm, r in records.items() if r != base]
    if others:
        base = {**base, "note": f"{base['note']}; other arms: {'; '.join(others)}"}
    return base


def known_version(store: ResultStore, arm: ResolvedArm) -> str | None:
    """The engine version an earlier session recorded for this arm and profile: by the
    profile's hash, or, in a session rebuilt from its cells rows (store/manifest_rebuild.py:
    no hash), by arm and profile name, which is safe: a cell id computed with a version
    matches a stored cell only where that version measured it. A local folder absent here
    (an export not yet made on a fresh machine) is hashed by the fingerprint the store
    recorded for it, as the cells' ids are (runner._Run.cid)."""
    manifest = store.manifest()
    want = identity.profile_hash(arm.resolved, identity.recorded_fingerprints(manifest))
    for session in reversed(manifest.get("sessions", [])):
        for eng in reversed(session.get("engines") or []):
            if eng.get("arm") == arm.name and (
                    eng.get("profile_hash") == want
                    or (eng.get("rebuilt") and eng.get("profile") == arm.resolved.name)):
                return eng.get("version")
    return engines.engine(arm.resolved.engine).known_version()
