#!/usr/bin/env bash
# Issue 16: the 2-step student distilled on the DAgger stream-mask fine-tune (fd8/vla_dagger_lr3e5_seed4_s150), the
# VLA FlashDrive is within 1% of plain on (resumable: run again; 800 steps as s2b reached).

exec .venv/bin/python -m mmspec.drivers.distill --vla "${VLA:-/work/runs/fd8/vla_dagger_lr3e5_seed4_s150}" --out "${1:-fewstep-dagger-s2}" \
  --student-steps 2 --steps 800 --batch-size 8 --lr 3e-4 --warmup 20 --stream-mask 0.5 --seed 0 --threads 1 --save-every 25
