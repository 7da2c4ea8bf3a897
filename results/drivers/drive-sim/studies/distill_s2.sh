#!/usr/bin/env bash
# Issue 16: few-step distillation of the bundled VLA's action expert into 2 Euler steps, as run on 2026-12-02
# (the README's "s2": 400 steps; resumable: run again). Usage: bash distill_s2.sh [OUT]
set -euo pipefail
OUT=${1:-fewstep-s2}
python -m mmspec.drivers.distill --vla drivers/assets/driving-vla --out "$OUT" \
  --student-steps 2 --steps 400 --batch-size 8 --lr 3e-4 --warmup 20 --stream-mask 0.5 --seed 0 --threads 1 --save-every 50
