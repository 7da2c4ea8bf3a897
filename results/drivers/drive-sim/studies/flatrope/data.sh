cd /work/main
export OMP_NUM_THREADS=1
date -u
.venv/bin/mmspec train --kind glance --target drivers/assets/driving-vla --workload driving --n-train 1024 --max-new-tokens 40 \
    --layer-ids 1,2,3 --num-draft-tokens 7 --options '{"num_layers": 1, "anchor_feature": "all", "num_kept_layers": 3}' \
    --out /work/runs/flat/drafter --shard-size 64 --val-shards 1 --stage data --threads 1 --dtype float32
date -u
