"""The ``testbed-docs`` workload: small document pages (and crops of single blocks) with Markdown transcriptions, read by the 12M testbed target (the reader reads its own pages: :mod:`mmspec.vision.reader.workloads`).

Why: transcription is the "verbatim copy" regime of GLANCE, where a drafter that reads the image should
predict long runs of target tokens. The pages are rendered with Pillow from seeded text (headings,
paragraphs, bulleted and numbered lists, ruled tables, simple formulas) in several fonts and sizes, with
light noise, rotation and blur, and kept small and sparse so that a tiny CPU-trained VLM can learn to read
them. Layout conventions are fixed (left-aligned blocks, one block after another, ``#`` headings bold and
larger, tables fully ruled with a bold header), so the mapping from pixels to Markdown is learnable.

Target conventions: blocks are separated by one blank line; ``# Title`` / ``## Section``; paragraphs on one
line (the page wraps them; the target does not); ``- item`` and ``1. item``; tables as
``| a | b |`` / ``|---|---|`` / rows; formulas as plain text where ``^`` marks the superscript drawn raised
(``E = mc^2``) and fractions are ``x/y``. Targets are ASCII.

Example:
    >>> w = DocsWorkload()
    >>> ex = w.example("train", 0)
    >>> ex.images[0].size, ex.meta["kind"] in ("page", "block"), ex.target.isascii()
    ((336, 448), True, True)
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass

import numpy as np
from PIL import Image

from mmspec.errors import InvalidInputError
from mmspec.workloads import Example

from mmspec.workloads import SeededWorkload
from .bundled import bundled_eagle, bundled_target
from .render import Canvas, augment, font_families, get_font, line_height, text_width, wrap_words
from .text import ScrambledTextGen, TextGen

__all__ = ["DocsWorkload", "block_markdown", "page_markdown", "BLOCK_TYPES", "DENSE_PAGES"]

BLOCK_TYPES = ("paragraph", "bullets", "numbered", "table", "formula")
"""Content block types (headings come on top of these in pages)."""

DENSE_PAGES = dict(width=672, height=448, columns=2, min_blocks=6, max_blocks=9, mode="page")
"""The dense page option (``DocsWorkload(**DENSE_PAGES)``): two columns, each about as wide as a default page's
text, under an optional title spanning both, with more blocks, so that finding the blocks and their reading
order (title, left column top to bottom, then right column) is not trivial. Twice a default page's pixels:
a Qwen2-VL processor capped at 336 x 448 pixels shrinks the whole page, while a crop of one block fits as is."""

PAGE_PROMPTS = (
    "Transcribe this page to Markdown.",
    "Convert the document in the image to Markdown.",
    "Write out the text of this page in Markdown.",
    "Read this page and return its content as Markdown.",
)
BLOCK_PROMPTS = (
    "Transcribe this block to Markdown.",
    "Convert the text in the image to Markdown.",
    "Write out the content of this crop in Markdown.",
    "Read the text in this image and return it as Markdown.",
)

_SUP = re.compile(r"\^(\d+|[A-Za-z])")
_NUMERIC = re.compile(r"^[-+$]?\d[\d,.]*\s?(%|k|t|C|mm|M)?$")


def block_markdown(block: dict) -> str:
    """The Markdown of one block dict (as found in ``Example.meta["blocks"]``).

    Example:
        >>> print(block_markdown({"type": "table", "header": ["a", "b"], "rows": [["1", "2"]]}))
        | a | b |
        |---|---|
        | 1 | 2 |
    """
    t = block["type"]
    if t == "heading":
        return "#" * block["level"] + " " + block["text"]
    if t in ("paragraph", "formula"):
        return block["text"]
    if t == "bullets":
        return "\n".join("- " + it for it in block["items"])
    if t == "numbered":
        return "\n".join(f"{k}. {it}" for k, it in enumerate(block["items"], 1))
    if t == "table":
        lines = ["| " + " | ".join(block["header"]) + " |", "|" + "|".join("---" for _ in block["header"]) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in block["rows"]]
        return "\n".join(lines)
    raise InvalidInputError(f"unknown block type {t!r}")


def page_markdown(blocks: list[dict]) -> str:
    """Blocks' Markdown joined by blank lines (the target of a page).

    Example:
        >>> page_markdown([{"type": "heading", "level": 1, "text": "Notes"}, {"type": "bullets", "items": ["a", "b"]}])
        '# Notes\\n\\n- a\\n- b'
    """
    return "\n\n".join(block_markdown(b) for b in blocks)


@dataclass
class _Style:
    family: str
    size: int
    h1: int
    h2: int
    spacing: float
    color: tuple
    bg: tuple
    margin: int
    center_title: bool
    header_fill: tuple | None
    rule: tuple

    def font(self, size=None, bold=False):
        return get_font(self.family, size or self.size, bold)


class _Laid:
    """A block measured for a given width: its height and how to draw it at an offset."""

    def __init__(self, block: dict, height: int, width: int, draw):
        self.block, self.height, self.width, self.draw = block, height, width, draw


def _layout_lines(lines, font, st: _Style, width: int, align: str = "left"):
    lh = line_height(font)
    step = int(round(lh * st.spacing))
    height = step * (len(lines) - 1) + lh

    def draw(c: Canvas, x, y):
        for i, ln in enumerate(lines):
            dx = (width - text_width(font, ln)) / 2 if align == "center" else 0
            c.text(x + dx, y + i * step, ln, font, st.color)

    return height, draw


def _layout(block: dict, st: _Style, width: int, min_size: int) -> _Laid | None:
    t = block["type"]
    if t == "heading":
        font = st.font(st.h1 if block["level"] == 1 else st.h2, bold=True)
        lines = wrap_words(block["text"], font, width)
        align = "center" if (block["level"] == 1 and st.center_title) else "left"
        h, draw = _layout_lines(lines, font, st, width, align)
        return _Laid(block, h, width, draw)
    if t == "paragraph":
        font = st.font()
        h, draw = _layout_lines(wrap_words(block["text"], font, width), font, st, width)
        return _Laid(block, h, width, draw)
    if t in ("bullets", "numbered"):
        return _layout_list(block, st, width)
    if t == "table":
        return _layout_table(block, st, width, min_size)
    if t == "formula":
        return _layout_formula(block, st, width)
    raise InvalidInputError(f"unknown block type {t!r}")


def _layout_list(block, st: _Style, width: int) -> _Laid:
    font = st.font()
    lh = line_height(font)
    step = int(round(lh * st.spacing))
    items = block["items"]
    numbered = block["type"] == "numbered"
    indent = int(text_width(font, f"{len(items)}.") + st.size * 0.6) if numbered else int(st.size * 1.2)
    wrapped = [wrap_words(it, font, width - indent) for it in items]
    gap = int(round(lh * 0.25))
    height = sum(step * (len(w) - 1) + lh for w in wrapped) + gap * (len(items) - 1)
    ascent = font.getmetrics()[0] if hasattr(font, "getmetrics") else lh

    def draw(c: Canvas, x, y):
        for k, lines in enumerate(wrapped, 1):
            if numbered:
                c.text(x, y, f"{k}.", font, st.color)
            else:
                r = max(1.5, st.size * 0.16)
                cx, cy = x + st.size * 0.35, y + ascent * 0.62
                c.draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=st.color)
            for i, ln in enumerate(lines):
                c.text(x + indent, y + i * step, ln, font, st.color)
            y += step * (len(lines) - 1) + lh + gap

    return _Laid(block, height, width, draw)


def _layout_table(block, st: _Style, width: int, min_size: int) -> _Laid | None:
    header, rows = list(block["header"]), [list(r) for r in block["rows"]]
    while True:
        for size in range(st.size, min_size - 1, -1):
            font, bold = st.font(size), st.font(size, bold=True)
            pad = max(3, size // 3)
            colw = [int(max([text_width(bold, header[j])] + [text_width(font, r[j]) for r in rows])) + 2 * pad
                    for j in range(len(header))]
            if sum(colw) + 1 <= width:
                break
        else:
            if len(header) <= 2:
                return None
            header, rows = header[:-1], [r[:-1] for r in rows]
            continue
        break
    block = dict(block, header=header, rows=rows)
    lh = line_height(font)
    rowh = lh + 2 * pad
    tw = sum(colw)
    height = rowh * (len(rows) + 1) + 1

    def draw(c: Canvas, x, y):
        x, y = int(x), int(y)
        if st.header_fill is not None:
            c.draw.rectangle([x, y, x + tw, y + rowh], fill=st.header_fill)
        for i in range(len(rows) + 2):
            c.draw.line([x, y + i * rowh, x + tw, y + i * rowh], fill=st.rule, width=1)
        cx = x
        for j in range(len(header) + 1):
            c.draw.line([cx, y, cx, y + rowh * (len(rows) + 1)], fill=st.rule, width=1)
            if j < len(header):
                cx += colw[j]
        cx = x
        for j in range(len(header)):
            c.text(cx + pad, y + pad, header[j], bold, st.color)
            for i, r in enumerate(rows, 1):
                cell = r[j]
                dx = colw[j] - pad - text_width(font, cell) if _NUMERIC.match(cell) else pad
                c.text(cx + dx, y + i * rowh + pad, cell, font, st.color)
            cx += colw[j]

    return _Laid(block, height, tw + 1, draw)


def _layout_formula(block, st: _Style, width: int) -> _Laid:
    font = st.font()
    sup = st.font(max(9, int(round(st.size * 0.7))))
    pieces, pos = [], 0
    for m in _SUP.finditer(block["text"]):
        if m.start() > pos:
            pieces.append((block["text"][pos:m.start()], False))
        pieces.append((m.group(1), True))
        pos = m.end()
    if pos < len(block["text"]):
        pieces.append((block["text"][pos:], False))
    total = sum(text_width(sup if s else font, p) for p, s in pieces)
    raise_px = int(round(st.size * 0.3))
    height = line_height(font) + raise_px
    indent = int(st.size * 2)

    def draw(c: Canvas, x, y):
        cx = x + indent
        for p, s in pieces:
            c.text(cx, y + (0 if s else raise_px), p, sup if s else font, st.color)
            cx += text_width(sup if s else font, p)

    return _Laid(block, height, int(indent + total), draw)


class DocsWorkload(SeededWorkload):
    """Rendered document pages (``kind="page"``), single-block crops (``kind="block"``) or single-line crops
    (``kind="line"``) to transcribe.

    Args:
        width, height: page size in pixels (multiples of 28 suit Qwen2-VL's 14-px patches merged 2x2).
            Block crops keep ``width`` and take the height of their content, rounded up to a multiple of
            ``crop_multiple``.
        min_blocks, max_blocks: content blocks per page (headings come on top); blocks that would not fit
            are dropped, so the target always matches what is drawn.
        mode: ``"page"``, ``"block"``, ``"mix"`` (a block crop with probability ``block_fraction``, a line
            crop with probability ``line_fraction``, else a page) or ``"line"`` (a crop of one line of body
            text: the first rung of a reading curriculum, ``kind="line"``).
        block_fraction, line_fraction: the shares of block and line crops in ``"mix"`` (their sum at most
            1; ``line_fraction=0``, the default, leaves every item of the default world as it was).
        font_sizes: ``(min, max)`` body text size in pixels; headings are 2-6 px larger. The default 22-26 px
            is 10-12 pt type scanned at 150-200 dpi, and puts about two characters in each 28-px merged
            Qwen2-VL token; at 11-14 px (the first default) a token spans about four characters and two lines,
            more than the small testbed target's tower learned to separate.
        fonts: ``"auto"`` (every family :func:`~mmspec.vision.workloads.render.font_families` finds),
            ``"default"`` (Pillow's bundled font only: the same pixels on any machine with this Pillow), or
            a list of family names.
        augment: apply light noise, rotation (up to ``max_rotation`` degrees) and blur.
        block_types: the content block types to draw from (see :data:`BLOCK_TYPES`).
        char_boxes: record each character's left edge in ``meta["runs"]`` (slower).
        scrambled_fraction: share of items whose letters and digits are random (same layouts and lengths,
            no language prior: :class:`~mmspec.vision.workloads.text.ScrambledTextGen`); a curriculum for
            targets that must learn to read. ``meta["text"]`` says which.
        seed: mixed into every item's seed; another value gives another world.
        columns: ``1`` (default) or ``2``: pages in two columns (``gutter`` pixels apart) under an optional
            level-1 title spanning both; blocks flow down the left column, then the right one, and ``blocks``
            (and the target) follow that reading order. See :data:`DENSE_PAGES`.

    ``meta``: ``regime`` (always ``"copy"``), ``kind``, ``blocks`` (the placed blocks as dicts, each with
    its ``box``), ``font``, ``font_size``, ``augment`` (what was applied) and ``runs`` (every text run drawn,
    with its box in pre-augmentation pixels).

    Example:
        >>> w = DocsWorkload(width=280, height=336, mode="block", block_types=("table",))
        >>> ex = w.example("test", 1)
        >>> ex.meta["kind"], ex.meta["blocks"][0]["type"], "|---|" in ex.target
        ('block', 'table', True)
        >>> line = DocsWorkload(mode="line").example("test", 0)
        >>> line.meta["kind"], "\\n" in line.target, line.images[0].height <= 112
        ('line', False, True)
    """

    name = "testbed-docs"
    seed_key = "docs"  # the items drawn when this was the "docs" world stay the same

    def bundled_model(self):
        return bundled_target()

    def bundled_drafters(self):
        path = bundled_eagle()
        return [f"eagle:{path}"] if path and self.bundled_model() else []

    def __init__(self, width: int = 336, height: int = 448, *, min_blocks: int = 2, max_blocks: int = 3,
                 mode: str = "mix", block_fraction: float = 0.3, line_fraction: float = 0.0,
                 font_sizes: tuple[int, int] = (22, 26),
                 fonts="auto", augment: bool = True, max_rotation: float = 1.0,
                 block_types=BLOCK_TYPES, crop_multiple: int = 28, char_boxes: bool = False,
                 scrambled_fraction: float = 0.0, seed: int = 0, columns: int = 1, gutter: int = 28):
        if mode not in ("page", "block", "mix", "line"):
            raise InvalidInputError(f"mode must be 'page', 'block', 'mix' or 'line', got {mode!r}")
        if width < 160 or height < 112:
            raise InvalidInputError(f"page too small ({width}x{height}); use at least 160x112")
        if not 1 <= min_blocks <= max_blocks:
            raise InvalidInputError(f"need 1 <= min_blocks <= max_blocks, got {min_blocks}, {max_blocks}")
        if not 8 <= font_sizes[0] <= font_sizes[1]:
            raise InvalidInputError(f"font_sizes must be (min, max) with 8 <= min <= max, got {font_sizes}")
        bad = set(block_types) - set(BLOCK_TYPES)
        if bad or not block_types:
            raise InvalidInputError(f"block_types must be a non-empty subset of {BLOCK_TYPES}, got {block_types}")
        self.width, self.height = int(width), int(height)
        self.min_blocks, self.max_blocks = min_blocks, max_blocks
        if mode == "mix" and not (0 <= line_fraction and 0 <= block_fraction and line_fraction + block_fraction <= 1):
            raise InvalidInputError(f"need 0 <= line_fraction, block_fraction and their sum <= 1, got "
                                    f"{line_fraction}, {block_fraction}")
        self.mode, self.block_fraction, self.line_fraction = mode, float(block_fraction), float(line_fraction)
        self.font_sizes = (int(font_sizes[0]), int(font_sizes[1]))
        self.fonts = _resolve_fonts(fonts)
        self.augment, self.max_rotation = augment, float(max_rotation)
        self.block_types = tuple(block_types)
        self.crop_multiple, self.char_boxes, self.seed = int(crop_multiple), char_boxes, int(seed)
        if not 0.0 <= scrambled_fraction <= 1.0:
            raise InvalidInputError(f"scrambled_fraction must be in [0, 1], got {scrambled_fraction}")
        self.scrambled_fraction = float(scrambled_fraction)
        if columns not in (1, 2):
            raise InvalidInputError(f"columns must be 1 or 2, got {columns!r}")
        if columns == 2 and (gutter < 8 or (width - 40 - gutter) // 2 < 140):
            raise InvalidInputError(f"two columns need gutter >= 8 and columns of at least 140 px; got width "
                                    f"{width}, gutter {gutter}")
        self.columns, self.gutter = int(columns), int(gutter)

    # ------------------------------------------------------------------ generation
    def generate(self, rng: random.Random, nrng: np.random.Generator, split: str, index: int,
                 draw: bool = True) -> Example:
        u_kind = rng.random()
        mixed = self.mode == "mix"
        kind = ("line" if self.mode == "line" or (mixed and u_kind < self.line_fraction) else
                "block" if self.mode == "block" or (mixed and u_kind < self.line_fraction + self.block_fraction)
                else "page")
        st = self._style(rng)
        # Only drawn when asked for, so the default world's items stay what they were.
        scrambled = self.scrambled_fraction > 0 and rng.random() < self.scrambled_fraction
        g = ScrambledTextGen(rng) if scrambled else TextGen(rng)
        inner = self.width - 2 * st.margin
        placed: list[tuple[_Laid, int]] = []  # (laid block, y)
        xs = None  # each placed block's left edge when not at the margin (two columns)
        if kind == "page" and self.columns == 2:
            placed, xs = self._place_columns(self._page_specs(g), st, inner)
            if not placed:
                placed = [(self._fit_block(g, st, inner, self.height - 2 * st.margin, ("paragraph",)), st.margin)]
                xs = None
            img_h = self.height
        elif kind == "page":
            specs = self._page_specs(g)
            y, limit = st.margin, self.height - st.margin
            gap = int(round(line_height(st.font()) * 0.8))
            for spec in specs:
                laid = _layout(spec, st, inner, self.font_sizes[0] - 1)
                if laid is None or y + laid.height > limit:
                    break
                placed.append((laid, y))
                y += laid.height + (gap // 2 if spec["type"] == "heading" else gap)
            while placed and placed[-1][0].block["type"] == "heading":
                placed.pop()
            if not placed:  # the first content block did not fit: fall back to short paragraphs
                placed = [(self._fit_block(g, st, inner, self.height - 2 * st.margin, ("paragraph",)), st.margin)]
            img_h = self.height
        elif kind == "line":
            # One line of a paragraph as the page would wrap it (any line, so mid-sentence text too): reading
            # along one row, no line breaks.
            lines = wrap_words(g.paragraph(1, 2), st.font(), inner)
            text = lines[rng.randrange(len(lines))]
            laid = _layout({"type": "paragraph", "text": text}, st, inner, self.font_sizes[0] - 1)
            placed = [(laid, st.margin)]
            m = max(1, self.crop_multiple)
            img_h = min(self.height, int(math.ceil((laid.height + 2 * st.margin) / m) * m))
        else:
            laid = self._fit_block(g, st, inner, self.height - 2 * st.margin, self.block_types)
            placed = [(laid, st.margin)]
            m = max(1, self.crop_multiple)
            img_h = min(self.height, int(math.ceil((laid.height + 2 * st.margin) / m) * m))
        prompt = rng.choice(PAGE_PROMPTS if kind == "page" else BLOCK_PROMPTS)
        xs = xs or [st.margin] * len(placed)
        blocks = []
        for (laid, y), x in zip(placed, xs):
            b = dict(laid.block)
            b["box"] = [x, y, x + laid.width, y + laid.height]
            blocks.append(b)
        target = page_markdown(blocks)
        meta = {"regime": "copy", "kind": kind, "blocks": blocks, "font": st.family, "font_size": st.size,
                "text": "scrambled" if scrambled else "natural"}
        images = []
        if draw:
            img = Image.new("RGB", (self.width, img_h), st.bg)
            canvas = Canvas(img, char_boxes=self.char_boxes)
            for (laid, y), x in zip(placed, xs):
                laid.draw(canvas, x, y)
            info = {"rotation": 0.0, "blur": 0.0, "noise": 0.0}
            if self.augment:
                img, info = augment(img, rng, nrng, max_rotation=self.max_rotation, background=st.bg)
            meta["augment"], meta["runs"] = info, canvas.runs
            images = [img]
        return Example(id="", prompt=prompt, target=target, images=images, meta=meta)

    def _style(self, rng: random.Random) -> _Style:
        fam = rng.choice(self.fonts)
        # Pillow's bundled font sets words tightly: one pixel more keeps the spaces visible
        size = rng.randint(*self.font_sizes) + (fam == "default")
        ink = rng.randint(0, 60)
        paper = rng.randint(238, 255)
        tint = rng.randint(0, 6)
        return _Style(
            family=fam, size=size, h1=size + rng.randint(4, 6), h2=size + rng.randint(2, 3),
            spacing=rng.uniform(1.15, 1.4), color=(ink, ink, ink + rng.randint(0, 20)),
            bg=(paper, paper, max(0, paper - tint)), margin=rng.randint(10, 18), center_title=rng.random() < 0.3,
            header_fill=(rng.randint(215, 235),) * 3 if rng.random() < 0.5 else None,
            rule=(rng.randint(40, 110),) * 3,
        )

    def _content_spec(self, g: TextGen, types, *, crop: bool = False) -> dict:
        r = g.rng
        weights = {"paragraph": 4, "bullets": 2, "numbered": 1.5, "table": 2, "formula": 1}
        t = r.choices(types, weights=[weights[x] for x in types])[0]
        if t == "paragraph":
            return {"type": t, "text": g.paragraph(1, 4 if crop else 3)}
        if t in ("bullets", "numbered"):
            return {"type": t, "items": [g.list_item() for _ in range(r.randint(2, 5 if crop else 4))]}
        if t == "table":
            header, rows = g.table(r.randint(2, 5 if crop else 4))
            return {"type": t, "header": header, "rows": rows}
        return {"type": t, "text": g.formula()}

    def _page_specs(self, g: TextGen) -> list[dict]:
        r = g.rng
        specs = []
        if r.random() < 0.75:
            specs.append({"type": "heading", "level": 1, "text": g.heading(1)})
        for i in range(r.randint(self.min_blocks, self.max_blocks)):
            if i > 0 and r.random() < 0.35:
                specs.append({"type": "heading", "level": 2, "text": g.heading(2)})
            types = self.block_types
            prev = specs[-1]["type"] if specs else None
            if prev in ("bullets", "numbered") and len(types) > 1:
                types = tuple(t for t in types if t != prev)  # two such lists in a row would read as one
            specs.append(self._content_spec(g, types))
        return specs

    def _place_columns(self, specs: list, st: _Style, inner: int) -> tuple[list, list]:
        """Two-column placement: a leading level-1 title spans both columns, then blocks fill the left column
        and the right one in turn (a spec too wide for a column is skipped; a level-2 heading left last in the
        left column moves to the top of the right one). Returns ``(placed, xs)`` in reading order."""
        col_w = (inner - self.gutter) // 2
        minsize = self.font_sizes[0] - 1
        gap = int(round(line_height(st.font()) * 0.8))
        limit = self.height - st.margin
        placed, xs, top, i = [], [], st.margin, 0
        if specs and specs[0]["type"] == "heading" and specs[0]["level"] == 1:
            laid = _layout(specs[0], st, inner, minsize)
            if top + laid.height <= limit:
                placed.append((laid, top))
                xs.append(st.margin)
                top += laid.height + gap // 2
            i = 1
        for col in range(2):
            x, y, start = st.margin + col * (col_w + self.gutter), top, len(placed)
            while i < len(specs):
                laid = _layout(specs[i], st, col_w, minsize)
                if laid is None:
                    i += 1
                    continue
                if y + laid.height > limit:
                    break
                placed.append((laid, y))
                xs.append(x)
                y += laid.height + (gap // 2 if specs[i]["type"] == "heading" else gap)
                i += 1
            if col == 0 and len(placed) > start and placed[-1][0].block["type"] == "heading":
                placed.pop()
                xs.pop()
                i -= 1  # its spec comes next: it heads the right column
                while specs[i]["type"] != "heading":  # step back over specs skipped as too wide
                    i -= 1
        while placed and placed[-1][0].block["type"] == "heading":
            placed.pop()
            xs.pop()
        return placed, xs

    def _fit_block(self, g: TextGen, st: _Style, width: int, max_h: int, types) -> _Laid:
        for _ in range(8):
            laid = _layout(self._content_spec(g, types, crop=True), st, width, self.font_sizes[0] - 1)
            if laid is not None and laid.height <= max_h:
                return laid
        for _ in range(8):  # short paragraphs always fit a sane page
            laid = _layout({"type": "paragraph", "text": g.sentence()}, st, width, self.font_sizes[0] - 1)
            if laid.height <= max_h:
                return laid
        raise InvalidInputError(f"a {self.width}x{self.height} page cannot hold one sentence at the font sizes "
                                f"{self.font_sizes}; use a larger page or smaller fonts")


def _resolve_fonts(fonts) -> list[str]:
    have = font_families()
    if fonts == "auto":
        return have
    if isinstance(fonts, str):
        fonts = [fonts]
    fonts = [f for f in fonts if f in have]
    return fonts or ["default"]
