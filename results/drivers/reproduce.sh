#!/usr/bin/env bash
# Reproduce the bundled driving VLA on a CPU (what shipped was trained by these commands on a 2-core machine).
# Phases 1-2 of the shipped model were trained before the world drew tail lamps (2f0d0a1); run here, they see
# the lamps from the start, so the result is close to, not identical with, what shipped.
# Usage: bash results/drivers/reproduce.sh [WORKDIR]
set -euo pipefail
W=${1:-.mmspec_cache/reproduce-driving}
# Phase 1: backbone (reasoning LM loss + class-map reading loss on the vision tower) and flow-matching expert,
# 1500 steps at batch 8 from scratch (~23 min at 2 threads).
python -m mmspec.drivers.train_vla train --out "$W/vla1" --size small --steps 1500 --batch-size 8 --threads 2
# Phase 2: from phase 1 with the expert's per-dimension action normalisation (1500 steps, ~31 min at 1 thread).
python -m mmspec.drivers.train_vla train --out "$W/vla2" --init "$W/vla1" --steps 1500 --threads 1
# Phase 3: from phase 2 once the world drew tail lamps (lit while the lead brakes): 1200 steps at lr 5e-4
# (~25 min at 1 thread).
python -m mmspec.drivers.train_vla train --out "$W/vla3" --init "$W/vla2" --steps 1200 --lr 5e-4 --threads 1
# Phase 4: from phase 3, 2000 steps at lr 4e-4 (~45 min at 1 thread beside another job).
python -m mmspec.drivers.train_vla train --out "$W/vla4" --init "$W/vla3" --steps 2000 --lr 4e-4 --threads 1 --save-every 200
# Phase 5: from phase 4, 1500 steps at lr 4e-4 with the road-ahead loss (the vision tokens say where the road's
# centreline lies 5-30 m ahead) and 30% perturbed lead-ins (~32 min at 1 thread).
python -m mmspec.drivers.train_vla train --out "$W/vla5" --init "$W/vla4" --steps 1500 --lr 4e-4 --threads 1 \
    --perturb 0.3 --road-weight 1.0
# Phase 6, one DAgger round: phase 5 drives 180 training scenarios (~7 min), then 1000 steps at lr 3e-4 with half
# the items replaying those drives to a tick and labelled with the expert's recovery (~21 min).
python -m mmspec.drivers.train_vla rollouts --model "$W/vla5" --out "$W/rollouts5.jsonl" --n 180 --threads 1
python -m mmspec.drivers.train_vla train --out "$W/vla6" --init "$W/vla5" --steps 1000 --lr 3e-4 --threads 1 \
    --perturb 0.2 --road-weight 1.0 --rollouts "$W/rollouts5.jsonl" --rollout-fraction 0.5
python -m mmspec.drivers.train_vla export --model "$W/vla6"
# Phase 7 (2026-12-02; what ships now): a second DAgger round with FlashDrive's streaming mask. Phase 6 drives 180
# fresh training scenarios, then 150 steps at lr 3e-5 (seed 4) with phase 6's losses, half the items replaying those
# drives, half the steps under the streaming mask (frames see only the prompt head and themselves; ~6.7 s a step at
# 1 thread). Then its few-step action expert: a student of the expert distilled into 2 Euler steps (800 steps,
# ~4.3 s each; resumable), shipped beside the VLA in fewstep/ (bf16, re-bound to the exported backbone).
python -m mmspec.drivers.train_vla rollouts --model drivers/assets/driving-vla --out "$W/rollouts6.jsonl" --n 180 --threads 1
python -m mmspec.drivers.train_vla train --out "$W/vla7" --init drivers/assets/driving-vla --steps 150 --batch-size 8 \
    --lr 3e-5 --warmup 10 --aux-weight 1 --road-weight 1 --perturb 0.2 --rollouts "$W/rollouts6.jsonl" \
    --rollout-fraction 0.5 --stream-mask 0.5 --seed 4 --threads 1
python -m mmspec.drivers.distill --vla "$W/vla7" --out "$W/fewstep7" --student-steps 2 --steps 800 --batch-size 8 \
    --lr 3e-4 --warmup 20 --stream-mask 0.5 --seed 0 --threads 1 --save-every 25
python -m mmspec.drivers.train_vla export --model "$W/vla7" --student "$W/fewstep7"
# Then (2026-12-04, issue 35; what ships now): a 1-step student, distilled on the exported VLA itself and warm-started
# from the 2-step one (400 steps at lr 1e-4, ~1.3 s each at 1 thread), shipped in its place (bf16).
python -m mmspec.drivers.distill --vla drivers/assets/driving-vla --out "$W/fewstep1" --student-steps 1 --steps 400 \
    --batch-size 8 --lr 1e-4 --warmup 10 --stream-mask 0.5 --seed 1 --threads 1 --save-every 25 \
    --init drivers/assets/driving-vla/fewstep
python -m mmspec.drivers.train_vla export --model drivers/assets/driving-vla --student "$W/fewstep1" --student-only
python -m mmspec.drivers.train_vla eval --n 48 --samples 6 --closed-loop 48
# FlashDrive's reasoning drafter (drivers/assets/driving-drafter): a GLANCE block head (1 layer, blocks of 8, reading
# layers 1-3 over the whole prompt, frames included) trained with `mmspec train` on the bundled VLA's own greedy
# reasoning over 1024 driving items (float32 states; 64 items held out), then stored in bfloat16.
mmspec train --kind glance --target drivers/assets/driving-vla --workload driving --n-train 1024 --max-new-tokens 40 \
    --layer-ids 1,2,3 --num-draft-tokens 7 --options '{"num_layers": 1, "anchor_feature": "all", "num_kept_layers": 3}' \
    --out "$W/drafter" --shard-size 64 --val-shards 1 --stage data --threads 1 --dtype float32
# ... then the fit: refine pass on, position decay 2, batch 16, lr 3e-3 over a 500-step schedule; the shipped head is
# the step-200 checkpoint (held-out top-1 at offsets 1-7: 0.92 0.89 0.87 0.86 0.86 0.83 0.85; ~25 min at 1 thread on
# a loaded machine), stored in bfloat16 (python: GlanceDrafter.from_pretrained(CKPT).save_pretrained(DIR,
# dtype=torch.bfloat16)).
mmspec train --kind glance --target drivers/assets/driving-vla --workload driving --n-train 1024 --max-new-tokens 40 \
    --layer-ids 1,2,3 --num-draft-tokens 7 --out "$W/drafter" --shard-size 64 --val-shards 1 --stage fit --threads 1 \
    --dtype float32 --steps 500 --batch-size 16 --save-every 100 \
    --options '{"num_layers": 1, "anchor_feature": "all", "num_kept_layers": 3, "refine": 1, "loss_decay": 2}'
