#!/usr/bin/env bash
# Reproduce the bundled testbed target (testbed-vlm/) and its EAGLE head (testbed-vlm-eagle/) on a CPU.
# What shipped was trained by these commands on a 2-core machine (about 2 s per target step); see
# README.md in this folder for the logs and the measured quality. Usage: bash vision/assets/reproduce.sh [WORKDIR]
set -euo pipefail
W=${1:-.mmspec_cache/reproduce}
HERE=$(cd "$(dirname "$0")" && pwd)
# Phase 1: text model, vision tower and its character reader (the 3000-step schedule, stopped at 1400).
python -m mmspec.vision.testbed train --out "$W/phase1" --size small --steps 3000 --stop-after 1400 \
    --batch-size 8 --lr 1e-3 --warmup 100 --read-weight 0 --locate-weight 0 --save-every 100 --aux-loss bce
# Phase 2: from phase 1, with the reading-attention and image-location supervision (fresh schedule).
python -m mmspec.vision.testbed train --out "$W/phase2" --init "$W/phase1" --size small --steps 2000 \
    --warmup 50 --batch-size 8 --lr 1e-3 --save-every 100 --aux-loss bce
python -m mmspec.vision.testbed export --model "$W/phase2" --out "$HERE/testbed-vlm"
python -m mmspec.vision.testbed eval --model "$HERE/testbed-vlm" --n 24
# The EAGLE head, trained against the exported (bfloat16-rounded) target.
mmspec train --kind eagle --target "$HERE/testbed-vlm" --workload docs,charts --n-train 160 --max-new-tokens 192 \
    --steps 800 --batch-size 8 --lr 3e-3 --num-draft-tokens 5 --out "$W/eagle"
python - "$W/eagle" "$HERE/testbed-vlm-eagle" <<'PY'
import sys, torch
from mmspec.drafters import EagleDrafter
EagleDrafter.from_pretrained(sys.argv[1]).save_pretrained(sys.argv[2], dtype=torch.bfloat16)
PY
