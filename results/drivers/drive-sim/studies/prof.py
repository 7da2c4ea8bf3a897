"""Profile flashdrive ticks stage by stage (fp32, 1 thread)."""
import os, tempfile
import sys, time, cProfile, pstats, statistics
import torch
torch.set_num_threads(1)
from mmspec.drivers import DrivingPipeline
from mmspec.drivers.train_vla import DrivingVLA, bundled_vla
from mmspec.drivers.clips import write_clip, load_clip, sample_at, HISTORY_TICKS
vla = DrivingVLA.from_pretrained(bundled_vla(), dtype=torch.float32).eval()
pipe = DrivingPipeline(vla, flashdrive=True)
print(pipe.engine.describe())
prefix = write_clip(os.path.join(tempfile.gettempdir(), "mmspec-drive-sim-clips"), "test", 30_000, seconds=10.0, seed=0, kind="lead_brake")
clip = load_clip(prefix)
first = HISTORY_TICKS
def tick(j):
    smp = sample_at(clip, first + j)
    return pipe.step(smp["frames"]["front"], smp["history"], smp["speed"], seed=j, tick=first + j)
for j in range(3):
    tick(j)
rows = []
pr = cProfile.Profile()
for j in range(3, 13):
    if j == 8: pr.enable()
    r = tick(j)
    if j == 12: pr.disable()
    rows.append(r)
for k in ("preprocess", "encode", "prefill", "decode", "action", "total"):
    print(k, round(statistics.median(r["timings_ms"][k] for r in rows), 1))
print("tokens", [r["num_decode_tokens"] for r in rows], "rounds", [r.get("spec_rounds") for r in rows],
      "head_calls", [r["head_calls"] for r in rows], [r["stream"] for r in rows][:3])
pstats.Stats(pr).sort_stats("cumtime").print_stats(45)
