"""`specrepro train`: the whole embedded checkpoint from a seed.

Design (the recipe is data: `recipes.py`):
1. corpus: read the built corpus file (`corpus.py`; built here if missing), check
   its hash and that it was built with the recipe's prose unit; a byte-level BPE is
   trained on its training split.
2. target, 3. self-distillation data, 4. drafters: `loops.py`.
5. quality figures (`quality.py`, in fp32) and the checkpoint with its model card
   (`card.py`). The checkpoint is saved before the quality figures, so a run cut short
   still leaves one.

`--from DIR` adds drafters to a trained checkpoint instead: it loads DIR's target and
tokenizer, regenerates the distillation data from the same corpus and trains only the
recipe's drafters that DIR does not store (recipe `light`: a light block drafter on the
stored one's first layers, `specrepro.embedded.proposers`), then writes their folders, their
quality figures (`quality-<recipe>.json`) and a model-card section beside the rest.

CUDA when present, else the CPU (smoke runs only). `--smoke` is a tiny recipe that runs end
to end in well under a minute on a CPU. Run as `specrepro train` or
`python -m specrepro.tools.training`.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

from specrepro.embedded.checkpoint import (
    list_drafters,
    load_proposer,
    load_target,
    read_drafter_config,
    save_checkpoint,
    save_drafters,
)
from specrepro.embedded.model import ModelConfig
from specrepro.embedded.tokenizer import train_bpe
from specrepro.tools.training import quality
from specrepro.tools.training.card import (
    added_drafters_card,
    dir_sizes,
    model_card,
    quality_card,
    replace_section,
)
from specrepro.tools.training.corpus import build_corpus, read_corpus, write_corpus
from specrepro.tools.training.loops import (
    Log,
    distill_and_train_drafters,
    token_streams,
    train_target,
)
from specrepro.tools.training.recipes import RECIPES, SMOKE_OF, Recipe


def load_or_build_corpus(path: Path | None, r: Recipe, log: Log):
    if path is not None and path.is_file():
        return read_corpus(path)
    try:
        docs = build_corpus(code_chars=r.code_chars, limit=r.corpus_limit,
                            prose_docs=r.prose_docs)
    except Exception as e:
        if not r.name.startswith("smoke"):
            raise
        # Smoke runs must work without the datasets: code only.
        log(f"corpus: datasets unavailable ({type(e).__name__}); smoke corpus is code only")
        from specrepro.tools.training.corpus import code_documents
        docs = code_documents(r.code_chars)
    path = path or Path("build/corpus") / f"corpus-{r.name}.jsonl"
    write_corpus(docs, path, None if r.prose_docs == "articles" else {"prose_docs": r.prose_docs})
    return read_corpus(path)


def check_corpus(manifest: dict, path: Path | None, r: Recipe) -> None:
    """The corpus file must have been built with the recipe's prose unit."""
    built = manifest.get("prose_docs", "articles")
    if built != r.prose_docs:
        raise SystemExit(f"{path}: corpus built with prose_docs {built!r} but recipe {r.name!r}"
                         f" wants {r.prose_docs!r}: build it with `python -m"
                         f" specrepro.tools.training.corpus --prose-docs {r.prose_docs} --out FILE`")


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="specrepro train", description=__doc__.split("\n")[0])
    ap.add_argument("--recipe", choices=sorted(RECIPES), default="default")
    ap.add_argument("--smoke", action="store_true",
                    help="the tiny recipe (CPU, seconds); with --recipe v2 the smoke-sized v2")
    ap.add_argument("--corpus", type=Path, default=None,
                    help="corpus file (corpus.py); built (and written) when missing")
    ap.add_argument("--out", type=Path, default=Path("models/embedded"))
    ap.add_argument("--from", dest="from_dir", type=Path, default=None, metavar="CHECKPOINT",
                    help="add the recipe's drafters to this trained checkpoint (its target and"
                         " tokenizer are kept); writes into --out, a copy when it differs")
    ap.add_argument("--quality-json", type=Path, default=None, help="default: OUT/quality.json")
    ap.add_argument("--skip-quality", action="store_true",
                    help="with --from: train and save the drafters, leave the quality figures to a"
                         " --quality-only run (the training facts go to OUT/training-RECIPE.json)")
    ap.add_argument("--quality-only", action="store_true",
                    help="with --from: no training; the quality figures of every drafter stored in"
                         " the checkpoint (or each --drafter), on the validation and the test"
                         " split, into quality-RECIPE.json (merged with its figures of other"
                         " drafters) and the recipe's model-card section")
    ap.add_argument("--drafter", action="append", default=[], metavar="NAME",
                    help="with --quality-only: measure only this stored drafter (repeatable)")
    ap.add_argument("--device", default=None, help="default: cuda when present, else cpu")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=JSON",
                    help="override a recipe field, e.g. --set target_steps=2000")
    return ap.parse_args(argv)


def resolve_recipe(args) -> Recipe:
    smoke = SMOKE_OF.get(args.recipe, args.recipe if args.recipe.startswith("smoke") else "smoke")
    r = RECIPES[smoke if args.smoke else args.recipe]
    for item in args.set:
        key, _, val = item.partition("=")
        if key not in Recipe.__dataclass_fields__:
            raise SystemExit(f"--set {item!r}: unknown recipe field {key!r}")
        r = replace(r, **{key: json.loads(val)})
    if args.seed is not None:
        r = replace(r, seed=args.seed)
    return r


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    r = resolve_recipe(args)
    log = Log()
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    compile_ = device.type == "cuda" and not args.no_compile
    torch.manual_seed(r.seed)
    gen = torch.Generator().manual_seed(r.seed)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    hardware = (torch.cuda.get_device_name(device) if device.type == "cuda"
                else f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)")
    log(f"recipe {r.name}, seed {r.seed}, device {hardware}, compile {compile_}")
    trunked = sorted(n for n, d in r.drafters.items() if d.get("trunk"))
    if trunked and args.from_dir is None:
        raise SystemExit(f"recipe {r.name!r}: drafters {trunked} sit on a stored block drafter:"
                         " train it with --from CHECKPOINT")

    if (args.skip_quality or args.quality_only) and args.from_dir is None:
        raise SystemExit("--skip-quality and --quality-only need --from CHECKPOINT")
    docs, manifest = load_or_build_corpus(args.corpus, r, log)
    check_corpus(manifest, args.corpus, r)
    if args.quality_only:
        return quality_only(args, argv, r, log, device, hardware, docs, manifest)
    if args.from_dir is not None:
        return add_drafters(args, argv, r, log, device, hardware, compile_, gen, docs, manifest)
    tok = train_bpe([d.text for d in docs if d.split == "train"], r.vocab_size)
    log(f"tokenizer: {tok.vocab_size} tokens; corpus sha256 {manifest['sha256'][:16]}…")
    streams = token_streams(docs, tok, device)
    cfg = ModelConfig.from_dict({**r.target, "vocab_size": tok.vocab_size,
                                 "eos_token_id": tok.eos_token_id})
    target, tstats = train_target(r, cfg, streams, device, gen, log, compile_)
    props, dstats, distill_s = distill_and_train_drafters(target, streams, r, device, gen, log,
                                                          compile_)
    out = args.out
    # Save before the quality figures, so a run cut short still leaves a checkpoint.
    save_checkpoint(out, target.cpu(), tok, {n: p.cpu() for n, p in props.items()})
    log(f"checkpoint saved in {out}")

    q, quality_s = quality_figures(target, tok, props, docs, r, device, log)

    info = {"hardware": hardware, "wall_s": log.elapsed(), "target": tstats, "drafters": dstats,
            "distill_wall_s": distill_s, "quality_wall_s": quality_s, "corpus": manifest,
            "target_params": cfg.num_parameters(),
            "stream_tokens": {d: len(s) for d, s in streams.items()}}
    sizes = dir_sizes(out)
    info["wall_s"] = log.elapsed()
    card = model_card(r, argv, info, q, sizes)
    (out / "MODEL_CARD.md").write_text(card)
    report = {"recipe": asdict(r), "info": info, "sizes": sizes, "quality": q,
              "headline": quality.headline(q)}
    qpath = args.quality_json or out / "quality.json"
    qpath.write_text(json.dumps(report, indent=2, default=str) + "\n")
    log(f"checkpoint in {out} ({sizes['all files'] / 1e6:.2f} MB); headline {report['headline']}")
    return 0


def quality_figures(target, tok, props, docs, r: Recipe, device, log: Log):
    """The quality figures in fp32 (`quality.py`) and the seconds they took."""
    t0 = time.time()
    target_fp32 = target.to(device).float()
    props = {n: p.to(device).float() for n, p in props.items()}
    q = quality.evaluate(target_fp32, tok, props, docs, quality.QualitySpec(**r.quality), log)
    return q, time.time() - t0


def add_drafters(args, argv, r: Recipe, log: Log, device, hardware: str, compile_: bool, gen,
                 docs, manifest) -> int:
    """`--from`: train the recipe's drafters that the checkpoint lacks, on its target."""
    src, out = args.from_dir, args.out
    if not (src / "config.json").is_file():
        raise SystemExit(f"--from {src}: no config.json there, not a trained checkpoint")
    stored = list_drafters(src)
    clash = sorted(set(r.drafters) & set(stored))
    if clash:
        raise SystemExit(f"--from {src}: drafters {clash} are stored there already (drafters.json);"
                         f" recipe {r.name!r} would overwrite them")
    target, tok = load_target(src, device=device)
    log(f"target and tokenizer from {src}: {sum(p.numel() for p in target.parameters()) / 1e6:.2f}M"
        f" parameters, {tok.vocab_size} tokens; stored drafters {sorted(stored)}")
    streams = token_streams(docs, tok, device)
    props, dstats, distill_s = distill_and_train_drafters(target, streams, r, device, gen, log,
                                                          compile_, stored=src)
    if out.resolve() != src.resolve():
        shutil.copytree(src, out, dirs_exist_ok=True)
    save_drafters(out, target.cpu(), tok, {n: p.cpu() for n, p in props.items()}, add=True)
    log(f"drafters {sorted(props)} added to {out}")
    if args.skip_quality:
        info = {"hardware": hardware, "wall_s": log.elapsed(), "drafters": dstats,
                "distill_wall_s": distill_s, "corpus": manifest, "argv": argv}
        path = out / f"training-{r.name}.json"
        path.write_text(json.dumps({"recipe": asdict(r), "info": info, "sizes": dir_sizes(out)},
                                   indent=2, default=str) + "\n")
        log(f"training facts in {path}; quality figures: --quality-only --from {out}")
        return 0
    q, quality_s = quality_figures(target, tok, props, docs, r, device, log)
    info = {"hardware": hardware, "wall_s": log.elapsed(), "drafters": dstats,
            "distill_wall_s": distill_s, "quality_wall_s": quality_s, "corpus": manifest}
    sizes = dir_sizes(out)
    section = added_drafters_card(r, argv, info, q, sizes)
    card = out / "MODEL_CARD.md"
    card.write_text(replace_section(card.read_text() if card.is_file() else "", section))
    qpath = args.quality_json or out / f"quality-{r.name}.json"
    qpath.write_text(json.dumps({"recipe": asdict(r), "info": info, "sizes": sizes, "quality": q},
                                indent=2, default=str) + "\n")
    log(f"checkpoint in {out} ({sizes['all files'] / 1e6:.2f} MB); figures in {qpath}")
    return 0



def quality_only(args, argv, r: Recipe, log: Log, device, hardware: str, docs, manifest) -> int:
    """`--quality-only --from DIR`: the quality figures of every drafter DIR stores, on both
    splits (quality.SPLITS), beside the facts of the `--skip-quality` runs that trained them
    (DIR/training-*.json); writes DIR/quality-RECIPE.json and the recipe's card section."""
    src = args.from_dir
    stored = list_drafters(src)
    if not stored:
        raise SystemExit(f"--quality-only --from {src}: no drafters stored there (drafters.json)")
    unknown = sorted(set(args.drafter) - set(stored))
    if unknown:
        raise SystemExit(f"--drafter {unknown}: not stored in {src} (stored: {sorted(stored)})")
    names = args.drafter or list(stored)
    target, tok = load_target(src, device=device)
    props = {n: load_proposer(src, stored[n], target, name=n) for n in names}
    t0 = time.time()
    target32 = target.float()
    props = {n: p.float() for n, p in props.items()}
    qpath = args.quality_json or src / f"quality-{r.name}.json"
    old = json.loads(qpath.read_text()) if qpath.is_file() else None
    q = {}
    for split in quality.SPLITS:
        spec = quality.QualitySpec(**{**r.quality, "split": split})
        known = q["validation"]["perplexity"] if "validation" in q else None
        q[split] = quality.evaluate(target32, tok, props, docs, spec, log, known)
        if old is not None:  # keep the stored figures of the drafters not measured now
            kept = [row for row in old["quality"][split]["acceptance"]
                    if row["drafter"] not in props and row["drafter"] in stored]
            q[split]["acceptance"] = kept + q[split]["acceptance"]
    runs = {p.stem.removeprefix("training-"): json.loads(p.read_text())
            for p in sorted(src.glob("training-*.json"))}
    old_info = (old or {}).get("info", {})
    # figures written before `measured_on` existed were all measured on that run's hardware
    old_on = old_info.get("measured_on") or {
        row["drafter"]: old_info.get("hardware", "?")
        for res in (old or {}).get("quality", {}).values() for row in res["acceptance"]}
    measured_on = {n: m for n, m in old_on.items() if n in stored and n not in props}
    measured_on.update({n: hardware for n in props})
    # every stored drafter's config, in the index's order (the measured ones' are in props)
    drafters = {n: (props[n].cfg if n in props else read_drafter_config(src / n / "config.json")
                    ).to_dict() for n in stored}
    info = {"hardware": hardware, "quality_wall_s": time.time() - t0, "corpus": manifest,
            "training": {name: run["info"] for name, run in runs.items()},
            "drafters": drafters, "measured_on": measured_on}
    sizes = dir_sizes(src)
    heads = {split: quality.headline(res) for split, res in q.items()}
    card = src / "MODEL_CARD.md"
    section = quality_card(r, argv, info, q, sizes, heads)
    card.write_text(replace_section(card.read_text() if card.is_file() else "", section))
    qpath.write_text(json.dumps({"recipe": asdict(r), "info": info, "sizes": sizes, "quality": q,
                                 "headline": heads}, indent=2, default=str) + "\n")
    log(f"quality figures in {qpath}; headline {heads}")
    return 0
