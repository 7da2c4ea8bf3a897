#!/usr/bin/env bash
# Issue 16: "s2b": s2 continued from its step 400 with the schedule spread over 800 steps (the learning rate comes
# back to its cosine value at 400 of 800). Run 2026-12-02 by copying s2's folder and resuming it with --steps 800.
# Usage: bash distill_s2b.sh S2_DIR [OUT]   (S2_DIR: a finished distill_s2.sh folder)
set -euo pipefail
S2=$1; OUT=${2:-fewstep-s2b}
[ -d "$OUT" ] || cp -r "$S2" "$OUT"
python -m mmspec.drivers.distill --vla drivers/assets/driving-vla --out "$OUT" \
  --student-steps 2 --steps 800 --batch-size 8 --lr 3e-4 --warmup 20 --stream-mask 0.5 --seed 0 --threads 1 --save-every 50
