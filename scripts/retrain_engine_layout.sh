#!/usr/bin/env bash
# Retrain the block drafters and the MTP head in the layouts vLLM 0.26.0 and SGLang 0.5.14 load
# (recipes `engine-layout` and `light-engine-layout`), on a trained checkpoint's target, kept.
#
#   scripts/retrain_engine_layout.sh STEP CORPUS CHECKPOINT OUT
#
# STEP is one of (each fits one 10-minute command on one H200; run them in this order):
#   drafters  OUT := CHECKPOINT's target, tokenizer and draft model (its other drafters are left
#             behind: they are the ones being replaced), plus `dflash` and the EAGLE-style `mtp`
#             trained on it (~9.5 min)
#   light     `dflash_light` on OUT's new `dflash` (~6 min)
#   quality   the quality figures of every drafter OUT stores, validation and test split, into
#             OUT/quality-engine-layout.json and OUT's model card (fp32; GPU or CPU)
# Training runs write OUT/training-<recipe>.json and leave the figures to `quality`.
# TRAIN_ARGS (e.g. "--set time_budget_s=300") is passed to every run.
# Imports only what `specrepro.tools.training` imports (the H200 image has no polars).
set -euo pipefail
[ $# -eq 4 ] || { echo "usage: $0 drafters|light|quality CORPUS CHECKPOINT OUT" >&2; exit 2; }
step=$1 corpus=$2 ckpt=$3 out=$4
[ -f "$corpus" ] || { echo "$0: corpus file $corpus not found" >&2; exit 2; }
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}lib PYTHONUNBUFFERED=1
train() { python3 -m specrepro.tools.training --corpus "$corpus" ${TRAIN_ARGS:-} "$@"; }
case $step in
drafters)
    [ -f "$ckpt/config.json" ] || { echo "$0: $ckpt is not a trained checkpoint" >&2; exit 2; }
    [ ! -e "$out" ] || { echo "$0: $out exists; the drafters step writes a new folder" >&2; exit 2; }
    base=$(mktemp -d)/base
    mkdir -p "$base"
    # the target, its tokenizer and card, and the draft model (a plain Qwen3 model, unchanged)
    for f in config.json model.safetensors generation_config.json tokenizer.json \
        tokenizer_config.json special_tokens_map.json MODEL_CARD.md; do
        cp "$ckpt/$f" "$base/"
    done
    cp -r "$ckpt/draft_model" "$base/"
    echo '{"draft_model": "draft_model"}' >"$base/drafters.json"
    train --recipe engine-layout --from "$base" --out "$out" --skip-quality
    ;;
light) train --recipe light-engine-layout --from "$out" --out "$out" --skip-quality ;;
quality) train --recipe engine-layout --from "$out" --quality-only ;;
*) echo "$0: unknown step $step (drafters, light or quality)" >&2; exit 2 ;;
esac
