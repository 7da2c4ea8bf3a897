#!/usr/bin/env bash
# The SmolLM2-135M-Instruct EAGLE-3 head for vLLM (issue 37). Resumable: rerun this same script; the data stage skips
# the shards already written and the fit continues from the latest checkpoint (--resume).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-runs/vllm-head}"
T="$(.venv/bin/python -c 'from mmspec.vision.reader.lm import smollm2_path; print(smollm2_path())')"
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
exec nice -n 19 .venv/bin/mmspec train --kind eagle --target "$T" --workload chat --n-train 384 --shard-size 16 \
    --max-new-tokens 96 --layer-ids 2,15,27 --num-draft-tokens 3 --steps 800 --batch-size 8 --lr 3e-3 --warmup 50 \
    --save-every 200 --val-shards 4 --threads 1 --dtype float32 --no-progress --resume \
    --options '{"layout": "eagle3", "draft_vocab_size": 8192}' --out "$OUT"
