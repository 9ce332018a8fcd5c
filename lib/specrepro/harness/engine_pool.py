"""The engines of one run's launch groups across the rounds of its repeats (runner.py).

Design:
- The runner measures repeats in rounds (round r: repeat r of every arm, launch group by
  launch group, each study's baseline first), so a study's repeats run A B C, A B C, never
  back to back. A group's engine is started the first time the group has cells to measure
  in a round (`EnginePool.start`); whether it outlives its turn is the pool's `keep`:
  - restart (`keep=False`): stopped once the group's cells of the round are measured
    (`release`); the next round starts it anew, so each repeat is a fresh engine start and
    the spread of the repeats includes what a start changes (one vLLM process read 9,764-
    11,834 tok/s at 32 streams and 16,009-18,039 a minute later). For GPU engines: one
    takes the card's memory the next one needs.
  - side by side (`keep=True`): every engine stays up, idle while another group's cells
    are timed, until the run ends (`stop_all`). Each takes its profile's port, or the next
    one above it that no engine of the pool holds (the port is no part of a cell's
    identity: the arm's resolved profile keeps the declared one). On the CPU an idle
    embedded engine blocks on its queue (two wake-ups a second) and holds memory only, and
    a start (3.7-8 s on the 2-core box, the load of the machine deciding) is paid once per
    arm instead of once per arm and round.
  `choose_keep` reads the studies' `interleave` (params/window.py: auto is side by side
  where no arm needs a GPU).
- A group whose engine failed to start or died is `dead` for the rest of the run: its
  cells are left for a re-run (the error was recorded once), never restarted each round.
- Stopping a launch (`stop`): its last /metrics beside its log (every family whole, some
  10 KB gzipped), the engine stopped, its log copied into the stores of the other arms that
  rode on it (`copies`) and gzipped (compaction.pack_log: one gzip member per launch).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specrepro.harness import engines
from specrepro.harness.arm_engine import ArmEngine, start_engine
from specrepro.harness.engine_http import port_open
from specrepro.params import ResolvedArm
from specrepro.store import append_log, pack_log


@dataclass
class Launch:
    """One engine start: the engine, its ordinal in the command, the arms announced in the
    manifest against it, and the logs to copy it into when it stops."""

    eng: ArmEngine
    index: int
    ready_s: float | None = None
    study: str = ""  # the study whose arm launched it
    announced: set[tuple[int, str]] = field(default_factory=set)  # (id(ctx), arm name)
    copies: list[Path] = field(default_factory=list)

    @property
    def log(self) -> Path | None:
        h = self.eng.handle
        launched = h is not None and not h.attached
        return h.log_path if launched and h.log_path is not None else None


def choose_keep(studies: Sequence[Any], arms: Sequence[ResolvedArm]) -> tuple[bool, str]:
    """Whether a run keeps its engines side by side, and why (the manifest's note)."""
    modes = {st.interleave for st in studies}
    gpu = sorted({a.name for a in arms if a.resolved.needs_gpu})
    if "restart" in modes:
        return False, ("interleave: restart (a study says so): each arm's engine is "
                       "started anew in every round")
    if modes == {"side_by_side"}:
        return True, ("interleave: side_by_side: every arm's engine stays up, idle while "
                      "another arm's cells are timed")
    if gpu:
        return False, (f"interleave: auto, restart: arms {', '.join(gpu)} need a GPU, whose "
                       "memory the next engine needs; each arm's engine is started anew in "
                       "every round")
    return True, ("interleave: auto, side by side: no arm needs a GPU; every arm's engine "
                  "stays up, idle while another arm's cells are timed")


class EnginePool:
    """The run's live launches by group key (module docstring)."""

    def __init__(self, keep: bool):
        self.keep = keep
        self.live: dict[int, Launch] = {}
        self.dead: set[int] = set()
        self.launches = 0

    def get(self, key: int) -> Launch | None:
        return self.live.get(key)

    def port_for(self, arm: ResolvedArm) -> int | None:
        """Side by side, a launched engine's port: its profile's, else the next one above
        that no live engine of the pool holds and nothing else listens on (the profile's
        own port is left to the launch's check, which stops a stale engine of this results
        dir or names who holds it); None to keep the profile's."""
        p = arm.resolved
        if not self.keep or not engines.engine(p.engine).launches:  # attached, in-process
            return None
        held = {launch.eng.handle.profile.port for launch in self.live.values()
                if launch.eng.handle is not None}
        port = p.port
        while port in held or (port != p.port and port_open(p.host, port)):
            port += 1
        return port

    def start(self, key: int, arm: ResolvedArm, log_dir: Path, root: Path, placement,
              pid_dir: Path) -> Launch:
        eng = start_engine(arm, log_dir, root, placement, pid_dir, port=self.port_for(arm))
        launch = self.live[key] = Launch(eng, self.launches)
        self.launches += 1
        return launch

    def release(self, key: int) -> None:
        """The group's turn in the round is over: stopped unless the pool keeps engines."""
        if not self.keep or key in self.dead:
            self.stop(key)

    def stop(self, key: int) -> None:
        launch = self.live.pop(key, None)
        if launch is None:
            return
        eng, log = launch.eng, launch.log
        final = eng.scrape() if log is not None and eng.alive() else None
        eng.stop()
        if log is not None and log.is_file():
            text = eng.handle.log_text()
            for path in launch.copies:  # each store keeps the log of every engine it used
                append_log(path, text)
            pack_log(log)
        if final:
            append_log(metrics_name(log), final)

    def stop_all(self) -> None:
        for key in list(self.live):
            self.stop(key)


def metrics_name(log: Path) -> Path:
    """Where a launch's last /metrics text goes beside its log (`.metrics.txt`, gzipped)."""
    return log.with_name(log.name.removesuffix(".log") + ".metrics.txt")
