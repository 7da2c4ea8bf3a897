#!/usr/bin/env bash
# The commands that trained the bundled reader (vision/assets/reader) on a 2-core CPU, in order. Each stage is
# resumable: run it again after a kill and it continues from its last checkpoint (OUT/state.pt).
set -euo pipefail
RUNS=${RUNS:-runs}
# 1. the eyes: vision transformer + connector on labelled token tiles (3,000 steps of ~384 tiles; ~3.5 h here,
#    under other load). The run was started with --steps 4000 and shortened to 3000 at step 1700 (its cosine
#    schedule followed the new length from there).
python -m mmspec.vision.reader.train vision --out "$RUNS/reader-vision" --steps 3000 --tiles 384 --threads 2
# 2a. the transcription habit on noised target embeddings (stopped after 80 of 600 steps: the loss had settled)
python -m mmspec.vision.reader.train adapter --out "$RUNS/reader-lora" --steps 600 --batch 4 --threads 1
# 2b. on the front end's own outputs, the connector trained end to end (250 steps, ~23 min)
python -m mmspec.vision.reader.train adapter --out "$RUNS/reader-lora-b" --steps 250 --batch 4 --lr 2e-4 \
    --threads 2 --frontend "$RUNS/reader-vision" --train-connector --init-lora "$RUNS/reader-lora"
# 2c. 300 more steps on new pages (seed 1) from 2b, connector included, at half the learning rate
python -m mmspec.vision.reader.train adapter --out "$RUNS/reader-lora-c" --steps 300 --batch 4 --lr 1e-4 --warmup 10 \
    --seed 1 --threads 2 --frontend "$RUNS/reader-vision" --train-connector --init-lora "$RUNS/reader-lora-b"
# 3. the shipped folder
python -m mmspec.vision.reader.train export --vision "$RUNS/reader-vision" --adapter "$RUNS/reader-lora-c" \
    --out vision/assets/reader
# 4. the report card (held-out items from index 1000 on, greedy, float32)
python -m mmspec.vision.reader.evaluate --n 40 --json vision/assets/reader/eval.json
# 5. the EAGLE-3-style baseline on the reader (not shipped: 246 MB with the target's embedding and LM head; run
#    here in two parts: stopped at step 300, then the same command with --resume)
mmspec train --kind eagle --target vision/assets/reader --workload docs,charts --n-train 320 --max-new-tokens 320 \
    --steps 500 --batch-size 8 --lr 3e-3 --num-draft-tokens 5 --ttt-steps 4 --val-shards 1 --shard-size 32 \
    --save-every 100 --out "$RUNS/reader-eagle" --threads 2
mmspec bench --model vision/assets/reader --workload docs --n 12 --batch-sizes 1 --max-new-tokens 400 \
    --systems "ar,page-lookup,eagle:$RUNS/reader-eagle" --json vision/assets/reader/bench-docs-bs1.json
