"""The image world: small pictures composed from a text prompt, for autoregressive image generation.

Why: spatial speculation for AR image generators is only measurable on a generator whose images have
structure a classifier can check, and no real generator or data set can be downloaded here. Every item is a
*scene spec* drawn from a seed, a prompt written from the spec, and the picture drawn from the spec:

* **shapes**: one or two shapes (circle, square, triangle, diamond) in one of six colours, small or large;
  one shape has a position (left, right, top, bottom, centre), two shapes a relation (above, left of);
* **glyphs**: one large letter or digit in a colour;
* on a background: plain, striped (horizontal or vertical), checkered or dotted, in two colours.

Prompts read like "a red circle above a blue square on a striped background" or "the letter K in green on a
white background"; :func:`parse_prompt` inverts :func:`prompt_for` exactly, so a generated image can be
checked against what its prompt asked (see :mod:`mmspec.image_ar` quality measures).

Example:
    >>> spec = sample_spec(np.random.default_rng(0))
    >>> parse_prompt(prompt_for(spec)) == spec
    True
    >>> draw(spec, 64).size
    (64, 64)
"""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw, ImageFont

__all__ = ["SHAPES", "COLORS", "BACKGROUNDS", "POSITIONS", "RELATIONS", "GLYPHS", "sample_spec", "prompt_for",
           "parse_prompt", "draw", "spec_labels", "LABEL_HEADS"]

SHAPES = ("circle", "square", "triangle", "diamond")
COLORS = {"red": (220, 40, 40), "green": (40, 170, 60), "blue": (40, 80, 220), "yellow": (240, 210, 40),
          "purple": (150, 60, 190), "orange": (245, 140, 30)}
BG_COLORS = {"white": (245, 245, 245), "black": (20, 20, 20), "gray": (128, 128, 128)}
BACKGROUNDS = ("plain", "striped", "checkered", "dotted")
POSITIONS = ("left", "right", "top", "bottom", "center")
RELATIONS = ("above", "left of")
GLYPHS = tuple("ABCEFHKLMNPRSTXZ2345789")
SIZES = ("small", "large")


def sample_spec(rng: np.random.Generator) -> dict:
    """A random scene spec (a plain dict of strings, so it round-trips through the prompt)."""
    c = lambda: str(rng.choice(list(COLORS)))  # noqa: E731
    bg = {"pattern": str(rng.choice(BACKGROUNDS)), "color": str(rng.choice(list(BG_COLORS)))}
    kind = str(rng.choice(["shapes", "shapes", "glyph"]))
    if kind == "glyph":
        return {"kind": "glyph", "glyph": str(rng.choice(GLYPHS)), "color": c(), "background": bg}
    n = int(rng.integers(1, 3))
    objs = []
    for _ in range(n):
        objs.append({"shape": str(rng.choice(SHAPES)), "color": c(), "size": str(rng.choice(SIZES))})
    if n == 2:
        while objs[1]["shape"] == objs[0]["shape"] and objs[1]["color"] == objs[0]["color"]:
            objs[1]["color"] = c()
        return {"kind": "shapes", "objects": objs, "relation": str(rng.choice(RELATIONS)), "background": bg}
    return {"kind": "shapes", "objects": objs, "position": str(rng.choice(POSITIONS)), "background": bg}


def _bg_text(bg: dict) -> str:
    return f"on a {bg['color']} background" if bg["pattern"] == "plain" else f"on a {bg['pattern']} {bg['color']} background"


def prompt_for(spec: dict) -> str:
    """The prompt of a spec.

    Example:
        >>> prompt_for({"kind": "glyph", "glyph": "K", "color": "green",
        ...             "background": {"pattern": "plain", "color": "white"}})
        'the letter K in green on a white background'
    """
    bg = _bg_text(spec["background"])
    if spec["kind"] == "glyph":
        return f"the letter {spec['glyph']} in {spec['color']} {bg}"
    o = [f"a {x['size']} {x['color']} {x['shape']}" for x in spec["objects"]]
    if len(o) == 2:
        return f"{o[0]} {spec['relation']} {o[1]} {bg}"
    where = "in the center" if spec["position"] == "center" else (
        f"on the {spec['position']}" if spec["position"] in ("left", "right") else f"at the {spec['position']}")
    return f"{o[0]} {where} {bg}"


def parse_prompt(prompt: str) -> dict:
    """The spec a prompt describes (the inverse of :func:`prompt_for`; ``ValueError`` on other text)."""
    words = prompt.split()
    try:
        i = words.index("on")
        while words[i + 1] != "a" or not words[-1] == "background":
            i = words.index("on", i + 1)
        tail = words[words.index("a", i) + 1: -1]
    except (ValueError, IndexError) as e:
        raise ValueError(f"not a prompt of this world: {prompt!r}") from e
    bg = {"pattern": "plain", "color": tail[0]} if len(tail) == 1 else {"pattern": tail[0], "color": tail[1]}
    head = words[:i]
    if head[:2] == ["the", "letter"]:
        return {"kind": "glyph", "glyph": head[2], "color": head[4], "background": bg}
    obj = lambda w: {"shape": w[3], "color": w[2], "size": w[1]}  # noqa: E731  ["a", size, color, shape]
    first = obj(head[:4])
    rest = head[4:]
    if rest[:1] == ["above"]:
        return {"kind": "shapes", "objects": [first, obj(rest[1:5])], "relation": "above", "background": bg}
    if rest[:2] == ["left", "of"]:
        return {"kind": "shapes", "objects": [first, obj(rest[2:6])], "relation": "left of", "background": bg}
    return {"kind": "shapes", "objects": [first], "position": rest[-1], "background": bg}


def _background(img: Image.Image, bg: dict) -> None:
    W = img.size[0]
    d = ImageDraw.Draw(img)
    base = BG_COLORS[bg["color"]]
    other = tuple(int(v * 0.6 + 128 * 0.4) if bg["color"] != "gray" else int(v * 0.6) for v in base)
    d.rectangle([0, 0, W, W], fill=base)
    step = max(4, W // 8)
    if bg["pattern"] == "striped":
        for k in range(0, W, step * 2):
            d.rectangle([0, k, W, k + step - 1], fill=other)
    elif bg["pattern"] == "checkered":
        for r in range(0, W, step):
            for c in range(0, W, step):
                if (r // step + c // step) % 2:
                    d.rectangle([c, r, c + step - 1, r + step - 1], fill=other)
    elif bg["pattern"] == "dotted":
        rad = max(1, step // 5)
        for r in range(step // 2, W, step):
            for c in range(step // 2, W, step):
                d.ellipse([c - rad, r - rad, c + rad, r + rad], fill=other)


def _shape(d: ImageDraw.ImageDraw, shape: str, cx: float, cy: float, r: float, color) -> None:
    if shape == "circle":
        d.ellipse([cx - r, cy - r, cx + r, cy + r], fill=color)
    elif shape == "square":
        d.rectangle([cx - r, cy - r, cx + r, cy + r], fill=color)
    elif shape == "triangle":
        d.polygon([(cx, cy - r), (cx + r, cy + r), (cx - r, cy + r)], fill=color)
    else:
        d.polygon([(cx, cy - r), (cx + r, cy), (cx, cy + r), (cx - r, cy)], fill=color)


def draw(spec: dict, size: int = 64) -> Image.Image:
    """Render a spec as an RGB ``size x size`` image (deterministic: no randomness beyond the spec)."""
    img = Image.new("RGB", (size, size))
    _background(img, spec["background"])
    d = ImageDraw.Draw(img)
    W = size
    if spec["kind"] == "glyph":
        font = _font(int(W * 0.7))
        box = d.textbbox((0, 0), spec["glyph"], font=font)
        x = (W - (box[2] - box[0])) / 2 - box[0]
        y = (W - (box[3] - box[1])) / 2 - box[1]
        d.text((x, y), spec["glyph"], fill=COLORS[spec["color"]], font=font)
        return img
    objs = spec["objects"]
    radius = lambda o: W * (0.12 if o["size"] == "small" else 0.2)  # noqa: E731
    if len(objs) == 1:
        cx, cy = {"left": (0.27, 0.5), "right": (0.73, 0.5), "top": (0.5, 0.27), "bottom": (0.5, 0.73),
                  "center": (0.5, 0.5)}[spec["position"]]
        _shape(d, objs[0]["shape"], cx * W, cy * W, radius(objs[0]), COLORS[objs[0]["color"]])
        return img
    a, b = ((0.5, 0.27), (0.5, 0.73)) if spec["relation"] == "above" else ((0.27, 0.5), (0.73, 0.5))
    for o, (cx, cy) in zip(objs, (a, b)):
        _shape(d, o["shape"], cx * W, cy * W, radius(o), COLORS[o["color"]])
    return img


_FONTS: dict = {}


def _font(px: int):
    if px not in _FONTS:
        try:
            _FONTS[px] = ImageFont.truetype("DejaVuSans-Bold.ttf", px)
        except OSError:
            _FONTS[px] = ImageFont.load_default(size=px)
    return _FONTS[px]


LABEL_HEADS = {"kind": ("shapes", "glyph"), "count": ("1", "2"), "shape1": SHAPES + ("none",),
               "color1": tuple(COLORS), "size1": SIZES + ("none",), "shape2": SHAPES + ("none",),
               "color2": tuple(COLORS) + ("none",), "size2": SIZES + ("none",),
               "layout": POSITIONS + RELATIONS + ("none",), "glyph": GLYPHS + ("none",),
               "pattern": BACKGROUNDS, "bg_color": tuple(BG_COLORS)}
"""What a classifier of this world predicts (one softmax head each); ``none`` where a field does not apply."""


def spec_labels(spec: dict) -> dict:
    """Class index per :data:`LABEL_HEADS` head for a spec (the classifier's targets; prompt accuracy asks
    that every head of a generated image match its prompt's).

    Example:
        >>> spec_labels(parse_prompt("a small red circle in the center on a white background"))["layout"]
        4
    """
    none = "none"
    if spec["kind"] == "glyph":
        vals = {"kind": "glyph", "count": "1", "shape1": none, "color1": spec["color"], "size1": none,
                "shape2": none, "color2": none, "size2": none, "layout": none, "glyph": spec["glyph"]}
    else:
        o = spec["objects"]
        two = len(o) == 2
        vals = {"kind": "shapes", "count": str(len(o)), "shape1": o[0]["shape"], "color1": o[0]["color"],
                "size1": o[0]["size"], "shape2": o[1]["shape"] if two else none,
                "color2": o[1]["color"] if two else none, "size2": o[1]["size"] if two else none,
                "layout": spec["relation"] if two else spec["position"], "glyph": none}
    vals.update(pattern=spec["background"]["pattern"], bg_color=spec["background"]["color"])
    return {k: LABEL_HEADS[k].index(v) for k, v in vals.items()}
