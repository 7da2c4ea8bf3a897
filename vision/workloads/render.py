"""Drawing helpers shared by the synthetic workloads: fonts, a canvas that records what it draws, noise.

Why: the docs and charts workloads must render legible text at small sizes with whatever fonts the
machine has (DejaVu, Liberation, Free or Noto TTFs when present, else Pillow's bundled font), and the
testbed's later training wants to know where each piece of text was drawn (an auxiliary loss on the vision
tower reads the character under each patch column). :class:`Canvas` draws text through Pillow and
records every run (text, box, font size and, on request, each character's left edge) in pixel
coordinates of the image before augmentation. :func:`augment` adds the light scan-like noise, rotation
and blur.

Fonts and determinism: the same ``(split, index)`` gives the same pixels on machines with the same Pillow
and the same font files. Pass ``fonts="default"`` to a workload to use only Pillow's bundled font, which
travels with Pillow. ``MMSPEC_FONT_DIRS`` (``os.pathsep``-separated folders) adds places to look for fonts.

Example:
    >>> from PIL import Image
    >>> "default" in font_families()
    True
    >>> c = Canvas(Image.new("RGB", (80, 20), "white"))
    >>> run = c.text(2, 2, "Hi", get_font("default", 12))
    >>> run["text"], run["box"][0]
    ('Hi', 2)
"""

from __future__ import annotations

import functools
import os
import random

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

__all__ = ["font_families", "get_font", "text_width", "line_height", "Canvas", "augment", "wrap_words",
           "PALETTE"]

FONT_DIRS = ("/usr/share/fonts", "/usr/local/share/fonts", "~/.local/share/fonts", "~/.fonts",
             "/Library/Fonts", "/System/Library/Fonts", "C:/Windows/Fonts")

# family name -> (regular file, bold file); the bold one may be missing (the regular one is used instead)
_FAMILY_FILES = {
    "dejavu-sans": ("DejaVuSans.ttf", "DejaVuSans-Bold.ttf"),
    "dejavu-sans-condensed": ("DejaVuSansCondensed.ttf", "DejaVuSansCondensed-Bold.ttf"),
    "dejavu-serif": ("DejaVuSerif.ttf", "DejaVuSerif-Bold.ttf"),
    "dejavu-serif-condensed": ("DejaVuSerifCondensed.ttf", "DejaVuSerifCondensed-Bold.ttf"),
    "dejavu-mono": ("DejaVuSansMono.ttf", "DejaVuSansMono-Bold.ttf"),
    "liberation-sans": ("LiberationSans-Regular.ttf", "LiberationSans-Bold.ttf"),
    "liberation-serif": ("LiberationSerif-Regular.ttf", "LiberationSerif-Bold.ttf"),
    "liberation-mono": ("LiberationMono-Regular.ttf", "LiberationMono-Bold.ttf"),
    "free-sans": ("FreeSans.ttf", "FreeSansBold.ttf"),
    "free-serif": ("FreeSerif.ttf", "FreeSerifBold.ttf"),
    "noto-sans": ("NotoSans-Regular.ttf", "NotoSans-Bold.ttf"),
    "noto-serif": ("NotoSerif-Regular.ttf", "NotoSerif-Bold.ttf"),
}

PALETTE = [
    (31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189), (140, 86, 75),
    (227, 119, 194), (127, 127, 127), (188, 189, 34), (23, 190, 207),
]
"""Ten distinguishable colours (matplotlib's tab10), used for bars, lines and slices."""


@functools.lru_cache(maxsize=1)
def _font_files() -> dict[str, str]:
    dirs = [d for d in os.environ.get("MMSPEC_FONT_DIRS", "").split(os.pathsep) if d] + list(FONT_DIRS)
    wanted = {f for pair in _FAMILY_FILES.values() for f in pair}
    found: dict[str, str] = {}
    for d in dirs:
        d = os.path.expanduser(d)
        if not os.path.isdir(d):
            continue
        for root, subdirs, files in os.walk(d):
            subdirs.sort()
            for f in sorted(files):
                if f in wanted and f not in found:
                    found[f] = os.path.join(root, f)
    return found


@functools.lru_cache(maxsize=1)
def _families() -> dict[str, tuple[str, str]]:
    files = _font_files()
    fams = {}
    for fam, (reg, bold) in _FAMILY_FILES.items():
        if reg in files:
            fams[fam] = (files[reg], files.get(bold, files[reg]))
    return fams


def font_families() -> list[str]:
    """Font families usable here: the TTF families found on this machine, then ``"default"`` (Pillow's own).

    Example:
        >>> font_families()[-1]
        'default'
    """
    return sorted(_families()) + ["default"]


@functools.lru_cache(maxsize=512)
def get_font(family: str, size: int, bold: bool = False):
    """A Pillow font of ``family`` at ``size`` px (cached). Unknown families and missing files fall back
    to Pillow's bundled font (bitmap, fixed size, when Pillow lacks FreeType).

    Example:
        >>> get_font("default", 12).getlength("abc") > 0
        True
    """
    fams = _families()
    if family in fams:
        try:
            return ImageFont.truetype(fams[family][1 if bold else 0], size)
        except OSError:  # unreadable file: fall through to Pillow's font
            pass
    try:
        return ImageFont.load_default(size=size)
    except (TypeError, ImportError, OSError):  # Pillow without FreeType or older than 10.1
        return ImageFont.load_default()


def text_width(font, s: str) -> float:
    """Advance width of ``s`` in pixels.

    Example:
        >>> text_width(get_font("default", 12), "") == 0
        True
    """
    return font.getlength(s)


@functools.lru_cache(maxsize=512)
def _metrics(font) -> tuple[int, int]:
    try:
        return font.getmetrics()
    except AttributeError:  # bitmap font
        box = font.getbbox("Ag")
        return box[3], 0


def line_height(font) -> int:
    """Ascent + descent of ``font`` in pixels (the height of one line of text, without leading).

    Example:
        >>> line_height(get_font("default", 12)) >= 12
        True
    """
    a, d = _metrics(font)
    return a + d


def wrap_words(text: str, font, width: float) -> list[str]:
    """Greedy word wrap of ``text`` into lines no wider than ``width`` (a longer single word stays whole).

    Example:
        >>> wrap_words("a b c", get_font("default", 12), 1000)
        ['a b c']
    """
    lines, cur = [], ""
    space = font.getlength(" ")
    cur_w = 0.0
    for w in text.split():
        ww = font.getlength(w)
        if cur and cur_w + space + ww > width:
            lines.append(cur)
            cur, cur_w = w, ww
        else:
            cur, cur_w = (cur + " " + w, cur_w + space + ww) if cur else (w, ww)
    if cur:
        lines.append(cur)
    return lines


class Canvas:
    """An image with an ``ImageDraw`` that records every text run it draws (for layout-aware training).

    Each run is ``{"text", "box": [x0, y0, x1, y1], "size"}``, plus ``"chars"`` (the left edge of every
    character, then the right edge of the last) when ``char_boxes`` is on. Boxes are integers, in pixels
    of the image before :func:`augment`. With ``record=False`` nothing is kept (faster).
    """

    def __init__(self, image: Image.Image, char_boxes: bool = False, record: bool = True):
        self.image = image
        self.draw = ImageDraw.Draw(image)
        self.runs: list[dict] = []
        self.char_boxes = char_boxes
        self.record = record

    def text(self, x: float, y: float, s: str, font, fill=(0, 0, 0)) -> dict | None:
        """Draw ``s`` with its top-left (ascender line) at ``(x, y)``; return the recorded run."""
        x, y = int(round(x)), int(round(y))
        self.draw.text((x, y), s, font=font, fill=fill)
        if not self.record:
            return None
        w = font.getlength(s)
        run = {"text": s, "box": [x, y, int(round(x + w)), y + line_height(font)],
               "size": getattr(font, "size", None)}
        if self.char_boxes:
            run["chars"] = [int(round(x + font.getlength(s[:i]))) for i in range(len(s) + 1)]
        self.runs.append(run)
        return run

    def rotated_text(self, cx: float, cy: float, s: str, font, fill=(0, 0, 0), bg=(255, 255, 255)) -> dict | None:
        """Draw ``s`` turned 90 degrees counter-clockwise (reading bottom to top), centred on ``(cx, cy)``."""
        w, h = int(font.getlength(s)) + 2, line_height(font) + 2
        tile = Image.new("RGB", (w, h), bg)
        ImageDraw.Draw(tile).text((1, 1), s, font=font, fill=fill)
        tile = tile.transpose(Image.Transpose.ROTATE_90)
        x0, y0 = int(round(cx - h / 2)), int(round(cy - w / 2))
        self.image.paste(tile, (x0, y0))
        if not self.record:
            return None
        run = {"text": s, "box": [x0, y0, x0 + h, y0 + w], "size": getattr(font, "size", None), "rotated": 90}
        self.runs.append(run)
        return run


def augment(image: Image.Image, rng: random.Random, nrng: np.random.Generator, *, max_rotation: float = 1.0,
            max_blur: float = 0.6, max_noise: float = 6.0, p_rotate: float = 0.5, p_blur: float = 0.3,
            background=(255, 255, 255)) -> tuple[Image.Image, dict]:
    """Light scan-like degradation: a small rotation, a slight blur, grey Gaussian noise.

    Returns the new image and what was applied (``{"rotation": deg, "blur": radius, "noise": sigma}``).
    Draws from ``rng`` a fixed number of times whatever the settings, so the settings never shift the
    content of later draws.

    Example:
        >>> import random, numpy as np
        >>> img = Image.new("RGB", (40, 30), "white")
        >>> out, info = augment(img, random.Random(0), np.random.default_rng(0))
        >>> out.size, sorted(info)
        ((40, 30), ['blur', 'noise', 'rotation'])
    """
    u_rot, a_rot, u_blur, a_blur, a_noise = (rng.random() for _ in range(5))
    rot = (a_rot * 2 - 1) * max_rotation if (u_rot < p_rotate and max_rotation > 0) else 0.0
    blur = (0.25 + 0.75 * a_blur) * max_blur if (u_blur < p_blur and max_blur > 0) else 0.0
    sigma = a_noise * max_noise
    if rot:
        image = image.rotate(rot, resample=Image.Resampling.BILINEAR, fillcolor=background)
    if blur:
        image = image.filter(ImageFilter.GaussianBlur(blur))
    if sigma > 0.5:
        arr = np.asarray(image).astype(np.int16)
        noise = np.rint(nrng.standard_normal(arr.shape[:2], dtype=np.float32) * sigma).astype(np.int16)
        arr += noise[..., None]
        np.clip(arr, 0, 255, out=arr)
        image = Image.fromarray(arr.astype(np.uint8), "RGB")
    return image, {"rotation": round(rot, 3), "blur": round(blur, 3), "noise": round(sigma, 3)}
