#!/usr/bin/env bash
# Issue 36 on a lent GPU, one call of the device tool: the image world's generators at larger grids and their
# spatial heads, trained for a wall-clock budget, brought back as one tarball (<= 16 MiB) per grid.
#
#   run(command="bash results/image_ar/train_gpu.sh", timeout_s=600)
#
# What travels: the checkout (tracked files must fit the device's 64 MiB: move the bundled weights this call does
# not read out of the checkout first, e.g. vision/assets/reader and drivers/assets; the VQ-VAE of
# image_ar/assets/image-gen/vq is read). The device image has transformers 5.17 and no registry; mmspec's
# image_ar path runs on it (checked here with 5.17 on PYTHONPATH), installed editable with --no-deps.
#
# Per grid G in GRIDS (default "32 8"; the VQ-VAE is convolutional, so 4 G px pictures give G x G codes):
#   1. the generator (Llama "medium", 4 x 192, the bundled 16 x 16 one's shape), bf16 autocast, DataLoader workers
#      drawing the pictures; its step count is what GEN_SECONDS_<G> buys at the speed of a 30-step probe;
#   2. the spatial head (`mmspec train --kind spatial`) on 384 of the generator's own samples (one shard held out).
# Each grid's folder is packed as soon as it is done ($OUT/grid<G>.tar.gz, $OUT/grid<G>.log: the weights, configs
# and logs; no optimizer state), so a call that runs out of time still brings back the grids finished before.
# DEADLINE (s after start, default 540) bounds the whole script: a grid's generator budget shrinks to leave
# HEAD_RESERVE_<G> s for its head, the head runs under `timeout`, and a grid with under 100 s left is skipped.
# Locally: DEVICE=cpu GRIDS=8 GEN_SECONDS_8=10 BATCH_8=8 HEAD_STEPS_8=10 NTRAIN_8=40 WORKERS=1 (a smoke run).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/gpu-out}"
W="${W:-/tmp/w36}"
PY="${PYTHON:-python3}"
DEVICE="${DEVICE:-cuda}"
GRIDS="${GRIDS:-32 8}"
WORKERS="${WORKERS:-$(( $(nproc) > 4 ? $(nproc) - 2 : 0 ))}"
T0=$(date +%s)
mkdir -p "$OUT" "$W"
if ! "$PY" -c "import mmspec.image_ar" 2>/dev/null; then
  "$PY" -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/install.log" 2>&1 || { tail "$OUT/install.log"; exit 2; }
fi
"$PY" - <<'EOF'
import torch, transformers
print("torch", torch.__version__, "transformers", transformers.__version__,
      "gpu", torch.cuda.get_device_name(0) if torch.cuda.is_available() else None, flush=True)
EOF
VQ=image_ar/assets/image-gen/vq
status=0
for G in $GRIDS; do
  S=$(( G * 4 ))
  D="$W/grid$G"
  LOG="$OUT/grid$G.log"
  LEFT=$(( ${DEADLINE:-540} - ($(date +%s) - T0) ))
  if [ "$LEFT" -lt 100 ]; then echo "grid $G skipped: ${LEFT}s left"; status=1; continue; fi
  RESERVE_VAR="HEAD_RESERVE_$G"; RESERVE="${!RESERVE_VAR:-150}"
  BUDGET_VAR="GEN_SECONDS_$G"; BUDGET="${!BUDGET_VAR:-240}"
  BUDGET=$(( BUDGET < LEFT - RESERVE - 30 ? BUDGET : LEFT - RESERVE - 30 )); BUDGET=$(( BUDGET < 20 ? 20 : BUDGET ))
  BATCH_VAR="BATCH_$G"; BATCH="${!BATCH_VAR:-32}"
  HEAD_VAR="HEAD_STEPS_$G"; HEAD_STEPS="${!HEAD_VAR:-1200}"
  NTRAIN_VAR="NTRAIN_$G"; NTRAIN="${!NTRAIN_VAR:-384}"
  # workers hand their batches (uint8 pixels, 4 batches ahead each) through /dev/shm: a small one is a bus error
  SHM_KB=$(df -k --output=avail /dev/shm 2>/dev/null | tail -1); SHM_KB=${SHM_KB:-65536}
  CAP=$(( SHM_KB * 1024 / (BATCH * S * S * 3 * 4 * 2) )); NW=$(( WORKERS < CAP ? WORKERS : CAP ))
  (
    echo "== grid $G x $G ($S px), generator budget ${BUDGET}s, batch $BATCH, $NW workers, $(( $(date +%s) - T0 ))s in"
    # 1. speed probe (30 steps, thrown away), then the run sized to the budget
    "$PY" -m mmspec.image_ar train-generator --out "$W/probe$G" --vq $VQ --size medium --image-size $S \
      --batch-size $BATCH --steps 30 --device "$DEVICE" --workers "$NW" --save-every 100000 || exit 3
    STEPS=$("$PY" - "$W/probe$G/train_log.jsonl" "$BUDGET" <<'EOF'
import json, sys
secs = [json.loads(l)["sec"] for l in open(sys.argv[1])][1:]  # the first entry holds the warm-up
per = sorted(secs)[len(secs) // 2] if secs else 1.0
print(max(50, int(float(sys.argv[2]) / per)))
EOF
)
    echo "generator: $STEPS steps"
    "$PY" -m mmspec.image_ar train-generator --out "$D/gen" --vq $VQ --size medium --image-size $S \
      --batch-size $BATCH --steps "$STEPS" --device "$DEVICE" --workers "$NW" --save-every 1000 || exit 4
    echo "generator done, $(( $(date +%s) - T0 ))s in"
    # 2. the spatial head on the generator's own samples (k_v 3 and long plans: the run-time window is chosen
    #    per size afterwards, from measured verify costs, within what the head was trained on)
    HEAD_LEFT=$(( ${DEADLINE:-540} - ($(date +%s) - T0) - 15 ))
    ${HEAD_TIMEOUT:+timeout --foreground $HEAD_TIMEOUT} \
    "$PY" -m mmspec.cli train --dtype float32 --kind spatial --target "$D/gen" --workload images --n-train "$NTRAIN" \
      --shard-size 32 --val-shards 1 --steps "$HEAD_STEPS" --batch-size 16 --lr 2e-3 --warmup 50 --save-every 400 \
      --options '{"k_h": 8, "k_v": 3, "draft_len": 96, "rounds_per_record": 2}' --out "$D/spatial-head" \
      --no-progress ${HEAD_RESUME:+--resume} || exit 5
    echo "spatial head done, $(( $(date +%s) - T0 ))s in"
  ) > "$LOG" 2>&1 || { status=1; tail -20 "$LOG"; }
  rm -rf "$D/spatial-head/data" "$D"/spatial-head/*/data 2>/dev/null
  tar -C "$W" -czf "$OUT/grid$G.tar.gz" --exclude=checkpoints --exclude=state.pt --exclude=data "grid$G" && ls -la "$OUT/grid$G.tar.gz"
  tail -3 "$LOG"
done
exit $status
