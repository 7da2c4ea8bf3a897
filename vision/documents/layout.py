"""The layout stage of hierarchical page decoding: a page image in, its blocks (type, box, reading order) out.

Why: hierarchical parallel decoding (HPD-Parsing, MinerU's two stages) needs each block of a page before the
target reads it; the blocks must come from the pixels alone (never the renderer's metadata at inference), so
that the same stage runs on a scanned page. The detector is a small fully convolutional net trained here on
rendered pages of the docs workload, whose metadata gives the labels:

* **Model** (:class:`LayoutDetector`): the page in grey at half resolution, a six-conv encoder down to 1/32 with
  a dilated context layer (a block's type is a property of the whole block: a numbered list's numbers sit at
  its left edge), and a small top-down decoder back to a grid of 4-px cells. Each cell is classified as
  background or one of :data:`LAYOUT_TYPES`. About 100k parameters, saved in float16 (well under 1 MB).
* **Labels**: a cell is a block's type when its centre lies in the block's box. The blank band between two
  blocks (11 px or more on these pages, against 4-10 px between lines) is weighted up in the loss: it is what
  keeps neighbouring blocks apart.
* **Decoding** (:meth:`LayoutDetector.detect`): connected components of the foreground cells
  (:func:`label_cells`), small ones dropped; a component's box is its cells' extent grown by half a cell, its
  type the type with the largest summed probability over its cells, its score their mean foreground probability.
* **Reading order** (:func:`reading_order`): from the boxes only: boxes wider than 60% of the content width
  span the columns and split the page into bands; inside a band, columns (found as gaps in the horizontal
  coverage of the narrower boxes) left to right, each top to bottom.

Training (:func:`train_layout`, ``mmspec train-layout``) is resumable (a checkpoint with the optimiser and the
step every ``save_every`` steps), and runs on one CPU thread within minutes.

Example:
    >>> from mmspec.vision.workloads import DocsWorkload
    >>> det = LayoutDetector.from_pretrained(bundled_layout())
    >>> page = DocsWorkload(mode="page").example("test", 0)
    >>> [b["type"] for b in det.detect([page.images[0]])[0]]
    ['heading1', 'paragraph']
    >>> reading_order([(350, 60, 650, 200), (10, 10, 650, 50), (10, 60, 320, 300), (350, 210, 650, 300)])
    [1, 2, 0, 3]
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from mmspec.errors import InvalidInputError

__all__ = ["LAYOUT_TYPES", "LayoutDetector", "LayoutTrainConfig", "train_layout", "evaluate_layout",
           "reading_order", "block_type", "page_labels", "bundled_layout", "match_boxes", "label_cells"]

LAYOUT_TYPES = ("heading1", "heading2", "paragraph", "bullets", "numbered", "table", "formula")
"""Block types the detector tells apart (a heading's level is its type: it decides the ``#`` prefix)."""

CELL = 4
"""Pixels (at full resolution) per output cell."""
SCALE = 0.5
"""The detector reads the page at this scale (text stays visible as texture; four times fewer pixels)."""
_ALIGN = 64  # the encoder halves the half-resolution page five times: pad to a multiple of 2**5 there


def block_type(block: dict) -> str:
    """The layout type of a docs-workload block dict (``heading1`` / ``heading2`` for headings).

    Example:
        >>> block_type({"type": "heading", "level": 2}), block_type({"type": "table"})
        ('heading2', 'table')
    """
    return f"heading{block['level']}" if block["type"] == "heading" else block["type"]


def _conv(cin, cout, stride=1, dilation=1):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, padding=dilation, dilation=dilation, bias=False),
                         nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class LayoutDetector(nn.Module):
    """Dense block detector over a page image (see the module docstring); ``save_pretrained`` /
    ``from_pretrained`` like an HF model (``config.json`` + ``model.safetensors``).

    Example:
        >>> det = LayoutDetector(width=8)
        >>> det(torch.zeros(1, 1, 224, 192)).shape   # a 448 x 384 page at half scale: 4-px cells
        torch.Size([1, 8, 112, 96])
    """

    def __init__(self, width: int = 16, types=LAYOUT_TYPES, min_cells: int = 40):
        super().__init__()
        self.config = {"kind": "docs-layout", "width": int(width), "types": list(types), "cell": CELL,
                       "scale": SCALE, "min_cells": int(min_cells)}
        w = int(width)
        self.types = tuple(types)
        # the output grid (1/4 of the page) is the costly resolution: one thin conv there each way
        self.e1 = _conv(1, w, 2)                                          # 1/4 of the page
        self.e2 = nn.Sequential(_conv(w, 2 * w, 2), _conv(2 * w, 2 * w))  # 1/8
        self.e3 = _conv(2 * w, 4 * w, 2)                                  # 1/16
        self.e4 = nn.Sequential(_conv(4 * w, 4 * w, 2), _conv(4 * w, 4 * w, dilation=2))  # 1/32, page context
        self.d3 = _conv(8 * w, 3 * w)
        self.d2 = _conv(5 * w, w)
        self.d1 = _conv(2 * w, w)
        self.head = nn.Conv2d(w, 1 + len(self.types), 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: ``[B, 1, H, W]`` ink in ``[0, 1]`` at half scale (H, W multiples of 32) -> logits
        ``[B, 1 + len(types), H / 2, W / 2]`` (class 0: background)."""
        f1 = self.e1(x)
        f2 = self.e2(f1)
        f3 = self.e3(f2)
        f4 = self.e4(f3)
        up = lambda t, ref: F.interpolate(t, size=ref.shape[-2:], mode="nearest")  # noqa: E731
        d = self.d3(torch.cat([up(f4, f3), f3], 1))
        d = self.d2(torch.cat([up(d, f2), f2], 1))
        d = self.d1(torch.cat([up(d, f1), f1], 1))
        return self.head(d)

    # ------------------------------------------------------------------ inference
    @staticmethod
    def page_tensor(image) -> tuple[torch.Tensor, tuple[int, int]]:
        """A page (PIL image) as the detector's input ``[1, H, W]`` (ink = 1 - grey, half scale, zero-padded
        to a multiple of 32) and the page's ``(width, height)``.

        Example:
            >>> from PIL import Image
            >>> LayoutDetector.page_tensor(Image.new("RGB", (336, 448), "white"))[0].shape
            torch.Size([1, 224, 192])
        """
        from PIL import Image

        w, h = image.size
        small = image.convert("L").resize((max(1, round(w * SCALE)), max(1, round(h * SCALE))), Image.BILINEAR)
        a = 1.0 - np.asarray(small, dtype=np.float32) / 255.0
        ph, pw = -(-a.shape[0] // (_ALIGN // 2)) * (_ALIGN // 2), -(-a.shape[1] // (_ALIGN // 2)) * (_ALIGN // 2)
        out = np.zeros((1, ph, pw), np.float32)
        out[0, : a.shape[0], : a.shape[1]] = a
        return torch.from_numpy(out), (w, h)

    @torch.no_grad()
    def detect(self, images: list, batch_size: int = 8) -> list[list[dict]]:
        """Blocks of each page, in reading order: dicts ``{"type", "box": [x0, y0, x1, y1], "score", "order"}``
        (boxes in the page's pixels).

        Example:
            >>> from PIL import Image
            >>> det = LayoutDetector.from_pretrained(bundled_layout())
            >>> det.detect([Image.new("RGB", (336, 448), "white")])     # a blank page has no blocks
            [[]]
            >>> from mmspec.vision.workloads import DocsWorkload
            >>> blocks = det.detect([DocsWorkload(mode="page").example("test", 3).images[0]])[0]
            >>> sorted(blocks[0]), [b["order"] for b in blocks] == list(range(len(blocks)))
            (['box', 'order', 'score', 'type'], True)
        """
        was = self.training
        self.eval()
        out = []
        try:
            for i in range(0, len(images), batch_size):
                chunk = images[i:i + batch_size]
                tensors = [self.page_tensor(im) for im in chunk]
                hmax = max(t.shape[1] for t, _ in tensors)
                wmax = max(t.shape[2] for t, _ in tensors)
                x = torch.stack([F.pad(t, (0, wmax - t.shape[2], 0, hmax - t.shape[1])) for t, _ in tensors])
                dev = next(self.parameters()).device
                probs = self(x.to(dev, next(self.parameters()).dtype)).float().softmax(1).cpu().numpy()
                for p, (t, size) in zip(probs, tensors):
                    out.append(self._decode(p, size, t[0].numpy()))
        finally:
            self.train(was)
        return out

    def _decode(self, probs: np.ndarray, size: tuple[int, int], ink: np.ndarray | None = None) -> list[dict]:
        """Blocks from the class probabilities ``[1 + T, H/4, W/4]`` of a page of ``size``; ``ink`` (the
        detector's half-scale input) drops a block with no ink in its box (the net has a prior for a title at the
        top of a page, even of a blank one)."""
        w, h = size
        gh, gw = -(-h // CELL), -(-w // CELL)
        p = probs[:, :gh, :gw]
        fg = p[0] < 0.5
        labels, boxes = label_cells(fg)
        heading = np.array([t.startswith("heading") for t in self.types])
        parts = []
        for k, sl in enumerate(boxes, 1):
            ys, xs = sl
            mask = labels[sl] == k
            # A heading touching the block below it (a missed blank band) is split off where the rows' majority
            # type turns from heading to content: headings only ever come on top of what they head.
            rows = p[1:, ys, xs].argmax(0)
            row_heading = [bool(heading[np.bincount(r[m], minlength=len(heading)).argmax()]) if m.any() else False
                           for r, m in zip(rows, mask)]
            cut = next((i for i in range(3, min(len(row_heading) - 3, 20))  # a heading is at most two lines
                        if all(row_heading[:i]) and not any(row_heading[i:])), None)
            for a, b in ([(0, cut), (cut, len(row_heading))] if cut else [(0, len(row_heading))]):
                sub = np.zeros_like(mask)
                sub[a:b] = mask[a:b]
                rr, cc = np.nonzero(sub)
                if len(rr):
                    parts.append((ys.start + rr.min(), ys.start + rr.max() + 1, xs.start + cc.min(),
                                  xs.start + cc.max() + 1, sub, ys, xs))
        blocks = []
        for y0, y1, x0, x1, sub, ys, xs in parts:
            if int(sub.sum()) < self.config["min_cells"]:
                continue
            if ink is not None:
                s_ = SCALE * CELL
                patch = ink[int(y0 * s_):int(y1 * s_), int(x0 * s_):int(x1 * s_)]
                if patch.size == 0 or (patch > 0.25).mean() < 0.005:
                    continue
            typ = p[1:, ys, xs][:, sub].sum(1)
            half = CELL // 2
            box = [int(max(0, x0 * CELL - half)), int(max(0, y0 * CELL - half)), int(min(w, x1 * CELL + half)),
                   int(min(h, y1 * CELL + half))]
            blocks.append({"type": self.types[int(typ.argmax())], "box": box,
                           "score": round(float(1.0 - p[0, ys, xs][sub].mean()), 4)})
        order = reading_order([b["box"] for b in blocks])
        blocks = [blocks[i] for i in order]
        for i, b in enumerate(blocks):
            b["order"] = i
        return blocks

    # ------------------------------------------------------------------ saving
    def save_pretrained(self, path) -> None:
        """Write ``config.json`` and ``model.safetensors`` (float16 weights) to ``path``."""
        from mmspec.checkpoints import save_state_compact

        os.makedirs(path, exist_ok=True)
        save_state_compact(self.state_dict(), os.path.join(path, "model.safetensors"), torch.float16)
        with open(os.path.join(path, "config.json"), "w") as f:
            json.dump(self.config, f, indent=2)

    @classmethod
    def from_pretrained(cls, path) -> "LayoutDetector":
        """Load a detector saved by :meth:`save_pretrained` (weights back in float32, eval mode).

        Example:
            >>> LayoutDetector.from_pretrained("/no/such/layout")
            Traceback (most recent call last):
            ...
            mmspec.errors.InvalidInputError: no layout detector in /no/such/layout (config.json and model.safetensors)
        """
        from safetensors.torch import load_file

        cfg_path, weights = os.path.join(path, "config.json"), os.path.join(path, "model.safetensors")
        if not (os.path.isfile(cfg_path) and os.path.isfile(weights)):
            raise InvalidInputError(f"no layout detector in {path} (config.json and model.safetensors)")
        with open(cfg_path) as f:
            cfg = json.load(f)
        if cfg.get("kind") != "docs-layout":
            raise InvalidInputError(f"{path} is not a layout detector (config kind {cfg.get('kind')!r})")
        det = cls(width=cfg["width"], types=cfg["types"], min_cells=cfg.get("min_cells", 40))
        det.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in load_file(weights).items()})
        return det.eval()


def label_cells(mask: np.ndarray) -> tuple[np.ndarray, list[tuple[slice, slice]]]:
    """Connected components (4-neighbour) of a 2-D boolean ``mask``: an int label map (0 outside, components
    numbered from 1 in the row-major order of their first cell) and each component's bounding slices
    ``(rows, cols)``; what ``scipy.ndimage.label`` + ``find_objects`` return, without scipy (a runtime
    dependency for a grid of a few thousand cells).

    Example:
        >>> labels, boxes = label_cells(np.array([[1, 1, 0], [0, 0, 0], [0, 1, 1]], bool))
        >>> labels.tolist()
        [[1, 1, 0], [0, 0, 0], [0, 2, 2]]
        >>> [(r.start, r.stop, c.start, c.stop) for r, c in boxes]
        [(0, 1, 0, 2), (2, 3, 1, 3)]
    """
    mask = np.asarray(mask, bool)
    if mask.ndim != 2:
        raise InvalidInputError(f"label_cells takes a 2-D mask (got shape {mask.shape})")
    h, w = mask.shape
    flat = mask.ravel()
    labels = np.zeros(h * w, np.int32)
    boxes = []
    for start in np.flatnonzero(flat).tolist():  # row-major: a component is numbered at its first cell
        if labels[start]:
            continue
        n = len(boxes) + 1
        labels[start] = n
        stack, cells = [start], []
        while stack:
            i = stack.pop()
            cells.append(i)
            y, x = divmod(i, w)
            for j, ok in ((i - w, y > 0), (i + w, y < h - 1), (i - 1, x > 0), (i + 1, x < w - 1)):
                if ok and flat[j] and not labels[j]:
                    labels[j] = n
                    stack.append(j)
        ys, xs = np.divmod(np.array(cells), w)
        boxes.append((slice(int(ys.min()), int(ys.max()) + 1), slice(int(xs.min()), int(xs.max()) + 1)))
    return labels.reshape(h, w), boxes


def bundled_layout() -> str | None:
    """Folder of the layout detector shipped with the docs testbed (``None`` when absent).

    Example:
        >>> p = bundled_layout(); p is None or p.endswith("docs-layout")
        True
    """
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "assets", "docs-layout")
    return path if os.path.isfile(os.path.join(path, "model.safetensors")) else None


# ---------------------------------------------------------------------------- reading order
def reading_order(boxes, span: float = 0.6, min_gap: int = 8) -> list[int]:
    """Indices of ``boxes`` (``[x0, y0, x1, y1]``) in reading order: columns, then top to bottom.

    Boxes wider than ``span`` of the content width cross the columns: they cut the page into bands, read in
    turn. Inside a band, the other boxes fall into columns separated by gaps of at least ``min_gap`` pixels in
    their horizontal coverage (over the whole page, so a column stays a column in every band), read left to
    right, each top to bottom.

    Example:
        >>> reading_order([(10, 100, 300, 150), (10, 10, 300, 60)])           # one column: top to bottom
        [1, 0]
        >>> reading_order([(350, 60, 650, 120), (10, 60, 320, 100), (10, 110, 320, 160)])   # two columns
        [1, 2, 0]
    """
    boxes = [tuple(float(v) for v in b) for b in boxes]
    if len(boxes) <= 1:
        return list(range(len(boxes)))
    left, right = min(b[0] for b in boxes), max(b[2] for b in boxes)
    wide = [i for i, b in enumerate(boxes) if b[2] - b[0] > span * (right - left)]
    narrow = [i for i in range(len(boxes)) if i not in wide]
    # column intervals: the union of the narrow boxes' horizontal extents, split where a gap opens
    cols = []
    for i in sorted(narrow, key=lambda i: boxes[i][0]):
        x0, x1 = boxes[i][0], boxes[i][2]
        if cols and x0 < cols[-1][1] + min_gap:
            cols[-1][1] = max(cols[-1][1], x1)
        else:
            cols.append([x0, x1])

    def column(i):
        cx = (boxes[i][0] + boxes[i][2]) / 2
        return next((k for k, (a, b) in enumerate(cols) if a <= cx <= b), len(cols))

    cy = lambda i: (boxes[i][1] + boxes[i][3]) / 2  # noqa: E731
    order, spans = [], sorted(wide, key=cy)
    bounds = [-float("inf")] + [cy(i) for i in spans] + [float("inf")]
    for band in range(len(spans) + 1):
        inside = [i for i in narrow if bounds[band] <= cy(i) < bounds[band + 1]]
        order += sorted(inside, key=lambda i: (column(i), boxes[i][1], boxes[i][0]))
        if band < len(spans):
            order.append(spans[band])
    return order


# ---------------------------------------------------------------------------- labels and training
def page_labels(example, width: int, height: int) -> tuple[np.ndarray, np.ndarray]:
    """Cell labels ``[H/4, W/4]`` (0 background, ``1 + LAYOUT_TYPES.index(type)``) and loss weights for a
    rendered docs page (its ``meta["blocks"]`` boxes), on the grid the detector outputs for a page of
    ``width`` x ``height`` padded as :meth:`LayoutDetector.page_tensor` pads it.

    Example:
        >>> from mmspec.vision.workloads import DocsWorkload
        >>> ex = DocsWorkload(mode="page").example("train", 0)
        >>> lab, wt = page_labels(ex, 336, 448)
        >>> lab.shape, int(lab.max()) <= len(LAYOUT_TYPES)
        ((112, 96), True)
    """
    gh = -(-int(round(height * SCALE)) // (_ALIGN // 2)) * (_ALIGN // 2) // 2
    gw = -(-int(round(width * SCALE)) // (_ALIGN // 2)) * (_ALIGN // 2) // 2
    lab = np.zeros((gh, gw), np.int64)
    centres_y = np.arange(gh) * CELL + CELL / 2
    centres_x = np.arange(gw) * CELL + CELL / 2
    for b in example.meta["blocks"]:
        x0, y0, x1, y1 = b["box"]
        ys = (centres_y >= y0) & (centres_y < y1)
        xs = (centres_x >= x0) & (centres_x < x1)
        lab[np.ix_(ys, xs)] = 1 + LAYOUT_TYPES.index(block_type(b))
    # the blank band between two blocks (background with a block within 4 cells above and below)
    fg = lab > 0
    above = np.zeros_like(fg)
    below = np.zeros_like(fg)
    for d in range(1, 5):
        above[d:] |= fg[:-d]
        below[:-d] |= fg[d:]
    left = np.zeros_like(fg)
    right = np.zeros_like(fg)
    for d in range(1, 8):  # and between two columns
        left[:, d:] |= fg[:, :-d]
        right[:, :-d] |= fg[:, d:]
    gap = ~fg & ((above & below) | (left & right))
    weight = np.ones((gh, gw), np.float32)
    weight[gap] = 5.0
    weight[int(np.ceil(height / CELL)):, :] = 0.0  # padding
    weight[:, int(np.ceil(width / CELL)):] = 0.0
    return lab, weight


@dataclass
class LayoutTrainConfig:
    """Settings of :func:`train_layout`.

    Attributes:
        out: folder for the detector (``save_pretrained``) and its resumable ``checkpoint.pt``.
        steps, batch_size, lr: optimisation (AdamW, cosine decay after a short warm-up).
        pages: rendered training pages held in memory (``dense_fraction`` of them two-column
            :data:`~mmspec.vision.workloads.docs.DENSE_PAGES`, the rest default pages).
        width: the detector's base channel count.
        save_every: steps between checkpoints (the job resumes from the last one).
        threads: ``torch.set_num_threads``.
    """

    out: str
    steps: int = 1500
    batch_size: int = 8
    lr: float = 3e-3
    pages: int = 1600
    dense_fraction: float = 0.5
    width: int = 16
    save_every: int = 100
    threads: int = 1
    seed: int = 0
    log: list = field(default_factory=list)


def _page_worlds():
    from ..workloads.docs import DENSE_PAGES, DocsWorkload

    return DocsWorkload(mode="page"), DocsWorkload(**DENSE_PAGES)


def _render_pool(n: int, dense_fraction: float, split: str, progress: bool = True) -> dict:
    """``n`` rendered pages grouped by size: ``{(w, h): (inputs [N,1,H,W] uint8, labels, weights)}``."""
    from tqdm.auto import tqdm

    default, dense = _page_worlds()
    n_dense = int(round(n * dense_fraction))
    groups: dict = {}
    for i in tqdm(range(n), desc=f"rendering {split} pages", disable=not progress, leave=False):
        ex = (dense.example(split, i) if i < n_dense else default.example(split, i))
        x, (w, h) = LayoutDetector.page_tensor(ex.images[0])
        lab, wt = page_labels(ex, w, h)
        g = groups.setdefault((w, h), ([], [], []))
        g[0].append((x.numpy() * 255).round().astype(np.uint8))
        g[1].append(lab.astype(np.uint8))
        g[2].append(wt)
    return {k: (np.stack(a), np.stack(b), np.stack(c)) for k, (a, b, c) in groups.items()}


def train_layout(cfg: LayoutTrainConfig, progress: bool = True) -> LayoutDetector:
    """Train (or resume training) a :class:`LayoutDetector` on rendered docs pages; saves it to ``cfg.out``.

    Resumable: ``cfg.out/checkpoint.pt`` holds the weights, the optimiser and the step; a rerun with the same
    ``out`` continues from it (the pages are re-rendered: they are a pure function of their index).

    Example:
        >>> det = train_layout(LayoutTrainConfig(out="/tmp/layout", steps=2, pages=4))   # doctest: +SKIP
    """
    from tqdm.auto import tqdm

    if cfg.steps < 1 or cfg.batch_size < 1 or cfg.pages < cfg.batch_size:
        raise InvalidInputError(f"need steps >= 1 and pages >= batch_size >= 1 (got {cfg.steps}, {cfg.pages}, "
                                f"{cfg.batch_size})")
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    os.makedirs(cfg.out, exist_ok=True)
    det = LayoutDetector(width=cfg.width)
    opt = torch.optim.AdamW(det.parameters(), lr=cfg.lr, weight_decay=1e-4)
    ckpt_path = os.path.join(cfg.out, "checkpoint.pt")
    start, log = 0, []
    if os.path.isfile(ckpt_path):
        state = torch.load(ckpt_path, weights_only=True)
        det.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start, log = int(state["step"]), json.loads(state["log"])
    pool = _render_pool(cfg.pages, cfg.dense_fraction, "train", progress)
    keys = sorted(pool)
    sizes = np.array([len(pool[k][0]) for k in keys], np.float64)
    warm = max(1, cfg.steps // 20)

    def lr_at(s) -> float:  # a Python float: the checkpoint must load with weights_only=True
        if s < warm:
            return cfg.lr * (s + 1) / warm
        return float(cfg.lr * 0.5 * (1 + np.cos(np.pi * (s - warm) / max(1, cfg.steps - warm))))

    det.train()
    t0 = time.time()
    bar = tqdm(range(start, cfg.steps), desc="layout", disable=not progress, initial=start, total=cfg.steps)
    for step in bar:
        rng = np.random.default_rng([cfg.seed, step])  # the batch of a step does not depend on resuming
        key = keys[rng.choice(len(keys), p=sizes / sizes.sum())]
        xs, labs, wts = pool[key]
        idx = rng.choice(len(xs), size=min(cfg.batch_size, len(xs)), replace=False)
        x = torch.from_numpy(xs[idx]).float() / 255.0
        if rng.random() < 0.5:  # contrast jitter: paper and ink shades vary
            x = x * float(rng.uniform(0.6, 1.0))
        lab = torch.from_numpy(labs[idx].astype(np.int64))
        wt = torch.from_numpy(wts[idx])
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        logits = det(x)
        loss = (F.cross_entropy(logits, lab, reduction="none") * wt).sum() / wt.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        bar.set_postfix(loss=f"{loss.item():.4f}")
        if (step + 1) % 20 == 0:
            log.append({"step": step + 1, "loss": round(loss.item(), 5), "elapsed_s": round(time.time() - t0, 1)})
        if (step + 1) % cfg.save_every == 0 or step + 1 == cfg.steps:
            tmp = ckpt_path + ".tmp"
            torch.save({"model": det.state_dict(), "optimizer": opt.state_dict(), "step": step + 1,
                        "log": json.dumps(log)}, tmp)
            os.replace(tmp, ckpt_path)  # atomic: a kill never leaves half a checkpoint
    det.eval()
    det.save_pretrained(cfg.out)
    with open(os.path.join(cfg.out, "train_log.jsonl"), "w") as f:
        for row in log:
            f.write(json.dumps(row) + "\n")
    with open(os.path.join(cfg.out, "train_config.json"), "w") as f:
        json.dump({k: v for k, v in asdict(cfg).items() if k != "log"}, f, indent=2)
    return det


# ---------------------------------------------------------------------------- evaluation
def _iou(a, b) -> float:
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def match_boxes(pred: list, gold: list, iou: float = 0.5) -> list[tuple[int, int]]:
    """Greedy one-to-one matching of predicted to gold boxes by IoU (highest first, at least ``iou``):
    ``[(pred index, gold index)]``.

    Example:
        >>> match_boxes([(0, 0, 10, 10), (20, 0, 30, 10)], [(21, 0, 30, 10), (0, 0, 9, 10)])
        [(0, 1), (1, 0)]
    """
    pairs = sorted(((_iou(p, g), i, j) for i, p in enumerate(pred) for j, g in enumerate(gold)), reverse=True)
    used_p, used_g, out = set(), set(), []
    for v, i, j in pairs:
        if v < iou:
            break
        if i not in used_p and j not in used_g:
            used_p.add(i)
            used_g.add(j)
            out.append((i, j))
    return sorted(out)


def evaluate_layout(det: LayoutDetector, examples: list, iou: float = 0.5) -> dict:
    """Box recall and precision (IoU >= ``iou``), type accuracy of matched boxes, and reading-order accuracy
    (pages whose blocks were all found, in the renderer's order) of ``det`` on rendered docs pages.

    Example:
        >>> from mmspec.vision.workloads import DocsWorkload
        >>> r = evaluate_layout(LayoutDetector(), DocsWorkload(mode="page").examples("test", 2))
        >>> sorted(r)
        ['box_precision', 'box_recall', 'order_accuracy', 'pages', 'pages_all_found', 'type_accuracy']
    """
    tp = n_pred = n_gold = type_ok = all_found = order_ok = 0
    preds = det.detect([ex.images[0] for ex in examples])
    for ex, blocks in zip(examples, preds):
        gold = ex.meta["blocks"]
        pairs = match_boxes([b["box"] for b in blocks], [g["box"] for g in gold], iou)
        tp += len(pairs)
        n_pred += len(blocks)
        n_gold += len(gold)
        type_ok += sum(blocks[i]["type"] == block_type(gold[j]) for i, j in pairs)
        if len(pairs) == len(gold) == len(blocks):
            all_found += 1
            order_ok += [j for _, j in sorted(pairs)] == list(range(len(gold)))  # blocks come in reading order
    return {"pages": len(examples), "box_recall": tp / max(n_gold, 1), "box_precision": tp / max(n_pred, 1),
            "type_accuracy": type_ok / max(tp, 1), "pages_all_found": all_found / max(len(examples), 1),
            "order_accuracy": order_ok / max(all_found, 1)}


# ---------------------------------------------------------------------------- command line
TRAIN_HELP = "train the layout detector of hierarchical page decoding on rendered docs pages (resumable)"


def add_train_arguments(parser) -> None:
    """``mmspec train-layout`` options (the fields of :class:`LayoutTrainConfig`)."""
    d = LayoutTrainConfig(out="")
    parser.add_argument("--out", required=True, help="folder for the detector and its resumable checkpoint")
    parser.add_argument("--steps", type=int, default=d.steps)
    parser.add_argument("--batch-size", type=int, default=d.batch_size)
    parser.add_argument("--lr", type=float, default=d.lr)
    parser.add_argument("--pages", type=int, default=d.pages, help="rendered training pages held in memory")
    parser.add_argument("--dense-fraction", type=float, default=d.dense_fraction,
                        help="share of two-column (dense) pages among them")
    parser.add_argument("--width", type=int, default=d.width, help="the detector's base channel count")
    parser.add_argument("--save-every", type=int, default=d.save_every)
    parser.add_argument("--threads", type=int, default=d.threads)
    parser.add_argument("--eval-pages", type=int, default=50, help="test pages of each kind to evaluate on after")


def run_train(args) -> int:
    """``mmspec train-layout``: train (or resume), then print the box recall / precision and order accuracy on
    the test split's default and dense pages (also written to ``OUT/eval.json``)."""
    cfg = LayoutTrainConfig(out=args.out, steps=args.steps, batch_size=args.batch_size, lr=args.lr, pages=args.pages,
                            dense_fraction=args.dense_fraction, width=args.width, save_every=args.save_every,
                            threads=args.threads)
    det = train_layout(cfg)
    default, dense = _page_worlds()
    report = {name: evaluate_layout(det, w.examples("test", args.eval_pages))
              for name, w in (("default", default), ("dense", dense))}
    with open(os.path.join(args.out, "eval.json"), "w") as f:
        json.dump(report, f, indent=2)
    print(json.dumps(report, indent=2))
    return 0
