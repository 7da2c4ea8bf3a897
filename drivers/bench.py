"""``mmspec bench --workload driving``: the plain driving pipeline's latency per stage and its quality.

One record per run (system ``ar``, batch 1: a car plans one tick at a time). After one untimed warm-up
step, every item of the split goes through :meth:`~mmspec.drivers.pipeline.DrivingPipeline.step` (one
trajectory sample, as a car drives); ``latency_ms`` holds the mean of each stage (encode, prefill, decode,
action, total) with ``p50`` / ``p90`` of total, ``quality`` the offline figures of
:func:`~mmspec.drivers.train_vla.summarize_scores` on the same steps (reasoning exact, hazard accuracy,
distance error, minADE of the sample against the constant-velocity ADE). FlashDrive's systems later add
their records beside this one, measured the same way.

Example:
    >>> from mmspec.bench import BenchConfig                                           # doctest: +SKIP
    >>> examples = get_workload("driving").examples("test", 8)                        # doctest: +SKIP
    >>> bench_driving("drivers/assets/driving-vla", examples, BenchConfig())          # doctest: +SKIP
"""

from __future__ import annotations

import sys

from mmspec.bench import plain_record
from mmspec.checkpoints import dtype_note, resolve_dtype

from .pipeline import STAGES, DrivingPipeline
from .train_vla import DrivingVLA, score_step, summarize_scores

__all__ = ["bench_driving"]


def bench_driving(model: str, examples: list, cfg, progress: bool = True) -> list[dict]:
    """Measure :class:`DrivingPipeline` of the VLA at ``model`` on ``examples``; one ``ar`` record."""
    from tqdm.auto import tqdm

    device = cfg.resolved_device()
    vla = DrivingVLA.from_pretrained(model, dtype=resolve_dtype(cfg.dtype, model, device))
    vla.to(device)
    pipe = DrivingPipeline(vla)
    first = examples[0]
    pipe.step(first.images, first.meta["history"], first.meta["speed"], seed=cfg.seed)  # warm-up, untimed
    stages = {s: [] for s in STAGES}
    scores, tokens = [], 0
    for i, ex in enumerate(tqdm(examples, desc="driving", file=sys.stderr, disable=not progress, leave=False)):
        res = pipe.step(ex.images, ex.meta["history"], ex.meta["speed"], seed=cfg.seed + i)
        for s in STAGES:
            stages[s].append(res["timings_ms"][s])
        tokens += res["num_decode_tokens"]
        scores.append(score_step(res, ex))
    note = ("DrivingPipeline.step, batch 1 (one car, one tick); quality on the same steps, one trajectory "
            "sample each")
    note += "; " + (dtype_note(cfg.dtype, model, device) or "run in its stored dtype")
    return [plain_record("driving", 1, len(examples), [t / 1e3 for t in stages["total"]], tokens, stages,
                         summarize_scores(scores), note, dtype=vla.backbone.dtype)]
