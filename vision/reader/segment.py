"""Find a page's token boxes from its pixels: rules erased, blocks by recursive cuts, lines, boxes by gaps.

Why: the reader's processor turns a page into one visual token per token box, in reading order, plus the
line breaks between them (:mod:`.typeset` draws pages whose token boxes are visible). Everything here is
plain numpy geometry on a binarised page, deterministic and fast (a few ms a page):

1. ink: pixels darker than halfway between the paper (the median grey) and the darkest ink;
2. rules and graphics: horizontal ink runs of >= ``RULE_PX`` and vertical ones of >= ``VRULE_PX`` are erased (frames around blocks, table rules, a chart's bars): text never has runs that long;
3. blocks and reading order: a region is cut at a vertical white gap of >= ``GUTTER_EM`` that spans its whole
   height when the parts on both sides are >= ``COLUMN_MIN_EM`` wide and hold two lines or more (columns, left to
   right), else its top
   slab is cut off at the first white band of >= ``BLOCK_GAP_EM`` (the next block, or a title above columns),
   recursively; what remains is one block. These are in units of the page's median line height;
4. lines: bands of rows with ink inside a block (slivers such as a lone dot merged into their neighbour);
5. boxes: columns with ink inside a line, split at white gaps wider than ``TOKEN_SPLIT_EM`` of the line's
   em (a token gap is 0.35 em, a word gap 0.9 em, glyphs of one token sit closer).

The first line of every block but the first gets ``blank_before = 1`` (the Markdown's blank line).

Example:
    >>> import numpy as np
    >>> from PIL import Image, ImageDraw
    >>> img = Image.new("RGB", (120, 40), "white")
    >>> d = ImageDraw.Draw(img); d.rectangle([10, 10, 20, 24], fill="black"); d.rectangle([40, 10, 52, 24], fill="black")
    >>> [[(b.x0, b.x1) for b in line.boxes] for line in segment(img)]
    [[(10, 21), (40, 53)]]
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["segment", "page_ink", "page_gray", "ink_mask", "line_height_estimate", "SegLine", "SegBox", "RULE_PX", "VRULE_PX", "GUTTER_EM", "COLUMN_MIN_EM", "BLOCK_GAP_EM",
           "TOKEN_SPLIT_EM"]

RULE_PX = 40
VRULE_PX = 40
GUTTER_EM = 2.2
COLUMN_MIN_EM = 8.0
BLOCK_GAP_EM = 1.1
TOKEN_SPLIT_EM = 0.32
INK_LEVEL = 0.4  # of the way from the paper to the darkest ink: faint blurred strokes (a hyphen, a dot) stay ink


@dataclass
class SegBox:
    """A found box: ink columns ``[x0, x1)`` on its line, and the white gap before it (``None`` at a line start)."""

    x0: int
    x1: int
    gap: int | None


@dataclass
class SegLine:
    """A found line: ink rows ``[y0, y1)``, the columns ``[x_lo, x_hi)`` of its block, its boxes."""

    y0: int
    y1: int
    boxes: list = field(default_factory=list)
    blank_before: int = 0
    block: int = 0
    em: float = 0.0


def ink_mask(gray: np.ndarray) -> tuple[np.ndarray, float]:
    """Boolean ink mask of a grey page and the paper's grey level.

    Example:
        >>> g = np.full((4, 4), 250, np.uint8); g[1, 1] = 10
        >>> int(ink_mask(g)[0].sum())
        1
    """
    g = gray.astype(np.float32)
    paper = float(np.median(g))
    dark = float(np.percentile(g, 0.3)) if g.size else paper
    if paper - dark < 40:  # a blank page (or one without contrast): no ink
        return np.zeros(g.shape, bool), paper
    return g < paper - INK_LEVEL * (paper - dark), paper


def _runs(mask_1d: np.ndarray) -> list[tuple[int, int]]:
    """``[start, end)`` of the True runs of a 1-D bool array."""
    if not mask_1d.any():
        return []
    d = np.diff(np.concatenate([[0], mask_1d.astype(np.int8), [0]]))
    starts, ends = np.flatnonzero(d == 1), np.flatnonzero(d == -1)
    return list(zip(starts.tolist(), ends.tolist()))


def _long_runs(mask: np.ndarray, length: int) -> np.ndarray:
    """Cells of ``mask`` that lie in a horizontal run of at least ``length`` True cells (row-wise)."""
    h, w = mask.shape
    if w < length:
        return np.zeros_like(mask)
    m = mask.astype(np.int8)
    pad = np.concatenate([np.zeros((h, 1), np.int8), m, np.zeros((h, 1), np.int8)], axis=1)
    d = np.diff(pad, axis=1)
    out = np.zeros_like(mask)
    rows_s, cols_s = np.nonzero(d == 1)
    rows_e, cols_e = np.nonzero(d == -1)
    # starts and ends pair up in row-major order
    long = (cols_e - cols_s) >= length
    for r, s, e in zip(rows_s[long].tolist(), cols_s[long].tolist(), cols_e[long].tolist()):
        out[r, s:e] = True
    return out


def erase_rules(ink: np.ndarray) -> np.ndarray:
    """``ink`` without rules and graphics: horizontal runs of >= ``RULE_PX`` (frames, table rules, a chart's
    bars) and vertical runs of >= ``VRULE_PX`` (frame sides; the tallest glyph drawn, a bar or bracket of a 30 px
    heading, is shorter), and the thin anti-aliased fringe they leave."""
    gone = _long_runs(ink, RULE_PX) | _long_runs(ink.T, VRULE_PX).T
    if not gone.any():
        return ink
    out = ink & ~gone
    # the fringe: ink cells next to an erased cell whose own run across the rule direction is short
    near = np.zeros_like(gone)
    near[1:] |= gone[:-1]
    near[:-1] |= gone[1:]
    near[:, 1:] |= gone[:, :-1]
    near[:, :-1] |= gone[:, 1:]
    fringe = out & near & ~_has_neighbour_off(out, near)
    return out & ~fringe


def _has_neighbour_off(out: np.ndarray, near: np.ndarray) -> np.ndarray:
    """Cells of ``out`` with an ink neighbour that is not itself beside an erased rule (part of a glyph)."""
    solid = out & ~near
    nb = np.zeros_like(solid)
    nb[1:] |= solid[:-1]
    nb[:-1] |= solid[1:]
    nb[:, 1:] |= solid[:, :-1]
    nb[:, :-1] |= solid[:, 1:]
    return nb


def line_height_estimate(ink: np.ndarray, strips: int = 6) -> float:
    """The page's typical line height: a high percentile (80) of the heights of ink row bands within vertical strips (a strip
    mostly crosses one column, so lines of two columns at different heights do not merge).

    Example:
        >>> m = np.zeros((40, 60), bool); m[5:15, 2:50] = True; m[25:35, 2:50] = True
        >>> line_height_estimate(m)
        10.0
    """
    w = ink.shape[1]
    heights = []
    for k in range(strips):
        part = ink[:, k * w // strips:(k + 1) * w // strips]
        heights += [e - s for s, e in _runs(part.any(axis=1)) if e - s >= 3]
    return float(np.percentile(heights, 80)) if heights else 0.0


def _blocks(ink: np.ndarray, y0: int, y1: int, x0: int, x1: int, em: float, out: list) -> None:
    """Append the blocks ``(y0, y1, x0, x1)`` of a region in reading order (recursive cuts, see the module);
    ``em`` is the page's median line height, which the gutter and block-gap thresholds are measured in."""
    sub = ink[y0:y1, x0:x1]
    rows = sub.any(axis=1)
    if not rows.any():
        return
    r = np.flatnonzero(rows)
    y0, y1 = y0 + int(r[0]), y0 + int(r[-1]) + 1
    sub = ink[y0:y1, x0:x1]
    cols = sub.any(axis=0)
    c = np.flatnonzero(cols)
    x0, x1 = x0 + int(c[0]), x0 + int(c[-1]) + 1
    sub = ink[y0:y1, x0:x1]
    cols = sub.any(axis=0)
    # 1. a full-height vertical gutter between two parts that are both wide enough to be columns of text (a
    #    table's or a chart's columns are narrow, and a heading's word gap is no gutter): left to right
    gaps = [(s, e) for s, e in _runs(~cols) if e - s >= GUTTER_EM * em]
    if gaps:
        edges = [0] + [v for s, e in gaps for v in (s, e)] + [x1 - x0]
        parts = list(zip(edges[::2], edges[1::2]))
        # every part holds at least two lines: a single line's word gaps span its whole height but part no columns
        lines_in = [len(_runs(ink[y0:y1, x0 + a:x0 + b].any(axis=1))) for a, b in parts]
        if min(b - a for a, b in parts) >= COLUMN_MIN_EM * em and min(lines_in) >= 2:
            for a, b in parts:
                _blocks(ink, y0, y1, x0 + a, x0 + b, em, out)
            return
    # 2. the top slab, cut at the first wide white band
    rows = sub.any(axis=1)
    bands = [(s, e) for s, e in _runs(~rows) if e - s >= BLOCK_GAP_EM * em]
    if bands:
        s, e = bands[0]
        _blocks(ink, y0, y0 + s, x0, x1, em, out)
        _blocks(ink, y0 + e, y1, x0, x1, em, out)
        return
    out.append((y0, y1, x0, x1))


def _lines(ink: np.ndarray, y0: int, y1: int, x0: int, x1: int) -> list[tuple[int, int]]:
    """Ink row bands of a block; slivers (< 35% of the median band, a dot or an accent) join their neighbour."""
    bands = [(y0 + s, y0 + e) for s, e in _runs(ink[y0:y1, x0:x1].any(axis=1))]
    if len(bands) < 2:
        return bands
    med = float(np.median([e - s for s, e in bands]))
    merged = list(bands)
    changed = True
    while changed and len(merged) > 1:
        changed = False
        for i, (s, e) in enumerate(merged):
            if e - s < 0.35 * med:
                # join the nearer neighbour
                prev_gap = s - merged[i - 1][1] if i > 0 else 1 << 30
                next_gap = merged[i + 1][0] - e if i + 1 < len(merged) else 1 << 30
                j = i - 1 if prev_gap <= next_gap else i + 1
                a, b = sorted((i, j))
                merged[a] = (min(merged[a][0], merged[b][0]), max(merged[a][1], merged[b][1]))
                del merged[b]
                changed = True
                break
    return merged


def page_gray(image) -> np.ndarray:
    """A page (a PIL image or an ``H x W (x 3)`` uint8 array) as float32 grey by the luma weights.

    Example:
        >>> from PIL import Image
        >>> float(page_gray(Image.new("RGB", (2, 2), "white")).max())
        255.0
    """
    arr = np.asarray(image)
    if arr.ndim == 3:
        return arr[..., :3].astype(np.float32) @ np.array([0.299, 0.587, 0.114], np.float32)
    return arr.astype(np.float32)


def page_ink(image) -> np.ndarray:
    """The boolean ink mask of a page (a PIL image or an ``H x W (x 3)`` uint8 array): grey by the luma weights,
    then :func:`ink_mask`; rules are not erased here (:func:`segment` erases them).

    Example:
        >>> from PIL import Image
        >>> int(page_ink(Image.new("RGB", (8, 8), "white")).sum())
        0
    """
    return ink_mask(page_gray(image))[0]


def segment(image) -> list[SegLine]:
    """The lines of a page in reading order, each with its token boxes (see the module docstring).

    ``image``: a PIL image or an ``H x W (x 3)`` uint8 array.

    Example:
        >>> from PIL import Image
        >>> segment(Image.new("RGB", (50, 50), "white"))
        []
    """
    ink = erase_rules(page_ink(image))
    blocks: list = []
    em = line_height_estimate(ink)
    if em == 0:
        return []
    _blocks(ink, 0, ink.shape[0], 0, ink.shape[1], em, blocks)
    lines: list[SegLine] = []
    for k, (by0, by1, bx0, bx1) in enumerate(blocks):
        bands = _lines(ink, by0, by1, bx0, bx1)
        if not bands:
            continue
        med = float(np.median([e - s for s, e in bands]))
        for j, (ly0, ly1) in enumerate(bands):
            em = max(ly1 - ly0, 0.85 * med)
            cols = ink[ly0:ly1, bx0:bx1].any(axis=0)
            split = TOKEN_SPLIT_EM * em
            runs = _runs(cols)
            boxes: list[SegBox] = []
            for s, e in runs:
                if boxes and s - (boxes[-1].x1 - bx0) < split:
                    boxes[-1].x1 = bx0 + e
                    continue
                gap = None if not boxes else s - (boxes[-1].x1 - bx0)
                boxes.append(SegBox(bx0 + s, bx0 + e, gap))
            line = SegLine(ly0, ly1, boxes, blank_before=1 if (j == 0 and lines) else 0, block=k, em=em)
            lines.append(line)
    return lines
