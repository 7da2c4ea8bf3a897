"""A 10 Hz closed loop: the bundled driving VLA drives the simulated world, plain decoding vs FlashDrive.

Each system loads the bundled VLA (``drivers/assets/driving-vla``) through ``DrivingPipeline.from_pretrained``:
``plain`` (``generate``) and ``flashdrive`` (``flashdrive=True``: vision cache, streaming KV reuse across ticks,
the few-step action expert, the system level and speculative reasoning with the bundled drafter). Both drive the
same test scenarios of the driving world (``mmspec.drivers.world``): the expert drives the first 2 s (the
model's ego history), then the model plans every tick (10 Hz) from the last four front-camera frames and the
ego executes the plan (``mmspec.drivers.pipeline.model_policy`` inside ``simulate``). Every tick prints the
per-stage latency from ``DrivingPipeline.step``'s ``timings_ms`` (preprocess, encode, prefill, decode, action,
total) and whether the tick met the budget; at the end one summary line per system (median and p90 tick, ticks
over budget, incidents). ``mmspec drive-sim`` is the full benchmark of the same loop (open-loop clip replay too,
minADE, every mechanism alone); this script shows the loop a user writes around the pipeline.

FlashDrive's streaming and few-step expert are approximations (its description says "lossy"): the two systems
drive apart after the first ticks, so they are compared by latency and incidents, not tick for tick.
The world waits for the planner (simulated time), so an over-budget tick is counted, not punished: on a car
that plan would arrive late.

Run:  python examples/drive_latency_loop.py [--ticks 30] [--scenarios 2] [--budget-ms 100] [--every 1]
      [--dtype auto] [--threads N]
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from mmspec.drivers import DrivingPipeline
from mmspec.drivers.bundled import bundled_vla
from mmspec.drivers.pipeline import STAGES, model_policy
from mmspec.drivers.world import DT, INCIDENTS, SCENARIO_KINDS, safety_events, scenario_for, simulate
from mmspec.workloads import get_workload

HANDOVER_TICK = 20  # the expert drives the first 2 s: the model needs a 1.6 s ego history to plan from
SYSTEMS = {"plain": None, "flashdrive": True}  # DrivingPipeline's flashdrive= argument per system
SHORT = {"preprocess": "pre", "encode": "enc", "prefill": "fill", "decode": "dec", "action": "act"}


def _tick_line(system: str, kind: str, k: int, res: dict, budget_ms: float) -> str:
    t = res["timings_ms"]
    stages = " ".join(f"{SHORT[s]} {t[s]:6.1f}" for s in STAGES if s != "total")
    line = (f"{system:10s} {kind:10s} t={k:3d}  {stages} | total {t['total']:6.1f} ms "
            f"{'ok  ' if t['total'] <= budget_ms else 'OVER'}")
    if "stream" in res:  # FlashDrive: did the tick reuse the stream, or why it prefilled in full
        line += f"  [{res['stream']}"
        if "spec_rounds" in res:  # speculative reasoning: verify passes after the prefill
            line += f", {res['spec_rounds']} verify pass{'es' if res['spec_rounds'] != 1 else ''}"
        line += "]"
    return line


def main(ticks: int = 30, scenarios: int = 2, budget_ms: float = 100.0, every: int = 1, dtype: str = "auto",
         seed: int = 0) -> dict:
    """Drive ``scenarios`` test scenarios for ``ticks`` planned ticks each with every system of :data:`SYSTEMS`;
    print a line every ``every`` ticks and a summary; return the per-tick records and the summary figures."""
    if ticks < 1 or scenarios < 1 or every < 1 or not budget_ms > 0:
        raise ValueError("ticks, scenarios and every must be >= 1, budget_ms > 0")
    model = bundled_vla()
    if model is None:
        raise SystemExit("no bundled driving VLA in this install (drivers/assets/driving-vla)")
    pipes = {name: DrivingPipeline.from_pretrained(model, dtype=dtype, flashdrive=fd) for name, fd in SYSTEMS.items()}
    print(f"model {model} ({pipes['plain'].vla.backbone.dtype}); budget {budget_ms:g} ms per tick "
          f"({1e3 / budget_ms:.0f} Hz)")
    for name, pipe in pipes.items():
        print(f"  {name}: {pipe.engine.describe() if pipe.engine is not None else 'generate, no reuse'}")

    # One untimed step each: the first call pays one-off costs (kernel selection, lazy buffers) no tick should.
    ex = get_workload("driving").example("test", 0)
    for pipe in pipes.values():
        pipe.step(ex.images, ex.meta["history"], ex.meta["speed"])
        pipe.reset()

    seconds = (HANDOVER_TICK + ticks) * DT  # simulate plans on ticks HANDOVER_TICK .. HANDOVER_TICK + ticks - 1
    out = {name: {"ticks": [], "events": dict.fromkeys(INCIDENTS, 0)} for name in pipes}
    names = list(pipes)
    for i in range(scenarios):
        kind = SCENARIO_KINDS[i % len(SCENARIO_KINDS)]
        scn = scenario_for("test", 10_000 + i, seed, kind)  # the scenarios `mmspec drive-sim --closed-loop` drives
        for name in names[i % len(names):] + names[:i % len(names)]:  # alternate who drives first (machine noise)
            def on_plan(k, res, name=name):
                rec = {"scenario": i, "kind": kind, "tick": k, "timings_ms": dict(res["timings_ms"]),
                       "within_budget": res["timings_ms"]["total"] <= budget_ms, "actions": res["actions"],
                       "trajectory": res["trajectory"], "reasoning": res["reasoning"], "stream": res.get("stream")}
                out[name]["ticks"].append(rec)
                if (k - HANDOVER_TICK) % every == 0:
                    print(_tick_line(name, kind, k, res, budget_ms))

            # model_policy resets the pipeline (a new drive) and calls pipe.step(frames, history, speed, tick=k)
            # every replan_every ticks: 1 is a real stack's 10 Hz.
            sim = simulate(scn, seconds, model_policy(pipes[name], handover_tick=HANDOVER_TICK, replan_every=1,
                                                      seed=seed, on_plan=on_plan))
            ev = safety_events(sim, HANDOVER_TICK)
            for k in INCIDENTS:
                out[name]["events"][k] += int(ev[k])

    print()
    for name, d in out.items():
        totals = np.array([r["timings_ms"]["total"] for r in d["ticks"]])
        d.update(n_ticks=len(totals), median_ms=float(np.median(totals)), p90_ms=float(np.percentile(totals, 90)),
                 over_budget=int((totals > budget_ms).sum()),
                 stage_median_ms={s: float(np.median([r["timings_ms"][s] for r in d["ticks"]])) for s in STAGES})
        stages = " ".join(f"{SHORT[s]} {d['stage_median_ms'][s]:.1f}" for s in STAGES if s != "total")
        incidents = " / ".join(f"{d['events'][k]}" for k in INCIDENTS)
        print(f"{name:10s} {d['n_ticks']} ticks: median {d['median_ms']:.1f} ms, p90 {d['p90_ms']:.1f} ms "
              f"({1e3 / d['median_ms']:.1f} Hz), over budget {d['over_budget']}/{d['n_ticks']}; "
              f"median stages {stages}; collision / off-road / red light {incidents} of {scenarios}")
    speedup = out["plain"]["median_ms"] / out["flashdrive"]["median_ms"]
    print(f"flashdrive median tick {speedup:.2f}x faster than plain")
    return {"model": model, "budget_ms": budget_ms, "dtype": str(pipes["plain"].vla.backbone.dtype),
            "systems": out, "speedup_median": speedup}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ticks", type=int, default=30, help="planned ticks per drive, after the 2 s hand-over")
    ap.add_argument("--scenarios", type=int, default=2, help="test scenarios to drive (scenario kinds in turn)")
    ap.add_argument("--budget-ms", type=float, default=100.0, help="latency budget per tick (100 ms: 10 Hz)")
    ap.add_argument("--every", type=int, default=1, help="print every N-th tick (1: all)")
    ap.add_argument("--dtype", default="auto",
                    help="auto (the checkpoint's bf16 where the CPU computes in it, else float32), float32, bfloat16")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    main(a.ticks, a.scenarios, a.budget_ms, a.every, a.dtype, a.seed)
