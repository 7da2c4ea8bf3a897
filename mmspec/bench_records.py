"""The records ``mmspec bench`` writes: one dict per (workload, system, batch size) with the fields every
record has (:data:`MEASURED_FIELDS`), the ``ar`` record of a plain pipeline (:func:`plain_record`) and the run's
metadata.

Why a module of its own: the record is the bench's JSON schema, shared with the workloads that measure their own
pipelines (``mmspec.drivers.bench``, ``mmspec.image_ar.bench``); it must not depend on how a run was timed.
"""

from __future__ import annotations

import os
import platform
import statistics
from dataclasses import asdict
from datetime import datetime, timezone

import torch

from .bench_timing import _Tally
from .inputs import text_quality

# A record's measured fields: ``None`` in a record whose system did not run to the end.
MEASURED_FIELDS = ("tau", "accept_rate", "accepted_hist", "ceiling_rounds", "speedup_vs_ar", "speedup_median",
                   "forwards_per_token", "target_forwards", "tokens_per_s", "tokens_per_s_vs_ar", "time_s",
                   "identical_to_ar", "identical_rate", "divergences", "new_tokens", "lossless", "quality",
                   "draftability", "drafter_counters")


def _record(workload: str, batch_size: int, n_examples: int, tally: _Tally, ar: _Tally, references=None) -> dict:
    """One result row; measured fields are ``None`` when the system did not run to the end.

    ``speedup_vs_ar`` is the pooled ratio (sum of AR times / sum of the system's); ``speedup_median``, the
    median over batches of the per-batch ratio, is its robust companion: when they disagree, a few runs
    were disturbed (on a small shared CPU, a stalled thread can inflate one run many times over).
    ``quality`` (character error rate and exact match of the system's texts against ``references``, the
    examples' reference answers, ``None`` where an example has none) is ``None`` when no example has one.
    """
    s, kind, ok = tally.stats, tally.system.kind, tally.status == "ok"
    rec = {"workload": workload, "system": tally.system.label, "spec": tally.system.name, "kind": kind,
           "batch_size": batch_size, "status": tally.status, "n_examples": n_examples, "note": tally.system.note,
           "dtype": dtype_name(getattr(tally.system.model, "dtype", None)), "sampling": tally.system.sampling}
    if not ok:
        return {**rec, **dict.fromkeys(MEASURED_FIELDS)}
    if kind == "mmspec":
        fpt, tau, lossless = s.forwards_per_token, s.tau, s.lossless
    elif kind == "ar":
        fpt, tau, lossless = 1.0, 1.0, True
    else:  # transformers hides its rounds; batch 1, so forward calls per token are per row
        fpt, tau, lossless = tally.forwards / max(tally.new_tokens, 1), None, True
    rec.update(
        tau=tau,
        accept_rate=s.accept_rate if s else None,
        accepted_hist=list(s.accepted_hist) if s else None,
        ceiling_rounds=s.ceiling_rounds if s else None,
        draftability=s.draftability() if s else None,
        drafter_counters=dict(s.drafter_counters) if s and s.drafter_counters else None,
        speedup_vs_ar=ar.time / tally.time if tally.time else None,
        speedup_median=statistics.median(a / b for a, b in zip(ar.batch_times, tally.batch_times)),
        forwards_per_token=fpt,
        target_forwards=tally.forwards,
        tokens_per_s=tally.new_tokens / tally.time if tally.time else None,
        # Under sampling the systems emit different texts (lengths differ), so the time ratio compares unequal
        # work; the throughput ratio does not. Under greedy lossless systems both ratios agree.
        tokens_per_s_vs_ar=(tally.new_tokens / tally.time) / (ar.new_tokens / ar.time)
        if tally.time and ar.time and ar.new_tokens else None,
        time_s=tally.time,
        identical_to_ar=tally.identical if tally.rows else None,
        identical_rate=tally.identical_rows / tally.rows if tally.rows else None,
        divergences=tally.divergences,
        new_tokens=tally.new_tokens,
        quality=text_quality(tally.texts, references) if references and len(tally.texts) == len(references)
        else None,
        lossless=lossless,
    )
    if kind == "ar":
        rec["speedup_vs_ar"] = rec["speedup_median"] = rec["tokens_per_s_vs_ar"] = 1.0  # exactly, by definition
    return rec


def dtype_name(dtype) -> str | None:
    """``torch.bfloat16`` -> ``"bfloat16"`` (how records name a dtype); ``None`` stays ``None``.

    Example:
        >>> dtype_name(torch.bfloat16), dtype_name(None)
        ('bfloat16', None)
    """
    return None if dtype is None else str(dtype).removeprefix("torch.")


def _of_ceiling(records: list) -> list:
    """Give every record of one (workload, batch size) its speedup as a fraction of the ceiling's in the same
    run (``of_ceiling``; ``None`` without a ceiling record). Returns ``records``.

    Example:
        >>> _of_ceiling([{"system": "ceiling", "speedup_vs_ar": 2.0}, {"system": "eagle", "speedup_vs_ar": 1.5}])[1]
        {'system': 'eagle', 'speedup_vs_ar': 1.5, 'of_ceiling': 0.75}
    """
    top = next((r.get("speedup_vs_ar") for r in records if r["system"].split(";")[0] == "ceiling"), None)
    for r in records:
        r["of_ceiling"] = r["speedup_vs_ar"] / top if top and r.get("speedup_vs_ar") is not None else None
    return records


def plain_record(workload: str, batch_size: int, n_examples: int, batch_times: list, new_tokens: int,
                 latency_ms: dict, quality: dict, note: str = "", dtype=None) -> dict:
    """The ``ar`` record of a workload served by its own plain pipeline (a driving VLA, an image generator):
    the fields every record has (AR against itself: ``speedup_vs_ar`` 1, ``tau`` 1, identical, lossless),
    plus ``latency_ms`` (mean per stage over the timed calls, with ``p50`` / ``p90`` of ``total``) and
    ``quality`` (the workload's own measures), so later speculative systems add records beside it.

    Example:
        >>> r = plain_record("driving", 1, 2, [0.5, 0.7], 24, {"total": [500.0, 700.0]}, {"reasoning_exact": 1.0})
        >>> r["tokens_per_s"], r["latency_ms"]["total"], r["latency_ms"]["p90"], r["quality"]["reasoning_exact"]
        (20.0, 600.0, 680.0, 1.0)
    """
    total = sum(batch_times)
    lat = {k: float(statistics.fmean(v)) for k, v in latency_ms.items() if v}
    if latency_ms.get("total"):
        qs = torch.tensor(latency_ms["total"], dtype=torch.float64)
        lat["p50"], lat["p90"] = float(qs.quantile(0.5)), float(qs.quantile(0.9))
    return {"workload": workload, "system": "ar", "spec": "ar", "kind": "ar", "batch_size": batch_size,
            "status": "ok", "n_examples": n_examples, "note": note, "tau": 1.0, "accept_rate": None,
            "accepted_hist": None, "ceiling_rounds": None, "speedup_vs_ar": 1.0, "speedup_median": 1.0,
            "forwards_per_token": 1.0, "target_forwards": None, "tokens_per_s": new_tokens / total if total else None,
            "time_s": total, "identical_to_ar": True, "identical_rate": 1.0, "divergences": [],
            "new_tokens": new_tokens, "lossless": True, "latency_ms": lat, "quality": quality,
            "draftability": None, "of_ceiling": None,
            "dtype": dtype_name(dtype)}


def _meta(cfg, model_path: str, model, n: int, max_new: int) -> dict:
    """The run's metadata: machine, versions, target and the :class:`~mmspec.bench.BenchConfig` ``cfg`` as run."""
    import transformers

    from . import __version__

    cuda = torch.cuda.get_device_name(model.device) if model is not None and model.device.type == "cuda" else None
    return {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"node": platform.node(), "platform": platform.platform(), "processor": platform.processor(),
                    "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(), "cuda_device": cuda},
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "mmspec": __version__,
        "model": model_path,
        "model_type": model.config.model_type if model is not None else None,
        "dtype": dtype_name(model.dtype) if model is not None else None,
        "device": str(model.device if model is not None else cfg.resolved_device()),
        "draft_model": cfg.draft_model,
        "sampling": cfg.sampling,
        "args": {**asdict(cfg), "n": n, "max_new_tokens": max_new},
        "speedup": "sum of AR times / sum of system times, interleaved per batch after a warm-up, one run",
    }
