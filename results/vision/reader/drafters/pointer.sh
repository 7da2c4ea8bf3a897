#!/usr/bin/env bash
# Issue 33, GLANCE with the pointer (copy path) on the reader. Resumable: run again after a stop and it continues.
# Usage: bash results/vision/reader/drafters/pointer.sh [WORKDIR]   (WORKDIR as drafters.sh's: its data stage, step 1)
set -euo pipefail
W=${1:-runs/reader-drafters}
MMSPEC=${MMSPEC:-mmspec}
PY=${PY:-python}
# 1. drafters.sh step 1 (the data stage: 800 items, layers 2 / 15 / 29), then the pointer's slots added to its records
#    (the data stage of this code writes them itself; this upgrades data collected before): ~8 min at one thread.
$PY -m mmspec.vision.glance.train add-pointer-slots "$W/data-run/data" --target vision/assets/reader --threads 1
# 2. GLANCE with the pointer: blocks of 8, 2 layers, 32 anchors a record, 400 steps of batch 8 (~5 s a step here)
$MMSPEC train --kind glance --stage fit --data "$W/data-run/data" --target vision/assets/reader --steps 400 \
    --batch-size 8 --lr 3e-3 --warmup 40 --val-shards 1 --save-every 25 --layer-ids 2,15,29 --num-draft-tokens 7 \
    --options '{"num_anchors": 32, "num_layers": 2, "anchor_feature": "all", "pointer": true}' --threads 2 \
    --out "$W/glance-slots" --resume --no-progress
# 3. the measurements (bf16 = auto on the 2-core AVX-512 BF16 CPU, --threads 2, nothing else running)
R=results/vision/reader/drafters
G="$W/glance-slots"
E=vision/assets/reader/drafters/eagle
$MMSPEC bench --model vision/assets/reader --workload docs --n 8 --batch-sizes 1,4 --max-new-tokens 320 --threads 2 \
    --systems "ar,ceiling;depth=7,reference-lookup,page-lookup,eagle:$E,glance:$G,glance:$G;image_features=shuffled,glance:$G;branch_k=2;tree_budget=12,glance:$G & page-lookup" \
    --json $R/bench-pointer-docs-bs1-4.json
$MMSPEC bench --model vision/assets/reader --workload charts --n 8 --batch-sizes 1 --max-new-tokens 160 --threads 2 \
    --systems "ar,ceiling;depth=7,page-lookup,glance:$G,glance:$G;branch_k=2;tree_budget=12" --json $R/bench-pointer-charts-bs1.json
# 4. ship the head with the reader (bf16, without the reader's embedding and LM head: it takes them at load), its
#    validation block copied from the run
$PY - "$G" vision/assets/reader/drafters/glance <<'PY'
import json, sys, torch
from mmspec import MMSpecPipeline
from mmspec.vision.glance.drafter import GlanceDrafter
src, dst = sys.argv[1:]
reader = MMSpecPipeline.from_pretrained("vision/assets/reader", drafter=None, dtype="float32").model
GlanceDrafter.from_pretrained(src, target=reader).save_pretrained(dst, dtype=torch.bfloat16)
cfg = json.load(open(f"{dst}/config.json"))
cfg["validation"] = json.load(open(f"{src}/config.json"))["validation"]
json.dump(cfg, open(f"{dst}/config.json", "w"), indent=2, sort_keys=True)
PY
