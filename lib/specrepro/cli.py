"""The `specrepro` console script: a thin dispatcher.

Each subcommand lives in the module that owns its concept and exposes
``main(argv: list[str]) -> int``; the module is imported only when its
subcommand runs, so `specrepro serve` on a GPU box never imports polars.
"""

from __future__ import annotations

import importlib
import sys

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("specrepro.embedded.serve", "start the embedded OpenAI-compatible engine"),
    "train": ("specrepro.tools.training.cli", "train the embedded target and drafters from a seed"),
    "run": ("specrepro.harness.run_command", "run a study (params/*.yaml) against an engine"),
    "plan": ("specrepro.harness.plan_command", "a suite's commands and leases with their estimated GPU seconds; --spent: planned against spent"),
    "profile": ("specrepro.harness.profile_command", "trace one arm's engine under a short load: where its time goes"),
    "probe": ("specrepro.harness.probe_command", "ask a study's probes: does a profile's engine start and serve?"),
    "report": ("specrepro.analysis.render.report", "render notebooks' HTML index from executed reports"),
    "check": ("specrepro.harness.preflight", "validate a params file (suite, study or profile) and what its run would meet before an engine starts"),
    "compact": ("specrepro.store.compaction", "make a results store ready to commit: merge, fold, gzip logs"),
    "export-drafters": ("specrepro.tools.export.drafters", "write the drafters in the layouts vLLM and SGLang load"),
    "export-nvfp4": ("specrepro.tools.export.nvfp4", "write the target as NVFP4 (compressed-tensors) for vLLM"),
    "export-fp8-drafter": ("specrepro.tools.export.fp8_drafter", "write a block drafter as an FP8 checkpoint vLLM loads (notebook 05)"),
    "export-standin": ("specrepro.tools.export.standin", "write the target and drafters inflated to a 27B-class byte budget"),
}


def usage() -> str:
    lines = ["usage: specrepro <command> [options]", "", "commands:"]
    lines += [f"  {name:<8} {help_}" for name, (_, help_) in SUBCOMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    if argv[0] in ("-V", "--version"):
        from specrepro import __version__

        print(__version__)
        return 0
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        print(f"specrepro: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(SUBCOMMANDS[name][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
