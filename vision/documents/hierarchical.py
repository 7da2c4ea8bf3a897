"""Hierarchical parallel decoding of document pages: layout first, then every block as one row of a batch.

Why: a page decoded as one sequence is read token after token, however many independent blocks it holds.
HPD-Parsing and MinerU's two-stage pipeline (research/anchors_domains.md §3) first find the blocks, then
decode them side by side. Here:

1. the layout stage (:class:`~mmspec.vision.documents.layout.LayoutDetector`) finds each page's blocks (type,
   box, reading order) from the pixels alone;
2. each block is cropped and set on a blank canvas of the page's paper colour the way the docs workload draws
   its block items (``mode="block"``: the block near the top-left corner, a width of at least 336 px, heights
   in multiples of 28 px), with the block prompt the target was trained on, so the target and its drafters stay
   as they are;
3. all blocks of all pages of a call go through one batched :func:`mmspec.generate` (with any drafter:
   speculative decoding inside each row; without one, ``model.generate``); a row is lossless: its text is the
   target's greedy decoding of that block alone;
4. each page is assembled from its blocks' texts in reading order, joined by blank lines; a block the layout
   stage calls a heading gets the ``#`` marks of its level (the crop alone does not show its size).

Example:
    >>> from mmspec import MMSpecPipeline                                           # doctest: +SKIP
    >>> hp = HierarchicalParser(MMSpecPipeline.from_pretrained(target), drafter="eagle:HEAD")  # doctest: +SKIP
    >>> pages = hp.parse([page_image])                                              # doctest: +SKIP
    >>> pages[0].text, [b["type"] for b in pages[0].blocks]                         # doctest: +SKIP
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch
from PIL import Image

from mmspec.errors import InvalidInputError
from mmspec.stats import SpecStats

from .layout import LayoutDetector, bundled_layout

__all__ = ["HierarchicalParser", "HierarchicalPage", "SegmentedRows", "balanced_cuts", "is_table_block", "block_canvas", "assemble", "paper_colour",
           "is_reader"]

CANVAS_WIDTH = 336  # the width of the docs workload's block items (the pages the target learned to read)
CANVAS_MARGIN = 12  # the workload draws a block 10-18 px from the corner
MULTIPLE = 28  # Qwen2-VL reads 28-px merged patches: the processor would round other sizes


def paper_colour(page: Image.Image) -> tuple:
    """The page's background colour: the per-channel median of its pixels (text is sparse on a page).

    Example:
        >>> paper_colour(Image.new("RGB", (8, 8), (250, 248, 240)))
        (250, 248, 240)
    """
    a = np.asarray(page.convert("RGB").reduce(2) if min(page.size) >= 64 else page.convert("RGB"))
    return tuple(int(v) for v in np.median(a.reshape(-1, 3), axis=0))


def block_canvas(page: Image.Image, box, paper=None, pad: int = 3) -> Image.Image:
    """The crop of ``box`` (``[x0, y0, x1, y1]``, grown by ``pad`` px) on a canvas like the docs workload's block
    items: the crop at ``CANVAS_MARGIN`` px from the top-left corner, width at least 336, both sides multiples
    of 28, filled with ``paper`` (default: :func:`paper_colour`).

    Example:
        >>> page = Image.new("RGB", (336, 448), "white")
        >>> block_canvas(page, [14, 20, 300, 80]).size
        (336, 112)
    """
    w, h = page.size
    x0, y0, x1, y1 = (int(round(v)) for v in box)
    x0, y0, x1, y1 = max(0, x0 - pad), max(0, y0 - pad), min(w, x1 + pad), min(h, y1 + pad)
    if x1 <= x0 or y1 <= y0:
        raise InvalidInputError(f"empty block box {list(box)} on a {w}x{h} page")
    crop = page.convert("RGB").crop((x0, y0, x1, y1))
    # A crop that fits 336 px keeps that width (the side margin shrinks to fit): the target learned its block
    # items at exactly that width, and one more column of patches visibly hurts its reading.
    mx = CANVAS_MARGIN if crop.width + 2 * CANVAS_MARGIN <= CANVAS_WIDTH else max(0, (CANVAS_WIDTH - crop.width) // 2)
    cw = max(CANVAS_WIDTH, -(-(crop.width + 2 * mx) // MULTIPLE) * MULTIPLE)
    ch = -(-(crop.height + 2 * CANVAS_MARGIN) // MULTIPLE) * MULTIPLE
    canvas = Image.new("RGB", (cw, ch), paper if paper is not None else paper_colour(page))
    canvas.paste(crop, (mx, CANVAS_MARGIN))
    return canvas


def _first_lines(text: str, n: int) -> str:
    """``text`` up to and including its ``n``-th non-blank line (the blank lines between them kept)."""
    out, seen = [], 0
    for line in text.split("\n"):
        out.append(line)
        seen += bool(line.strip())
        if seen >= n:
            break
    return "\n".join(out)


def assemble(blocks: list[dict], texts: list[str]) -> str:
    """A page's Markdown from its blocks (in reading order, each with ``order`` and ``type``) and their texts:
    sorted by ``order``, empty texts dropped, headings given the ``#`` marks of their level, blank lines between.
    Line rows (:class:`SegmentedRows`, type ``"lines"``) keep their first ``lines`` lines (a reader that runs on past
    the last line of its crop is cut there) and join the text before them with their ``joiner`` (``"\\n"`` inside
    a block, ``"\\n\\n"`` between blocks); the reader writes their Markdown marks itself.

    Example:
        >>> assemble([{"order": 1, "type": "paragraph"}, {"order": 0, "type": "heading2"}],
        ...          ["Some text.", "Results"])
        '## Results\\n\\nSome text.'
        >>> assemble([{"order": 0, "type": "lines", "lines": 1, "joiner": ""},
        ...           {"order": 1, "type": "lines", "lines": 2, "joiner": "\\n"}], ["# Title\\nTranscribe", "a\\nb"])
        '# Title\\na\\nb'
    """
    if blocks and all(b["type"] == "lines" for b in blocks):
        out = ""
        for b, t in sorted(zip(blocks, texts), key=lambda bt: bt[0]["order"]):
            t = _first_lines(t.strip(), int(b["lines"])).strip()
            if b.get("skip"):  # a table part read under a copy of its header: the copy's lines go
                t = "\n".join([ln for ln in t.split("\n") if ln.strip()][int(b["skip"]):])
            if t:
                out += (b["joiner"] if out else "") + t
        return out
    parts = []
    for b, t in sorted(zip(blocks, texts), key=lambda bt: bt[0]["order"]):
        t = t.strip()
        if b["type"].startswith("heading") and b["type"][-1].isdigit():
            t = "#" * int(b["type"][-1]) + " " + t.lstrip("#").strip()
        if t.strip("# "):
            parts.append(t)
    return "\n\n".join(parts)


def balanced_cuts(weights: list, parts: int, max_len: int | None = None) -> list[int]:
    """Cut ``weights`` (in order) into ``parts`` contiguous runs, each of at most ``max_len`` items, so that the
    heaviest run is as light as it can be (exact, by dynamic programming: a block has tens of lines). Returns the
    ``parts + 1`` cut indices, ``0`` first and ``len(weights)`` last.

    Example:
        >>> balanced_cuts([13, 3, 3, 3, 12, 2], 3)
        [0, 1, 4, 6]
        >>> balanced_cuts([5, 5, 5, 5], 2, max_len=3)
        [0, 2, 4]
    """
    n = len(weights)
    cap = n if max_len is None else int(max_len)
    if not 1 <= parts <= n or parts * cap < n:
        raise InvalidInputError(f"cannot cut {n} items into {parts} runs of at most {cap}")
    pre = [0]
    for w in weights:
        pre.append(pre[-1] + w)
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(parts + 1)]
    back = [[0] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = 0
    for k in range(1, parts + 1):
        for j in range(k, n + 1):
            for i in range(max(k - 1, j - cap), j):
                v = max(best[k - 1][i], pre[j] - pre[i])
                if v <= best[k][j]:  # ties: the later cut (earlier rows the longer, as 3 + 2)
                    best[k][j], back[k][j] = v, i
    cuts = [n]
    for k in range(parts, 0, -1):
        cuts.append(back[k][cuts[-1]])
    return cuts[::-1]


PIPE_EM = 0.25  # a "|" box is at most 0.15 em wide on the reader's pages and spans its line (>= 0.86 of it)
PIPE_HEIGHT = 0.75


def is_table_block(lines: list, ink) -> bool:
    """Whether a block's lines (:class:`~mmspec.vision.reader.segment.SegLine`) are a Markdown table: at least two
    lines, and at least half of them begin and end with a "|": a box no wider than ``PIPE_EM`` of the line's em
    whose ink spans ``PIPE_HEIGHT`` of the line (``ink``: the page's boolean ink mask). On 1,073 lines of 120 test
    pages this finds all 220 table lines and none of the 853 others.

    Example:
        >>> import numpy as np
        >>> from mmspec.vision.reader.segment import SegBox, SegLine
        >>> ink = np.zeros((40, 60), bool); ink[0:15, 0:2] = ink[0:15, 58:60] = ink[5:10, 10:50] = True
        >>> ink[20:35, 0:20] = ink[30:35, 50:52] = True  # a word, then a "." below the line's middle
        >>> row = SegLine(0, 15, [SegBox(0, 2, None), SegBox(10, 50, 8), SegBox(58, 60, 8)], em=15.0)
        >>> text = SegLine(20, 35, [SegBox(0, 20, None), SegBox(50, 52, 30)], em=15.0)
        >>> is_table_block([row, row, text], ink), is_table_block([text, text], ink)
        (True, False)
    """
    def pipe(ln, b) -> bool:
        rows = np.flatnonzero(ink[ln.y0:ln.y1, b.x0:b.x1].any(axis=1))
        return bool(b.x1 - b.x0 <= PIPE_EM * ln.em and len(rows)
                    and rows[-1] - rows[0] + 1 >= PIPE_HEIGHT * (ln.y1 - ln.y0))

    piped = sum(len(ln.boxes) >= 2 and pipe(ln, ln.boxes[0]) and pipe(ln, ln.boxes[-1]) for ln in lines)
    return bool(len(lines) >= 2 and 2 * piped >= len(lines))


def _box(lines: list) -> list:
    """``[x0, y0, x1, y1]`` around the token boxes of consecutive lines."""
    return [min(b.x0 for ln in lines for b in ln.boxes), lines[0].y0, max(b.x1 for ln in lines for b in ln.boxes),
            lines[-1].y1]


class SegmentedRows:
    """The layout stage of the reader (:mod:`mmspec.vision.reader`): rows of whole lines from the page's own
    segmentation (:func:`~mmspec.vision.reader.segment.segment`), no trained detector.

    Why: the reader reads token boxes in reading order and writes a page's Markdown marks itself, so a row needs
    no block type, only a crop it can read. Its segmentation already finds the blocks (columns, paragraphs,
    headings, tables), their lines and each line's token boxes (one box per token the reader writes, so a row's
    length is known before it is read). Each block is cut into rows of consecutive lines balanced by their token
    counts: a batch lasts as long as its longest row, so the rows should end at about the same step. A block gets
    as many rows as it needs for at most ``lines_per_row`` lines and (when given) about ``row_tokens`` tokens a
    row. A table (:func:`is_table_block`) of four lines or more is cut in parts of its body, each read under its
    header (the reader loops on a table's body cut from its header): the first part holds the header, later parts
    get a copy of it stacked above them (``head``: its box; ``skip``: the lines their text then drops). Each row records its line count (the text is cut after that many lines: on a crop of one line the reader
    may run on into its prompt's words before its end of turn), the joiner before it and its expected ``tokens``.

    Args:
        lines_per_row: lines per row at most (rows of a block are balanced: 5 lines at 3 a row give 3 + 2).
        margin: paper kept around a row's ink, in px.
        row_tokens: expected tokens per row to aim at (``None``: rows by line count alone). Shorter rows end
            sooner, but every row is a batch row and a prefill, and a crop of one line reads less surely.

    Example:
        >>> from PIL import ImageDraw
        >>> page = Image.new("RGB", (200, 200), "white"); d = ImageDraw.Draw(page)
        >>> for y in (20, 40, 60, 120):  # three lines, a wide gap, a fourth: two blocks
        ...     for x in (10, 30, 50): _ = d.rectangle([x, y, x + 12, y + 10], fill="black")
        >>> [(b["lines"], b["joiner"], b["tokens"]) for b in SegmentedRows(lines_per_row=2).detect([page])[0]]
        [(2, '', 8), (1, '\\n', 4), (1, '\\n\\n', 4)]
        >>> [b["lines"] for b in SegmentedRows(lines_per_row=3, row_tokens=4).detect([page])[0]]
        [1, 1, 1, 1]
    """

    def __init__(self, lines_per_row: int = 3, margin: int = 8, row_tokens: int | None = None):
        if lines_per_row < 1 or margin < 0 or (row_tokens is not None and row_tokens < 1):
            raise InvalidInputError(f"lines_per_row and row_tokens must be >= 1 and margin >= 0 (got {lines_per_row}, "
                                    f"{row_tokens}, {margin})")
        self.lines_per_row, self.margin = int(lines_per_row), int(margin)
        self.row_tokens = None if row_tokens is None else int(row_tokens)

    def detect(self, images: list) -> list[list[dict]]:
        """Each page's rows: ``type`` ``"lines"``, ``box`` ``[x0, y0, x1, y1]``, ``order``, ``lines``, ``joiner``,
        ``block`` (the segmentation's block index), ``tokens`` (its token boxes plus one per line end)."""
        from ..reader.segment import page_ink, segment

        pages = []
        for image in images:
            ink = None
            blocks: dict = {}
            for line in segment(image):
                blocks.setdefault(line.block, []).append(line)
            rows = []
            for k in sorted(blocks):
                lines = blocks[k]
                weights = [len(ln.boxes) + 1 for ln in lines]  # a line's tokens and its line break
                if len(lines) > 1 and ink is None:
                    ink = page_ink(image)  # a table's "|" is short: rules are kept
                head = 2 if len(lines) > 3 and is_table_block(lines, ink) else 0  # a table's header and its rule
                body, bw = lines[head:], weights[head:]
                head_tokens = sum(weights[:head])  # read again at the top of every row of a table
                n = -(-len(body) // self.lines_per_row)  # rows the line cap asks for
                if self.row_tokens is not None:
                    # rows the token budget asks for: every row but the first also reads the repeated header
                    tokens_to_read = sum(bw) + (n - 1) * head_tokens
                    n = min(len(body), max(n, -(-tokens_to_read // self.row_tokens)))
                cuts = balanced_cuts(bw, n, self.lines_per_row)
                for r in range(n):
                    part = body[cuts[r]:cuts[r + 1]]
                    row = {"type": "lines", "order": len(rows), "block": k, "score": 1.0,
                           "joiner": "" if not rows else ("\n" if r else "\n\n"),
                           "lines": len(part) + head, "tokens": sum(bw[cuts[r]:cuts[r + 1]]) + head_tokens}
                    if head and r == 0:  # the first part of a table holds its header
                        part = lines[:head] + part
                    elif head:  # later parts are read under a copy of it, which the text then drops
                        row.update(head=_box(lines[:head]), skip=head)
                    row["box"] = _box(part)
                    rows.append(row)
            pages.append(rows)
        return pages

    def crop(self, page: Image.Image, box, head=None) -> Image.Image:
        """The page cut to ``box`` grown by ``margin`` px (the reader reads any page size); with ``head`` (a table
        header's box above ``box``), the header's crop stacked over the box's, both as wide as the two together
        (the columns stay where they were), a line gap between them."""
        w, h = page.size
        m = self.margin
        if head is None:
            return page.crop((max(0, box[0] - m), max(0, box[1] - m), min(w, box[2] + m), min(h, box[3] + m)))
        x0, x1 = max(0, min(box[0], head[0]) - m), min(w, max(box[2], head[2]) + m)
        gap = max(2, min(m, (box[1] - head[3]) // 2))
        top = page.crop((x0, max(0, head[1] - m), x1, head[3] + gap))
        bottom = page.crop((x0, box[1] - gap, x1, min(h, box[3] + m)))
        out = Image.new(page.mode, (x1 - x0, top.height + bottom.height))
        out.paste(top, (0, 0))
        out.paste(bottom, (0, top.height))
        return out


def is_reader(pipe) -> bool:
    """Whether ``pipe`` runs the reader (its processor is :class:`~mmspec.vision.reader.processor.PageReaderProcessor`)."""
    from ..reader.processor import PageReaderProcessor

    return isinstance(getattr(pipe, "processor", None), PageReaderProcessor)


@dataclass
class HierarchicalPage:
    """One decoded page: ``text`` (Markdown, blocks in reading order), ``blocks`` (the layout stage's dicts, each
    with its ``text`` and ``new_tokens``), and ``truncated`` (blocks cut at ``max_new_tokens``)."""

    text: str
    blocks: list
    truncated: int = 0


@dataclass
class HierarchicalResult:
    """:meth:`HierarchicalParser.parse`'s pages, the pooled :class:`~mmspec.stats.SpecStats` of the rows (``None``
    without a drafter), and the seconds spent in each stage (``layout``, ``decode``)."""

    pages: list
    stats: SpecStats | None = None
    timings: dict = field(default_factory=dict)
    rows: int = 0


class HierarchicalParser:
    """Layout, then all blocks of the pages given as rows of one batch (see the module docstring).

    Args:
        pipe: a loaded VLM pipeline (:class:`~mmspec.MMSpecPipeline` of the target).
        layout: a :class:`~mmspec.vision.documents.layout.LayoutDetector`, a folder holding one, or ``None``
            (the bundled detector).
        drafter: ``None`` (plain ``model.generate`` per batch) or a drafter / spec for :func:`mmspec.generate`
            (speculative decoding inside each row).
        prompt: the block prompt (the docs workload's first block prompt by default).
        max_new_tokens: tokens per block at most (a block ends at the target's end of turn well before).
        max_rows: rows per batch at most (longer lists of blocks go in several batches, similar heights
            together).
        row_budget: a row whose expected length the layout stage gives (:class:`SegmentedRows`' ``tokens``) stops
            after ``row_budget`` times that plus 8 tokens (:meth:`budget`); ``None``: only ``max_new_tokens``.

    On the reader, a row also stops at a line that starts with its prompt's first word (``stop_strings``).
    """

    def __init__(self, pipe, layout=None, drafter=None, prompt: str | None = None, max_new_tokens: int = 512,
                 max_rows: int = 64, row_budget: float | None = 2.0):
        from mmspec.registry import make_drafter

        from ..workloads.docs import BLOCK_PROMPTS

        if max_new_tokens < 1 or max_rows < 1 or (row_budget is not None and row_budget < 1):
            raise InvalidInputError(f"max_new_tokens and max_rows must be positive and row_budget >= 1 (got "
                                    f"{max_new_tokens}, {max_rows}, {row_budget})")
        reader = is_reader(pipe)
        if layout is None and reader:
            layout = SegmentedRows()
        elif layout is None:
            layout = bundled_layout()
            if layout is None:
                raise InvalidInputError("no layout detector bundled; pass layout=DIR (from `mmspec train-layout`)")
        self.layout = layout if isinstance(layout, (LayoutDetector, SegmentedRows)) else \
            LayoutDetector.from_pretrained(layout)
        self.pipe = pipe
        self.drafter = make_drafter(drafter, pipe.model) if drafter is not None else None
        if prompt is None and reader:
            from ..reader.workloads import PAGE_PROMPTS as READER_PROMPTS

            prompt = READER_PROMPTS[0]  # a row is a (small) page to the reader
        self.prompt = prompt or BLOCK_PROMPTS[0]
        # A row ends where the reader starts echoing its prompt on a line of its own (what it does past the last
        # line of a short crop, before its end of turn): the rest of that row would only be cut off by assemble.
        self.stop_strings = ("\n" + self.prompt.split()[0],) if reader else ()
        self.max_new_tokens, self.max_rows = int(max_new_tokens), int(max_rows)
        self.row_budget = None if row_budget is None else float(row_budget)

    def detect(self, pages: list) -> list[list[dict]]:
        """The layout stage alone: each page's blocks (``type``, ``box``, ``score``, ``order``)."""
        return self.layout.detect(pages)

    def crops(self, page, blocks: list[dict]) -> list[Image.Image]:
        """The block canvases of one page (:func:`block_canvas`; a :class:`SegmentedRows` layout's own crops), in
        the order of ``blocks``."""
        if isinstance(self.layout, SegmentedRows):
            return [self.layout.crop(page, b["box"], b.get("head")) for b in blocks]
        paper = paper_colour(page)
        return [block_canvas(page, b["box"], paper) for b in blocks]

    def budget(self, expected: int | None) -> int:
        """A row's token budget: ``max_new_tokens``, or, for a row whose length the layout stage knows (``expected``
        tokens), ``row_budget`` times that plus 8, whichever is less. Why: a reader that loops on a crop (a table
        cut from its header) writes until its budget; a row five times its own length is no reading any more, and
        the batch it is in would wait for it.

        Example:
            >>> from types import SimpleNamespace
            >>> HierarchicalParser.budget(SimpleNamespace(max_new_tokens=160, row_budget=2.0), 20)
            48
        """
        if expected is None or self.row_budget is None:
            return self.max_new_tokens
        return min(self.max_new_tokens, int(self.row_budget * expected) + 8)

    def decode_rows(self, images: list, lengths: list | None = None) -> tuple[list[str], list[int], list[bool],
                                                                           SpecStats | None]:
        """Decode block canvases as rows of batches (at most ``max_rows`` each, rows of similar expected length
        together: ``lengths``, else the crops' heights): each row's text, its new tokens (end of turn included),
        whether it was cut at its budget (:meth:`budget`: no end of turn), and the pooled stats (``None`` without
        a drafter). A batch runs as long as the largest budget among its rows."""
        from mmspec.decode import generate

        texts, counts, cut = [""] * len(images), [0] * len(images), [False] * len(images)
        budgets = [self.budget(lengths[i] if lengths else None) for i in range(len(images))]
        stats = None
        order = sorted(range(len(images)), key=lambda i: (lengths[i] if lengths else images[i].height))
        model = self.pipe.model
        stop = {"stop_strings": list(self.stop_strings), "tokenizer": self.pipe.tokenizer} if self.stop_strings else {}
        eos = model.generation_config.eos_token_id
        eos = set(eos if isinstance(eos, (list, tuple)) else [eos])
        for s in range(0, len(order), self.max_rows):
            idx = order[s:s + self.max_rows]
            inputs = self.pipe.prepare(images=[[images[i]] for i in idx], prompt=[self.prompt] * len(idx))
            inputs = inputs.to(model.device)
            steps = max(budgets[i] for i in idx)
            with torch.no_grad():
                if self.drafter is None:
                    seq = model.generate(**inputs, max_new_tokens=steps, do_sample=False, **stop)
                else:
                    out = generate(model, inputs, drafter=self.drafter, max_new_tokens=steps, do_sample=False, **stop)
                    seq = out.sequences
                    stats = out.stats if stats is None else stats.merge(out.stats)
            plen = inputs["input_ids"].shape[1]
            for j, i in enumerate(idx):
                row = seq[j, plen:plen + budgets[i]]
                end = next((k for k, t in enumerate(row.tolist()) if t in eos), None)
                texts[i] = self.pipe.decode_new(row[None], 0)[0]
                counts[i], cut[i] = (len(row) if end is None else end + 1), end is None
        return texts, counts, cut, stats

    def parse(self, pages: list, blocks: list | None = None) -> HierarchicalResult:
        """Decode ``pages`` (PIL images): layout (unless ``blocks`` gives each page's blocks), then every block of
        every page as one row, then each page assembled in reading order.

        Example:
            >>> res = hp.parse([page1, page2])                                         # doctest: +SKIP
            >>> res.pages[0].text, res.timings["layout"], res.stats.tau                  # doctest: +SKIP
        """
        if not pages:
            raise InvalidInputError("no pages to parse")
        t0 = time.perf_counter()
        if blocks is None:
            blocks = self.detect(pages)
        t1 = time.perf_counter()
        images, lengths = [], []
        for page, bl in zip(pages, blocks):
            images += self.crops(page, bl)
            lengths += [b.get("tokens") for b in bl]
        lengths = lengths if all(v is not None for v in lengths) else None
        texts, counts, cut, stats = self.decode_rows(images, lengths) if images else ([], [], [], None)
        t2 = time.perf_counter()
        out, k = [], 0
        for bl in blocks:
            mine = texts[k:k + len(bl)]
            done = [dict(b, text=t.strip(), new_tokens=c) for b, t, c in zip(bl, mine, counts[k:k + len(bl)])]
            out.append(HierarchicalPage(assemble(bl, mine), done, sum(cut[k:k + len(bl)])))
            k += len(bl)
        return HierarchicalResult(out, stats, {"layout": t1 - t0, "decode": t2 - t1}, rows=len(images))
