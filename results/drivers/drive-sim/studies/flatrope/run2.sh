# Round 2: seed repeats of both heads, the FlatRoPE + text-only-context head, and a larger tau eval.
cd /work/main
export OMP_NUM_THREADS=1
fit() {  # name seed rope context
  local name=$1 seed=$2 rope=$3 context=$4 out=/work/runs/flat/fit-$1
  date -u; echo "fit $name"
  .venv/bin/mmspec train --kind glance --target drivers/assets/driving-vla --workload driving --n-train 1024 \
    --max-new-tokens 40 --layer-ids 1,2,3 --num-draft-tokens 7 --out $out --data /work/runs/flat/drafter/data \
    --shard-size 64 --val-shards 1 --stage fit --threads 1 --dtype float32 --steps 500 --batch-size 16 --save-every 100 \
    --seed $seed --options "{\"num_layers\": 1, \"anchor_feature\": \"all\", \"num_kept_layers\": 3, \"refine\": 1, \"loss_decay\": 2, \"rope\": \"$rope\", \"context\": \"$context\"}" \
    > /work/runs/flat/fit-$name.log 2>&1 &
  local pid=$!
  until grep -q '"step": 200' $out/val_log.jsonl 2>/dev/null || ! kill -0 $pid 2>/dev/null; do sleep 10; done
  kill $pid 2>/dev/null; wait $pid
  date -u; echo "stopped $name"; grep '"step": 200' $out/val_log.jsonl
  .venv/bin/python -c "
import torch
from mmspec.vision.glance import GlanceDrafter
GlanceDrafter.from_pretrained('$out/checkpoints/step-000200').save_pretrained('/work/runs/flat/head-$name', dtype=torch.bfloat16)
print('saved /work/runs/flat/head-$name')"
}
fit flattext 0 flat text
fit flat-s1 1 flat all
fit target-s1 1 target all
fit flattext-s1 1 flat text
fit flat-s2 2 flat all
fit target-s2 2 target all
fit flattext-s2 2 flat text
for v in flattext flat-s1 target-s1 flattext-s1 flat-s2 target-s2 flattext-s2; do
  date -u; echo "drive-sim $v"
  .venv/bin/mmspec drive-sim --dtype bfloat16 --systems plain,spec,flashdrive --clips 4 --ticks 8 --warmup 3 \
    --closed-loop 0 --samples 1 --threads 1 --drafter glance:/work/runs/flat/head-$v --clips-dir /work/runs/flat/clips \
    --json /work/runs/flat/drive-$v.json --no-progress > /work/runs/flat/drive-$v.log 2>&1
  tail -8 /work/runs/flat/drive-$v.log
done
# tau on more clips (4x the rounds), speculative systems only
for v in flat target flattext flat-s1 target-s1 flattext-s1 flat-s2 target-s2 flattext-s2 shipped; do
  d=/work/runs/flat/head-$v; [ $v = shipped ] && d=drivers/assets/driving-drafter
  date -u; echo "drive-sim16 $v"
  .venv/bin/mmspec drive-sim --dtype bfloat16 --systems spec,flashdrive --clips 16 --ticks 8 --warmup 3 \
    --closed-loop 0 --samples 1 --threads 1 --drafter glance:$d --clips-dir /work/runs/flat/clips \
    --json /work/runs/flat/drive16-$v.json --no-progress > /work/runs/flat/drive16-$v.log 2>&1
  tail -6 /work/runs/flat/drive16-$v.log
done
date -u; echo done
