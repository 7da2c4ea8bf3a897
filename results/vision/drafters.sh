#!/usr/bin/env bash
# Every page-reading drafter of issue 15 and the EAGLE baseline they are measured against, trained on ONE data
# stage of one target, then measured in ONE bench run (the table). Each step is resumable: run the script
# again after a stop and finished steps are skipped (their drafter folders exist), unfinished ones resume.
#
# Usage: bash results/vision/drafters.sh TARGET WORKDIR [N_ITEMS] [STEPS]
#   TARGET   a testbed target folder (e.g. vision/assets/testbed-vlm, or the faithful run's snapshot)
#   WORKDIR  where data, checkpoints and drafters go
# Environment: LAYERS (kept target layers, comma-separated).
#   LAYERS default: EAGLE-3's (low, middle, high) as `mmspec train` picks them. THREADS (torch threads, default
#   1), DTYPE (bench dtype, default the checkpoint's), N_BENCH (default 48),
#   VAL (held-out data shards, default 8), SHARD_SIZE (records per shard, default mmspec train's), MAX_NEW
#   (response tokens per item, default 128; the reader's pages need 448).
# A smoke run of the whole pipeline: N_BENCH=2 VAL=2 SHARD_SIZE=4 bash results/vision/drafters.sh TARGET /tmp/d 24 2
set -euo pipefail
TARGET=${1:?target folder}
W=${2:?work folder}
N=${3:-2000}
STEPS=${4:-3000}
THREADS=${THREADS:-1}
N_BENCH=${N_BENCH:-48}
VAL=${VAL:-8}
MAX_NEW=${MAX_NEW:-128}
MMSPEC=${MMSPEC:-mmspec}
PY=${PY:-python}
mkdir -p "$W"
if [ -z "${LAYERS:-}" ]; then  # EAGLE-3's low / middle / high layers of this target (what `mmspec train` defaults to)
  LAYERS=$($PY -c "
import json, sys
from mmspec.drafters.eagle import default_layer_ids
c = json.load(open(sys.argv[1] + '/config.json'))
print(','.join(map(str, default_layer_ids(c.get('text_config', c)['num_hidden_layers']))))" "$TARGET")
fi
if [ "$N_BENCH" -lt 2 ]; then echo "drafters.sh: N_BENCH must be at least 2" >&2; exit 2; fi
echo "drafters.sh: target $TARGET, layers $LAYERS, $N items, $STEPS steps, work $W"
BLOCK='"num_anchors": 64, "num_layers": 2, "anchor_feature": "all"'
COMMON=(--target "$TARGET" --n-train "$N" --max-new-tokens "$MAX_NEW" ${SHARD_SIZE:+--shard-size "$SHARD_SIZE"}
        --steps "$STEPS" --batch-size 8 --lr 3e-3 --warmup $((STEPS < 1000 ? STEPS / 10 : 100))
        --val-shards "$VAL" --save-every 250
        --threads "$THREADS" --resume)
done_() { [ -f "$1/config.json" ] && [ -f "$1/model.safetensors" ]; }

# 1. One data stage, TIGER's records (GLANCE's plus what the router reads): EAGLE and GLANCE train on them too.
#    Resumable (written shards are kept); a complete data folder returns at once.
$MMSPEC train --kind tiger --stage data --target "$TARGET" --n-train "$N" --max-new-tokens "$MAX_NEW" \
    --layer-ids "$LAYERS" --num-draft-tokens 7 --val-shards "$VAL" --threads "$THREADS" --out "$W/data-run" \
    ${SHARD_SIZE:+--shard-size "$SHARD_SIZE"} \
    --options "{$BLOCK, \"visual_top_k\": 32}"
DATA="$W/data-run/data"
# 2. The EAGLE baseline on the same records (the bundled head's depth 5 and 4 unroll steps; the same data, steps
#    and rate as the block heads below, so the comparison is per training sample).
done_ "$W/eagle" || $MMSPEC train --kind eagle --stage fit --data "$DATA" "${COMMON[@]}" --num-draft-tokens 5 \
    --ttt-steps 4 --out "$W/eagle"
# 3. GLANCE, blocks of 8: DFlash's position decay and the flat loss (decay 1 gave offset 1 twice the held-out
#    top-1 on the shipped target), each with and without the refinement pass.
for name in glance-decay:"" glance-flat:', "loss_decay": 1.0' glance-flat-refine:', "loss_decay": 1.0, "refine": 1'; do
  out="$W/${name%%:*}"
  done_ "$out" || $MMSPEC train --kind glance --stage fit --data "$DATA" "${COMMON[@]}" --layer-ids "$LAYERS" \
      --num-draft-tokens 7 --options "{$BLOCK${name#*:}}" --out "$out"
done
# 4. TIGER: distillation with the routed top-32 visual tokens and the visual_top_k=all ablation (same recipe and
#    data), then the policy stage from the distilled head, and the distillation-only head given the same extra steps.
done_ "$W/tiger-distill" || $MMSPEC train --kind tiger --stage fit --data "$DATA" "${COMMON[@]}" \
    --layer-ids "$LAYERS" --num-draft-tokens 7 --options "{$BLOCK, \"visual_top_k\": 32}" --out "$W/tiger-distill"
done_ "$W/tiger-all" || $MMSPEC train --kind tiger --stage fit --data "$DATA" "${COMMON[@]}" \
    --layer-ids "$LAYERS" --num-draft-tokens 7 --options "{$BLOCK, \"visual_top_k\": \"all\"}" --out "$W/tiger-all"
EXTRA=$((STEPS / 3 > 0 ? STEPS / 3 : 1))
done_ "$W/tiger-policy" || $MMSPEC train --kind tiger --stage fit --data "$DATA" "${COMMON[@]}" --steps "$EXTRA" \
    --layer-ids "$LAYERS" --num-draft-tokens 7 --init-drafter "$W/tiger-distill" \
    --options "{$BLOCK, \"visual_top_k\": 32, \"stage\": \"policy\", \"group\": 4}" --out "$W/tiger-policy"
done_ "$W/tiger-more" || $MMSPEC train --kind tiger --stage fit --data "$DATA" "${COMMON[@]}" --steps "$EXTRA" \
    --layer-ids "$LAYERS" --num-draft-tokens 7 --init-drafter "$W/tiger-distill" \
    --options "{$BLOCK, \"visual_top_k\": 32}" --out "$W/tiger-more"
# 5. One bench run: AR, the ceiling, EAGLE, every head, the reading ablation, tree vs chain, GLANCE's
#    sample-then-match is a separate --sample run (below).
G="$W/glance-flat"
SYSTEMS="ar,ceiling,eagle:$W/eagle,glance:$G,glance:$G;branch_k=1,glance:$G;image_features=shuffled"
SYSTEMS+=",glance:$W/glance-decay,glance:$W/glance-flat-refine,tiger:$W/tiger-distill,tiger:$W/tiger-all"
SYSTEMS+=",tiger:$W/tiger-policy,tiger:$W/tiger-more"
$MMSPEC bench --model "$TARGET" --workload docs,charts --n "$N_BENCH" --batch-sizes 1,4 --max-new-tokens "$MAX_NEW" \
    --systems "$SYSTEMS" --threads "$THREADS" ${DTYPE:+--dtype "$DTYPE"} --json "$W/bench.json" | tee "$W/bench.txt"
$MMSPEC bench --model "$TARGET" --workload docs,charts --n "$((N_BENCH / 2))" --batch-sizes 1 --max-new-tokens "$MAX_NEW" \
    --systems "ar,glance:$G,glance:$G;rule=sample_then_match,eagle:$W/eagle" --sample default \
    --threads "$THREADS" ${DTYPE:+--dtype "$DTYPE"} --json "$W/bench-sample.json" | tee "$W/bench-sample.txt"
