"""The speed / quality trade-off of the image systems of one ``mmspec bench --workload images`` run: the table and the
Pareto plot of issue 18, and its two bars.

Per system (one batch size, each against the AR of its guidance scale): target forwards and their ratio to AR's, wall
speedup, FID with the AR-vs-AR noise floor, prompt accuracy with its AR-vs-AR spread, the code NLL, lossless or not.
A system is *within tolerance* when its FID is at most AR's plus ``max(5% of AR's, the FID noise floor)`` and its
prompt accuracy at least AR's minus ``max(the accuracy spread, 0.02)``; it is on the *Pareto front* when no other
system is at least as fast with an FID at least as low (one of the two strictly). The bars: a lossless system at
``>= 1.8x``, and the fastest system within tolerance at ``>= 3.5x``.

``python -m mmspec.image_ar pareto BENCH.json --png PLOT.png --md TABLE.md`` writes them (matplotlib for the plot).

Example:
    >>> ar = {"workload": "images", "status": "ok", "system": "ar", "batch_size": 1, "lossless": True,
    ...       "speedup_vs_ar": 1.0, "target_forwards": 512, "tau": 1.0, "reference": "ar",
    ...       "quality": {"fid": 40.0, "fid_n": 256, "fid_noise_floor": 3.0, "prompt_accuracy": 0.8,
    ...                   "prompt_accuracy_noise": 0.01, "code_nll": 0.9}}
    >>> fast = dict(ar, system="spatial;rounds=1", lossless=False, speedup_vs_ar=4.0, target_forwards=128,
    ...             quality=dict(ar["quality"], fid=41.5, prompt_accuracy=0.79))
    >>> rows = pareto_rows([ar, fast])
    >>> [(r["system"], r["forwards_ratio"], r["within_tolerance"], r["pareto"]) for r in rows]
    [('ar', 1.0, True, True), ('spatial;rounds=1', 4.0, True, True)]
    >>> bars(rows)["fastest_within_tolerance"], bars(rows)["quality_bar_holds"]
    ('spatial;rounds=1', True)
"""

from __future__ import annotations

import json

from mmspec.errors import InvalidInputError

__all__ = ["pareto_rows", "bars", "table", "save_png", "main"]

LOSSLESS_BAR, FAST_BAR = 1.8, 3.5
FID_REL_TOL, ACC_MIN_TOL = 0.05, 0.02


def _tolerances(ar: dict) -> tuple:
    q = ar["quality"]
    fid_tol = max(FID_REL_TOL * q["fid"], q.get("fid_noise_floor") or 0.0) if q.get("fid") is not None else None
    return fid_tol, max(q.get("prompt_accuracy_noise") or 0.0, ACC_MIN_TOL)


def pareto_rows(results: list, batch_size: int | None = None) -> list[dict]:
    """One row per image system of ``results`` (a bench JSON's ``results``) at ``batch_size`` (default: the smallest
    measured), in the run's order, with ``within_tolerance`` and ``pareto`` set (module docstring).

    Example:
        >>> q = {"fid": 40.0, "fid_n": 256, "fid_noise_floor": 3.0, "prompt_accuracy": 0.8}
        >>> ar = {"workload": "images", "status": "ok", "system": "ar", "batch_size": 1, "lossless": True,
        ...       "speedup_vs_ar": 1.0, "target_forwards": 512, "quality": q}
        >>> sjd = dict(ar, system="sjd", speedup_vs_ar=2.0, target_forwards=256)  # AR's FID, twice as fast
        >>> csd = dict(ar, system="csd", lossless=False, speedup_vs_ar=3.0, target_forwards=128,
        ...            quality=dict(q, fid=47.0))  # faster still, past AR's FID + 5%
        >>> rows = pareto_rows([ar, sjd, csd])
        >>> [(r["system"], r["forwards_ratio"], r["within_tolerance"], r["pareto"]) for r in rows]
        [('ar', 1.0, True, False), ('sjd', 2.0, True, True), ('csd', 4.0, False, True)]
    """
    recs = [r for r in results if r.get("workload") == "images" and r.get("status") == "ok"]
    if not recs:
        raise InvalidInputError("no images records in this bench run (mmspec bench --workload images)")
    bs = min(r["batch_size"] for r in recs) if batch_size is None else batch_size
    recs = [r for r in recs if r["batch_size"] == bs]
    if not recs:
        raise InvalidInputError(f"no images records at batch size {bs}")
    by_name = {r["system"]: r for r in recs}
    rows = []
    for r in recs:
        ar = by_name.get(r.get("reference") or "ar", by_name.get("ar"))
        if ar is None:
            raise InvalidInputError(f"system {r['system']!r} has no AR record to compare with")
        q, qa = r["quality"], ar["quality"]
        fid_tol, acc_tol = _tolerances(ar)
        fid_ok = fid_tol is not None and q.get("fid") is not None and q["fid"] <= qa["fid"] + fid_tol
        acc_ok = q.get("prompt_accuracy") is not None and q["prompt_accuracy"] >= qa["prompt_accuracy"] - acc_tol
        fwd = r.get("target_forwards")
        rows.append({"system": r["system"], "reference": ar["system"], "lossless": bool(r.get("lossless")),
                     "target_forwards": fwd, "forwards_ratio": (ar["target_forwards"] / fwd) if fwd else None,
                     "speedup_vs_ar": r["speedup_vs_ar"], "tau": r.get("tau"), "fid": q.get("fid"),
                     "fid_n": q.get("fid_n"), "fid_noise_floor": qa.get("fid_noise_floor"), "fid_tolerance": fid_tol,
                     "kid": q.get("kid"), "kid_noise_floor": qa.get("kid_noise_floor"),
                     "batch_size": r["batch_size"], "mode": q.get("mode", "quick"),
                     "prompt_accuracy": q.get("prompt_accuracy"),
                     "prompt_accuracy_noise": qa.get("prompt_accuracy_noise"),
                     "accuracy_tolerance": acc_tol, "code_nll": q.get("code_nll"),
                     "within_tolerance": bool(fid_ok and acc_ok)})
    for row in rows:  # dominated: another row at least as fast with an FID at least as low, one of them strictly
        s, f = row["speedup_vs_ar"], row["fid"]
        row["pareto"] = f is not None and not any(
            o is not row and o["fid"] is not None and o["speedup_vs_ar"] >= s and o["fid"] <= f
            and (o["speedup_vs_ar"] > s or o["fid"] < f) for o in rows)
    return rows


def bars(rows: list) -> dict:
    """The issue's two bars over :func:`pareto_rows`: the fastest lossless system (``>= 1.8x``) and the fastest system
    within tolerance (``>= 3.5x``). AR itself (a row that is its own reference) counts for neither.

    Example:
        >>> ar = {"system": "ar", "reference": "ar", "lossless": True, "within_tolerance": True, "speedup_vs_ar": 1.0}
        >>> rows = [ar, dict(ar, system="sjd", speedup_vs_ar=2.1)]
        >>> b = bars(rows)
        >>> b["fastest_lossless"], b["lossless_bar_holds"], b["fastest_within_tolerance"], b["quality_bar_holds"]
        ('sjd', True, 'sjd', False)
    """
    def fastest(ok):
        cands = [r for r in rows if ok(r) and r["reference"] != r["system"]]
        return max(cands, key=lambda r: r["speedup_vs_ar"]) if cands else None

    lossless, within = fastest(lambda r: r["lossless"]), fastest(lambda r: r["within_tolerance"])
    return {"fastest_lossless": lossless and lossless["system"],
            "fastest_lossless_speedup": lossless and lossless["speedup_vs_ar"],
            "lossless_bar_holds": bool(lossless and lossless["speedup_vs_ar"] >= LOSSLESS_BAR),
            "fastest_within_tolerance": within and within["system"],
            "fastest_within_tolerance_speedup": within and within["speedup_vs_ar"],
            "quality_bar_holds": bool(within and within["speedup_vs_ar"] >= FAST_BAR)}


def _f(v, fmt):
    return "-" if v is None else fmt.format(v)


def _milli(v):
    return None if v is None else 1e3 * v


def table(rows: list) -> str:
    """:func:`pareto_rows` as a markdown table, with the tolerances and the bars under it.

    Example:
        >>> q = {"fid": 40.0, "fid_n": 256, "fid_noise_floor": 3.0, "prompt_accuracy": 0.8, "code_nll": 0.9}
        >>> ar = {"workload": "images", "status": "ok", "system": "ar", "batch_size": 1, "lossless": True,
        ...       "speedup_vs_ar": 1.0, "target_forwards": 512, "tau": 1.0, "quality": q}
        >>> sjd = dict(ar, system="sjd", speedup_vs_ar=2.0, target_forwards=256, tau=2.0)
        >>> print(table(pareto_rows([ar, sjd])))  # doctest: +NORMALIZE_WHITESPACE
        | system | lossless | target forwards | fwd ratio | wall speedup | tau | FID | KID x 1000 | prompt acc. |
        code NLL | within tol. | Pareto |
        |---|---|---|---|---|---|---|---|---|---|---|---|
        | `ar` | yes | 512 | 1.00x | 1.00x | 1.00 | 40.0 | - | 0.800 | 0.900 | yes |  |
        | `sjd` | yes | 256 | 2.00x | 2.00x | 2.00 | 40.0 | - | 0.800 | 0.900 | yes | * |
        <BLANKLINE>
        FID n = 256; AR-vs-AR noise floor: FID 3.00, KID x 1000 -, prompt accuracy -. Tolerance: FID <= 40.0 +
        3.00, prompt accuracy >= 0.800 - 0.020.
        Lossless bar (>= 1.8x): holds (sjd: 2.00x). Fastest within tolerance (>= 3.5x): fails (sjd: 2.00x).
    """
    out = ["| system | lossless | target forwards | fwd ratio | wall speedup | tau | FID | KID x 1000 | prompt acc. | "
           "code NLL | within tol. | Pareto |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| `{r['system']}` | {'yes' if r['lossless'] else 'no'} | {_f(r['target_forwards'], '{}')} | "
                   f"{_f(r['forwards_ratio'], '{:.2f}x')} | {_f(r['speedup_vs_ar'], '{:.2f}x')} | "
                   f"{_f(r['tau'], '{:.2f}')} | {_f(r['fid'], '{:.1f}')} | {_f(_milli(r['kid']), '{:.2f}')} | "
                   f"{_f(r['prompt_accuracy'], '{:.3f}')} | "
                   f"{_f(r['code_nll'], '{:.3f}')} | {'yes' if r['within_tolerance'] else 'no'} | "
                   f"{'*' if r['pareto'] else ''} |")
    ar = next((r for r in rows if r["system"] == r["reference"]), rows[0])
    b = bars(rows)
    out += ["", f"FID n = {ar['fid_n']}; AR-vs-AR noise floor: FID {_f(ar['fid_noise_floor'], '{:.2f}')}, KID x 1000 "
                f"{_f(_milli(ar['kid_noise_floor']), '{:.2f}')}, prompt accuracy {_f(ar['prompt_accuracy_noise'], '{:.3f}')}. Tolerance: FID <= "
                f"{_f(ar['fid'], '{:.1f}')} + {_f(ar['fid_tolerance'], '{:.2f}')}, prompt accuracy >= "
                f"{_f(ar['prompt_accuracy'], '{:.3f}')} - {ar['accuracy_tolerance']:.3f}.",
            f"Lossless bar (>= {LOSSLESS_BAR}x): {'holds' if b['lossless_bar_holds'] else 'fails'} "
            f"({b['fastest_lossless'] or 'no lossless system'}: {_f(b['fastest_lossless_speedup'], '{:.2f}x')}). "
            f"Fastest within tolerance (>= {FAST_BAR}x): {'holds' if b['quality_bar_holds'] else 'fails'} "
            f"({b['fastest_within_tolerance'] or 'no system'}: "
            f"{_f(b['fastest_within_tolerance_speedup'], '{:.2f}x')})."]
    if ar.get("mode") == "full" and ar.get("batch_size", 1) > 1:  # the bars speak of batch-1 latency
        out.append(f"A quality run (--quality full) at batch size {ar['batch_size']}: its wall speedups are throughput "
                   "there, where a CPU is compute-bound, so the speed bars above are not judged on it; they are the "
                   "batch-1 run's.")
    return "\n".join(out)


def save_png(rows: list, path: str, title: str = "") -> None:
    """Two panels against wall speedup: (a) FID with AR's tolerance band and the Pareto front, (b) prompt accuracy
    with its tolerance band; filled markers lossless, crosses lossy. Needs matplotlib (``mmspec[bench]``).

    Example:
        >>> import os, tempfile
        >>> q = {"fid": 40.0, "fid_n": 256, "fid_noise_floor": 3.0, "prompt_accuracy": 0.8}
        >>> ar = {"workload": "images", "status": "ok", "system": "ar", "batch_size": 1, "lossless": True,
        ...       "speedup_vs_ar": 1.0, "target_forwards": 512, "quality": q}
        >>> csd = dict(ar, system="csd", lossless=False, speedup_vs_ar=3.0, quality=dict(q, fid=47.0))
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     save_png(pareto_rows([ar, csd]), os.path.join(tmp, "pareto.png"), title="two systems")
        ...     open(os.path.join(tmp, "pareto.png"), "rb").read(8) == bytes([137, 80, 78, 71, 13, 10, 26, 10])
        True
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:
        raise InvalidInputError("the Pareto plot needs matplotlib: pip install 'mmspec[bench]'") from e
    ar = next((r for r in rows if r["system"] == r["reference"]), rows[0])
    fig = Figure(figsize=(13, 5), layout="constrained")
    FigureCanvasAgg(fig)
    ax_fid, ax_acc = fig.subplots(1, 2)
    for ax, key, tol, sign in ((ax_fid, "fid", ar["fid_tolerance"], 1), (ax_acc, "prompt_accuracy",
                                                                         ar["accuracy_tolerance"], -1)):
        if ar[key] is not None and tol is not None:
            lo, hi = sorted((ar[key], ar[key] + sign * tol))
            ax.axhspan(lo, hi, color="0.85", label="AR and its tolerance")
        for i, r in enumerate(rows):
            if r[key] is None:
                continue
            ax.scatter([r["speedup_vs_ar"]], [r[key]], color=f"C{i}", marker="o" if r["lossless"] else "X", s=60,
                       label=f"{r['system']}{'' if r['lossless'] else ' (lossy)'}")
            ax.annotate(r["system"], (r["speedup_vs_ar"], r[key]), fontsize=7, xytext=(4, 4),
                        textcoords="offset points")
        ax.set_xlabel("wall speedup vs AR (x)")
        ax.grid(alpha=0.3)
    front = sorted((r for r in rows if r["pareto"]), key=lambda r: r["speedup_vs_ar"])
    ax_fid.plot([r["speedup_vs_ar"] for r in front], [r["fid"] for r in front], "k--", lw=1, label="Pareto front")
    ax_fid.set_yscale("log")  # broken lossy settings sit an order of magnitude above the rest
    ax_fid.set_ylabel(f"FID (classifier features, n = {ar['fid_n']}; log scale, lower is better)")
    ax_fid.set_title("(a) speed / FID")
    ax_acc.set_ylabel("prompt accuracy (higher is better)")
    ax_acc.set_title("(b) speed / prompt accuracy")
    ax_fid.legend(fontsize=7)
    fig.suptitle(title or "image systems: speed against quality (one bench run)")
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    """``python -m mmspec.image_ar pareto BENCH.json [--png PATH] [--md PATH] [--batch-size N]``: print the table
    (and write it, the plot), from a bench JSON; returns the exit status.

    Example:
        >>> import os, tempfile
        >>> ar = {"workload": "images", "status": "ok", "system": "ar", "batch_size": 1, "lossless": True,
        ...       "speedup_vs_ar": 1.0, "target_forwards": 512, "quality": {"fid": 40.0, "prompt_accuracy": 0.8}}
        >>> with tempfile.TemporaryDirectory() as tmp:  # doctest: +ELLIPSIS
        ...     with open(os.path.join(tmp, "bench.json"), "w") as f:
        ...         json.dump({"results": [ar, dict(ar, system="sjd", speedup_vs_ar=2.0)]}, f)
        ...     main([os.path.join(tmp, "bench.json"), "--md", os.path.join(tmp, "table.md")])
        ...     os.path.getsize(os.path.join(tmp, "table.md")) > 0
        | system | lossless | target forwards | fwd ratio | wall speedup | tau | FID | ...
        ...
        0
        True
    """
    import argparse

    p = argparse.ArgumentParser(prog="python -m mmspec.image_ar pareto")
    p.add_argument("bench_json")
    p.add_argument("--png", default=None)
    p.add_argument("--md", default=None)
    p.add_argument("--batch-size", type=int, default=None)
    args = p.parse_args(argv)
    try:
        with open(args.bench_json) as f:
            report = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise InvalidInputError(f"cannot read the bench JSON {args.bench_json!r}: {e}") from e
    if not isinstance(report, dict) or not isinstance(report.get("results", []), list):
        raise InvalidInputError(f"{args.bench_json!r} is not a bench JSON (an object with a 'results' list)")
    rows = pareto_rows(report.get("results", []), args.batch_size)
    text = table(rows)
    print(text)
    if args.md:
        with open(args.md, "w") as f:
            f.write(text + "\n")
    if args.png:
        meta = report.get("meta", {})
        save_png(rows, args.png,
                 f"image systems, one bench run ({meta.get('date', '')[:10]}, {meta.get('device', '')})")
    return 0
