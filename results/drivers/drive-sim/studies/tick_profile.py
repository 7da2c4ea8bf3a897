"""Where one tick's time goes: plain and FlashDrive ticks end to end, per stage, per op and per Python function.

Three passes over the same open-loop ticks (``--clips`` clips of the drive-sim test scenarios, all kinds in turn,
``--warmup`` untimed then ``--ticks`` timed ticks each, the systems interleaved tick by tick as in ``mmspec
drive-sim``; each pass with fresh pipelines, so no vision cache or stream carries over from the pass before):

* **timing**: no profiler; each tick's ``timings_ms`` (the figures drive-sim reports) and the wall of the whole
  ``pipe.step`` call (validation before the clock and the trajectory integration after it included).
* **profile**: ``torch.profiler`` (CPU, per op) around every timed tick. The stages are the ``drive.<stage>``
  ranges of :class:`mmspec.drivers.stages.StageClock` (the very intervals ``timings_ms`` adds up; plain's
  ``drive.generate`` is ``generate``'s own work between the model's forwards). Per stage: its wall, the time in
  the ATen ops Python called in it (top level; by name), the ops' own time by kind (matmul, attention, copies,
  allocations, views, elementwise, scalar reads) and the rest: Python (the modelling code, the loops, the
  profiler's own per-op cost).
* **python**: ``cProfile`` switched per stage by the clock: own time of each Python function per tick (inflated by
  cProfile; read as shares of a stage's Python time).

Medians over the timed ticks do not add up to the median total; the ``middle`` columns do: each component's mean
over the ticks whose total lies between the 25th and 75th percentile.

    flock /work/scratch/cpu.lock python results/drivers/drive-sim/studies/tick_profile.py --clips 6 --ticks 8 \\
        --warmup 3 --threads 2 --json results/drivers/drive-sim/tick_profile_bf16_threads2.json

``--systems plain,flashdrive`` (default) takes any drive-sim system names.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import platform
import pstats
import statistics
import sys
import tempfile
import time

import numpy as np
import torch

from mmspec.checkpoints import resolve_dtype
from mmspec.drivers import DrivingPipeline
from mmspec.drivers.bench import SIM_SYSTEMS
from mmspec.drivers.bundled import bundled_vla
from mmspec.drivers.clips import FUTURE_TICKS, HISTORY_TICKS, load_clip, sample_at, write_clip
from mmspec.drivers.flashdrive import FlashDriveConfig
from mmspec.drivers.stages import STAGES, StageClock
from mmspec.drivers.vla import DrivingVLA
from mmspec.drivers.world import DT, SCENARIO_KINDS

KINDS = [  # the ops' own (self) time by kind; first match wins, the rest is "elementwise"
    ("matmul", ("addmm", "mm", "bmm", "matmul", "linear", "baddbmm", "_addmm_activation", "mkldnn_", "_mkl_",
                "_weight_int")),
    ("attention", ("scaled_dot_product", "_softmax", "softmax", "flash_attention")),
    ("copy", ("copy_", "cat", "index_select", "clone", "contiguous", "_to_copy", "to", "index", "index_put_",
              "index_copy_", "stack", "masked_fill", "where", "gather", "scatter", "repeat", "_index_put_impl_",
              "embedding", "pad", "constant_pad_nd")),
    ("alloc", ("empty", "empty_strided", "zeros", "ones", "full", "arange", "new_empty", "resize_", "empty_like",
               "zeros_like", "ones_like", "full_like", "new_zeros", "new_ones", "fill_", "zero_", "new_full",
               "scalar_tensor", "lift_fresh", "randn", "normal_", "linspace")),
    ("view", ("view", "reshape", "transpose", "slice", "select", "unsqueeze", "squeeze", "expand", "as_strided",
              "permute", "t", "_unsafe_view", "split", "chunk", "unbind", "narrow", "alias", "detach", "flatten",
              "view_as", "expand_as", "movedim", "split_with_sizes", "_reshape_alias", "unflatten", "unfold",
              "numpy_T", "diagonal", "broadcast_to", "_unsafe_split")),
    ("scalar", ("item", "_local_scalar_dense", "is_nonzero", "equal", "nonzero", "argmax", "max", "all", "any",
                "min", "eq", "ne", "le", "lt", "ge", "gt", "isin", "unique", "sort", "topk", "cumsum", "sum",
                "amax", "mean", "prod", "allclose")),
]
KIND_NAMES = [k for k, _ in KINDS] + ["elementwise"]
MAP_STAGES = list(STAGES[:-1]) + ["generate"]  # plain's generate: its own work between the forwards, in total only


def kind_of(name: str) -> str:
    op = name.split("::", 1)[-1]
    for kind, names in KINDS:
        if op in names or (kind == "matmul" and op.startswith(("mkldnn", "_mkl"))) \
                or (kind == "attention" and any(n in op for n in names)):  # the SDPA kernels' own names
            return kind
    return "elementwise"


def ticks(clips_dir: str, n_clips: int, warmup: int, n_ticks: int):
    """``(clip, j, tick, sample, timed)`` over the drive-sim open-loop ticks (same clips, seeds and ticks)."""
    first = HISTORY_TICKS
    need_s = (first + warmup + n_ticks + FUTURE_TICKS + 1) * DT
    for c in range(n_clips):
        prefix = write_clip(clips_dir, "test", 30_000 + c, seconds=need_s, seed=0,
                            kind=SCENARIO_KINDS[c % len(SCENARIO_KINDS)])
        clip = load_clip(prefix)
        for j in range(warmup + n_ticks):
            yield c, j, first + j, sample_at(clip, first + j), j >= warmup


def make_pipes(vla, systems):
    return {s: DrivingPipeline(vla, flashdrive=FlashDriveConfig.parse(SIM_SYSTEMS[s])) for s in systems}


def run_pass(vla, systems, args, on_tick):
    """One pass with fresh pipelines; ``on_tick(system, pipe, sample, tick, seed, timed) -> result``."""
    pipes = make_pipes(vla, systems)
    last = None
    for c, j, k, smp, timed in ticks(args.clips_dir, args.clips, args.warmup, args.ticks):
        if c != last:
            for p in pipes.values():
                p.reset()
            last = c
        for s, p in pipes.items():
            on_tick(s, p, smp, k, 1000 * c + k, timed)
    return pipes


def step(pipe, smp, k, seed):
    return pipe.step(smp["frames"]["front"], smp["history"], smp["speed"], num_samples=1, seed=seed, tick=k)


# ------------------------------------------------------------------------------------------------ analysis
def profile_tick(prof) -> dict:
    """One profiled tick -> per stage: wall, top-level ops by name, own op time by kind (us); and the parts of the
    ``tick`` range outside every stage (before the clock: validation; after it: untimed samples, integration)."""
    evs = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CPU]
    ranges = [e for e in evs if e.name.startswith("drive.")]
    tick = next(e for e in evs if e.name == "tick")
    out = {}

    def stage_of(e):
        p = e
        while p is not None:
            if p.name.startswith("drive."):
                return p.name[len("drive."):]
            if p.name == "tick":
                return None
            p = p.cpu_parent
        return None

    for r in ranges:
        st = out.setdefault(r.name[len("drive."):], {"wall": 0.0, "pieces": 0, "ops": {}, "own": dict.fromkeys(
            KIND_NAMES, 0.0), "n_ops": 0})
        st["wall"] += r.time_range.elapsed_us()
        st["pieces"] += 1
    outside = {"wall": tick.time_range.elapsed_us() - sum(r.time_range.elapsed_us() for r in ranges), "ops": {},
               "own": dict.fromkeys(KIND_NAMES, 0.0), "n_ops": 0}
    for e in evs:
        if e.name.startswith("drive.") or e.name == "tick":
            continue
        st = stage_of(e)
        bucket = out[st] if st is not None else outside
        bucket["own"][kind_of(e.name)] += e.self_cpu_time_total
        bucket["n_ops"] += 1
        parent = e.cpu_parent
        if parent is not None and (parent.name.startswith("drive.") or parent.name == "tick"):
            bucket["ops"][e.name] = bucket["ops"].get(e.name, 0.0) + e.time_range.elapsed_us()
    out["(outside the clock)"] = outside
    for st in out.values():
        st["in_ops"] = sum(st["ops"].values())
        st["python"] = st["wall"] - st["in_ops"]
    return out


def middle(totals) -> list:
    lo, hi = np.percentile(totals, 25), np.percentile(totals, 75)
    return [i for i, t in enumerate(totals) if lo <= t <= hi] or list(range(len(totals)))


def summarize_timing(rows) -> dict:
    """rows: per tick ``{"timings_ms": ..., "step_ms": ...}``."""
    keys = list(STAGES) + ["step_ms"]
    vals = {k: [r["timings_ms"][k] if k in STAGES else r[k] for r in rows] for k in keys}
    mid = middle(vals["total"])
    out = {k: {"median": statistics.median(v), "mean": float(np.mean(v)), "middle": float(np.mean([v[i] for i in mid])),
               "p90": float(np.percentile(v, 90))} for k, v in vals.items()}
    stages = [k for k in STAGES if k != "total"]
    out["sum_of_stage_medians"] = sum(out[k]["median"] for k in stages)
    out["median_total_minus_sum_of_stage_medians"] = out["total"]["median"] - out["sum_of_stage_medians"]
    out["middle_outside_stages"] = out["total"]["middle"] - sum(out[k]["middle"] for k in stages)
    out["n"] = len(rows)
    return out


def summarize_profile(ticks_prof, top: int = 12) -> dict:
    """Per stage over the profiled ticks, in ms: median and middle-half mean of wall, ops and Python; top ops by
    name and own time by kind (median and middle-half mean per tick)."""
    totals = [sum(st["wall"] for n, st in t.items() if n != "(outside the clock)") for t in ticks_prof]
    mid = middle(totals)
    names = []
    for t in ticks_prof:
        names += [n for n in t if n not in names]
    out = {"n": len(ticks_prof), "tick_wall_ms": {"median": statistics.median(totals) / 1e3,
                                                  "middle": float(np.mean([totals[i] for i in mid])) / 1e3},
           "stages": {}}

    def stat(vals):
        vals = [v / 1e3 for v in vals]
        return {"median": statistics.median(vals), "middle": float(np.mean([vals[i] for i in mid]))}

    for n in names:
        per = [t.get(n) for t in ticks_prof]
        get = lambda f: [(p[f] if p else 0.0) for p in per]  # noqa: E731
        ops = {}
        for p in per:
            for op in (p["ops"] if p else {}):
                ops.setdefault(op, None)
        op_stats = {op: stat([(p["ops"].get(op, 0.0) if p else 0.0) for p in per]) for op in ops}
        ranked = sorted(op_stats.items(), key=lambda kv: -kv[1]["middle"])
        out["stages"][n] = {
            "wall": stat(get("wall")), "in_ops": stat(get("in_ops")), "python": stat(get("python")),
            "n_ops": statistics.median(get("n_ops")), "pieces": statistics.median([p.get("pieces", 0) if p else 0
                                                                                  for p in per]),
            "top_ops": dict(ranked[:top]),
            "other_ops": stat([sum((p["ops"].get(op, 0.0) if p else 0.0) for op, _ in ranked[top:]) for p in per]),
            "own_by_kind": {k: stat([(p["own"][k] if p else 0.0) for p in per]) for k in KIND_NAMES}}
    return out


def short_func(key) -> str:
    file, line, func = key
    if file == "~":
        return func  # a builtin: "<built-in method ...>" / "<method '...' of ... objects>"
    for mark in ("site-packages/", "/work/main/"):
        if mark in file:
            file = file.split(mark, 1)[1]
    return f"{file}:{line}({func})"


def summarize_python(profs: dict, n_ticks: int, top: int = 15) -> dict:
    """Per stage: own time per tick (ms, under cProfile) of the Python functions and of the builtins (the C calls,
    ops included), the top Python functions by own time."""
    out = {}
    for stage, p in profs.items():
        st = pstats.Stats(p).stats
        py, builtin = {}, 0.0
        for key, (cc, nc, tt, ct, callers) in st.items():
            if key[0] == "~":
                builtin += tt
            else:
                name = short_func(key)
                py[name] = (py.get(name, (0.0, 0))[0] + tt, py.get(name, (0.0, 0))[1] + nc)
        ranked = sorted(py.items(), key=lambda kv: -kv[1][0])
        out[stage] = {"python_ms_per_tick": sum(v[0] for v in py.values()) * 1e3 / n_ticks,
                      "builtin_ms_per_tick": builtin * 1e3 / n_ticks,
                      "top_python": [{"function": k, "ms_per_tick": v[0] * 1e3 / n_ticks, "calls_per_tick": v[1] / n_ticks}
                                     for k, v in ranked[:top]]}
    return out


def stage_map(timing: dict, prof: dict) -> dict:
    """The tick in unprofiled ms: per stage its middle-half time from the timing pass, split into the profile's
    parts (own op time by kind, Python) in the profile's proportions (the profiler adds ~1 us per recorded op, so
    its stage times run high); ``profiler_us_per_op``: (profiled - unprofiled tick) / op events."""
    out, events = {}, 0.0
    for stage in MAP_STAGES:
        p = prof["stages"].get(stage)
        if p is None:
            continue
        events += p["n_ops"]
        wall = p["wall"]["middle"]
        parts = {k: v["middle"] for k, v in p["own_by_kind"].items()}
        parts["python"] = max(0.0, wall - sum(parts.values()))
        ms = timing["middle_outside_stages"] if stage == "generate" else timing[stage]["middle"]
        scale = ms / wall if wall else 0.0
        out[stage] = {"ms": ms, "profiled_ms": wall, "parts_ms": {k: v * scale for k, v in parts.items()}}
    out["total"] = {"ms": timing["total"]["middle"], "profiled_ms": prof["tick_wall_ms"]["middle"]}
    out["profiler_us_per_op"] = (prof["tick_wall_ms"]["middle"] - timing["total"]["middle"]) * 1e3 / max(events, 1)
    out["around_the_clock_ms"] = timing["step_ms"]["middle"] - timing["total"]["middle"]
    return out


# ------------------------------------------------------------------------------------------------ main
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--systems", default="plain,flashdrive")
    ap.add_argument("--clips", type=int, default=6)
    ap.add_argument("--ticks", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--clips-dir", default=os.path.join(tempfile.gettempdir(), "mmspec-drive-sim-clips"))
    ap.add_argument("--passes", default="timing,profile,python")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = args.model or bundled_vla()
    dtype = resolve_dtype(args.dtype, model, "cpu")
    vla = DrivingVLA.from_pretrained(model, dtype=dtype)
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    passes = args.passes.split(",")
    rec = {"command": " ".join([os.path.basename(sys.argv[0])] + (argv if argv is not None else sys.argv[1:])),
           "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "machine": platform.processor() or platform.machine(),
           "cpu_bf16": "avx512_bf16" in open("/proc/cpuinfo").read(), "torch": torch.__version__,
           "cpu_capability": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads(),
           "dtype": str(vla.backbone.dtype), "systems": {}}
    import transformers

    rec["transformers"] = transformers.__version__
    t_start = time.perf_counter()

    if "timing" in passes:
        rows = {s: [] for s in systems}
        extra = {s: [] for s in systems}

        def on_tick(s, p, smp, k, seed, timed):
            t0 = time.perf_counter()
            res = step(p, smp, k, seed)
            wall = (time.perf_counter() - t0) * 1e3
            if timed:
                rows[s].append({"timings_ms": res["timings_ms"], "step_ms": wall})
                extra[s].append({"tokens": res["num_decode_tokens"], "rounds": res.get("spec_rounds"),
                                 "head_calls": res.get("head_calls"), "stream": res.get("stream")})

        pipes = run_pass(vla, systems, args, on_tick)
        for s in systems:
            e = extra[s]
            rec["systems"].setdefault(s, {})["timing"] = summarize_timing(rows[s])
            rec["systems"][s]["per_tick"] = {
                "tokens": float(np.mean([x["tokens"] for x in e])),
                "spec_rounds": float(np.mean([x["rounds"] for x in e])) if e[0]["rounds"] is not None else None,
                "head_calls": float(np.mean([x["head_calls"] for x in e])) if e[0]["head_calls"] is not None else None,
                "stream_reuse": float(np.mean([x["stream"] == "reuse" for x in e])) if e[0]["stream"] else None,
                "engine": pipes[s].engine.describe() if pipes[s].engine is not None else "plain (generate)"}
            rec["systems"][s]["timing_rows"] = [r["timings_ms"] | {"step_ms": r["step_ms"]} for r in rows[s]]
        print(f"timing pass done ({time.perf_counter() - t_start:.0f} s)", file=sys.stderr, flush=True)

    if "profile" in passes:
        from torch.profiler import ProfilerActivity, profile, record_function

        per = {s: [] for s in systems}
        with profile(activities=[ProfilerActivity.CPU]):  # the profiler's own first-use cost, outside the figures
            torch.ones(2) + 1

        def on_tick(s, p, smp, k, seed, timed):
            if not timed:
                step(p, smp, k, seed)
                return
            with profile(activities=[ProfilerActivity.CPU], record_shapes=False) as prof:
                with record_function("tick"):
                    step(p, smp, k, seed)
            per[s].append(profile_tick(prof))

        run_pass(vla, systems, args, on_tick)
        for s in systems:
            rec["systems"][s]["profile"] = summarize_profile(per[s])
        print(f"profile pass done ({time.perf_counter() - t_start:.0f} s)", file=sys.stderr, flush=True)

    if "python" in passes:
        profs = {s: {} for s in systems}
        state = {"system": None}
        orig_to, orig_close = StageClock.to, StageClock.close

        def to(self, stage):
            cur = getattr(self, "_cprof", None)
            if cur is not None:
                cur.disable()
                self._cprof = None
            ended = orig_to(self, stage)
            if stage is not None and state["system"] is not None:
                self._cprof = profs[state["system"]].setdefault(stage, cProfile.Profile())
                self._cprof.enable()
            return ended

        def close(self):
            cur = getattr(self, "_cprof", None)
            if cur is not None:
                cur.disable()
                self._cprof = None
            orig_close(self)

        n_timed = {s: 0 for s in systems}

        def on_tick(s, p, smp, k, seed, timed):
            state["system"] = s if timed else None
            step(p, smp, k, seed)
            n_timed[s] += timed
            state["system"] = None

        StageClock.to, StageClock.close = to, close
        try:
            run_pass(vla, systems, args, on_tick)
        finally:
            StageClock.to, StageClock.close = orig_to, orig_close
        for s in systems:
            rec["systems"][s]["python"] = summarize_python(profs[s], n_timed[s])
        print(f"python pass done ({time.perf_counter() - t_start:.0f} s)", file=sys.stderr, flush=True)

    for r in rec["systems"].values():
        if "timing" in r and "profile" in r:
            r["map"] = stage_map(r["timing"], r["profile"])
    rec["seconds"] = time.perf_counter() - t_start
    report(rec)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rec, f, indent=1, default=float)
    return 0


def report(rec) -> None:
    for s, r in rec["systems"].items():
        print(f"\n=== {s}: {r.get('per_tick', {}).get('engine', '')}")
        if "timing" in r:
            t = r["timing"]
            print("timing pass (no profiler), ms:  " + "  ".join(
                f"{k} {t[k]['median']:.2f}/{t[k]['middle']:.2f}" for k in list(STAGES) + ["step_ms"])
                  + f"   (median/middle; n={t['n']})")
            print(f"  median total - sum of stage medians: {t['median_total_minus_sum_of_stage_medians']:.2f}; "
                  f"middle outside stages: {t['middle_outside_stages']:.2f}; per tick: {r['per_tick']}")
        if "map" in r:
            m = r["map"]
            print(f"map (unprofiled middle-half ms; profiler ~{m['profiler_us_per_op']:.2f} us per op event; "
                  f"{m['around_the_clock_ms']:.2f} ms around the clock):")
            for stage in MAP_STAGES:
                if stage in m:
                    print(f"  {stage:10s} {m[stage]['ms']:6.2f}  = " + ", ".join(
                        f"{k} {v:.2f}" for k, v in m[stage]["parts_ms"].items() if v >= 0.005))
            print(f"  total      {m['total']['ms']:6.2f}")
        if "profile" in r:
            p = r["profile"]
            print(f"profile pass: tick wall (the clock's stages) {p['tick_wall_ms']['median']:.2f} median, "
                  f"{p['tick_wall_ms']['middle']:.2f} middle")
            for n, st in p["stages"].items():
                print(f"  [{n}] wall {st['wall']['middle']:.2f}  in ops {st['in_ops']['middle']:.2f}  python "
                      f"{st['python']['middle']:.2f}  (middle; median wall {st['wall']['median']:.2f}; {st['n_ops']:.0f} "
                      f"op events, {st['pieces']:.0f} pieces)")
                print("     own op time by kind: " + ", ".join(f"{k} {v['middle']:.2f}"
                                                              for k, v in st["own_by_kind"].items()))
                print("     top ops: " + ", ".join(f"{op.replace('aten::', '')} {v['middle']:.2f}"
                                                   for op, v in st["top_ops"].items()))
        if "python" in r:
            for n, st in r["python"].items():
                print(f"  cProfile [{n}] python {st['python_ms_per_tick']:.2f} builtins {st['builtin_ms_per_tick']:.2f}"
                      " ms/tick; top: " + "; ".join(f"{x['function']} {x['ms_per_tick']:.2f}"
                                                     for x in st["top_python"][:8]))


if __name__ == "__main__":
    sys.exit(main())
