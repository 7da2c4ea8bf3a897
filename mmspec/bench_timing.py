"""How ``mmspec bench`` measures one (workload, batch size): every system warmed up, then run back to back on the
same batches in a rotated order, each run timed with the device idle, its tokens counted and its output compared
with AR's (a divergence diagnosed by the target's logit margin).

Why a module of its own: the clock and the comparison are the protocol every speedup claim rests on (see
:mod:`mmspec.bench`); keeping them apart from the systems and the records keeps that protocol in one place.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from .bench_systems import System
from .stats import SpecStats

@dataclass
class _Tally:
    """What one system accumulated over the timed batches of one (workload, batch size)."""

    system: System
    status: str = "ok"
    time: float = 0.0
    batch_times: list = field(default_factory=list)
    forwards: int = 0
    new_tokens: int = 0
    identical: bool = True
    rows: int = 0
    identical_rows: int = 0
    divergences: list = field(default_factory=list)
    texts: list = field(default_factory=list)  # decoded outputs, in example order (quality fields)
    stats: SpecStats | None = None


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(system: System, inputs, device) -> tuple:
    """``(sequences, stats, forwards, seconds)`` of one run, the clock read after the device is idle; the
    seconds the run spent measuring itself (``stats.audit_time``: the entropy of the draftability fit) are
    taken out, so a system is not charged for the bench's own bookkeeping."""
    _sync(device)
    t0 = time.perf_counter()
    sequences, stats, forwards = system.run(inputs)
    _sync(device)
    seconds = time.perf_counter() - t0
    return sequences, stats, forwards, seconds - (stats.audit_time if stats is not None else 0.0)


def _count_new_tokens(sequences, prompt_len: int, eos_ids: set) -> int:
    """Generated tokens over the rows: up to and including each row's first eos (padding excluded).

    Example:
        >>> _count_new_tokens(torch.tensor([[9, 1, 2, 7, 0], [9, 1, 7, 0, 0]]), 1, {7})
        5
    """
    total = 0
    for row in sequences[:, prompt_len:].tolist():
        stop = next((i for i, t in enumerate(row) if t in eos_ids), None)
        total += len(row) if stop is None else stop + 1
    return total


def _row_tokens(sequences, prompt_len: int, eos_ids: set) -> list:
    """Each row's generated tokens up to and including its first eos (what identity is judged on: trailing
    padding after a finished row depends on when the batch stopped, not on what the row said).

    Example:
        >>> _row_tokens(torch.tensor([[9, 1, 7, 0], [9, 1, 2, 3]]), 1, {7})
        [[1, 7], [1, 2, 3]]
    """
    out = []
    for row in sequences[:, prompt_len:].tolist():
        stop = next((i for i, t in enumerate(row) if t in eos_ids), None)
        out.append(row if stop is None else row[: stop + 1])
    return out


def _divergences(model, inputs, ar_seq, rows: list, other: list, ar: list, where: str) -> list:
    """For each row in ``rows`` (where ``other`` differs from ``ar``), the first differing position, both
    tokens and the target's logits for them there, from one teacher-forced pass over AR's own output.

    The margin ``logit(ar_token) - logit(other_token)`` tells a near-tie (a fraction of a rounding step
    of the dtype: bf16 keeps 8 bits of mantissa) from a bug (a clear winner replaced).
    """
    import torch.nn.functional as F

    prompt_len = inputs["input_ids"].shape[1]
    first = {}
    for r in rows:
        a, b = ar[r], other[r]
        first[r] = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    upto = prompt_len + max(first.values())  # logits at position p - 1 predict token p
    seq = ar_seq[:, :upto].to(inputs["input_ids"].device)
    extra = upto - prompt_len
    fwd = {}
    for k, v in inputs.items():
        if torch.is_tensor(v) and v.dim() == 2 and v.shape == inputs["input_ids"].shape and k != "input_ids":
            fill = 1 if k == "attention_mask" else 0  # new tokens are text: attended, not multimodal
            v = torch.cat([v, torch.full((v.shape[0], extra), fill, dtype=v.dtype, device=v.device)], dim=1)
        fwd[k] = v
    fwd["input_ids"] = seq
    with torch.no_grad():
        logits = model(**fwd).logits.float()
    out = []
    for r in rows:
        p = first[r]
        a = ar[r][p] if p < len(ar[r]) else None
        b = other[r][p] if p < len(other[r]) else None
        row = {"batch": where, "row": r, "position": p, "ar_token": a, "token": b}
        if a is not None and b is not None:
            lg = logits[r, prompt_len + p - 1]
            top2 = lg.topk(2)
            row.update(margin=float(lg[a] - lg[b]), top2_gap=float(top2.values[0] - top2.values[1]),
                       ar_prob=float(F.softmax(lg, -1)[a]))
        out.append(row)
    return out


def _eos_ids(model) -> set:
    eos = model.generation_config.eos_token_id
    return set() if eos is None else set(eos if isinstance(eos, (list, tuple)) else [eos])


def _error_status(exc: Exception, where: str) -> str:
    msg = " ".join(str(exc).split())
    return f"error: {where}: {type(exc).__name__}: {msg}"


def _attempt(tally: _Tally, inputs, where: str, device):
    """One timed run of ``tally``'s system, or ``None`` after marking it ``error`` (AR errors propagate)."""
    try:
        with torch.no_grad():
            tally.system.prepare(inputs)  # untimed
        return _timed(tally.system, inputs, device)
    except Exception as e:  # noqa: BLE001 - a failing competitor is a result, not a crash
        if tally.system.kind == "ar":
            raise
        tally.status = _error_status(e, where)
        return None


def _bench_cell(batches: list, ids: list, batch_size: int, systems: list[System], device, eos_ids: set,
                bar, decode=None, references=None, seed: int = 0) -> list[_Tally]:
    """Measure every system on ``batches`` (one workload, one batch size), interleaved; one tally each.

    The first batch is run once untimed by every system (warm-up); then each batch is run by every
    system back to back, the order rotated by one per batch. AR failing is a real failure and raises;
    any other system that raises is marked ``error`` and skipped for the rest of the cell. ``decode``
    (sequences, prompt length -> texts) keeps each system's texts for the quality fields; ``references``
    (per batch, each row's reference answer as token ids) go to each system before it runs that batch.
    When the systems sample, batch ``i`` runs with seed ``seed + i`` in every system and identity with AR is
    not judged (a lossless sampler matches AR's distribution, not its draws).
    """
    tallies = [_Tally(s) for s in systems]
    for t in tallies:
        t.status = t.system.unsupported(batch_size) or "ok"
    live = [t for t in tallies if t.status == "ok"]
    for t in live:
        if references is not None:
            t.system.use_references(references[0])
        _attempt(t, batches[0], f"warm-up on {ids[0]}", device)
        t.system.forget()  # a drafter with cross-request memory must not meet the warm-up's outputs again
        bar.update(1)
    for i, (inputs, where) in enumerate(zip(batches, ids)):
        outputs = {}
        for t in live[i % len(live):] + live[: i % len(live)]:
            if references is not None:
                t.system.use_references(references[i])
            t.system.seed = seed + i
            run = _attempt(t, inputs, where, device) if t.status == "ok" else None
            bar.update(1)
            if run is None:
                continue
            seq, stats, forwards, seconds = run
            outputs[t.system.name] = seq.cpu()
            if decode is not None:
                t.texts += decode(seq, inputs["input_ids"].shape[1])
            t.time += seconds
            t.batch_times.append(seconds)
            t.forwards += forwards
            t.new_tokens += _count_new_tokens(seq, inputs["input_ids"].shape[1], eos_ids)
            if stats is not None:
                t.stats = (t.stats or SpecStats()).merge(stats)
        plen = inputs["input_ids"].shape[1]
        sampling = any(t.system.sampling is not None for t in live)
        ar_rows = _row_tokens(outputs["ar"], plen, eos_ids) if "ar" in outputs and not sampling else None
        for t in live:
            if t.system.name in outputs and ar_rows is not None:
                rows = _row_tokens(outputs[t.system.name], plen, eos_ids)
                differ = [r for r, (a, b) in enumerate(zip(ar_rows, rows)) if a != b]
                t.rows += len(rows)
                t.identical_rows += len(rows) - len(differ)
                t.identical = t.identical and not differ
                if differ:
                    try:
                        t.divergences += _divergences(t.system.model, inputs, outputs["ar"], differ, rows, ar_rows,
                                                      where)
                    except Exception as e:  # noqa: BLE001 - a failed diagnosis must not end the whole run
                        t.divergences += [{"batch": where, "row": r, "error": _error_status(e, "margin")}
                                          for r in differ]
    return tallies
