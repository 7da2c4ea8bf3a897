"""The action stage's head calls through ``LeanExpert`` against the decoder's own path, on real tick contexts.

For each of ``--ticks`` FlashDrive ticks of a drive-sim clip (the bundled VLA, the shipped 2-step student, the
dtype ``auto`` picks, ``--threads``): the context the expert read (a copy taken at its call), then ``expert.sample``
from the same noise with ``lean=False`` (FlashDrive's path until now: ``precompute=True``) and ``lean=True``,
checked equal bit for bit, and both timed (``--reps`` each, interleaved; median ms per sample, i.e. per action
stage). Run under ``flock /work/scratch/cpu.lock`` with nothing else running:

    python results/drivers/drive-sim/studies/lean_expert.py --ticks 6 --reps 30 --threads 2
"""

import argparse
import copy
import os
import statistics
import tempfile
import time

import torch

from mmspec.checkpoints import resolve_dtype
from mmspec.drivers import DrivingPipeline
from mmspec.drivers.bundled import bundled_vla
from mmspec.drivers.clips import HISTORY_TICKS, load_clip, sample_at, write_clip
from mmspec.drivers.vla import DrivingVLA


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ticks", type=int, default=6)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="auto")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = bundled_vla()
    vla = DrivingVLA.from_pretrained(model, dtype=resolve_dtype(args.dtype, model, "cpu"))
    pipe = DrivingPipeline(vla, flashdrive={"lean_expert": False})
    expert = pipe.engine.expert
    print(pipe.engine.describe(), vla.backbone.dtype, flush=True)
    clip = load_clip(write_clip(os.path.join(tempfile.gettempdir(), "mmspec-drive-sim-clips"), "test", 30_000,
                                seconds=(HISTORY_TICKS + 3 + args.ticks + 65) * 0.1, seed=0, kind="cruise"))
    seen = {}
    own_sample = expert.sample

    def sample(cache, start, valid, **kw):  # the context as the expert reads it (the engine crops it afterwards)
        seen["ctx"] = (copy.deepcopy(cache), start.clone(), valid.clone())
        return own_sample(cache, start, valid, **kw)

    expert.sample = sample
    rows = []
    for j in range(3 + args.ticks):
        smp = sample_at(clip, HISTORY_TICKS + j)
        pipe.step(smp["frames"]["front"], smp["history"], smp["speed"], seed=j, tick=HISTORY_TICKS + j)
        if j < 3:
            continue
        cache, start, valid = seen["ctx"]

        def run(lean):
            g = torch.Generator().manual_seed(j)
            return own_sample(cache, start, valid, generator=g, precompute=True, lean=lean)

        with torch.no_grad():
            same = torch.equal(run(False), run(True))
            times = {False: [], True: []}
            for _ in range(args.reps):
                for lean in (False, True):
                    t0 = time.perf_counter()
                    run(lean)
                    times[lean].append((time.perf_counter() - t0) * 1e3)
        med = {k: statistics.median(v) for k, v in times.items()}
        rows.append(med)
        print(f"tick {HISTORY_TICKS + j}: context {cache.get_seq_length()} tokens, bit-identical {same}, "
              f"decoder path {med[False]:.2f} ms, lean {med[True]:.2f} ms ({med[False] / med[True]:.2f}x)", flush=True)
    a = statistics.median(r[False] for r in rows)
    b = statistics.median(r[True] for r in rows)
    print(f"median over ticks: decoder path {a:.2f} ms, lean {b:.2f} ms per action stage ({a / b:.2f}x)")


if __name__ == "__main__":
    main()
