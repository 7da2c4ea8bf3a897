"""What a finished ``mmspec bench`` run gives back: :class:`BenchReport`, its records as JSON, a text table and
a PNG (accepted-length histograms, speedups vs AR).

Why a module of its own: presenting the records reads them only, so the table and the plots change without
touching how they were measured; matplotlib is imported only when a PNG is asked for.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

def _plain_lines(results: list) -> list[str]:
    """The latency and quality of plain-pipeline records (driving, images), one line each, for the table: their
    speed columns would only show ``ar`` against itself."""
    lines = []
    for r in results:
        lat, q = r.get("latency_ms"), r.get("quality")
        if not lat:  # a text system's record (its quality, e.g. on --inputs, has columns of its own)
            continue
        stages = ", ".join(f"{k} {v:.1f}" for k, v in lat.items() if k not in ("total", "p50", "p90"))
        text = f"{r['workload']}  {r['system']}  bs {r['batch_size']}:"
        if "total" in lat:
            text += f" total {lat['total']:.1f} ms (p50 {lat.get('p50', lat['total']):.1f}, p90 " \
                    f"{lat.get('p90', lat['total']):.1f})"
        text += f"; {stages}" if stages else ""
        quality = []
        for k, v in (q or {}).items():
            if k in ("fid_n", "note") or v is None:
                continue
            if isinstance(v, dict):
                quality += [f"{kk} {vv:.3g}" for kk, vv in v.items() if isinstance(vv, (int, float))]
            elif isinstance(v, (int, float)) and not isinstance(v, bool):
                quality.append(f"{k} {v:.3g}" + (f" (n {q['fid_n']})" if k == "fid" and "fid_n" in q else ""))
        lines.append(text + (f" | quality: {', '.join(quality)}" if quality else ""))
    return ["", "latency (ms per call) and quality of the plain pipelines:"] + lines if lines else []


@dataclass
class BenchReport:
    """The records (one per workload x system x batch size) and the run's metadata.

    Example:
        >>> r = BenchReport([], {"model": "m"})
        >>> json.loads(r.to_json())["meta"]["model"]
        'm'
    """

    results: list
    meta: dict

    def _dtype_label(self) -> str:
        """The run's dtype: the meta's, else the dtypes its records ran in (plain pipelines load their own)."""
        if self.meta.get("dtype"):
            return str(self.meta["dtype"])
        seen = sorted({str(r.get("dtype")) for r in self.results if r.get("dtype")})
        return ", ".join(seen) or "not recorded"

    def to_json(self) -> str:
        return json.dumps({"results": self.results, "meta": self.meta}, indent=2)

    def save_json(self, path) -> None:
        with open(path, "w") as f:
            f.write(self.to_json() + "\n")

    def table(self) -> str:
        """The records as a text table (column widths fit the content); full non-ok statuses follow it.

        Example:
            >>> rec = {"workload": "docs", "system": "ar", "batch_size": 1, "tau": 1.0, "forwards_per_token": 1.0,
            ...        "tokens_per_s": 20.0, "speedup_vs_ar": 1.0, "speedup_median": 1.0, "of_ceiling": None,
            ...        "identical_rate": 1.0, "status": "ok"}
            >>> print(BenchReport([rec], {}).table().splitlines()[2])
            docs      ar      1   1.00    1.000   20.0    1.00x   1.00x        -  100%  ok
        """
        cols = [("workload", "workload", "{}"), ("system", "system", "{}"), ("bs", "batch_size", "{}"),
                ("tau", "tau", "{:.2f}"), ("fwd/tok", "forwards_per_token", "{:.3f}"),
                ("tok/s", "tokens_per_s", "{:.1f}"), ("speedup", "speedup_vs_ar", "{:.2f}x"),
                ("median", "speedup_median", "{:.2f}x"), ("of ceil", "of_ceiling", "{:.0%}"),
                ("same", "identical_rate", "{:.0%}"), ("status", "status", "{}")]
        if self.meta.get("sampling") is not None:  # texts differ in length: throughput is the fair ratio
            cols.insert(7, ("tok/s x", "tokens_per_s_vs_ar", "{:.2f}x"))
        rows = [[_fmt(r[key], fmt) if key != "status" else r[key].split(":")[0] for _, key, fmt in cols]
                for r in self.results]
        widths = [max([len(head)] + [len(row[i]) for row in rows]) for i, (head, _, _) in enumerate(cols)]

        def line(cells):
            return "  ".join(c.ljust(w) if fmt == "{}" else c.rjust(w)
                             for c, w, (_, _, fmt) in zip(cells, widths, cols)).rstrip()

        out = [line([c[0] for c in cols]), "-" * (sum(widths) + 2 * (len(widths) - 1))] + [line(r) for r in rows]
        notes = [f"  {r['workload']} / {r['system']} / batch {r['batch_size']}: {r['status']}"
                 for r in self.results if r["status"] != "ok"]
        if notes:
            out += ["", "not run:"] + notes
        out += _plain_lines(self.results)
        out += ["", "speedup: sum of AR times / sum of the system's times, interleaved on the same inputs after a "
                    "warm-up; median: median of the per-batch ratios; of ceil: speedup as a share of the ceiling's (a "
                    "perfect drafter, same run); same: share of rows identical to AR token for "
                    f"token (dtype {self._dtype_label()})"]
        if self.meta.get("sampling") is not None:
            out += [f"sampling run ({self.meta['sampling'] or 'the model generation config'}, seed per batch shared by "
                    "the systems): outputs are not compared token for token, so texts differ in length and tok/s x (the "
                    "throughput ratio) is the fair speedup; a system is lossless when its "
                    "acceptance rule keeps the target's distribution (records: lossless, the rule in the system name)"]
        return "\n".join(out)

    def save_png(self, path) -> None:
        """One PNG: (a) accepted-length histograms of the mmspec systems, (b) speedups vs AR.

        Bars in (b) are the pooled ratios (``speedup_vs_ar``), black diamonds the per-batch medians.

        The histograms are those of the smallest batch size measured, as fractions of row-rounds; the
        legend gives each one's τ and ceiling share (rounds whose whole draft was accepted).
        """
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        fig = Figure(figsize=(13, 4.8), layout="constrained")
        FigureCanvasAgg(fig)
        ax_hist, ax_speed = fig.subplots(1, 2, width_ratios=[1, 1.3])
        colors = {name: f"C{i}" for i, name in enumerate(dict.fromkeys(r["system"] for r in self.results
                                                                       if r["system"] != "ar"))}
        _plot_histograms(ax_hist, self.results, colors)
        _plot_speedups(ax_speed, self.results, colors)
        fig.suptitle(f"mmspec bench: {os.path.basename(str(self.meta.get('model', '')).rstrip('/'))} "
                     f"({self.meta.get('device', '')}, {self.meta.get('date', '')[:10]})")
        fig.savefig(path, dpi=110)


def _fmt(value, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def _plot_histograms(ax, results: list, colors: dict) -> None:
    ok = [r for r in results if r["kind"] == "mmspec" and r["status"] == "ok" and r["accepted_hist"]]
    if not ok:
        ax.text(0.5, 0.5, "no mmspec system ran", ha="center", va="center", transform=ax.transAxes)
        return
    smallest = min(r["batch_size"] for r in ok)
    series = [r for r in ok if r["batch_size"] == smallest]
    width = 0.8 / len(series)
    for i, r in enumerate(series):
        hist = r["accepted_hist"]
        total = sum(hist) or 1
        xs = [a + 1 + (i - (len(series) - 1) / 2) * width for a in range(len(hist))]
        label = (f"{r['system']} / {r['workload']}: tau {r['tau']:.2f}, "
                 f"ceiling {r['ceiling_rounds'] / total:.0%}")
        workloads = sorted({q["workload"] for q in series})
        hatch = "//" if workloads.index(r["workload"]) % 2 else None
        ax.bar(xs, [h / total for h in hist], width=width, label=label, color=colors[r["system"]], hatch=hatch)
    ax.set_xticks(range(1, max(len(r["accepted_hist"]) for r in series) + 1))
    ax.set_xlabel("tokens committed per round (accepted + bonus)")
    ax.set_ylabel("fraction of row-rounds")
    ax.set_title(f"(a) accepted-length histogram, batch {smallest}")
    ax.legend(fontsize=7)


def _plot_speedups(ax, results: list, colors: dict) -> None:
    cells = list(dict.fromkeys((r["workload"], r["batch_size"]) for r in results))
    systems = [s for s in dict.fromkeys(r["system"] for r in results) if s != "ar"]
    by_key = {(r["workload"], r["batch_size"], r["system"]): r for r in results}
    width = 0.8 / max(len(systems), 1)
    for j, system in enumerate(systems):
        xs, ys, medians = [], [], []
        for i, (wl, bs) in enumerate(cells):
            r = by_key.get((wl, bs, system))
            x = i + (j - (len(systems) - 1) / 2) * width
            if r is None or r["speedup_vs_ar"] is None:
                status = "n/a" if r is None else r["status"].split(":")[0]
                ax.text(x, 0.02, status, rotation=90, ha="center", va="bottom", fontsize=7, color="gray")
                continue
            xs.append(x)
            ys.append(r["speedup_vs_ar"])
            medians.append(r["speedup_median"])
        bars = ax.bar(xs, ys, width=width, label=system, color=colors[system])
        ax.bar_label(bars, fmt="%.2f", fontsize=7, padding=6)
        ax.scatter(xs, medians, marker="D", s=12, color="black", zorder=3,
                   label="median of per-batch ratios" if j == 0 else None)
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--", label="AR = 1")
    ax.set_xticks(range(len(cells)), [f"{wl}\nbatch {bs}" for wl, bs in cells])
    ax.set_ylabel("wall-clock speedup vs AR (same run)")
    ax.set_title("(b) speedup over plain greedy generate")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.3)  # room for the legend above the bars
    ax.legend(fontsize=7, loc="upper right", ncols=2)
