"""The model card: `MODEL_CARD.md` of a trained checkpoint, written by the training run.

Design:
- A full run (`model_card`) writes the whole card: the command that rebuilt it, hardware,
  wall time by stage, corpus hash, the target's and drafters' training figures, the sizes
  of the bf16 safetensors files, the drafters table (each drafter's config as JSON) and the
  quality figures (`quality.py`: held-out perplexity, tokens per step and acceptance by
  position, each beside its repeated 4-gram share).
- A `--from` run (`added_drafters_card`) writes one section of its own,
  `## Added drafters: recipe NAME`, and `replace_section` puts it in place of the same
  heading (appended when absent), so a re-run updates its section instead of adding a
  second one and the rest of the card stays as the full run wrote it.
- A `--quality-only` run (`quality_card`) writes `## Drafters and quality: recipe NAME`: the
  `--skip-quality` training runs that made the stored drafters (command, hardware, steps,
  losses), every stored drafter's config, and the quality figures on the test split (the
  reported ones) and the validation split (what recipes are picked on).
- The card is text only: the checkpoint's fingerprint covers the weights and configs, not
  `*.md` files, so a rewritten card does not change a cell's identity.
"""

from __future__ import annotations

import json
import platform
from pathlib import Path

import torch

from specrepro.tools.training import quality
from specrepro.tools.training.recipes import Recipe, greedy_only, mix_label


def model_card(r: Recipe, argv, info: dict, q: dict, sizes: dict) -> str:
    head = quality.headline(q)
    lines = [
        "# Embedded model: Qwen3-architecture target with MTP head, block drafters and draft model",
        "",
        f"Rebuilt by `specrepro train {' '.join(argv)}` (recipe `{r.name}`, seed {r.seed}).",
        "",
        "| item | value |", "| --- | --- |",
        f"| hardware | {info['hardware']} |",
        f"| torch / python | {torch.__version__} / {platform.python_version()} |",
        f"| wall time | {info['wall_s']:.0f} s (target {info['target']['wall_s']:.0f} s,"
        f" distillation data {info['distill_wall_s']:.0f} s, drafters"
        f" {info['drafters']['wall_s']:.0f} s, quality {info['quality_wall_s']:.0f} s) |",
        f"| corpus | `{info['corpus']['file']}` sha256 `{info['corpus']['sha256']}`, built with"
        f" Python {info['corpus'].get('python', '?')} |",
        "| corpus tokens (train) | " + ", ".join(f"{d} {n:,}" for d, n in info["stream_tokens"].items())
        + " |",
        f"| target | {info['target_params'] / 1e6:.2f}M parameters, {json.dumps(r.target)} |",
        f"| target training | {r.target_steps} steps, batch {r.batch_size} x {r.seq_len}"
        f" (last {r.long_frac:.0%} at {r.batch_size // 2} x {r.long_seq_len}), lr {r.lr},"
        f" {info['target']['epochs']:.1f} epochs; final loss {info['target']['final_loss']:.3f} |",
        f"| distillation | {r.n_continuations:,} {distill_words(r)} continuations of {r.gen_len}"
        f" tokens after {r.prompt_len}-token corpus windows (mix {r.cont_mix}) |",
        # the steps run, which the time budget may cut below the recipe's `drafter_steps`
        f"| drafter training | {info['drafters']['steps']} steps (of {r.drafter_steps}) x"
        f" {r.drafter_batch} sequences, lr"
        f" {r.drafter_lr}, {r.anchors} blocks per sequence; final losses "
        + ", ".join(f"{n} {v:.3f}" for n, v in info["drafters"]["final_loss"].items()) + " |",
        "| sizes (bf16 safetensors) | " + ", ".join(f"{n} {b / 1e6:.2f} MB" for n, b in sizes.items())
        + " |",
        "",
        "## Drafters", "",
        *drafters_table(r),
    ]
    lines += ["", "## Quality (greedy, generation stops at end of text)", ""]
    if head:
        lines += [f"Held-out GSM8K: block drafter at 7 drafts {head['block_k7_tokens_per_step']:.2f}"
                  f" tokens per step, MTP head at 3 drafts {head['mtp_k3_tokens_per_step']:.2f}"
                  f" (ratio {head['ratio']:.2f}; targets >= 3.5 and >= 1.3)."]
        sampled = [f"{k.removeprefix('sampled_').replace('_tokens_per_step', '')} {v:.2f}"
                   for k, v in head.items() if k.startswith("sampled_")]
        if sampled:
            lines.append("Sampled (probabilistic verification), tokens per step: "
                         + ", ".join(sampled) + ".")
        lines.append("")
    lines.append(quality.markdown_tables(q))
    return "\n".join(lines)


def distill_words(r: Recipe) -> str:
    return "greedy" if greedy_only(r) else f"({mix_label(r.distill_mix)})"


def drafters_table(r: Recipe) -> list[str]:
    return (["| name | method | config |", "| --- | --- | --- |"]
            + [f"| {n} | {d['method']} | `{json.dumps(d)}` |" for n, d in r.drafters.items()])


def dir_sizes(out: Path) -> dict[str, int]:
    sizes = {"target": (out / "model.safetensors").stat().st_size}
    for sub in sorted(p for p in out.iterdir() if p.is_dir()):
        sizes[sub.name] = sum(f.stat().st_size for f in sub.iterdir() if f.is_file())
    sizes["all files"] = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    return sizes


def added_drafters_card(r: Recipe, argv, info: dict, q: dict, sizes: dict) -> str:
    """A model-card section of its own (`## Added drafters: recipe NAME`) for `--from` runs."""
    lines = [
        f"## Added drafters: recipe `{r.name}`", "",
        f"Trained by `specrepro train {' '.join(argv)}` (seed {r.seed}) on the target above.", "",
        "| item | value |", "| --- | --- |",
        f"| hardware | {info['hardware']} |",
        f"| wall time | {info['wall_s']:.0f} s (distillation data {info['distill_wall_s']:.0f} s,"
        f" drafters {info['drafters']['wall_s']:.0f} s, quality {info['quality_wall_s']:.0f} s) |",
        f"| distillation | {r.n_continuations:,} {distill_words(r)} continuations of {r.gen_len}"
        f" tokens after {r.prompt_len}-token corpus windows, corpus sha256"
        f" `{info['corpus']['sha256'][:16]}…` |",
        f"| drafter training | {info['drafters']['steps']} steps (of {r.drafter_steps}) x"
        f" {r.drafter_batch} sequences, lr {r.drafter_lr}; final losses "
        + ", ".join(f"{n} {v:.3f}" for n, v in info["drafters"]["final_loss"].items()) + " |",
        "| sizes (bf16 safetensors) | " + ", ".join(f"{n} {sizes[n] / 1e6:.2f} MB"
                                                    for n in r.drafters if n in sizes)
        + f"; all files {sizes['all files'] / 1e6:.2f} MB |",
        "", *drafters_table(r),
    ]
    lines += ["", quality.markdown_tables(q).strip(), ""]
    return "\n".join(lines)


def replace_section(card: str, section: str) -> str:
    """`card` with the `## ` section of the same heading replaced by `section` (appended when
    absent), so a re-run updates its section instead of adding a second one."""
    head = section.split("\n", 1)[0]
    start = card.find(head + "\n")
    if start < 0:
        return card.rstrip("\n") + "\n\n" + section
    end = card.find("\n## ", start + len(head))
    return card[:start] + section + ("" if end < 0 else card[end:])



def quality_card(r: Recipe, argv, info: dict, q: dict, sizes: dict, heads: dict) -> str:
    """The `--quality-only` section: training runs, drafters, figures per split (the test
    split first: it is the reported one)."""
    lines = [f"## Drafters and quality: recipe `{r.name}`", "",
             "Quality figures in fp32, greedy unless a temperature is given, generation stopping"
             " at end of text; the drafters table says where each drafter's figures were"
             f" measured (the last run: `specrepro train {' '.join(argv)}` on {info['hardware']},"
             f" {info['quality_wall_s']:.0f} s).", "",
             "| training run | command | hardware | wall time | drafter steps x batch |"
             " final losses |", "| --- | --- | --- | --- | --- | --- |"]
    for name, run in info["training"].items():
        d = run["drafters"]
        lines.append(
            f"| {name} | `specrepro train {' '.join(run.get('argv', []))}` | {run['hardware']} |"
            f" {run['wall_s']:.0f} s (distillation {run['distill_wall_s']:.0f} s, drafters"
            f" {d['wall_s']:.0f} s) | {d['steps']} x {d.get('batch', '?')} | "
            + ", ".join(f"{n} {v:.3f}" for n, v in d["final_loss"].items()) + " |")
    lines += ["", "| name | method | config | bf16 safetensors | quality measured on |",
              "| --- | --- | --- | --- | --- |"]
    lines += [f"| {n} | {c['method']} | `{json.dumps(c)}` | {sizes.get(n, 0) / 1e6:.2f} MB |"
              f" {info.get('measured_on', {}).get(n, '-')} |" for n, c in info["drafters"].items()]
    lines.append(f"\nAll files {sizes['all files'] / 1e6:.2f} MB.")
    for split in ("test", "validation"):
        if split not in q:
            continue
        h = heads.get(split) or {}
        lines += ["", f"### {split.capitalize()} split"
                  + (" (reported)" if split == "test" else " (recipes are picked on it)"), ""]
        if h:
            lines.append(f"Held-out GSM8K: block drafter at 7 drafts {h['block_k7_tokens_per_step']:.2f}"
                         f" tokens per step, MTP head at 3 drafts {h['mtp_k3_tokens_per_step']:.2f}"
                         f" (ratio {h['ratio']:.2f}).\n")
        lines.append(quality.markdown_tables(q[split]).strip())
    return "\n".join(lines) + "\n"
