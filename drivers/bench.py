"""``mmspec bench --workload driving``: the plain driving pipeline's latency per stage and its quality.

One record per system, batch 1 (a car plans one tick at a time): ``ar``, the plain pipeline, and FlashDrive's
systems (``flashdrive``, or any ``mmspec drive-sim`` system name; default ``ar,flashdrive``). After one untimed
warm-up step per system, every item of the split goes through each system's
:meth:`~mmspec.drivers.pipeline.DrivingPipeline.step` (one trajectory sample, as a car drives), the systems in an
order rotated per item; items are independent ticks, so a streaming system starts each one fresh (``reset``):
what reuse across the ticks of a clip buys is ``mmspec drive-sim``'s to measure. ``latency_ms`` holds the mean of
each stage (encode, prefill, decode, action, total) with ``p50`` / ``p90`` of total, ``quality`` the offline
figures of :func:`~mmspec.drivers.train_vla.summarize_scores` on the same steps (reasoning exact, hazard
accuracy, distance error, minADE of the sample against the constant-velocity ADE).

Example:
    >>> from mmspec.bench import BenchConfig                                           # doctest: +SKIP
    >>> examples = get_workload("driving").examples("test", 8)                        # doctest: +SKIP
    >>> bench_driving("drivers/assets/driving-vla", examples, BenchConfig())          # doctest: +SKIP
"""

from __future__ import annotations

import sys

import numpy as np
import torch

from mmspec.bench import plain_record
from mmspec.checkpoints import dtype_note, resolve_dtype

from .pipeline import STAGES, DrivingPipeline
from .scoring import score_step, summarize_scores
from .vla import DrivingVLA
from .workload import DrivingWorkload

__all__ = ["bench_driving", "DrivingBenchWorkload"]


DEFAULT_BENCH_SYSTEMS = ("ar", "flashdrive")


def bench_systems(names) -> list[str]:
    """The driving bench's systems (``ar`` first); raises :class:`~mmspec.InvalidInputError` on an unknown one.

    Example:
        >>> bench_systems(None), bench_systems(["flashdrive-stepcache"])
        (['ar', 'flashdrive'], ['ar', 'flashdrive-stepcache'])
    """
    from mmspec.errors import InvalidInputError

    names = list(names or DEFAULT_BENCH_SYSTEMS)
    known = ["ar"] + [s for s in SIM_SYSTEMS if s != "plain"]
    bad = [s for s in names if s not in known]
    if bad:
        raise InvalidInputError(f"unknown driving system(s) {bad}; the driving bench knows {', '.join(known)}")
    return ["ar"] + [s for s in dict.fromkeys(names) if s != "ar"]


class DrivingBenchWorkload(DrivingWorkload):
    """The ``driving`` workload as ``mmspec bench`` measures it: :class:`~mmspec.drivers.workload.DrivingWorkload`'s
    items, measured through the driving pipeline (``ar`` and FlashDrive's systems, :func:`bench_driving`). The
    package registers this class, so the workload module itself imports no bench."""

    plain_pipeline = True
    plain_systems = True

    def check_plain_systems(self, systems) -> None:
        bench_systems(systems)

    def bench_plain(self, model, examples, cfg, progress=True):
        return bench_driving(model or self.bundled_model(), examples, cfg, progress)


def bench_driving(model: str, examples: list, cfg, progress: bool = True) -> list[dict]:
    """Measure the driving systems of ``cfg.systems`` (:func:`bench_systems`) for the VLA at ``model`` on
    ``examples``; one record per system."""
    from tqdm.auto import tqdm

    from .bundled import bundled_student

    systems = bench_systems(cfg.systems)  # checked before the model loads
    device = cfg.resolved_device()
    vla = DrivingVLA.from_pretrained(model, dtype=resolve_dtype(cfg.dtype, model, device))
    vla.to(device)
    student = bundled_student(model)
    pipes = {}
    for s in systems:
        spec = None if s == "ar" else SIM_SYSTEMS[s]
        if isinstance(spec, dict) and spec.get("expert") == FEWSTEP:
            if not student:
                continue  # no distilled student ships with this VLA: the few-step systems have nothing to run
            spec = {**spec, "expert": student}
        pipes[s] = DrivingPipeline(vla, flashdrive=spec)
    first = examples[0]
    for pipe in pipes.values():  # warm-up, untimed
        pipe.reset()
        pipe.step(first.images, first.meta["history"], first.meta["speed"], seed=cfg.seed)
    stages = {s: {k: [] for k in STAGES} for s in pipes}
    scores = {s: [] for s in pipes}
    tokens = dict.fromkeys(pipes, 0)
    rounds = dict.fromkeys(pipes, 0)  # target passes after the prefill, where the system decodes speculatively
    spec_tokens = dict.fromkeys(pipes, 0)
    texts = {s: [] for s in pipes}
    order = list(pipes)
    for i, ex in enumerate(tqdm(examples, desc="driving", file=sys.stderr, disable=not progress, leave=False)):
        for s in order[i % len(order):] + order[:i % len(order)]:
            pipes[s].reset()  # an item is a tick of its own, not the next tick of the last item's clip
            res = pipes[s].step(ex.images, ex.meta["history"], ex.meta["speed"], seed=cfg.seed + i)
            for k in STAGES:
                stages[s][k].append(res["timings_ms"][k])
            tokens[s] += res["num_decode_tokens"]
            if "spec_rounds" in res:
                rounds[s] += res["spec_rounds"]
                spec_tokens[s] += res["num_decode_tokens"] - 1
            scores[s].append(score_step(res, ex))
            texts[s].append(res["reasoning"])
    dnote = dtype_note(cfg.dtype, model, device) or "run in its stored dtype"
    out = []
    for s in pipes:
        note = ("DrivingPipeline.step, batch 1 (one car, one tick); quality on the same steps, one trajectory "
                "sample each; " + ("plain generate" if s == "ar" else f"FlashDrive {s}, each item a fresh tick")
                + "; " + dnote)
        rec = plain_record("driving", 1, len(examples), [t / 1e3 for t in stages[s]["total"]], tokens[s],
                           stages[s], summarize_scores(scores[s]), note, dtype=vla.backbone.dtype)
        same = [a == b for a, b in zip(texts[s], texts["ar"])]
        # the reasoning is exact (speculative decoding is lossless) but a trajectory from a cached or few-step
        # expert is not the plain expert's: these systems are compared by their quality figures, not token for token
        rec.update(system=s, spec=s, kind="ar" if s == "ar" else "flashdrive", identical_rate=sum(same) / len(same),
                   identical_to_ar=all(same), lossless=s == "ar")
        out.append(rec)
    ar_total = sum(stages["ar"]["total"])
    for rec in out:  # the pooled ratio, as for text systems: sum of AR times over the system's, same items
        s = rec["system"]
        mine = sum(stages[s]["total"])
        rec["speedup_vs_ar"] = ar_total / mine if mine else None
        # its robust companion, as for text systems: the median of the per-item ratios (plain_record says 1)
        rec["speedup_median"] = float(np.median([a / b for a, b in zip(stages["ar"]["total"], stages[s]["total"])
                                                 if b > 0])) if s != "ar" else 1.0
        if rounds[s]:
            # speculative reasoning: tokens committed per target pass after the prefill, and passes per token
            # (plain greedy makes one per token: the prefill's, then one for each further token)
            rec["tau"] = spec_tokens[s] / rounds[s]
            rec["target_forwards"] = rounds[s] + len(examples)
            rec["forwards_per_token"] = rec["target_forwards"] / tokens[s] if tokens[s] else None
    return out


# ---------------------------------------------------------------------------- mmspec drive-sim
FEWSTEP = "<--expert>"  # stands for the distilled expert: drive-sim's expert= folder, else the one the VLA ships
SIM_SYSTEMS = {"plain": None, "engine": {"vision_cache": False, "stream": False, "step_cache": None, "system": False,
                                        "spec": False, "lean_expert": False, "lean_lm": False, "lean_vision": False},
               "vision_cache": "vision_cache", "stream": "stream", "stream-shift": "stream-shift",
               "stream-refresh2": {"step_cache": None, "system": False, "refresh_every": 2, "spec": False,
                                   "lean_expert": False, "lean_lm": False, "lean_vision": False},
               "step_cache": "step_cache", "step_cache_fixed": "step_cache_fixed", "system": "system", "spec": "spec",
               "flashdrive": True, "flashdrive-stepcache": {"expert": None, "frame_mask": False},
               "flashdrive-refresh2": {"refresh_every": 2}, "flashdrive-framemask": {"frame_mask": True},
               "flashdrive-fullmask": {"frame_mask": False},
               "flashdrive-noreuse": {"reuse_reasoning": False}, "lean_expert": "lean_expert",
               "flashdrive-nolean": {"lean_expert": False}, "lean_lm": "lean_lm",
               "flashdrive-noleanlm": {"lean_lm": False}, "lean_vision": "lean_vision",
               "flashdrive-noleanvision": {"lean_vision": False}, "flashdrive-patchmatmul": {"patch_matmul": True},
               "fewstep": {"vision_cache": False, "stream": False, "step_cache": None, "system": True, "spec": False,
                           "expert": FEWSTEP, "lean_expert": False, "lean_lm": False, "lean_vision": False},
               "flashdrive-fewstep": {"step_cache": None, "expert": FEWSTEP}}
"""The systems ``mmspec drive-sim`` knows: ``plain`` (``generate``), ``engine`` (FlashDrive's tick runner with every
mechanism off: a control for the mechanisms measured alone), each mechanism alone (``spec``: speculative reasoning,
which needs a drafter for the VLA; ``fewstep``: the few-step expert, with the system level it runs in), and
``flashdrive`` (all; speculative reasoning when a drafter fits, the few-step expert when the VLA ships one, else the
step cache; ``flashdrive-stepcache`` as FlashDrive was before the few-step expert and the frame mask: the VLA's own expert,
the step cache, the full mask; ``flashdrive-framemask`` /
``flashdrive-fullmask`` with frames prefilled under the streaming mask / the full causal mask (``flashdrive``: the
streaming mask when the VLA was fine-tuned with it); ``flashdrive-noreuse`` without
drafting the last tick's reasoning first; ``lean_expert`` the action expert's head calls without the transformers call
stack (exact; alone, over the VLA's own 10-step expert), ``flashdrive-nolean`` FlashDrive without it; ``lean_lm``
the language model's passes without it (exact; alone, in the engine's own loop), ``flashdrive-noleanlm`` FlashDrive
without that; ``lean_vision`` the vision tower's encodes without it (exact; alone), ``flashdrive-noleanvision``
FlashDrive without that, ``flashdrive-patchmatmul`` FlashDrive with the patch embedding as one matmul (approximate);
``flashdrive-fewstep`` with the few-step expert in place of the step
cache). The few-step systems take ``--expert DIR`` (a :mod:`mmspec.drivers.distill` student of the VLA's expert)
or, without it, the student the VLA folder ships (``fewstep/``)."""


def stage_record(system: str, stages: dict, quality: dict, note: str, dtype, exact: bool, budget_ms: float,
                 tokens: int) -> dict:
    """A drive-sim record in the bench's schema: :func:`mmspec.bench.plain_record`'s fields, with ``system``,
    ``latency_ms`` holding per-stage *medians* (``total`` its median, ``p50`` / ``p90`` of total), ``hz`` (1000 /
    median total), ``realtime`` (p90 within ``budget_ms``), ``budget_ms`` and ``exact``.

    Example:
        >>> r = stage_record("plain", {"total": [90.0, 110.0, 100.0]}, {}, "", None, True, 100.0, 3)
        >>> r["system"], r["latency_ms"]["total"], r["hz"], r["realtime"]
        ('plain', 100.0, 10.0, False)
    """
    import statistics

    totals = stages.get("total") or []
    rec = plain_record("driving", 1, len(totals), [t / 1e3 for t in totals], tokens, {}, quality, note, dtype=dtype)
    lat = {k: float(statistics.median(v)) for k, v in stages.items() if v}
    if totals:
        qs = torch.tensor(totals, dtype=torch.float64)
        lat["p50"], lat["p90"] = float(qs.quantile(0.5)), float(qs.quantile(0.9))
    med = lat.get("total")
    rec.update(system=system, spec=system, kind="plain" if system == "plain" else "flashdrive", latency_ms=lat,
               hz=(1e3 / med) if med else None, budget_ms=float(budget_ms),
               realtime=bool(totals) and lat["p90"] <= budget_ms, exact=bool(exact), lossless=bool(exact))
    return rec


def _ade(a, b) -> float:
    return float(np.linalg.norm(np.asarray(a) - np.asarray(b), axis=-1).mean())


def drive_sim(model: str, systems=("plain", "flashdrive"), clips: int = 2, ticks: int = 8, warmup: int = 3,
              closed: int = 2, seconds: float = 6.0, budget_ms: float = 100.0, samples: int = 6, seed: int = 0,
              dtype="float32", clips_dir: str | None = None, progress: bool = True, drafter=None,
              closed_start: int = 0, expert: str | None = None) -> list[dict]:
    """``mmspec drive-sim``: the driving-simulation latency loop, one record per system.

    **Open loop**: ``clips`` clips (the expert's drives of test scenarios, all kinds in turn) are written as video
    files (PyAV) and read back with decord; every system replays each clip tick by tick (``ticks`` timed ticks after
    ``warmup`` untimed ones, in order, streaming state reset between clips), the systems interleaved tick by tick
    with the same flow-matching noise (paired). Each tick scores minADE (the first sample, and the best of
    ``samples``) against the expert's future, and, against plain on the same tick, whether the reasoning is identical,
    the largest first-token logit difference and the trajectory's ADE to plain's (``vs_plain``).
    **Closed loop**: each system drives ``closed`` scenarios for ``seconds`` (the expert hands over at 2 s), planning
    every tick (10 Hz); collision, off-road and red-light rates (scenarios ``closed_start`` to ``closed_start + closed
    - 1``: a long study runs in chunks whose counts add up). Latency (per stage: median; ``p50`` / ``p90``) pools
    the timed open-loop ticks and every closed-loop plan; with ``plain`` in the run each record also has
    ``stage_ratio_vs_plain`` (plain's median over this system's, per stage). Systems with speculative reasoning
    (``drafter``: its ``make_drafter`` spec or folder; default the bundled one) report under ``speculation`` the mean
    accepted length ``tau`` (tokens committed per target pass after the prefill, the bonus token counted) and
    ``target_forwards`` against plain greedy's on the same ticks. ``expert``: the distilled few-step expert's folder
    the ``fewstep`` systems use.

    Example:
        >>> recs = drive_sim("drivers/assets/driving-vla", ("plain", "flashdrive"), clips=1, ticks=2)  # doctest: +SKIP
        >>> [r["system"] for r in recs]                                                            # doctest: +SKIP
        ['plain', 'flashdrive']
    """
    import os
    import tempfile

    from tqdm.auto import tqdm

    from mmspec.errors import InvalidInputError

    from .clips import FUTURE_TICKS, HISTORY_TICKS, load_clip, sample_at, write_clip
    from .bundled import bundled_student
    from .flashdrive import FlashDriveConfig
    from .pipeline import model_policy
    from .world import DT, INCIDENTS, SCENARIO_KINDS, safety_events, scenario_for, simulate

    unknown = [s for s in systems if s not in SIM_SYSTEMS]
    if unknown or not systems:
        raise InvalidInputError(f"unknown systems {unknown}; drive-sim knows {list(SIM_SYSTEMS)}")
    if min(clips, closed, closed_start) < 0 or ticks < 1 or warmup < 0 or samples < 1 or (clips == 0 and closed == 0) \
            or not budget_ms > 0:
        raise InvalidInputError("drive-sim needs clips >= 0, closed >= 0 (not both 0), ticks >= 1, warmup >= 0, "
                                "samples >= 1, closed-loop-start >= 0, budget-ms > 0")
    fewstep = [s for s in systems if isinstance(SIM_SYSTEMS[s], dict) and SIM_SYSTEMS[s].get("expert") == FEWSTEP]
    if fewstep and not expert and bundled_student(model) is None:
        raise InvalidInputError(f"{', '.join(fewstep)} need a distilled few-step expert: --expert DIR "
                                f"(python -m mmspec.drivers.distill writes one; {model} ships none)")
    if closed and seconds <= 2.0 + DT:
        raise InvalidInputError(f"a closed-loop drive of {seconds} s ends before the hand-over at 2 s")
    vla = DrivingVLA.from_pretrained(model, dtype=resolve_dtype(dtype, model, "cpu"))
    import dataclasses

    configs = {s: FlashDriveConfig.parse({**SIM_SYSTEMS[s], "expert": expert or "bundled"} if s in fewstep
                                         else SIM_SYSTEMS[s])
               for s in systems}
    if drafter is not None:
        configs = {s: c if c is None or not c.spec else dataclasses.replace(c, drafter=drafter)
                   for s, c in configs.items()}
    pipes = {s: DrivingPipeline(vla, flashdrive=configs[s]) for s in systems}
    stages = {s: {k: [] for k in STAGES} for s in systems}
    per = {s: {"ade_1": [], "ade_k": [], "same_text": [], "logit_diff": [], "ade_vs_plain": [], "tokens": 0,
               "head_calls": [], "stream_reuse": 0, "ticks": 0, "rounds": 0, "spec_tokens": 0} for s in systems}
    first = HISTORY_TICKS
    need_s = (first + warmup + ticks + FUTURE_TICKS + 1) * DT
    clips_dir = clips_dir or os.path.join(tempfile.gettempdir(), "mmspec-drive-sim-clips")
    total_steps = clips * (warmup + ticks) + closed * int(round((seconds - 2.0) / DT))
    bar = tqdm(total=total_steps * len(systems), desc="drive-sim", file=sys.stderr, disable=not progress)

    def record(s, res, timed):
        per[s]["ticks"] += 1
        per[s]["stream_reuse"] += res.get("stream") == "reuse"
        if timed:
            for k in STAGES:
                stages[s][k].append(res["timings_ms"][k])
            per[s]["tokens"] += res["num_decode_tokens"]
            if "spec_rounds" in res:
                per[s]["rounds"] += res["spec_rounds"]
                per[s]["spec_tokens"] += res["num_decode_tokens"] - 1
            if "head_calls" in res:
                per[s]["head_calls"].append(res["head_calls"])

    for c in range(clips):
        prefix = write_clip(clips_dir, "test", 30_000 + c, seconds=need_s, seed=seed,
                            kind=SCENARIO_KINDS[c % len(SCENARIO_KINDS)])
        clip = load_clip(prefix)
        for p in pipes.values():
            p.reset()
        for j in range(warmup + ticks):
            k = first + j
            smp = sample_at(clip, k)
            outs = {}
            for s, p in pipes.items():
                res = p.step(smp["frames"]["front"], smp["history"], smp["speed"], num_samples=samples,
                             seed=seed + 1000 * c + k, tick=k)
                outs[s] = res
                record(s, res, j >= warmup)
                if j >= warmup:
                    per[s]["ade_1"].append(_ade(res["trajectories"][0], smp["future"]))
                    per[s]["ade_k"].append(min(_ade(t, smp["future"]) for t in res["trajectories"]))
                bar.update(1)
            ref = outs.get("plain")
            if ref is not None and j >= warmup:
                for s, res in outs.items():
                    per[s]["same_text"].append(res["reasoning"] == ref["reasoning"])
                    per[s]["logit_diff"].append(float((res["first_logits"] - ref["first_logits"]).abs().max()))
                    per[s]["ade_vs_plain"].append(_ade(res["trajectory"], ref["trajectory"]))
    events = {s: {k: 0 for k in INCIDENTS} for s in systems}
    for i in range(closed_start, closed_start + closed):
        scn = scenario_for("test", 10_000 + i, seed, SCENARIO_KINDS[i % len(SCENARIO_KINDS)])
        for s, p in pipes.items():
            def on_plan(k, res, s=s):
                record(s, res, True)
                bar.update(1)

            sim = simulate(scn, seconds, model_policy(p, handover_tick=20, replan_every=1, seed=seed, on_plan=on_plan))
            ev = safety_events(sim, 20)
            for k in INCIDENTS:
                events[s][k] += int(ev[k])
    bar.close()
    records = []
    for s in systems:
        d = per[s]
        quality = {"min_ade": float(np.mean(d["ade_1"])) if d["ade_1"] else None,
                   "min_ade_6" if samples == 6 else f"min_ade_{samples}":
                       float(np.mean(d["ade_k"])) if d["ade_k"] else None,
                   **{f"{k}_rate": (events[s][k] / closed if closed else None) for k in INCIDENTS},
                   **{f"{k}_count": events[s][k] for k in INCIDENTS},
                   "n_scenarios": closed, "first_scenario": closed_start, "n_clips": clips, "n_open_loop_ticks": len(d["ade_1"])}
        if d["same_text"]:
            quality["vs_plain"] = {"reasoning_identical_rate": float(np.mean(d["same_text"])),
                                   "max_first_logit_diff": float(np.max(d["logit_diff"])),
                                   "mean_trajectory_ade_m": float(np.mean(d["ade_vs_plain"]))}
        if d["head_calls"]:
            quality["mean_head_calls"] = float(np.mean(d["head_calls"]))
        if configs[s] is not None and configs[s].stream:
            quality["stream_reuse_rate"] = d["stream_reuse"] / max(1, d["ticks"])
        cfg = configs[s]
        note = ("plain DrivingPipeline (generate)" if cfg is None else
                f"FlashDrive engine: {pipes[s].engine.describe() or 'no mechanism (control)'}")
        note += (f"; batch 1, {samples} trajectory samples per tick (one timed); {warmup} warm-up ticks per clip "
                 "untimed; closed loop plans every tick (10 Hz)")
        engine = pipes[s].engine
        rec = stage_record(s, stages[s], quality, note, vla.backbone.dtype,
                           cfg is None or (engine.exact if engine is not None else cfg.exact), budget_ms, d["tokens"])
        if engine is not None and engine.drafter is not None:
            rec["exact_note"] = engine.SPEC_EXACT_NOTE
        n_timed = len(stages[s]["total"])
        if pipes[s].engine is not None and pipes[s].engine.drafter is not None and n_timed:
            # plain greedy makes one pass per token after the first (the prefill's); speculation one per round
            rec["speculation"] = {"tau": d["spec_tokens"] / d["rounds"] if d["rounds"] else None,
                           "target_forwards": d["rounds"] + n_timed,
                           "target_forwards_plain": d["spec_tokens"] + n_timed,
                           "drafter": pipes[s].engine.spec_note}
        records.append(rec)
    base = next((r for r in records if r["system"] == "plain"), None)
    if base is not None:
        for r in records:
            r["stage_ratio_vs_plain"] = {k: base["latency_ms"][k] / v for k, v in r["latency_ms"].items()
                                         if k in STAGES and v and base["latency_ms"].get(k)}
    return records


def _sim_arguments(p) -> None:
    p.add_argument("--model", default=None, help="driving VLA folder (default: the bundled one)")
    p.add_argument("--systems", default="plain,flashdrive",
                   help=f"comma list of {', '.join(SIM_SYSTEMS)}, or 'all' (default: plain,flashdrive)")
    p.add_argument("--clips", type=int, default=2, help="open-loop clips (default 2)")
    p.add_argument("--ticks", type=int, default=8, help="timed ticks per clip, after the warm-up (default 8)")
    p.add_argument("--warmup", type=int, default=3, help="untimed warm-up ticks per clip (default 3)")
    p.add_argument("--closed-loop", type=int, default=2, dest="closed", help="closed-loop scenarios (default 2)")
    p.add_argument("--closed-loop-start", type=int, default=0, dest="closed_start",
                   help="index of the first closed-loop scenario (default 0; chunks of a long study)")
    p.add_argument("--seconds", type=float, default=6.0, help="closed-loop drive length in s (default 6)")
    p.add_argument("--budget-ms", type=float, default=100.0, help="real-time budget per tick (default 100: 10 Hz)")
    p.add_argument("--samples", type=int, default=6, help="trajectory samples per tick for minADE (default 6)")
    p.add_argument("--dtype", default="auto",
                   help="auto (default: the checkpoint's stored dtype where the CPU computes in it natively, else "
                        "float32), bfloat16 or float32")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--clips-dir", default=None, help="where clip videos are written and reused")
    p.add_argument("--json", default=None, help='write {"results": [...]} here')
    p.add_argument("--step-study", type=int, default=0, metavar="N",
                   help="also compare the flow head's step cache with uniformly fewer steps on N items")
    p.add_argument("--drafter", default=None,
                   help="reasoning drafter for the systems with speculative reasoning (glance:DIR or DIR; default: "
                        "the bundled one)")
    p.add_argument("--expert", default=None,
                   help="a distilled few-step action expert (python -m mmspec.drivers.distill) for the fewstep systems "
                        "and the step study (default: the one the VLA folder ships in fewstep/, if any)")
    p.add_argument("--no-progress", action="store_true")


def _fmt(v, spec=".1f"):
    return "-" if v is None else format(v, spec)


def _sim_run(args) -> int:
    import json

    from mmspec.errors import InvalidInputError

    from .bundled import bundled_student, bundled_vla
    from .vla import student_info

    if not args.budget_ms > 0 or not args.seconds > 0:
        raise InvalidInputError(f"--budget-ms and --seconds must be positive (got {args.budget_ms}, {args.seconds})")
    from mmspec.checkpoints import resolve_dtype as _check_dtype

    _check_dtype(args.dtype)  # a bad name fails before the model loads
    if args.threads:
        torch.set_num_threads(args.threads)
    model = args.model or bundled_vla()
    if model is None:
        raise InvalidInputError("no driving VLA bundled with this install: pass --model PATH")
    student = args.expert or bundled_student(model)
    if student and not args.expert:
        try:
            student_info(student, model)
        except InvalidInputError:  # a stale fewstep/ (the VLA was saved over): "all" leaves the few-step systems out
            student = None
    if args.systems == "all":  # the few-step systems need a student: in "all" only when there is one
        systems = [s for s in SIM_SYSTEMS if student or not (isinstance(SIM_SYSTEMS[s], dict)
                                                             and SIM_SYSTEMS[s].get("expert") == FEWSTEP)]
    else:
        systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    recs = drive_sim(model, systems, args.clips, args.ticks, args.warmup, args.closed, args.seconds, args.budget_ms,
                     args.samples, args.seed, args.dtype, args.clips_dir, progress=not args.no_progress,
                     drafter=args.drafter, closed_start=args.closed_start, expert=args.expert)
    base = next((r for r in recs if r["system"] == "plain"), None)
    print(f"{'system':16s} {'pre':>5s} {'enc':>5s} {'fill':>5s} {'dec':>6s} {'act':>6s} {'total':>6s} {'p90':>6s} "
          f"{'Hz':>5s} {'x plain':>7s} {'RT':>3s} {'minADE':>6s} {'ADE_6':>6s} {'coll':>4s} {'off':>4s} {'red':>4s} "
          "exact")
    for r in recs:
        lat, q = r["latency_ms"], r["quality"]
        ratio = base["latency_ms"]["total"] / lat["total"] if base and lat.get("total") else None
        k6 = next((v for k, v in q.items() if k.startswith("min_ade_")), None)
        print(f"{r['system']:16s} {_fmt(lat.get('preprocess')):>5s} {_fmt(lat.get('encode')):>5s} "
              f"{_fmt(lat.get('prefill')):>5s} {_fmt(lat.get('decode')):>6s} {_fmt(lat.get('action')):>6s} "
              f"{_fmt(lat.get('total')):>6s} {_fmt(lat.get('p90')):>6s} {_fmt(r['hz'], '.2f'):>5s} "
              f"{_fmt(ratio, '.2f'):>7s} {'yes' if r['realtime'] else 'no':>3s} {_fmt(q['min_ade'], '.3f'):>6s} "
              f"{_fmt(k6, '.3f'):>6s} {q['collision_count']:>4d} {q['offroad_count']:>4d} {q['red_light_count']:>4d} "
              f"{r['exact']}")
    for r in recs:
        if r.get("speculation"):
            sp, ratio = r["speculation"], r.get("stage_ratio_vs_plain", {}).get("decode")
            print(f"{r['system']}: speculative reasoning tau {_fmt(sp['tau'], '.2f')}, target passes "
                  f"{sp['target_forwards']} vs plain greedy's {sp['target_forwards_plain']}, decode stage "
                  f"{_fmt(ratio, '.2f')}x plain's ({sp['drafter']})")
    out = {"results": recs}
    if args.step_study:
        from mmspec.workloads import get_workload

        vla = DrivingVLA.from_pretrained(model, dtype=resolve_dtype(args.dtype, model, "cpu"))
        students = []
        if student:
            from .vla import load_student

            st = load_student(student, vla, model)
            students = [(f"few-step expert {st.num_steps}", st)]
        rows = step_cache_study(vla, get_workload("driving").examples("test", args.step_study), seed=args.seed,
                                progress=not args.no_progress, students=students)
        out["step_cache_study"] = rows
        print(f"\n{'step schedule':22s} {'head calls':>10s} {'drift m':>8s} {'ADE m':>7s}   (same noise, vs "
              f"{rows[0]['variant']})")
        for r in rows:
            print(f"{r['variant']:22s} {r['head_calls']:10.2f} {r['drift_m']:8.3f} {r['ade_m']:7.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, default=float)
    return 0


def step_cache_study(vla, examples, thresholds=(0.05, 0.1, 0.2, 0.3), cache_steps=(3, 4, 5, 6), seed: int = 0,
                     progress: bool = True, students=()) -> list[dict]:
    """The flow head's step cache against uniformly fewer Euler steps, at equal head calls and the same noise.

    For each item the backbone runs once (prompt and reasoning in the cache); then the expert integrates from the
    same noise with: the full ``num_steps`` (the reference), the adaptive cache at each threshold, the fixed
    schedule, and plain Euler with every step count below ``num_steps``; then each of ``students`` (``(name,
    expert)`` pairs: distilled few-step experts, :mod:`mmspec.drivers.distill`) at its own step count. Rows:
    ``variant``, mean ``head_calls``, ``drift_m`` (ADE to the reference trajectory) and ``ade_m`` (ADE to the expert
    driver's future).

    Example:
        >>> rows = step_cache_study(vla, get_workload("driving").examples("test", 8))    # doctest: +SKIP
        >>> [r["variant"] for r in rows][:2]                                            # doctest: +SKIP
        ['uniform 10', 'adaptive 0.05']
    """
    from tqdm.auto import tqdm

    from .vla import StepCache, integrate_actions

    pipe = DrivingPipeline(vla, flashdrive="system")
    steps = vla.expert.num_steps
    variants = [(f"uniform {steps}", {})]
    variants += [(f"adaptive {t:g}", {"step_cache": StepCache("adaptive", t)}) for t in thresholds]
    variants += [(f"fixed {list(cache_steps)}", {"step_cache": StepCache("fixed", cache_steps=cache_steps)})]
    variants += [(f"uniform {n}", {"num_steps": n}) for n in range(steps - 1, 1, -1)]
    variants += [(name, {"expert": st}) for name, st in students]
    acc = {name: {"head_calls": [], "drift_m": [], "ade_m": []} for name, _ in variants}
    for i, ex in enumerate(tqdm(examples, desc="step-cache study", file=sys.stderr, disable=not progress)):
        pipe.step(ex.images, ex.meta["history"], ex.meta["speed"], seed=seed + i)
        cache, start, valid = pipe.engine.last_context
        ref = None
        for name, kw in variants:
            st: dict = {}
            gen = torch.Generator(device=start.device).manual_seed(seed + i)  # the same noise for every variant
            kw = dict(kw)
            a = kw.pop("expert", vla.expert).sample(cache, start, valid, generator=gen, precompute=True, stats=st, **kw)
            traj = integrate_actions(a.float().cpu().numpy(), [ex.meta["speed"]])[0]
            ref = traj if ref is None else ref
            acc[name]["head_calls"].append(st["head_calls"])
            acc[name]["drift_m"].append(_ade(traj, ref))
            acc[name]["ade_m"].append(_ade(traj, ex.meta["future"]))
    return [{"variant": name, "n": len(examples), **{k: float(np.mean(v)) for k, v in acc[name].items()}}
            for name, _ in variants]
