"""Interleaved A/B on the same clip ticks and noise (fp32, 1 thread): flashdrive without and with drafting the last
tick's reasoning first; paired per-tick savings. Usage: python ab2.py N_CLIPS"""
import os, tempfile
import sys, statistics, json
import torch
torch.set_num_threads(1)
from mmspec.drivers import DrivingPipeline
from mmspec.drivers.flashdrive import DRAFTER_DIR
from mmspec.drivers.train_vla import DrivingVLA, bundled_vla
from mmspec.drivers.clips import write_clip, load_clip, sample_at, HISTORY_TICKS
vla = DrivingVLA.from_pretrained(bundled_vla(), dtype=torch.float32).eval()
nd = int(sys.argv[2]) if len(sys.argv) > 2 else 16
systems = {"flashdrive-noreuse": {"reuse_reasoning": False}, "flashdrive": True}
pipes = {k: DrivingPipeline(vla, flashdrive=v) for k, v in systems.items()}
rows = {k: [] for k in systems}
n_clips, n_ticks = int(sys.argv[1]), 10
for c in range(n_clips):
    clip = load_clip(write_clip(os.path.join(tempfile.gettempdir(), "mmspec-drive-sim-clips"), "test", 30_000 + c, seconds=12.0, seed=0,
                                kind=["lead_brake", "cruise", "cut_in", "red_light"][c % 4]))
    for p in pipes.values(): p.reset()
    for j in range(2 + n_ticks):
        smp = sample_at(clip, HISTORY_TICKS + j)
        outs = {}
        for k, p in pipes.items():
            r = p.step(smp["frames"]["front"], smp["history"], smp["speed"], seed=j, tick=HISTORY_TICKS + j)
            outs[k] = r
            if j >= 2: rows[k].append(r)
        assert outs["flashdrive"]["tokens"] == outs["flashdrive-noreuse"]["tokens"]
for k, rs in rows.items():
    med = {s: round(statistics.median(r["timings_ms"][s] for r in rs), 1) for s in ("encode", "prefill", "decode", "action", "total")}
    extra = ""
    if "spec_rounds" in rs[0]:
        extra = f"rounds/tick {sum(r['spec_rounds'] for r in rs)/len(rs):.2f} tokens/tick {sum(r['num_decode_tokens'] for r in rs)/len(rs):.2f}"
    print(k, med, extra, flush=True)

import numpy as np
a, b = rows["flashdrive-noreuse"], rows["flashdrive"]
for st in ("decode", "action", "total"):
    d = np.array([x["timings_ms"][st] - y["timings_ms"][st] for x, y in zip(a, b)])
    print(f"paired {st}: median saving {np.median(d):.1f} ms, mean {d.mean():.1f}, ticks {len(d)}; medians {np.median([x['timings_ms'][st] for x in a]):.1f} -> {np.median([y['timings_ms'][st] for y in b]):.1f}")
