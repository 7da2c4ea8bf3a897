"""Pages for the reader: seeded Markdown documents and charts, typeset token by token (:mod:`.typeset`).

Why: the reader's front end is trained, and the reader measured, on pages whose Markdown is known and
whose every token box is known at render time. Content comes from three offline sources, each split into
train and test parts so that test pages hold text the front end never saw: the docs workload's templated
business English (:class:`~mmspec.vision.workloads.text.TextGen`), English prose from Python's own
documentation (``pydoc_data.topics``, paragraphs split 80/20 by a hash), and, in training only, lines of
random vocabulary words so that every common token is seen in several fonts. Held-out pages
(``words="heldout"``) are made of names and numbers built from syllables no training page uses.

Layouts: headings (``#``, ``##``), paragraphs, ``-`` and ``1.`` lists, pipe tables, one-line formulas; one or
two columns (two under a full-width title); blocks optionally framed by a drawn box; six font families
(DejaVu Sans / Serif / Mono / condensed, Pillow's own), body sizes 14-20 px, tinted paper, blur and noise.
Charts are horizontal bar charts whose category labels and values are drawn beside the bars; their
reference is the chart's table in Markdown.

Example:
    >>> import random
    >>> spec = page_spec(random.Random(0), "train")
    >>> sorted(spec)
    ['blocks', 'boxed', 'columns', 'title']
"""

from __future__ import annotations

import functools
import hashlib
import random
import re

import numpy as np
from PIL import Image, ImageDraw

from ..workloads.render import font_families, get_font, line_height
from ..workloads.text import TextGen
from .typeset import Line, Page, Style, Typesetter, degrade, font_em

__all__ = ["page_spec", "chart_spec", "render_page", "render_chart", "block_source_lines", "prose_paragraphs",
           "HeldoutTextGen", "FAMILIES"]

FAMILIES = ("dejavu-sans", "dejavu-serif", "dejavu-sans-condensed", "dejavu-serif-condensed",
            "default")
"""Font families pages are drawn in (those missing on a machine fall back to Pillow's bundled font)."""

_SYLLABLES_TRAIN = ("ka", "lo", "mi", "ren", "sa", "tor", "vel", "an", "ber", "cor", "dan", "el", "fin", "gar")
_SYLLABLES_HELDOUT = ("zu", "qix", "vyr", "oth", "pha", "wex", "jub", "kly", "dro", "ngu", "sve", "tza", "yml",
                      "hux")


@functools.lru_cache(maxsize=1)
def _prose() -> tuple[tuple, tuple]:
    """English paragraphs from Python's documentation topics, split train/test by a hash of their text."""
    try:
        from pydoc_data.topics import topics
    except ImportError:  # a Python built without its docs: templated text only
        return (), ()
    train, test = [], []
    for key in sorted(topics):
        for p in re.split(r"\n\s*\n", topics[key]):
            p = " ".join(p.split())
            if len(p) < 80 or not p.isascii() or sum(c.isalpha() or c == " " for c in p) < 0.88 * len(p):
                continue
            (test if hashlib.sha1(p.encode()).digest()[0] < 52 else train).append(p)
    return tuple(train), tuple(test)


def prose_paragraphs(split: str) -> tuple:
    """The documentation paragraphs of ``split`` (``"train"`` or ``"test"``).

    Example:
        >>> set(prose_paragraphs("train")).isdisjoint(prose_paragraphs("test"))
        True
    """
    train, test = _prose()
    return train if split == "train" else test


@functools.lru_cache(maxsize=4)
def _vocab_words(tokenizer) -> tuple:
    """Word-like tokens of the tokenizer (a space and 2+ letters), for random-vocabulary training lines."""
    out = []
    for i in range(tokenizer.vocab_size if hasattr(tokenizer, "vocab_size") else len(tokenizer)):
        s = tokenizer.decode([i])
        if len(s) >= 3 and s[0] == " " and s[1:].isalpha() and s[1:].isascii():
            out.append(s[1:])
    return tuple(out)


class HeldoutTextGen(TextGen):
    """:class:`TextGen` whose names, places and numbers are built from syllables and digit patterns no training
    page uses: the same sentence frames, words the front end cannot have memorised as wholes.

    Example:
        >>> g = HeldoutTextGen(random.Random(0))
        >>> g.name() != HeldoutTextGen(random.Random(1)).name()
        True
    """

    def _word(self, n_min=2, n_max=3) -> str:
        return "".join(self.pick(_SYLLABLES_HELDOUT) for _ in range(self.rng.randint(n_min, n_max))).capitalize()

    def name(self) -> str:
        return f"{self._word()} {self._word(2, 4)}"

    def number(self, lo: int = 2, hi: int = 950) -> str:
        return str(self.rng.randint(10_001, 99_999))

    def year(self) -> int:
        return self.rng.randint(2031, 2099)

    def sentence(self) -> str:
        s = super().sentence()
        # every capitalised word that is not the first becomes an invented one
        words = s.split(" ")
        return " ".join([words[0]] + [self._word() if w[:1].isupper() and w[1:].isalpha() else w for w in words[1:]])


def _gen(rng: random.Random, words: str) -> TextGen:
    return HeldoutTextGen(rng) if words == "heldout" else TextGen(rng)


def _paragraph(rng: random.Random, split: str, words: str, g: TextGen, vocab=None) -> str:
    r = rng.random()
    prose = prose_paragraphs(split)
    if words == "heldout":
        return g.paragraph(1, 3)
    if r < 0.4 and prose:
        p = prose[rng.randrange(len(prose))]
        sents = re.split(r"(?<=[.!?]) ", p)
        k = rng.randint(1, min(3, len(sents)))
        s0 = rng.randrange(len(sents) - k + 1)
        return " ".join(sents[s0:s0 + k])
    if r < 0.55 and vocab:
        n = rng.randint(8, 30)
        ws = [vocab[rng.randrange(len(vocab))] for _ in range(n)]
        if rng.random() < 0.5:
            ws[0] = ws[0].capitalize()
        return " ".join(ws) + rng.choice([".", ".", ",", ";", ":", "!", "?", ""])
    return g.paragraph(1, 3)


def page_spec(rng: random.Random, split: str, *, words: str = "normal", tokenizer=None, max_blocks: int = 4) -> dict:
    """The content and layout choices of one page: ``{"title", "blocks", "columns", "boxed"}``.

    ``words="heldout"`` draws names and numbers from :class:`HeldoutTextGen`; ``tokenizer`` (training only)
    allows random-vocabulary paragraphs.

    Example:
        >>> page_spec(random.Random(3), "test")["columns"] in (1, 2)
        True
    """
    g = _gen(rng, words)
    vocab = _vocab_words(tokenizer) if tokenizer is not None and split == "train" else None
    columns = 2 if rng.random() < 0.25 else 1
    title = g.heading(1) if rng.random() < 0.75 else None
    blocks = []
    for _ in range(rng.randint(2, max_blocks)):
        r = rng.random()
        if r < 0.18:
            blocks.append({"type": "heading", "level": 2, "text": g.heading(2)})
        if r < 0.55:
            blocks.append({"type": "paragraph", "text": _paragraph(rng, split, words, g, vocab)})
        elif r < 0.7:
            blocks.append({"type": "bullets", "items": [g.list_item() for _ in range(rng.randint(2, 4))]})
        elif r < 0.8:
            blocks.append({"type": "numbered", "items": [g.list_item() for _ in range(rng.randint(2, 4))]})
        elif r < 0.93:
            header, rows = g.table(rng.randint(2, 4), rng.choice([2, 3]) if columns == 2 else None)
            blocks.append({"type": "table", "header": header, "rows": rows})
        else:
            blocks.append({"type": "formula", "text": g.formula()})
    boxed = [rng.random() < 0.15 for _ in blocks]
    return {"title": title, "blocks": blocks, "columns": columns, "boxed": boxed}


def block_source_lines(block: dict) -> list[str]:
    """A block's Markdown source lines before wrapping (a table row or a list item per line).

    Example:
        >>> block_source_lines({"type": "table", "header": ["a", "b"], "rows": [["1", "2"]]})
        ['| a | b |', '|---|---|', '| 1 | 2 |']
    """
    t = block["type"]
    if t == "heading":
        return ["#" * block["level"] + " " + block["text"]]
    if t in ("paragraph", "formula"):
        return [block["text"]]
    if t == "bullets":
        return [f"- {x}" for x in block["items"]]
    if t == "numbered":
        return [f"{i}. {x}" for i, x in enumerate(block["items"], 1)]
    if t == "table":
        rows = [block["header"], ["---"] * len(block["header"])] + block["rows"]
        return ["|---" * len(block["header"]) + "|" if r == ["---"] * len(block["header"])
                else "| " + " | ".join(r) + " |" for r in rows]
    raise ValueError(f"unknown block type {t!r}")


class _Laid:
    def __init__(self, lines, height, source):
        self.lines, self.height, self.source = lines, height, source  # lines: [(text, font, em, dy)]


def _lay_block(ts: Typesetter, block: dict, st: Style, width: float) -> _Laid | None:
    """Wrap a block into typeset lines at ``width``; ``None`` if something does not fit or cannot be boxed."""
    if block["type"] == "heading":
        size = round(st.size * (1.5 if block["level"] == 1 else 1.2))
        font, bold = get_font(st.family, size, bold=True), True
    else:
        font, bold = get_font(st.family, st.size), False
    em = font_em(font)
    lh = line_height(font)
    out, y, source = [], 0, []
    for src in block_source_lines(block):
        if block["type"] == "table":
            wrapped = ts.wrap(src, font, em, width)
            if wrapped is None or len(wrapped) != 1:  # a table row never wraps
                return None
        else:
            wrapped = ts.wrap(src, font, em, width)
            if wrapped is None:
                return None
        for w in wrapped:
            out.append((w, font, em, y))
            source.append(w)
            y += lh + max(3, round(0.35 * em))
    return _Laid(out, y, "\n".join(source))


def render_page(ts: Typesetter, rng: random.Random, nrng: np.random.Generator, spec: dict, *,
                width: int | None = None, family: str | None = None, size: int | None = None,
                clean: bool = False) -> Page | None:
    """Typeset and draw ``spec`` (:func:`page_spec`); ``None`` if it does not fit (the caller draws another).

    The Markdown is the blocks' hard-wrapped source joined by blank lines, in reading order (title, then the
    left column, then the right one). ``clean`` skips the paper tint, blur and noise.

    Example:
        >>> page = render_page(ts, random.Random(0), np.random.default_rng(0), spec)     # doctest: +SKIP
        >>> page.markdown.splitlines()[0], len(page.lines)                             # doctest: +SKIP
    """
    fams = [f for f in FAMILIES if f in font_families()] or ["default"]
    family = family or fams[rng.randrange(len(fams))]
    size = size or rng.randint(14, 20)
    paper = (255, 255, 255) if clean or rng.random() < 0.5 else tuple(rng.randint(228, 255) for _ in range(3))
    ink = (0, 0, 0) if clean or rng.random() < 0.6 else tuple(rng.randint(0, 70) for _ in range(3))
    st = Style(family, size, ink, paper)
    columns = spec["columns"]
    margin = round(1.6 * size)
    width = width or rng.randint(34, 46) * size if columns == 1 else rng.randint(52, 64) * size
    gutter = round(3.5 * size)
    inner = width - 2 * margin
    col_w = inner if columns == 1 else (inner - gutter) / 2
    pad = round(1.0 * size)  # a framed block's padding: a frame's sides are >= 3 em (42 px) tall

    title = _lay_block(ts, {"type": "heading", "level": 1, "text": spec["title"]}, st, inner) if spec["title"] else None
    if spec["title"] and title is None:
        return None
    laid = []
    for block, boxed in zip(spec["blocks"], spec["boxed"]):
        lb = _lay_block(ts, block, st, col_w - (2 * pad if boxed else 0))
        if lb is None:
            return None
        laid.append((lb, boxed))
    # columns: fill the left one to about half the total height, the rest goes right
    heights = [lb.height + (2 * pad if boxed else 0) for lb, boxed in laid]
    cols = [[], []]
    if columns == 2:
        total, acc = sum(heights) + st.block_gap * (len(heights) - 1), 0
        for k, (item, h) in enumerate(zip(laid, heights)):
            side = 0 if (acc + h / 2 <= total / 2 or not cols[0]) else 1
            cols[side].append(item)
            acc += h + st.block_gap
        if not cols[1]:
            return None
    else:
        cols[0] = laid
    y0 = margin
    if title:
        y0 += title.height + st.block_gap
    col_h = [sum(lb.height + (2 * pad if bx else 0) for lb, bx in c) + st.block_gap * max(0, len(c) - 1) for c in cols]
    height = y0 + max(col_h) + margin
    image = Image.new("RGB", (int(width), int(height)), paper)
    draw = ImageDraw.Draw(image)
    lines: list[Line] = []
    sources: list[str] = []

    def put(lb: _Laid, x: float, y: float, boxed: bool, box_w: float):
        if boxed:
            rule = max(2, round(size / 9))  # thick enough to stay one run under blur and noise
            draw.rectangle([round(x), round(y), round(x + box_w), round(y + lb.height - round(0.35 * size) + 2 * pad)],
                           outline=st.ink, width=rule)
            x, y = x + pad, y + pad
        first = True
        for text, font, em, dy in lb.lines:
            line = ts.draw_line(draw, x, y + dy, text, font, em, st.ink)
            line.blank_before = 1 if (first and lines) else 0
            first = False
            lines.append(line)
        sources.append(lb.source)

    if title:
        put(title, margin, margin, False, inner)
    for c, col in enumerate(cols):
        x = margin + c * (col_w + gutter)
        y = y0
        for lb, boxed in col:
            put(lb, x, y, boxed, col_w)
            y += lb.height + (2 * pad if boxed else 0) + st.block_gap
    markdown = "\n\n".join(sources)
    if not ts.check(markdown, lines):
        return None
    meta = {"family": family, "size": size, "columns": columns, "width": int(width)}
    if not clean:
        image, info = degrade(image, rng, nrng)
        meta.update(info)
    return Page(image, markdown, lines, meta)


# ---------------------------------------------------------------------------------------------- charts
_CHART_TOPICS = (
    ("Visitors by city", "City", "Visitors", "cities"), ("Exports by country", "Country", "Tonnes", "countries"),
    ("Sales by month", "Month", "Units", "months"), ("Orders by product", "Product", "Orders", "products"),
    ("Rainfall by month", "Month", "mm", "months"), ("Staff by team", "Team", "Staff", "teams"),
)
BAR_COLORS = ((31, 60, 120), (60, 60, 60), (120, 30, 30), (20, 90, 40), (180, 200, 230), (205, 205, 205),
              (250, 200, 150), (190, 230, 190))
"""Bar fills far from the ink threshold either way: dark ones are erased as graphics, light ones are paper."""
_TEAMS = ("Sales", "Design", "Finance", "Support", "Research", "Legal", "Logistics", "Marketing", "Quality")


def chart_spec(rng: random.Random, split: str, *, words: str = "normal") -> dict:
    """A horizontal bar chart's content: title, the two column names, and ``(label, value)`` rows.

    Example:
        >>> spec = chart_spec(random.Random(0), "train")
        >>> len(spec["rows"]) >= 3 and all(isinstance(v, int) for _, v in spec["rows"])
        True
    """
    from ..workloads.text import CITIES, COUNTRIES, MONTHS_SHORT

    g = _gen(rng, words)
    title, c0, c1, kind = _CHART_TOPICS[rng.randrange(len(_CHART_TOPICS))]
    n = rng.randint(3, 7)
    if words == "heldout":
        labels = [g._word() for _ in range(n)]
    elif kind == "months":
        m = rng.randint(0, 12 - n)
        labels = list(MONTHS_SHORT[m:m + n])
    else:
        pool = {"cities": CITIES, "countries": COUNTRIES, "teams": _TEAMS,
                "products": [f"Model {c}{d}" for c in "ABCDEFKLMNPRSTX" for d in range(1, 10)]}[kind]
        labels = rng.sample(list(pool), n)
    top = rng.choice([50, 100, 500, 1000, 5000, 20000])
    values = [rng.randint(max(1, top // 20), top) for _ in range(n)]
    return {"title": title, "columns": (c0, c1), "rows": list(zip(labels, values))}


def chart_markdown(spec: dict) -> str:
    """The reference of a chart: its title as a heading, then its table.

    Example:
        >>> print(chart_markdown({"title": "T", "columns": ("a", "b"), "rows": [("x", 3)]}))
        ## T
        <BLANKLINE>
        | a | b |
        |---|---|
        | x | 3 |
    """
    rows = [f"| {spec['columns'][0]} | {spec['columns'][1]} |", "|---|---|"]
    rows += [f"| {label} | {value} |" for label, value in spec["rows"]]
    return f"## {spec['title']}\n\n" + "\n".join(rows)


def render_chart(ts: Typesetter, rng: random.Random, nrng: np.random.Generator, spec: dict, *,
                 clean: bool = False) -> Page | None:
    """Draw a horizontal bar chart: the title, a header line naming the two columns, then one row per bar: its
    label, its value, and the bar (at least 50 px long, so the processor erases it as a graphic). The page's
    lines are what a reader sees (title, header, ``label value`` rows); the reference is
    :func:`chart_markdown`, which the reader's LM writes from them.

    Example:
        >>> page = render_chart(ts, random.Random(0), np.random.default_rng(0), chart_spec(random.Random(0), "test"))  # doctest: +SKIP
    """
    fams = [f for f in FAMILIES if f in font_families()] or ["default"]
    family = fams[rng.randrange(len(fams))]
    size = rng.randint(14, 19)
    font, tfont = get_font(family, size), get_font(family, round(size * 1.25), bold=True)
    em, tem = font_em(font), font_em(tfont)
    lh = line_height(font)
    ink = (0, 0, 0) if clean or rng.random() < 0.7 else tuple(rng.randint(0, 60) for _ in range(3))
    paper = (255, 255, 255)
    margin = round(1.5 * size)
    rows = spec["rows"]
    c0, c1 = spec["columns"]

    def width_of(text):
        boxes = ts.boxes_of(ts.encode_line(str(text)))
        return None if boxes is None else ts.line_width(boxes, font, em)

    widths = [width_of(x) for x in [c0] + [lab for lab, _ in rows]]
    vwidths = [width_of(x) for x in [c1] + [v for _, v in rows]]
    if None in widths or None in vwidths:
        return None
    x_val = margin + max(widths) + round(1.5 * em)
    x_bar = x_val + max(vwidths) + round(1.0 * em)
    bar_max = rng.randint(14, 22) * size
    width = int(x_bar + bar_max + margin)
    row_h = lh + round(0.6 * size)
    height = int(margin * 2 + line_height(tfont) + round(1.6 * size) + lh + round(1.6 * size) + len(rows) * row_h)
    image = Image.new("RGB", (width, height), paper)
    draw = ImageDraw.Draw(image)
    lines = []
    y = margin
    lines.append(ts.draw_line(draw, margin, y, spec["title"], tfont, tem, ink))
    y += line_height(tfont) + round(1.6 * size)
    n0 = len(ts.boxes_of(ts.encode_line(c0)))
    lines.append(ts.draw_line(draw, margin, y, f"{c0} {c1}", font, em, ink, jumps={n0: x_val}))
    lines[-1].blank_before = 1
    y += lh + round(1.6 * size)
    top = max(v for _, v in rows)
    color = BAR_COLORS[rng.randrange(len(BAR_COLORS))]
    first = True
    for label, value in rows:
        bw = max(50, round(bar_max * value / top))
        draw.rectangle([x_bar, y + round(0.15 * lh), x_bar + bw, y + lh - round(0.1 * lh)], fill=color)
        n0 = len(ts.boxes_of(ts.encode_line(str(label))))
        lines.append(ts.draw_line(draw, margin, y, f"{label} {value}", font, em, ink, jumps={n0: x_val}))
        lines[-1].blank_before, first = int(first), False
        y += row_h
    markdown = chart_markdown(spec)
    meta = {"family": family, "size": size, "kind": "chart"}
    if not clean:
        image, info = degrade(image, rng, nrng, max_noise=8.0)
        meta.update(info)
    return Page(image, markdown, lines, meta)

