#!/usr/bin/env bash
# Reproduce the bundled testbed target (testbed-vlm/) and its EAGLE head (testbed-vlm-eagle/) on a CPU.
# What shipped was trained by these commands on a 2-core machine (2.3-3 s per target step at one thread); see
# README.md in this folder for the logs and the measured quality. Usage: bash vision/assets/reproduce.sh [WORKDIR]
set -euo pipefail
W=${1:-.mmspec_cache/reproduce}
HERE=$(cd "$(dirname "$0")" && pwd)
# Phase 1: text model, vision tower and its per-patch character reader (softmax, blank class) on block crops at
# 22-26 px, half of them scrambled text (no language prior to lean on); the 3000-step schedule, stopped at 1200.
BLOCKS='{"docs": {"mode": "block", "font_sizes": [22, 26], "scrambled_fraction": 0.5}, "charts": {}}'
MIX='{"docs": {"mode": "mix", "font_sizes": [22, 26], "scrambled_fraction": 0.25}, "charts": {}}'
python -m mmspec.vision.testbed train --out "$W/phase1" --size small --steps 3000 --stop-after 1200 \
    --batch-size 8 --lr 1e-3 --warmup 100 --read-weight 0 --locate-weight 0 --docs-fraction 0.75 \
    --save-every 100 --workload-options "$BLOCKS"
# Phase 2: from phase 1 (weights and reader), with the reading-attention, current-cell tracking and
# image-location supervision; blocks for steps 1-1300, then pages and blocks (a quarter scrambled) to 2000.
python -m mmspec.vision.testbed train --out "$W/phase2" --init "$W/phase1" --size small --steps 2000 \
    --stop-after 1300 --warmup 50 --batch-size 8 --lr 7e-4 --read-weight 0.5 --locate-weight 0.5 \
    --track-weight 0.5 --docs-fraction 0.75 --save-every 100 --workload-options "$BLOCKS"
python -m mmspec.vision.testbed train --out "$W/phase2" --size small --steps 2000 \
    --warmup 50 --batch-size 8 --lr 7e-4 --read-weight 0.5 --locate-weight 0.5 \
    --track-weight 0.5 --docs-fraction 0.75 --save-every 100 --workload-options "$MIX"
python -m mmspec.vision.testbed export --model "$W/phase2" --out "$HERE/testbed-vlm"
python -m mmspec.vision.testbed eval --model "$HERE/testbed-vlm" --n 24 --grounding
# The EAGLE head, trained against the exported (bfloat16-rounded) target.
mmspec train --kind eagle --target "$HERE/testbed-vlm" --workload docs,charts --n-train 480 --max-new-tokens 192 \
    --steps 800 --batch-size 8 --lr 3e-3 --num-draft-tokens 5 --ttt-steps 4 --out "$W/eagle"
python - "$W/eagle" "$HERE/testbed-vlm-eagle" <<'PY'
import sys, torch
from mmspec.drafters import EagleDrafter
EagleDrafter.from_pretrained(sys.argv[1]).save_pretrained(sys.argv[2], dtype=torch.bfloat16)
PY
