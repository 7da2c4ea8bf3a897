#!/usr/bin/env bash
# Issue 33 on the reader: ONE data stage (TIGER's records, which GLANCE and EAGLE also train on), then the heads.
# Every step is resumable: run the script again after a stop and it continues (written shards are kept, fits
# resume from OUT/checkpoints). Usage: bash results/vision/reader/drafters/drafters.sh [WORKDIR]
set -euo pipefail
W=${1:-runs/reader-drafters}
MMSPEC=${MMSPEC:-mmspec}
BLOCK='"num_anchors": 64, "num_layers": 2, "anchor_feature": "all"'
# 1. the reader's own greedy answers on 800 training items (400 docs pages, 400 charts), up to 448 tokens, and its
#    hidden states at layers 2 / 15 / 29 (EAGLE-3's low / mid / high); one held-out shard of 32 records.
#    ~34 min on the 2-core CPU, 800 MB.
$MMSPEC train --kind tiger --stage data --target vision/assets/reader --n-train 800 --max-new-tokens 448 \
    --layer-ids 2,15,29 --num-draft-tokens 7 --val-shards 1 --shard-size 32 --threads 2 --out "$W/data-run" \
    --options "{$BLOCK, \"visual_top_k\": 32}" --no-progress
# 2. GLANCE, blocks of 8, the flat loss (~9.4 s a step here)
$MMSPEC train --kind glance --stage fit --data "$W/data-run/data" --target vision/assets/reader --steps 400 \
    --batch-size 8 --lr 3e-3 --warmup 40 --val-shards 1 --save-every 50 --layer-ids 2,15,29 --num-draft-tokens 7 \
    --options "{$BLOCK, \"loss_decay\": 1.0}" --threads 2 --out "$W/glance" --resume
# 3. the measurements in this folder (2026-12-04, bf16 = auto on a 2-core AVX512-BF16 CPU, nothing else running;
#    README.md here has the tables). The GLANCE head is the one step 2 writes ($W/glance, 400 steps).
R=results/vision/reader/drafters
G="$W/glance"
E=vision/assets/reader/drafters/eagle
$MMSPEC bench --model vision/assets/reader --workload docs --n 8 --batch-sizes 1,4 --max-new-tokens 320 --threads 2 \
    --systems "ar,ceiling;depth=7,reference-lookup,page-lookup,eagle:$E,glance:$G,glance:$G;image_features=shuffled,glance:$G & page-lookup" \
    --json $R/bench-docs-bs1-4.json
$MMSPEC bench --model vision/assets/reader --workload charts --n 8 --batch-sizes 1 --max-new-tokens 160 --threads 2 \
    --systems "ar,ceiling;depth=7,page-lookup,glance:$G" --json $R/bench-charts-bs1.json
$MMSPEC bench --model vision/assets/reader --workload docs --n 8 --batch-sizes 1,2,4,8 --max-new-tokens 96 --threads 2 \
    --systems ar --json $R/bench-batch-cost.json
$MMSPEC bench --model vision/assets/reader --workload docs --n 8 --batch-sizes 1 --threads 2 \
    --systems "hierarchical;block_tokens=160,hierarchical;block_tokens=160;drafter=page-lookup" \
    --json $R/bench-hierarchical-bs1.json
# 4. row plans of hierarchical decoding (16 pages; README "row plans"), 2026-12-04 15:22, same machine and settings
H="hierarchical;block_tokens=160"
$MMSPEC bench --model vision/assets/reader --workload docs --n 16 --batch-sizes 1 --threads 2 \
    --systems "$H,$H;drafter=page-lookup,$H;lines_per_row=4;drafter=page-lookup,$H;row_tokens=24,$H;row_tokens=18,$H;row_tokens=18;drafter=page-lookup,$H;row_tokens=24;drafter=page-lookup" \
    --json $R/bench-hierarchical-plans-n16.json
# 5. rows of four pages in one batch (README "rows of several pages"), 2026-12-04 22:04, same machine and settings
$MMSPEC bench --model vision/assets/reader --workload docs --n 16 --batch-sizes 1,4 --threads 2 \
    --systems "$H;row_tokens=24,$H;row_tokens=24;drafter=page-lookup" --json $R/bench-hierarchical-bs1-4-n16.json
