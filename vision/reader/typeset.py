"""Token-spaced typesetting: pages whose every language-model token is a box a processor can find.

Why: the reader (:mod:`mmspec.vision.reader`) puts one visual token per token box, in reading order, into a
pretrained language model, trained so that each visual token is the LM's own input embedding of the token in
the box. A processor can only find token boxes if they are visible: here a page shows its hard-wrapped
Markdown source (``#`` headings, ``-`` bullets, ``|`` tables drawn as text) with a thin gap between the tokens
of a word (``un belie vable``) and a wider one between words. The gaps are measured in ems of the line's
font, so they survive every font size, blur and noise the pages get. Line breaks and blank lines need no box:
the processor sees them and writes ``\\n`` tokens itself.

One box is one token, except a space the tokenizer keeps apart: SmolLM2's tokenizer splits digits singly and
writes the space before a number as its own token (``in 2024`` -> ``in``, `` ``, ``2``, ``0``...). A digit
after a word gap is therefore one box of class ``SPACE_DIGIT_BASE + d`` ("a space, then ``d``"): ten classes
past the vocabulary.

The alternative, natural proportional text with word gaps only, gives no way to tell where one token of a
word ends and the next begins without reading it first; the bundled 12M testbed that read such pages reached
CER 0.45 (DESIGN.md). What was chosen and measured is written in ``vision/assets/reader/README.md``.

Example:
    >>> from mmspec.vision.reader.typeset import gap_ems
    >>> gap_ems()
    {'token': 0.6, 'word': 1.2}
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass, field

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

from ..workloads.render import get_font, line_height

__all__ = ["TOKEN_GAP_EM", "WORD_GAP_EM", "SPACE_DIGIT_BASE", "N_BOX_CLASSES", "TokenBox", "Line", "Page",
           "Typesetter", "Style", "gap_ems", "box_class_text", "degrade"]

TOKEN_GAP_EM = 0.6
"""Gap between two tokens of one word, in ems of the line's font."""
WORD_GAP_EM = 1.2
"""Gap before a token that starts with a space (a word gap), in ems."""
VOCAB_SIZE = 49152
SPACE_DIGIT_BASE = VOCAB_SIZE
"""Box class of "a space, then digit d" is ``SPACE_DIGIT_BASE + d`` (the tokenizer keeps that space apart)."""
N_BOX_CLASSES = VOCAB_SIZE + 10


def gap_ems() -> dict:
    """The two gaps of the typesetting, in ems (what the processor's thresholds sit between).

    Example:
        >>> gap_ems()["word"] > gap_ems()["token"]
        True
    """
    return {"token": TOKEN_GAP_EM, "word": WORD_GAP_EM}


@dataclass
class TokenBox:
    """One box on a line: ``[x0, x1)`` its ink columns, ``cls`` its box class, ``ids`` the tokens it stands for."""

    x0: int
    x1: int
    cls: int
    ids: tuple


@dataclass
class Line:
    """One typeset line: its ink rows ``[y0, y1)``, its boxes left to right, the Markdown source it shows."""

    y0: int
    y1: int
    boxes: list
    text: str
    blank_before: int = 0  # blank source lines between the previous line (in reading order) and this one


@dataclass
class Page:
    """A typeset page: the image, its Markdown (the reference transcription) and its lines in reading order."""

    image: Image.Image
    markdown: str
    lines: list
    meta: dict = field(default_factory=dict)


@dataclass
class Style:
    """How a page looks: font family, body size in px, ink and paper colours."""

    family: str = "dejavu-sans"
    size: int = 16
    ink: tuple = (0, 0, 0)
    paper: tuple = (255, 255, 255)

    @property
    def leading(self) -> int:
        return max(3, round(0.35 * self.size))

    @property
    def block_gap(self) -> int:
        return round(1.3 * self.size)


class Typesetter:
    """Lays hard-wrapped Markdown out as token-spaced lines and draws them (see the module docstring).

    ``tokenizer`` is the reader's (a transformers tokenizer); its per-line tokenization decides the boxes,
    and :meth:`check` confirms that the lines' tokens joined by ``\\n`` are the tokenization of the page.

    Example:
        >>> ts = Typesetter(tok)                                                    # doctest: +SKIP
        >>> lines = ts.wrap_paragraph("The quick brown fox.", Style(), 120)          # doctest: +SKIP
    """

    def __init__(self, tokenizer, spacing: str = "token"):
        if spacing not in ("token", "natural"):
            raise ValueError(f"spacing must be 'token' or 'natural', got {spacing!r}")
        # "natural": no gap inside words and a plain space between them (the alternative the reader is measured
        # on, to show what the token gaps buy); the space is set per font in line_width / draw_line
        self.spacing = spacing
        self.tok = tokenizer
        self.newline_id = tokenizer("\n", add_special_tokens=False)["input_ids"][0]
        self.space_id = tokenizer(" ", add_special_tokens=False)["input_ids"][0]
        self._digit_ids = {tokenizer(str(d), add_special_tokens=False)["input_ids"][0]: d for d in range(10)}

    # ------------------------------------------------------------------ tokens -> boxes
    @functools.lru_cache(maxsize=200_000)
    def _piece(self, token_id: int) -> str:
        return self.tok.decode([token_id])

    def encode_line(self, text: str) -> list:
        return self.tok(text, add_special_tokens=False)["input_ids"]

    def boxes_of(self, ids) -> list | None:
        """``[(glyphs, leading_space, cls, ids)]`` for a line's token ids; ``None`` if a token cannot be a box
        (two spaces, a space before something other than a digit, a whitespace token inside a line)."""
        out, i = [], 0
        while i < len(ids):
            t = ids[i]
            s = self._piece(t)
            if t == self.space_id:
                if i + 1 < len(ids) and ids[i + 1] in self._digit_ids:
                    d = ids[i + 1]
                    out.append((self._piece(d), True, SPACE_DIGIT_BASE + self._digit_ids[d], (t, d)))
                    i += 2
                    continue
                return None
            lead = s.startswith(" ")
            glyphs = s[1:] if lead else s
            if not glyphs or glyphs.strip() != glyphs or "\n" in glyphs:
                return None
            out.append((glyphs, lead, t, (t,)))
            i += 1
        return out

    def gap(self, lead: bool, font, em: float) -> float:
        """The space before a box: a word gap if the token starts with a space, else a token gap (pixels)."""
        if self.spacing == "natural":
            return font.getlength(" ") if lead else 0.0
        return (WORD_GAP_EM if lead else TOKEN_GAP_EM) * em

    def line_width(self, boxes, font, em: float) -> float:
        w = 0.0
        for j, (glyphs, lead, _, _) in enumerate(boxes):
            if j:
                w += self.gap(lead, font, em)
            w += font.getlength(glyphs)
        return w

    # ------------------------------------------------------------------ wrapping
    def wrap(self, text: str, font, em: float, width: float) -> list[str] | None:
        """Greedy hard wrap of ``text`` (one Markdown source line) into lines no wider than ``width`` as typeset;
        ``None`` when a single word does not fit or a line has a token that cannot be a box."""
        words = text.split(" ")
        lines, cur = [], ""
        for w in words:
            cand = w if not cur else cur + " " + w
            boxes = self.boxes_of(self.encode_line(cand))
            if boxes is None:
                return None
            if self.line_width(boxes, font, em) <= width:
                cur = cand
                continue
            if not cur:
                return None
            lines.append(cur)
            cur = w
            boxes = self.boxes_of(self.encode_line(cur))
            if boxes is None or self.line_width(boxes, font, em) > width:
                return None
        if cur:
            lines.append(cur)
        return lines

    # ------------------------------------------------------------------ drawing
    def draw_line(self, draw: ImageDraw.ImageDraw, x: float, y: float, text: str, font, em: float, ink,
                  jumps: dict | None = None) -> Line:
        """Draw one source line token by token from ``(x, y)`` (top of the font's ascent); return its boxes.

        ``jumps`` maps a box index to the x where that box starts instead (a chart's value after its bar); the
        box must start a word, so that the wider gap still reads as a word gap."""
        ids = self.encode_line(text)
        boxes = self.boxes_of(ids)
        if boxes is None:
            raise ValueError(f"line cannot be typeset box by box: {text!r}")
        jumps = jumps or {}
        out, cx = [], float(x)
        ys = []
        for j, (glyphs, lead, cls, tids) in enumerate(boxes):
            if j in jumps:
                if not lead:
                    raise ValueError(f"box {j} of {text!r} does not start a word")
                cx = float(jumps[j])
            elif j:
                cx += self.gap(lead, font, em)
            xi = round(cx)
            draw.text((xi, y), glyphs, font=font, fill=ink)
            l, t, r, b = draw.textbbox((xi, y), glyphs, font=font)
            out.append(TokenBox(int(l), int(r), int(cls), tuple(int(v) for v in tids)))
            ys += [t, b]
            cx += font.getlength(glyphs)
        return Line(int(min(ys)), int(max(ys)), out, text)

    def check(self, page_markdown: str, lines: list) -> bool:
        """Whether the page's tokenization is its lines' tokens joined by newline tokens (blank lines included):
        what the processor's ``\\n`` tokens and the boxes together spell."""
        want = self.encode_line(page_markdown)
        got = []
        for k, line in enumerate(lines):
            if k:
                got += [self.newline_id] * (1 + line.blank_before)
            for b in line.boxes:
                got += list(b.ids)
        return got == want


def box_class_text(cls: int, tokenizer) -> str:
    """The text a box class stands for (a token, or a space and a digit).

    Example:
        >>> box_class_text(SPACE_DIGIT_BASE + 7, None)
        ' 7'
    """
    if cls >= SPACE_DIGIT_BASE:
        return " " + str(cls - SPACE_DIGIT_BASE)
    return tokenizer.decode([cls])


def degrade(image: Image.Image, rng: random.Random, nrng: np.random.Generator, *, max_blur: float = 0.8,
            max_noise: float = 10.0, p_blur: float = 0.5) -> tuple[Image.Image, dict]:
    """Scan-like degradation without rotation: a slight Gaussian blur and grey noise (rotation would tilt the
    lines the processor finds by projection; pages here are upright, as a scanner's deskew leaves them).

    Example:
        >>> import random, numpy as np
        >>> out, info = degrade(Image.new("RGB", (20, 10), "white"), random.Random(0), np.random.default_rng(0))
        >>> out.size, sorted(info)
        ((20, 10), ['blur', 'noise'])
    """
    u_blur, a_blur, a_noise = rng.random(), rng.random(), rng.random()
    blur = (0.3 + 0.7 * a_blur) * max_blur if u_blur < p_blur else 0.0
    sigma = a_noise * max_noise
    if blur:
        image = image.filter(ImageFilter.GaussianBlur(blur))
    if sigma > 0.5:
        arr = np.asarray(image).astype(np.int16)
        arr += np.rint(nrng.standard_normal(arr.shape[:2], dtype=np.float32) * sigma).astype(np.int16)[..., None]
        image = Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8), "RGB")
    return image, {"blur": round(blur, 3), "noise": round(sigma, 3)}


def font_em(font) -> float:
    """A font's em in pixels (its size; Pillow's bitmap fallback: its line height)."""
    return float(getattr(font, "size", None) or line_height(font))
