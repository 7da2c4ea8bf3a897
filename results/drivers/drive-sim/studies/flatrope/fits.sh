# Fit the FlatRoPE head and the default (M-RoPE) head on the same data with the shipped recipe (500-step
# schedule, step-200 checkpoint kept, as reproduce.sh), one after the other; each fit is stopped once its
# step-200 checkpoint has been scored on the held-out shard.
cd /work/main
export OMP_NUM_THREADS=1
for v in flat target; do
  out=/work/runs/flat/fit-$v
  date -u; echo "fit $v"
  .venv/bin/mmspec train --kind glance --target drivers/assets/driving-vla --workload driving --n-train 1024 \
    --max-new-tokens 40 --layer-ids 1,2,3 --num-draft-tokens 7 --out $out --data /work/runs/flat/drafter/data \
    --shard-size 64 --val-shards 1 --stage fit --threads 1 --dtype float32 --steps 500 --batch-size 16 --save-every 100 \
    --options "{\"num_layers\": 1, \"anchor_feature\": \"all\", \"num_kept_layers\": 3, \"refine\": 1, \"loss_decay\": 2, \"rope\": \"$v\"}" \
    > /work/runs/flat/fit-$v.log 2>&1 &
  pid=$!
  until grep -q '"step": 200' $out/val_log.jsonl 2>/dev/null || ! kill -0 $pid 2>/dev/null; do sleep 10; done
  kill $pid 2>/dev/null; wait $pid
  date -u; echo "stopped $v"; cat $out/val_log.jsonl
  .venv/bin/python -c "
import torch
from mmspec.vision.glance import GlanceDrafter
GlanceDrafter.from_pretrained('$out/checkpoints/step-000200').save_pretrained('/work/runs/flat/head-$v', dtype=torch.bfloat16)
print('saved /work/runs/flat/head-$v')"
done
date -u
# Side by side on the same clips: each fitted head, then the shipped head for reference.
for v in flat target shipped; do
  d=/work/runs/flat/head-$v; [ $v = shipped ] && d=drivers/assets/driving-drafter
  date -u; echo "drive-sim $v"
  .venv/bin/mmspec drive-sim --dtype bfloat16 --systems plain,spec,flashdrive --clips 4 --ticks 8 --warmup 3 \
    --closed-loop 0 --samples 1 --threads 1 --drafter glance:$d --clips-dir /work/runs/flat/clips \
    --json /work/runs/flat/drive-$v.json --no-progress > /work/runs/flat/drive-$v.log 2>&1
  tail -30 /work/runs/flat/drive-$v.log
done
date -u; echo done
