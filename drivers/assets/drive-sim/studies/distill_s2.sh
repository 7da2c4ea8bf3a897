#!/usr/bin/env bash
# Issue 16: few-step distillation of the bundled VLA's action expert into 2 Euler steps (resumable: run again).
cd /work/main
exec .venv/bin/python -m mmspec.drivers.distill --vla drivers/assets/driving-vla --out /work/runs/fs8/s2 \
  --student-steps 2 --steps 400 --batch-size 8 --lr 3e-4 --warmup 20 --stream-mask 0.5 --seed 0 --threads 1 --save-every 50
