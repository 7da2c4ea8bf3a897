"""The ``charts`` workload: bar, line and pie charts with copy, grounded and caption questions.

Why: GLANCE measures speculative decoding in three regimes that differ in how much of the answer is in the
image: ``"copy"`` (the answer is text printed in the chart: its title, an axis label, the legend),
``"grounded"`` (a short answer read off the chart: the value printed on a bar, the largest category) and
``"caption"`` (a templated description, only partly predictable from the pixels). Charts are drawn with
Pillow from seeded data with real-looking labels (months, years, countries, products), every value is
printed on its bar, point or slice so grounded answers are readable, and maxima and minima are unique so
every answer is unambiguous.

Example:
    >>> w = ChartsWorkload()
    >>> ex = w.example("train", 0)
    >>> ex.images[0].size, ex.meta["regime"] in REGIMES, ex.meta["chart_type"] in CHART_TYPES
    ((336, 280), True, True)
"""

from __future__ import annotations

import math
import random

import numpy as np
from PIL import Image

from mmspec.errors import InvalidInputError
from mmspec.workloads import Example

from mmspec.workloads import SeededWorkload
from .bundled import bundled_eagle, bundled_target
from .render import PALETTE, Canvas, augment, font_families, get_font, line_height, text_width
from .text import CITIES, COUNTRIES, MONTHS_SHORT, WEEKDAYS_SHORT

__all__ = ["ChartsWorkload", "CHART_TYPES", "REGIMES"]

CHART_TYPES = ("bar", "line", "pie")
REGIMES = ("copy", "grounded", "caption")

# dimension: (x-axis label, singular, plural, kind); kind "time" dims are ordered (lines use only these)
_DIMS = {
    "month": ("Month", "month", "months", "time"),
    "year": ("Year", "year", "years", "time"),
    "quarter": ("Quarter", "quarter", "quarters", "time"),
    "weekday": ("Day", "day", "days", "time"),
    "country": ("Country", "country", "countries", "cat"),
    "city": ("City", "city", "cities", "cat"),
    "product": ("Product", "product", "products", "cat"),
    "fruit": ("Fruit", "fruit", "fruits", "cat"),
    "department": ("Department", "department", "departments", "cat"),
    "brand": ("Brand", "brand", "brands", "cat"),
    "channel": ("Channel", "channel", "channels", "cat"),
    "team": ("Team", "team", "teams", "cat"),
}
_FRUITS = ["Apples", "Pears", "Plums", "Grapes", "Lemons", "Mangos", "Kiwis", "Cherries", "Peaches", "Melons"]
_DEPTS = ["Sales", "HR", "IT", "Legal", "R&D", "Finance", "Support", "Design"]
_BRANDS = ["Acme", "Nova", "Orbit", "Zenit", "Vela", "Lumo", "Kora", "Brio", "Tesla", "Pico"]
_CHANNELS = ["Online", "Retail", "Phone", "Partners", "Catalog", "Events"]
_SHORT_COUNTRIES = [c for c in COUNTRIES if len(c) <= 7]

# metric: (name, unit label, lo, hi, decimals)
_METRICS = [
    ("Sales", "units", 20, 240, 0),
    ("Revenue", "$ thousands", 12, 95, 0),
    ("Visitors", "thousands", 1.0, 48.0, 1),
    ("Rainfall", "mm", 8, 160, 0),
    ("Temperature", "C", 2.0, 34.0, 1),
    ("Exports", "$ billions", 1.0, 19.5, 1),
    ("Students", "count", 120, 880, 0),
    ("Downloads", "thousands", 5, 99, 0),
    ("Orders", "count", 30, 450, 0),
    ("Profit", "$ millions", 1.0, 12.0, 1),
    ("Energy use", "MWh", 40, 300, 0),
    ("Patients", "count", 15, 220, 0),
]
_PIE_METRICS = ["Market share", "Budget share", "Survey answers", "Sales share", "Votes", "Time spent"]
_SERIES_POOLS = [
    ("year", None), ("pair", ["Online", "Store"]), ("pair", ["Model A", "Model B"]), ("pair", ["North", "South"]),
    ("pair", ["Plan", "Actual"]), ("pair", ["Men", "Women"]), ("city", None),
]

_COPY_PROMPTS = {
    "title": ["What is the title of the chart?", "What is the chart titled?", "Read the title of this chart."],
    "y_label": ["What is the label of the y-axis?", "What does the y-axis measure?"],
    "x_label": ["What is the label of the x-axis?"],
    "legend": ["List the legend entries.", "What are the entries in the legend?"],
    "categories": ["List the categories on the x-axis.", "List the labels along the x-axis, in order."],
}
_CAPTION_PROMPTS = ["Describe this chart.", "Write a short caption for this chart.",
                    "Summarize the chart in one or two sentences."]


def _fmt(v: float, dec: int) -> str:
    return f"{v:.{dec}f}" if dec else str(int(round(v)))


def _join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _nice_step(span: float, n: int = 5) -> float:
    raw = span / n
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if m * mag >= raw:
            return m * mag
    return 10 * mag


class ChartsWorkload(SeededWorkload):
    """Bar, line and pie charts with a question (or caption request) and its reference answer.

    Args:
        width, height: chart size in pixels.
        chart_types: which of :data:`CHART_TYPES` to draw (uniformly).
        regimes: which of :data:`REGIMES` to ask (uniformly); recorded in ``meta["regime"]``.
        max_categories: most categories (bars, points, slices) per chart; fewer are used when labels
            would not fit.
        fonts: ``"auto"``, ``"default"`` or a list of families (as for :class:`DocsWorkload`).
        augment: add faint noise (no rotation or blur: charts are digital).
        char_boxes: record each character's left edge in ``meta["runs"]``.
        seed: mixed into every item's seed.

    ``meta``: ``regime``, ``chart_type``, ``question`` (which kind of question: ``"title"``, ``"value"``,
    ``"argmax"``, ``"caption"``...), ``title``, ``x_label``, ``y_label``, ``categories``, ``series``
    (name -> numbers), ``labels`` (name -> the value strings printed), ``legend``, ``table`` (header and
    rows of strings: the chart's data), ``runs``.

    Example:
        >>> w = ChartsWorkload(chart_types=("pie",), regimes=("grounded",))
        >>> ex = w.example("test", 2)
        >>> ex.meta["chart_type"], ex.meta["regime"]
        ('pie', 'grounded')
    """

    name = "testbed-charts"
    seed_key = "charts"

    def bundled_model(self):
        return bundled_target()

    def bundled_drafters(self):
        path = bundled_eagle()
        return [f"eagle:{path}"] if path and self.bundled_model() else []

    def __init__(self, width: int = 336, height: int = 280, *, chart_types=CHART_TYPES, regimes=REGIMES,
                 max_categories: int = 7, fonts="auto", augment: bool = True, char_boxes: bool = False,
                 seed: int = 0):
        if width < 224 or height < 168:
            raise InvalidInputError(f"chart too small ({width}x{height}); use at least 224x168")
        for name, got, allowed in (("chart_types", chart_types, CHART_TYPES), ("regimes", regimes, REGIMES)):
            if not got or set(got) - set(allowed):
                raise InvalidInputError(f"{name} must be a non-empty subset of {allowed}, got {got}")
        if not 3 <= max_categories <= 12:
            raise InvalidInputError(f"max_categories must be in 3..12, got {max_categories}")
        self.width, self.height = int(width), int(height)
        self.chart_types, self.regimes = tuple(chart_types), tuple(regimes)
        self.max_categories = int(max_categories)
        have = font_families()
        fams = have if fonts == "auto" else [f for f in ([fonts] if isinstance(fonts, str) else fonts) if f in have]
        # monospace is too wide for tick labels at this size
        self.fonts = [f for f in fams if "mono" not in f] or ["default"]
        self.augment, self.char_boxes, self.seed = augment, char_boxes, int(seed)

    # ------------------------------------------------------------------ data
    def _categories(self, rng: random.Random, dim: str, n: int) -> list[str]:
        if dim == "month":
            s = rng.randint(0, 12 - n)
            return MONTHS_SHORT[s:s + n]
        if dim == "year":
            s = rng.randint(2008, 2024 - n)
            return [str(s + i) for i in range(n)]
        if dim == "quarter":
            return [f"Q{i + 1}" for i in range(min(n, 4))]
        if dim == "weekday":
            return WEEKDAYS_SHORT[:n]
        pool = {"country": _SHORT_COUNTRIES, "city": [c for c in CITIES if len(c) <= 7], "fruit": _FRUITS,
                "department": _DEPTS, "brand": _BRANDS, "channel": _CHANNELS,
                "product": [f"{p} {c}" for p in ("Kit",) for c in "ABCDEFGH"],
                "team": [f"Team {c}" for c in "ABCDEFG"]}[dim]
        return rng.sample(pool, min(n, len(pool)))

    def _values(self, rng: random.Random, n: int, lo: float, hi: float, dec: int, trend: bool) -> list[float]:
        scale = 10 ** dec
        while True:
            if trend:  # a random walk: lines look like time series
                v = [rng.uniform(lo, hi)]
                for _ in range(n - 1):
                    v.append(min(hi, max(lo, v[-1] + rng.uniform(-0.3, 0.3) * (hi - lo))))
            else:
                v = [rng.uniform(lo, hi) for _ in range(n)]
            v = [round(x * scale) / scale for x in v]
            if len(set(v)) == n:  # no ties: argmax/argmin answers are unique
                return v

    def _spec(self, rng: random.Random) -> dict:
        ctype = rng.choice(self.chart_types)
        if ctype == "pie":
            dim = rng.choice(["country", "fruit", "department", "brand", "channel", "team", "city"])
            n = rng.randint(3, min(6, self.max_categories))
            cats = self._categories(rng, dim, n)
            while True:
                w = [rng.uniform(0.5, 3.0) for _ in cats]
                raw = [100 * x / sum(w) for x in w]
                pct = [int(x) for x in raw]
                order = sorted(range(n), key=lambda i: raw[i] - pct[i], reverse=True)
                for i in order[: 100 - sum(pct)]:
                    pct[i] += 1
                if min(pct) >= 8 and len(set(pct)) == n:
                    break
            metric = rng.choice(_PIE_METRICS)
            year = rng.randint(2010, 2024)
            title = rng.choice([f"{metric} by {_DIMS[dim][1]}", f"{metric}, {year}",
                                f"{metric} by {_DIMS[dim][1]} in {year}"])
            return {"chart_type": "pie", "dim": dim, "categories": cats, "series": {metric: pct}, "dec": 0,
                    "metric": metric, "unit": "%", "title": title, "x_label": "", "y_label": "",
                    "labels": {metric: [f"{p}%" for p in pct]}, "legend": list(cats)}
        if ctype == "line":
            dim = rng.choice(["month", "month", "year", "year", "quarter", "weekday"])
        else:
            dim = rng.choice(list(_DIMS))
        metric, unit, lo, hi, dec = rng.choice(_METRICS)
        multi = rng.random() < 0.35
        n_max = self.max_categories if not multi else min(self.max_categories, 6 if ctype == "line" else 5)
        cap = {"quarter": 4, "weekday": 7}.get(dim, 12)
        n = rng.randint(3, max(3, min(n_max, cap)))
        cats = self._categories(rng, dim, n)
        n = len(cats)
        if multi:
            kind, pool = rng.choice(_SERIES_POOLS)
            if kind == "year":
                y = rng.randint(2012, 2023)
                names = [str(y), str(y + 1)]
            elif kind == "city":
                names = rng.sample([c for c in CITIES if len(c) <= 7], 2)
            else:
                names = list(pool)
            if dim == "year" and kind == "year":
                names = ["Online", "Store"]
        else:
            names = [metric]
        series = {s: self._values(rng, n, lo, hi, dec, ctype == "line") for s in names}
        if multi:  # per category, the two series differ (so "which is higher" has an answer)
            a, b = names
            series[b] = [y if y != x else round(y + 10 ** -dec, dec) for x, y in zip(series[a], series[b])]
        where = rng.choice(CITIES + COUNTRIES)
        dname = _DIMS[dim]
        if dname[3] == "time" and dim != "year":
            title = rng.choice([f"{metric} by {dname[1]}", f"{metric} in {where}, {rng.randint(2010, 2024)}",
                                f"{dname[1].capitalize()}ly {metric.lower()}" if dim in ("month", "quarter") else
                                f"{metric} per {dname[1]}"])
        else:
            title = rng.choice([f"{metric} by {dname[1]}", f"{metric} per {dname[1]}",
                                f"{metric} in {where}" if dim == "year" else f"{metric} by {dname[1]}, {rng.randint(2010, 2024)}"])
        return {"chart_type": ctype, "dim": dim, "categories": cats, "series": series, "dec": dec,
                "metric": metric, "unit": unit, "title": title, "x_label": dname[0],
                "y_label": f"{metric} ({unit})", "labels": {s: [_fmt(v, dec) for v in vs] for s, vs in series.items()},
                "legend": names if multi else []}

    # ------------------------------------------------------------------ questions
    def _question(self, rng: random.Random, spec: dict, regime: str) -> tuple[str, str, str]:
        cats, series, labels = spec["categories"], spec["series"], spec["labels"]
        names = list(series)
        dim = _DIMS[spec["dim"]]
        ct = spec["chart_type"]
        if regime == "copy":
            kinds = ["title", "title", "legend"] if ct == "pie" else ["title", "title", "y_label", "x_label", "categories"]
            if spec["legend"] and ct != "pie":
                kinds.append("legend")
            q = rng.choice(kinds)
            ans = {"title": spec["title"], "y_label": spec["y_label"], "x_label": spec["x_label"],
                   "legend": ", ".join(spec["legend"]), "categories": ", ".join(cats)}[q]
            return q, rng.choice(_COPY_PROMPTS[q]), ans
        if regime == "grounded":
            s = rng.choice(names)
            vals = series[s]
            i = rng.randrange(len(cats))
            q = rng.choice(["value", "value", "argmax", "argmin", "max"])
            imax, imin = vals.index(max(vals)), vals.index(min(vals))
            if ct == "pie":
                prompt = {"value": f"What percentage does {cats[i]} have?",
                          "argmax": rng.choice(["Which slice is the largest?", f"Which {dim[1]} has the largest share?"]),
                          "argmin": rng.choice(["Which slice is the smallest?", f"Which {dim[1]} has the smallest share?"]),
                          "max": "What is the largest percentage in the chart?"}[q]
            elif len(names) == 1:
                prompt = {"value": rng.choice([f"What is the value for {cats[i]}?", f"What is the value of {cats[i]}?"]),
                          "argmax": rng.choice([f"Which {dim[1]} has the highest value?", "Which category is largest?"]),
                          "argmin": rng.choice([f"Which {dim[1]} has the lowest value?", "Which category is smallest?"]),
                          "max": "What is the highest value in the chart?"}[q]
            else:
                prompt = {"value": f"What is the value of {s} in {cats[i]}?",
                          "argmax": f"In which {dim[1]} is {s} highest?",
                          "argmin": f"In which {dim[1]} is {s} lowest?",
                          "max": f"What is the highest value of {s}?"}[q]
            ans = {"value": labels[s][i], "argmax": cats[imax], "argmin": cats[imin], "max": labels[s][imax]}[q]
            return q, prompt, ans
        return "caption", rng.choice(_CAPTION_PROMPTS), self._caption(rng, spec)

    def _caption(self, rng: random.Random, spec: dict) -> str:
        cats, series, labels = spec["categories"], spec["series"], spec["labels"]
        names = list(series)
        dim = _DIMS[spec["dim"]]
        ct, title, n = spec["chart_type"], spec["title"], len(cats)
        span = f"from {cats[0]} to {cats[-1]}" if dim[3] == "time" else f"for {_join(cats)}" if n <= 4 else \
            f"for {n} {dim[2]}"
        s = names[0]
        v, lab = series[s], labels[s]
        imax, imin = v.index(max(v)), v.index(min(v))
        if ct == "pie":
            first = rng.choice([f'A pie chart titled "{title}" showing {spec["metric"].lower()} across {n} {dim[2]}.',
                                f"This pie chart splits {spec['metric'].lower()} between {_join(cats)}."])
            return (f"{first} {cats[imax]} has the largest share ({lab[imax]}) and {cats[imin]} the smallest "
                    f"({lab[imin]}).")
        noun = {"bar": "bar chart", "line": "line chart"}[ct]
        if len(names) > 1:
            a, b = names
            k = sum(x > y for x, y in zip(series[a], series[b]))
            lead, cnt = (a, k) if k >= n - k else (b, n - k)
            first = rng.choice([f'A grouped {noun} titled "{title}" comparing {a} and {b} {span}.',
                                f"This {noun} compares {spec['metric'].lower()} for {a} and {b} {span}."])
            return f"{first} {lead} is higher in {cnt} of the {n} {dim[2]}."
        first = rng.choice([f'A {noun} titled "{title}" showing {spec["metric"].lower()} {span}.',
                            f"This {noun} shows {spec['y_label'].lower()} {span}."])
        if ct == "line":
            d = v[-1] - v[0]
            rel = abs(d) / (max(v) - min(v))
            trend = "stays roughly flat overall" if rel < 0.15 else ("rises overall" if d > 0 else "falls overall")
            return f"{first} It {trend}, peaking at {lab[imax]} in {cats[imax]}."
        return (f"{first} The highest value is {lab[imax]} in {cats[imax]} and the lowest is {lab[imin]} "
                f"in {cats[imin]}.")

    # ------------------------------------------------------------------ generation
    def generate(self, rng: random.Random, nrng: np.random.Generator, split: str, index: int,
                 draw: bool = True) -> Example:
        spec = self._spec(rng)
        fam = rng.choice(self.fonts)
        style = {"family": fam, "title": rng.randint(13, 15), "tick": rng.randint(10, 11), "value": 10,
                 "label": rng.randint(11, 12), "colors": rng.sample(range(len(PALETTE)), len(PALETTE)),
                 "grid": rng.random() < 0.6}
        spec = self._fit(spec, style)  # fewer categories if labels would not fit; no pixels drawn yet
        regime = rng.choice(self.regimes)
        q, prompt, answer = self._question(rng, spec, regime)
        n = len(spec["categories"])
        header = [_DIMS[spec["dim"]][0]] + list(spec["series"])
        table = {"header": header, "rows": [[spec["categories"][i]] + [spec["labels"][s][i] for s in spec["series"]]
                                            for i in range(n)]}
        meta = {"regime": regime, "chart_type": spec["chart_type"], "question": q, "title": spec["title"],
                "x_label": spec["x_label"], "y_label": spec["y_label"], "categories": list(spec["categories"]),
                "series": {k: list(v) for k, v in spec["series"].items()}, "labels": spec["labels"],
                "legend": list(spec["legend"]), "unit": spec["unit"], "table": table, "font": fam}
        images = []
        if draw:
            img = Image.new("RGB", (self.width, self.height), (255, 255, 255))
            canvas = Canvas(img, char_boxes=self.char_boxes)
            if spec["chart_type"] == "pie":
                self._draw_pie(canvas, spec, style)
            else:
                self._draw_xy(canvas, spec, style)
            info = {"rotation": 0.0, "blur": 0.0, "noise": 0.0}
            if self.augment:
                img, info = augment(img, rng, nrng, max_rotation=0.0, max_blur=0.0, max_noise=4.0)
            meta["augment"], meta["runs"] = info, canvas.runs
            images = [img]
        return Example(id="", prompt=prompt, target=answer, images=images, meta=meta)

    # ------------------------------------------------------------------ layout and drawing
    def _fit(self, spec: dict, style: dict) -> dict:
        """Drop trailing categories until every tick and value label fits its slot (before any question)."""
        if spec["chart_type"] == "pie":
            return spec
        tick = get_font(style["family"], style["tick"])
        val = get_font(style["family"], style["value"])
        plot_w = self.width - 75
        ns = len(spec["series"])
        n = len(spec["categories"])
        while n > 3:
            slot = plot_w / n
            need_tick = max(text_width(tick, c) for c in spec["categories"][:n]) + 4
            need_val = max(text_width(val, lab) for labs in spec["labels"].values() for lab in labs[:n]) + 2
            val_room = slot * 0.7 / ns + 4 if spec["chart_type"] == "bar" else slot - 2
            if need_tick <= slot and need_val <= val_room:
                break
            n -= 1
        if n == len(spec["categories"]):
            return spec
        return dict(spec, categories=spec["categories"][:n],
                    series={k: v[:n] for k, v in spec["series"].items()},
                    labels={k: v[:n] for k, v in spec["labels"].items()})

    def _plot_frame(self, c: Canvas, spec: dict, style: dict):
        fam = style["family"]
        tf, lf = get_font(fam, style["title"], bold=True), get_font(fam, style["label"])
        kf = get_font(fam, style["tick"])
        W = self.width
        m = 8
        c.text((W - text_width(tf, spec["title"])) / 2, m, spec["title"], tf)
        top = m + line_height(tf) + 8
        if spec["legend"] and spec["chart_type"] != "pie":  # a pie's legend sits beside it
            x = (W - sum(text_width(lf, s) + 26 for s in spec["legend"])) / 2
            for k, s in enumerate(spec["legend"]):
                col = PALETTE[style["colors"][k]]
                if spec["chart_type"] == "line":
                    c.draw.line([x, top + 7, x + 14, top + 7], fill=col, width=2)
                else:
                    c.draw.rectangle([x + 2, top + 2, x + 12, top + 12], fill=col)
                c.text(x + 17, top, s, lf)
                x += text_width(lf, s) + 26
            top += line_height(lf) + 6
        return tf, lf, kf, top

    def _draw_xy(self, c: Canvas, spec: dict, style: dict) -> None:
        W, H = self.width, self.height
        tf, lf, kf, top = self._plot_frame(c, spec, style)
        vf = get_font(style["family"], style["value"])
        cats, series, labels = spec["categories"], spec["series"], spec["labels"]
        n, names = len(cats), list(series)
        vmax = max(max(v) for v in series.values())
        step = _nice_step(vmax, 5)
        vh = line_height(vf) + 3
        bottom = H - 8 - line_height(lf) - 6 - line_height(kf) - 6
        # y range: 0 .. ymax with room above the tallest value for its label
        ymax = step * math.ceil(vmax / step)
        while (ymax - vmax) / ymax * (bottom - top) < vh:
            ymax += step
        tick_dec = 0 if float(step).is_integer() else (1 if float(step * 10).is_integer() else 2)
        ticks = [_fmt(step * k, tick_dec) for k in range(int(round(ymax / step)) + 1)]
        ylab_w = line_height(lf)
        left = 8 + ylab_w + 6 + max(text_width(kf, t) for t in ticks) + 5
        right = W - 10
        ph = bottom - top

        def ypix(v):
            return bottom - v / ymax * ph

        axis = (60, 60, 60)
        for k, t in enumerate(ticks):
            y = ypix(step * k)
            if style["grid"] and k:
                c.draw.line([left, y, right, y], fill=(225, 225, 225))
            c.draw.line([left - 3, y, left, y], fill=axis)
            c.text(left - 5 - text_width(kf, t), y - line_height(kf) / 2, t, kf)
        c.draw.line([left, top, left, bottom], fill=axis)
        c.draw.line([left, bottom, right, bottom], fill=axis)
        c.rotated_text(8 + ylab_w / 2, (top + bottom) / 2, spec["y_label"], lf)
        c.text((left + right - text_width(lf, spec["x_label"])) / 2, H - 8 - line_height(lf), spec["x_label"], lf)
        slot = (right - left) / n
        for i, cat in enumerate(cats):
            cx = left + slot * (i + 0.5)
            c.text(cx - text_width(kf, cat) / 2, bottom + 5, cat, kf)
        if spec["chart_type"] == "bar":
            bw = slot * 0.7 / len(names)
            for k, s in enumerate(names):
                col = PALETTE[style["colors"][k]]
                for i, v in enumerate(series[s]):
                    x0 = left + slot * i + slot * 0.15 + k * bw
                    y0 = ypix(v)
                    c.draw.rectangle([x0, y0, x0 + bw - 1, bottom - 1], fill=col)
                    lab = labels[s][i]
                    c.text(x0 + (bw - text_width(vf, lab)) / 2, y0 - vh, lab, vf, fill=(30, 30, 30))
            return
        for k, s in enumerate(names):  # line
            col = PALETTE[style["colors"][k]]
            pts = [(left + slot * (i + 0.5), ypix(v)) for i, v in enumerate(series[s])]
            c.draw.line(pts, fill=col, width=2)
            for x, y in pts:
                c.draw.ellipse([x - 3, y - 3, x + 3, y + 3], fill=col)
        for k, s in enumerate(names):
            vals = series[s]
            for i, v in enumerate(vals):
                x, y = left + slot * (i + 0.5), ypix(v)
                if len(names) > 1:
                    other = series[names[1 - k]][i]
                    above = v > other
                else:
                    nb = [vals[j] for j in (i - 1, i + 1) if 0 <= j < n]
                    above = v >= sum(nb) / len(nb)
                if not above and y + 5 + vh > bottom:
                    above = True
                if above and y - 5 - vh < top - vh + 2 and len(names) == 1:
                    above = False
                lab = labels[s][i]
                ly = y - 4 - vh if above else y + 5
                c.text(x - text_width(vf, lab) / 2, ly, lab, vf, fill=(30, 30, 30))

    def _draw_pie(self, c: Canvas, spec: dict, style: dict) -> None:
        W, H = self.width, self.height
        tf, lf, kf, top = self._plot_frame(c, spec, style)
        vf = get_font(style["family"], style["tick"])
        cats = spec["categories"]
        pct = spec["series"][spec["metric"]]
        labs = spec["labels"][spec["metric"]]
        legend_w = max(text_width(lf, s) for s in cats) + 24
        d = int(min(H - top - 10, W - legend_w - 30))
        cx, cy = 10 + (W - legend_w - 20) / 2, top + (H - top - 4) / 2
        r = d / 2
        a0 = -90.0
        mids = []
        for k, p in enumerate(pct):
            a1 = a0 + 360.0 * p / 100
            col = PALETTE[style["colors"][k]]
            c.draw.pieslice([cx - r, cy - r, cx + r, cy + r], a0, a1, fill=col, outline=(255, 255, 255))
            mids.append(((a0 + a1) / 2, col))
            a0 = a1
        for (mid, col), lab in zip(mids, labs):
            t = math.radians(mid)
            x, y = cx + 0.64 * r * math.cos(t), cy + 0.64 * r * math.sin(t)
            lum = 0.299 * col[0] + 0.587 * col[1] + 0.114 * col[2]
            c.text(x - text_width(vf, lab) / 2, y - line_height(vf) / 2, lab, vf,
                   fill=(255, 255, 255) if lum < 150 else (0, 0, 0))
        lx = W - legend_w - 4
        lh = line_height(lf) + 6
        ly = cy - lh * len(cats) / 2
        for k, s in enumerate(cats):
            col = PALETTE[style["colors"][k]]
            c.draw.rectangle([lx, ly + 2, lx + 11, ly + 13], fill=col)
            c.text(lx + 17, ly, s, lf)
            ly += lh
