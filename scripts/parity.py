"""Acceptance parity between engines on the same weights: one study's result stores side by
side (tokens per step and its gap, token identity of outputs, invariance within each engine,
speed), as lib/specrepro/analysis/finding/parity.py builds them.

    python scripts/parity.py \\
        --store "vLLM 0.26.0=results/h200-engines/01_drafter_block_sweep/h200-engines" \\
        --store "embedded=results/h200-embedded/01_drafter_block_sweep/h200-embedded" \\
        [--reference NAME] [--gap-pct 5] [--markdown]

Prints the four tables, each under one line saying what it shows (plain text, or Markdown).
A figure, not a test: no thresholds fail the run; a gap above --gap-pct is flagged.

`--near-ties` adds where outputs part from the reference engine's autoregressive text
(lib/specrepro/analysis/finding/near_ties.py): at each first differing token, the target's top-1
minus top-2 log-probability, computed here by the embedded target (--model, fp32 on the CPU
unless --dtype/--device say otherwise) over the prompt, as the study built it, and the
common prefix. `--details` prints every differing prompt too.
"""

from __future__ import annotations

import argparse

from specrepro.analysis.finding import near_ties, parity

TITLES = {"acceptance": "Acceptance", "identity": "Identity across engines",
          "invariance": "Invariance within each engine", "speed": "Speed",
          "near_ties": "Where outputs part from the autoregressive text",
          "crossings": "Near-ties along the autoregressive text",
          "near_tie_details": "Each differing prompt"}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--store", action="append", required=True, metavar="NAME=PATH",
                    help="a run directory <results_dir>/<study>/<run_id> and the engine's name "
                         "for readers; twice or more (the first is the reference by default)")
    ap.add_argument("--reference", default=None, help="the store name to compare against")
    ap.add_argument("--gap-pct", type=float, default=parity.GAP_PCT,
                    help="flag a tokens-per-step gap whose size is above this (%%)")
    ap.add_argument("--markdown", action="store_true", help="Markdown tables")
    ap.add_argument("--near-ties", action="store_true",
                    help="where outputs part from the reference's autoregressive text, and "
                         "the target's margin there")
    ap.add_argument("--reference-arm", default=near_ties.REFERENCE_ARM,
                    help="the reference store's arm whose outputs are the reference text")
    ap.add_argument("--details", action="store_true", help="with --near-ties: every prompt")
    ap.add_argument("--model", default="models/embedded",
                    help="the embedded checkpoint that scores the partings")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)
    try:
        stores = parity.load_stores(args.store, end_of_text(args.model))
    except parity.ParityError as err:
        ap.error(str(err))
    try:
        parity.reference_of(stores, args.reference)
    except parity.ParityError as err:
        ap.error(f"--reference: {err}")
    return args, stores


def end_of_text(model_dir: str) -> tuple[int, ...]:
    """The checkpoint's end-of-text ids (generation_config.json, else config.json): outputs
    are compared up to the first of them."""
    import json
    from pathlib import Path

    for name in ("generation_config.json", "config.json"):
        f = Path(model_dir) / name
        if f.is_file() and (ids := json.loads(f.read_text()).get("eos_token_id")) is not None:
            return tuple(ids) if isinstance(ids, list) else (ids,)
    return ()


def study_prompts(store: parity.Store) -> dict[str, str]:
    """prompt_id -> the text the engines were sent, rebuilt from the store's manifest (the
    workloads as the study declared them); a chat prompt through the embedded template."""
    from specrepro.store import ResultStore
    from specrepro.workloads import build_workload

    sessions = ResultStore(store.path.parent.parent, store.path.parent.name,
                                   store.path.name).manifest().get("sessions", [])
    params = next((s["params"] for s in reversed(sessions) if s.get("params")), None)
    if params is None:
        raise SystemExit(f"{store.path}: its manifest has no session params to rebuild the "
                         "prompts from")
    out = {}
    for w in params["workloads"]:
        for p in build_workload(w):
            out[p.id] = p.text if p.messages is None else p.messages
    return out


def embedded_scorer(model_dir: str, dtype: str, device: str, prompts: dict[str, object]):
    """The embedded target's top log-probabilities after a prompt and a prefix (a Scorer),
    and its margins along a whole output."""
    import functools

    import torch

    from specrepro.embedded.checkpoint import load_target

    model, tok = load_target(model_dir, device=device, dtype=getattr(torch, dtype))

    @functools.cache
    def top(prompt_id: str, prefix: tuple[int, ...]) -> list[tuple[int, float]]:
        prompt = prompts[prompt_id]
        text = prompt if isinstance(prompt, str) else tok.apply_chat_template(prompt)
        ids = torch.tensor([tok.encode(text) + list(prefix)], device=device)
        with torch.inference_mode():
            logits = model(ids, logits="last").logits[0, -1].float()  # [V]
        lp = torch.log_softmax(logits, dim=-1)
        vals, idx = lp.topk(5)
        return list(zip(idx.tolist(), vals.tolist(), logits[idx].tolist(), strict=True))

    def along(prompt_id: str, output: list[int]) -> list[float]:
        """The margin at every position of an output, teacher-forced in one pass."""
        prompt = prompts[prompt_id]
        text = prompt if isinstance(prompt, str) else tok.apply_chat_template(prompt)
        head = tok.encode(text)
        ids = torch.tensor([head + list(output)], device=device)
        with torch.inference_mode():
            logits = model(ids, logits="all").logits[0].float()  # [S, V]
        lp = torch.log_softmax(logits[len(head) - 1: len(head) - 1 + len(output)], dim=-1)
        two = lp.topk(2, dim=-1).values  # [len(output), 2]
        return (two[:, 0] - two[:, 1]).tolist()

    scorer = near_ties.Scorer(lambda pid, prefix: top(pid, tuple(prefix)),
                              f"the embedded target ({model_dir}) in {dtype} on {device}")
    return scorer, along


def main(argv=None) -> dict:
    args, stores = parse_args(argv)
    out = parity.tables_for(stores, args.reference, args.gap_pct)
    if args.near_ties:
        ref = parity.reference_of(stores, args.reference)
        scorer, along = embedded_scorer(args.model, args.dtype, args.device,
                                        study_prompts(ref))
        ties = near_ties.tables(stores, scorer, args.reference, args.reference_arm)
        out["near_ties"] = ties["summary"]
        texts = {}  # the reference's autoregressive outputs, at its first level
        for level in parity.arm_levels(stores, ref):
            texts = parity.outputs_at(ref, args.reference_arm, level) or {}
            if texts:
                break
        out["crossings"] = near_ties.crossings(
            {p: along(p, ids) for p, ids in texts.items() if ids},
            what=f", along {ref.name}'s {args.reference_arm} outputs, from {scorer.what}")
        if args.details:
            out["near_tie_details"] = ties["details"]
    for key, table in out.items():
        head = f"## {TITLES[key]}" if args.markdown else f"== {TITLES[key]} =="
        print(f"{head}\n\n{parity.render(table, args.markdown)}\n")
    return out


if __name__ == "__main__":
    main()
