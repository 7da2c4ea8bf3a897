#!/usr/bin/env bash
# Reproduce the bundled testbed target (testbed-vlm/) and its EAGLE head (testbed-vlm-eagle/) on a CPU.
# What shipped was trained by these commands on a 2-core machine (2.3-3 s per target step at one thread); see
# README.md in this folder for the logs and the measured quality. Usage: bash results/vision/reproduce.sh [WORKDIR]
set -euo pipefail
W=${1:-.mmspec_cache/reproduce}
HERE=$(cd "$(dirname "$0")" && pwd)  # results (bench records, probes, training logs)
ASSETS="$HERE/../../vision/assets"  # the shipped models
# Phase 1: text model, vision tower and its per-patch character reader (softmax, blank class) on block crops at
# 22-26 px, half of them scrambled text (no language prior to lean on); the 3000-step schedule, stopped at 1200.
BLOCKS='{"docs": {"mode": "block", "font_sizes": [22, 26], "scrambled_fraction": 0.5}, "charts": {}}'
MIX='{"docs": {"mode": "mix", "font_sizes": [22, 26], "scrambled_fraction": 0.25}, "charts": {}}'
python -m mmspec.vision.testbed_train train --out "$W/phase1" --size small --steps 3000 --stop-after 1200 \
    --batch-size 8 --lr 1e-3 --warmup 100 --read-weight 0 --locate-weight 0 --docs-fraction 0.75 \
    --save-every 100 --workload-options "$BLOCKS"
# Phase 2: from phase 1 (weights and reader), with the reading-attention, current-cell tracking and
# image-location supervision; blocks for steps 1-1300, then pages and blocks (a quarter scrambled) to 2000.
python -m mmspec.vision.testbed_train train --out "$W/phase2" --init "$W/phase1" --size small --steps 2000 \
    --stop-after 1300 --warmup 50 --batch-size 8 --lr 7e-4 --read-weight 0.5 --locate-weight 0.5 \
    --track-weight 0.5 --docs-fraction 0.75 --save-every 100 --workload-options "$BLOCKS"
python -m mmspec.vision.testbed_train train --out "$W/phase2" --size small --steps 2000 \
    --warmup 50 --batch-size 8 --lr 7e-4 --read-weight 0.5 --locate-weight 0.5 \
    --track-weight 0.5 --docs-fraction 0.75 --save-every 100 --workload-options "$MIX"
# Phase 3: from phase 2, 800 steps of a 4000-step schedule at lr 5e-4 (pages and blocks, 60% docs).
python -m mmspec.vision.testbed_train train --out "$W/phase3" --init "$W/phase2" --size small --steps 4000 \
    --stop-after 800 --warmup 50 --batch-size 8 --lr 5e-4 --read-weight 0.5 --locate-weight 0.5 \
    --track-weight 0.5 --docs-fraction 0.6 --save-every 100 --workload-options "$MIX"
# Phases 4-6, a reading curriculum: single wrapped lines of a paragraph (336 x 56-84 px crops, ~7 tokens), batch
# 16, docs only; 1500 + 800 + 4000 steps, each a fresh schedule from the last (~1.15 s per step at one thread).
LINES='{"docs": {"mode": "line"}, "charts": {}}'
prev="$W/phase3"
for spec in phase4:1500 phase5:800 phase6:4000; do
  python -m mmspec.vision.testbed_train train --out "$W/${spec%%:*}" --init "$prev" --size small --steps "${spec##*:}" \
      --warmup 50 --batch-size 16 --lr 5e-4 --read-weight 0.5 --locate-weight 0.5 --track-weight 0.5 \
      --docs-fraction 1.0 --save-every 100 --workload-options "$LINES"
  prev="$W/${spec%%:*}"
done
# Phase 7: lines, blocks and pages (40 / 40 / 20%) with charts (a fifth of the items), 3000 steps at batch 8
# (~2.1 s per step at one thread), so line reading carries across line breaks.
python -m mmspec.vision.testbed_train train --out "$W/phase7" --init "$W/phase6" --size small --steps 3000 \
    --warmup 50 --batch-size 8 --lr 5e-4 --read-weight 0.5 --locate-weight 0.5 --track-weight 0.5 \
    --docs-fraction 0.8 --save-every 100 \
    --workload-options '{"docs": {"mode": "mix", "line_fraction": 0.4, "block_fraction": 0.4}, "charts": {}}'
python -m mmspec.vision.testbed_train export --model "$W/phase7" --out "$ASSETS/testbed-vlm"
python -m mmspec.vision.testbed eval --model "$ASSETS/testbed-vlm" --n 24 --grounding
# The EAGLE head, trained against the exported (bfloat16-rounded) target.
# (Run here as the data stage with --threads 1, then --stage fit with --threads 2; one command does both.)
mmspec train --kind eagle --target "$ASSETS/testbed-vlm" --workload docs,charts --n-train 6000 --max-new-tokens 192 \
    --steps 3000 --batch-size 8 --lr 3e-3 --num-draft-tokens 5 --ttt-steps 4 --val-shards 8 --save-every 250 \
    --out "$W/eagle"
python - "$W/eagle" "$ASSETS/testbed-vlm-eagle" <<'PY'
import sys, torch
from mmspec.budget import ConfidenceStop
from mmspec.drafters import EagleDrafter
head = EagleDrafter.from_pretrained(sys.argv[1])
head.stop = ConfidenceStop.parse(0.3)  # the shipped early stop (assets README)
head.save_pretrained(sys.argv[2], dtype=torch.bfloat16)
PY
mkdir -p "$HERE/training/testbed-vlm-eagle" && cp "$W/eagle/val_log.jsonl" "$HERE/training/testbed-vlm-eagle/"
# Its validation block (held-out acceptance and the tau it estimates), which drafter="auto" ranks drafters by.
python -m mmspec.drafters.validation "$ASSETS/testbed-vlm-eagle" --val-log "$HERE/training/testbed-vlm-eagle/val_log.jsonl"
# ---------------------------------------------------------------------------------------------------------------
# The faithful target of issue 14, IN TRAINING (not bundled yet; README.md, "Faithful target, in training").
# Warm start from the shipped target; pages, blocks and lines (50 / 35 / 15% of docs items) with charts a quarter
# of the items; half of the mispredicted answer input tokens fed back (--self-feed 0.5); one thread, resumable:
# run the same command again after a stop (state.pt holds the optimizer and step). On 2026-12-01 it ran as
# /work/ckpt/faithful/run_stage1.sh with --out /work/ckpt/faithful/stage1.
# Steps 1-700 ran under a 6000-step cosine; at step 700 the horizon was cut to 2000 (README: why), so the
# reproduction stops the first command at 700 and resumes with the shorter schedule.
# Stage 1 was stopped at step 1600 (2026-12-01 21:36 UTC, lr 1.3e-5 of the 2000-step cosine) for stage 2.
for horizon in "6000 --stop-after 700" "2000 --stop-after 1600"; do
python -m mmspec.vision.testbed_train train --out "$W/faithful-stage1" --init "$ASSETS/testbed-vlm" --size small \
    --steps $horizon --warmup 100 --batch-size 4 --lr 1e-4 --aux-weight 0.25 --read-weight 0.5 --read-layers 2,3 \
    --locate-weight 0.1 --track-weight 0.5 --probe-warmup 150 --self-feed 0.5 --docs-fraction 0.75 --save-every 100 \
    --threads 1 \
    --workload-options '{"docs": {"mode": "mix", "line_fraction": 0.15, "block_fraction": 0.35}, "charts": {}}'
done
# Stage 2, more capacity: stage 1's step 1600 grown to 8 text layers and 8 vision blocks (the new ones appended,
# starting as the identity: same outputs; patch reader and locator carried), then the same recipe under a fresh
# 3000-step cosine, no probe warm-up. On 2026-12-01 it ran as /work/ckpt/faithful2/run_stage2.sh.
python -m mmspec.vision.testbed_train grow --init "$W/faithful-stage1" --out "$W/faithful-grown" --text-layers 8 \
    --vision-depth 8
python -m mmspec.vision.testbed_train train --out "$W/faithful-stage2" --init "$W/faithful-grown" --size small \
    --steps 3000 --warmup 100 --batch-size 4 --lr 1e-4 --aux-weight 0.25 --read-weight 0.5 --read-layers 2,3 \
    --locate-weight 0.1 --track-weight 0.5 --probe-warmup 0 --self-feed 0.5 --docs-fraction 0.75 --save-every 100 \
    --threads 1 \
    --workload-options '{"docs": {"mode": "mix", "line_fraction": 0.15, "block_fraction": 0.35}, "charts": {}}'
# Its checkpoints' figures (README table; n 16 while training, 128 new tokens, bf16, one thread; --reference-tau
# gives tau and exact match / CER from one greedy pass) and the shipped target's reference_tau (n 8, 64 new
# tokens; that run also printed the plain evaluation, which --reference-tau now replaces):
python -m mmspec.vision.testbed eval --model "$W/faithful-stage1" --n 16 --max-new-tokens 128 \
    --workload docs,charts --reference-tau --dtype bfloat16 --threads 1
python -m mmspec.vision.testbed eval --model "$ASSETS/testbed-vlm" --n 8 --max-new-tokens 64 --workload docs,charts \
    --reference-tau --dtype bfloat16 --threads 1
# Reading tests of 2026-12-02 (README, "Why it does not read"): from stage 2's step 700, lines only, half scrambled,
# batch 16, lr 3e-4, 400-step schedule; once as trained (merge 2), once remerged to one vision token per patch.
# Teacher-forced accuracy on real and scrambled items: the probe results/vision/probes/tf_scrambled.py (MODEL N SCR MODES).
LINES_SCR='{"docs": {"mode": "line", "scrambled_fraction": 0.5}, "charts": {}}'
python -m mmspec.vision.testbed_train remerge --init "$W/faithful-stage2" --out "$W/faithful-stage2-m1" --merge 1
for pair in "$W/faithful-stage2:$W/read-m2" "$W/faithful-stage2-m1:$W/read-m1"; do
python -m mmspec.vision.testbed_train train --out "${pair#*:}" --init "${pair%%:*}" --size small --steps 400 --warmup 20 \
    --batch-size 16 --lr 3e-4 --aux-weight 0.25 --read-weight 0.5 --read-layers 2,3 --locate-weight 0.1 \
    --track-weight 0.5 --probe-warmup 0 --self-feed 0 --docs-fraction 1.0 --save-every 50 --threads 1 \
    --workload-options "$LINES_SCR"
done


# Tower vs text model (issue 14, 2026-12-02): teach the tower to read alone (text model frozen), probe it, then the
# lines test from it, with and without the speller; and the long reading curriculum (read3).
python -m mmspec.vision.testbed_train train --out "$W/vo-m2" --init "$W/faithful-stage2" --steps 2000 --stop-after 500 \
    --warmup 50 --batch-size 8 --lr 3e-4 --aux-loss ordered --vision-only --aux-weight 1 --read-weight 0 \
    --track-weight 0 --locate-weight 0 --probe-warmup 50 --docs-fraction 0.8 --save-every 100 --threads 1 \
    --workload-options '{"docs": {"mode": "mix", "block_fraction": 0.3, "line_fraction": 0.1, "scrambled_fraction": 0.5}, "charts": {}}'
python results/vision/probes/tower_read.py "$W/vo-m2" 8
python -m mmspec.vision.testbed_train train --out "$W/spell-b" --init "$W/vo-m2" --size small --steps 400 --stop-after 100 \
    --warmup 20 --batch-size 16 --lr 3e-4 --aux-weight 0.25 --aux-loss ordered --read-weight 0.5 --spell-weight 1.0 \
    --read-layers 2,3 --locate-weight 0.1 --track-weight 0.5 --probe-warmup 0 --self-feed 0 --docs-fraction 1.0 \
    --save-every 50 --threads 1 --workload-options '{"docs": {"mode": "line", "scrambled_fraction": 0.5}, "charts": {}}'
python results/vision/probes/tf_scrambled.py "$W/spell-b" 16 0,1 line,block
python -m mmspec.vision.testbed_train train --out "$W/read3" --init "$W/spell-b" --size small --steps 3000 --warmup 30 \
    --batch-size 12 --lr 3e-4 --aux-weight 0.25 --aux-loss ordered --read-weight 0.5 --read-layers 2,3 \
    --locate-weight 0.1 --track-weight 0.5 --spell-weight 1.0 --probe-warmup 0 --self-feed 0 --docs-fraction 0.9 \
    --save-every 100 --threads 1 \
    --workload-options '{"docs": {"mode": "mix", "line_fraction": 0.6, "block_fraction": 0.3, "scrambled_fraction": 0.5}, "charts": {}}'
# Key-value heads A/B (issue 14): the relay run at step 200 continued 100 steps as is, and as a copy with one
# key-value head per query head (same function at the start).
python -m mmspec.vision.testbed_train ungroup-kv --init "$W/relay-b" --out "$W/relay-b-kv6"
for pair in "$W/relay-b:$W/relay-cont" "$W/relay-b-kv6:$W/relay-kv6"; do
python -m mmspec.vision.testbed_train train --out "${pair#*:}" --init "${pair%%:*}" --size small --steps 400 --stop-after 100 \
    --warmup 20 --batch-size 16 --lr 3e-4 --aux-weight 0.25 --aux-loss ordered --read-weight 0.5 --relay-weight 1.0 \
    --read-layers 2,3 --locate-weight 0.1 --track-weight 0.5 --probe-warmup 0 --self-feed 0 --docs-fraction 1.0 \
    --save-every 50 --threads 1 --workload-options "$LINES_SCR"
python results/vision/probes/tf_scrambled.py "${pair#*:}" 16 0,1 line,block
done
# Session of 2026-12-02 (later): where the reading fails, and two shortcuts that were not ones.
python results/vision/probes/tf_by_tower.py "$W/relay-cont" 16 1.0 line,block
python results/vision/probes/hard_pointer.py "$W/relay-cont" 16 1.0 line,block
# Learning-rate A/B from read3's step 200 (a copy of the folder at that step), other items (docs seed 1).
python -m mmspec.vision.testbed_train train --out "$W/read3-lr1e3" --init "$W/read3-s200" --size small --steps 3000 \
    --warmup 30 --batch-size 12 --lr 1e-3 --aux-weight 0.25 --aux-loss ordered --read-weight 0.5 --read-layers 2,3 \
    --locate-weight 0.1 --track-weight 0.5 --spell-weight 1.0 --probe-warmup 0 --self-feed 0 --docs-fraction 0.9 \
    --save-every 100 --stop-after 100 --threads 1 \
    --workload-options '{"docs": {"mode": "mix", "line_fraction": 0.6, "block_fraction": 0.3, "scrambled_fraction": 0.5, "seed": 1}, "charts": {}}'
for r in read3-s200 read3-lr1e3 read3-s300; do python results/vision/probes/reading_head.py "$W/$r" 1.0 line,block; done
# Exact characters in place of the tower: can the text model learn to copy from perfect vision tokens?
python results/vision/probes/clean_cells.py "$W/relay-cont" "$W/cells-warm-rand.jsonl" 100 3e-4 8 0.5 50 warm random
# Session of 2026-12-02 (eighth): read3 at step 400 (a copy of the folder at that step), how the tokenizer segments
# real and scrambled answers, and a from-scratch lines run (stopped at step 597, where its figures were taken).
python results/vision/probes/reading_head.py "$W/read3-s400" 1.0 line,block
python results/vision/probes/tf_scrambled.py "$W/read3-s400" 16 0 line,block,page
python results/vision/probes/token_chars.py "$W/read3-s400" 16
python -m mmspec.vision.testbed_train train --out "$W/scratch" --size small --steps 3000 --stop-after 597 \
    --warmup 100 --batch-size 16 --lr 1e-3 --aux-weight 0.5 --aux-loss ordered --read-weight 0.5 --read-layers 2,3 \
    --locate-weight 0.5 --track-weight 0.5 --spell-weight 0.5 --relay-weight 0.5 --self-feed 0 --docs-fraction 1.0 \
    --save-every 50 --threads 1 --workload-options '{"docs": {"mode": "line", "scrambled_fraction": 1.0}, "charts": {}}'
python results/vision/probes/tf_scrambled.py "$W/scratch" 16 1 line
python -m mmspec.vision.testbed eval --model "$W/read3-s400" --n 16 --max-new-tokens 128 --workload docs,charts --reference-tau --dtype float32 --threads 1
