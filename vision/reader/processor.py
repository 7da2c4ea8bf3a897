"""The reader's processor: a page becomes one 64 x 64 tile per token box, and the prompt one image token per box.

Why: the reader's vision tower sees each token box on its own, as a square tile (a transformers
``Idefics3`` image with ``image_seq_len`` 1), and its language model sees the boxes as a run of image tokens
with the page's line breaks between them as ``\\n`` text tokens, in reading order (:mod:`.segment`). A box's
tile shows the box and the white gap before it (none at a line start, up to one line height otherwise): the
gap says whether the token starts a word. The box is scaled so that its line is 26 px tall, placed in a
32 px strip, and strips of 64 px are stacked (a box up to 128 px wide keeps its scale; a wider one is
squeezed). Pixels are grey, normalised from the page's paper (+1) to its darkest ink (-1).

:class:`PageReaderProcessor` has the call signature of a transformers processor (``images=``, ``text=``,
``return_tensors=``, ``padding=``), a chat template whose image placeholder it expands, and
``save_pretrained`` / ``from_pretrained``; :class:`mmspec.vision.pipeline.VLMPipeline` loads it for a reader
folder like any VLM's processor.

Example:
    >>> from PIL import Image, ImageDraw
    >>> img = Image.new("RGB", (160, 40), "white")
    >>> d = ImageDraw.Draw(img); d.rectangle([10, 12, 30, 28], fill="black"); d.rectangle([60, 12, 70, 28], fill="black")
    >>> layout = page_layout(img)
    >>> layout.tiles.shape, layout.line_sizes
    ((2, 64, 64), [2])
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy as np
from PIL import Image

from mmspec.errors import InvalidImageError, InvalidInputError

from .segment import ink_mask, page_gray, segment

__all__ = ["TILE", "STRIP", "page_layout", "PageLayout", "PageReaderProcessor", "READER_CHAT_TEMPLATE",
           "MAX_PAGE_PIXELS", "MIN_PAGE_SIDE"]

TILE = 64
STRIP = 32
LINE_PX = 26
GAP_CAP_EM = 1.0
MAX_PAGE_PIXELS = 40_000_000
"""Pages larger than this (about 6300 x 6300) are refused: far beyond any page the reader was trained on."""
MIN_PAGE_SIDE = 16
"""Pages narrower or lower than this are refused: no line of text fits."""

READER_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{{ '<image>' }}{% elif part['type'] == 'text' %}{{ '\n' + part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
"""ChatML (SmolLM2's own format) without its default system prompt; each image part is ``<image>``, which the
processor replaces by the page's tokens."""


@dataclass
class PageLayout:
    """A page as the reader sees it: ``tiles`` (N x 64 x 64 uint8, one per box, reading order), the number of
    boxes on each line, the blank lines before each line, and the found lines themselves."""

    tiles: np.ndarray
    line_sizes: list
    blank_before: list
    lines: list

    def token_pattern(self) -> list:
        """The page as the LM reads it: ``"img"`` per box, ``"\\n"`` between lines (one more per blank line).

        Example:
            >>> PageLayout(np.zeros((3, 64, 64), np.uint8), [2, 1], [0, 1], []).token_pattern()
            ['img', 'img', '\\n', '\\n', 'img']
        """
        out = []
        for k, (n, blank) in enumerate(zip(self.line_sizes, self.blank_before)):
            if k:
                out += ["\n"] * (1 + blank)
            out += ["img"] * n
        return out


def page_layout(image) -> PageLayout:
    """Find a page's token boxes (:func:`~.segment.segment`) and cut one tile per box (see the module).

    Example:
        >>> page_layout(Image.new("RGB", (40, 40), "white")).tiles.shape
        (0, 64, 64)
    """
    gray = page_gray(image)
    lines = segment(gray.astype(np.uint8))  # page_gray is float32; segment reads the bytes
    _, paper = ink_mask(gray)
    dark = float(np.percentile(gray, 0.3)) if gray.size else 0.0
    span = max(paper - dark, 1.0)
    norm = np.clip((gray - dark) / span, 0.0, 1.0)  # ink 0, paper 1
    tiles = []
    for line in lines:
        em = max(line.em, 1.0)
        scale = LINE_PX / em
        prev_x1 = None
        for box in line.boxes:
            x0 = box.x0 if prev_x1 is None else max(prev_x1, box.x0 - int(round(GAP_CAP_EM * em)))
            tiles.append(_tile(norm, line.y0, line.y1, x0, box.x1, scale))
            prev_x1 = box.x1
    arr = np.stack(tiles) if tiles else np.zeros((0, TILE, TILE), np.uint8)
    return PageLayout(arr, [len(line.boxes) for line in lines], [line.blank_before for line in lines], lines)


def _tile(norm: np.ndarray, y0: int, y1: int, x0: int, x1: int, scale: float) -> np.ndarray:
    """One box's tile (uint8, paper 255): the crop scaled by ``scale``, centred in a 32 px strip, folded."""
    crop = norm[y0:y1, x0:x1]
    h = max(1, min(STRIP, int(round(crop.shape[0] * scale))))
    w = max(1, int(round(crop.shape[1] * scale)))
    w = min(w, 2 * TILE)
    img = Image.fromarray((crop * 255).astype(np.uint8)).resize((w, h), Image.Resampling.BILINEAR)
    strip = np.full((STRIP, 2 * TILE), 255, np.uint8)
    top = (STRIP - h) // 2
    strip[top:top + h, :w] = np.asarray(img)
    return np.concatenate([strip[:, :TILE], strip[:, TILE:]], axis=0)


def tiles_to_pixels(tiles: np.ndarray):
    """uint8 tiles (N x 64 x 64) -> float pixel values (N x 1 x 64 x 64) in [-1, 1] (paper +1, ink -1).

    Example:
        >>> tiles_to_pixels(np.full((1, 64, 64), 255, np.uint8)).max().item()
        1.0
    """
    import torch

    return torch.from_numpy(tiles).float().div_(127.5).sub_(1.0).unsqueeze(1)


def check_page(image, index: int | None = None) -> None:
    """Refuse a page the reader cannot use, before any pixel is decoded where possible (size from the header).

    Raises:
        InvalidImageError: a side under ``MIN_PAGE_SIDE`` px, or more than ``MAX_PAGE_PIXELS`` pixels.

    Example:
        >>> check_page(Image.new("RGB", (1, 1)))
        Traceback (most recent call last):
        ...
        mmspec.errors.InvalidImageError: image is 1 x 1 px: the reader needs a page of at least 16 x 16 px
    """
    w, h = image.size if hasattr(image, "size") and not isinstance(image, np.ndarray) else image.shape[1::-1]
    where = f"image {index}" if index is not None else "image"
    if min(w, h) < MIN_PAGE_SIDE:
        raise InvalidImageError(f"{where} is {w} x {h} px: the reader needs a page of at least "
                                f"{MIN_PAGE_SIDE} x {MIN_PAGE_SIDE} px")
    if w * h > MAX_PAGE_PIXELS:
        raise InvalidImageError(f"{where} is {w} x {h} px, over the reader's limit of {MAX_PAGE_PIXELS:,} pixels")


class PageReaderProcessor:
    """Tokenizer plus page layout: ``processor(images=pages, text=prompts)`` gives ``input_ids``,
    ``attention_mask`` and ``pixel_values`` (B x N x 1 x 64 x 64, zero tiles padding short pages) for
    ``Idefics3ForConditionalGeneration``.

    Each prompt holds one ``<image>`` per page (the chat template writes them); each is replaced by the page's
    pattern of image tokens and newlines (:meth:`PageLayout.token_pattern`).

    Example:
        >>> proc = PageReaderProcessor.from_pretrained("path/to/reader")                  # doctest: +SKIP
        >>> text = proc.apply_chat_template([{"role": "user", "content": [{"type": "image"},
        ...     {"type": "text", "text": "Transcribe this page to Markdown."}]}], add_generation_prompt=True)  # doctest: +SKIP
        >>> batch = proc(images=[page], text=[text], return_tensors="pt")                # doctest: +SKIP
    """

    image_placeholder = "<image>"

    def __init__(self, tokenizer, image_token: str = "<empty_output>", chat_template: str = READER_CHAT_TEMPLATE,
                 padding_side: str = "left"):
        self.tokenizer = tokenizer
        self.tokenizer.padding_side = padding_side  # batched generation pads on the left
        self.image_token = image_token
        self.image_token_id = tokenizer.convert_tokens_to_ids(image_token)
        self.newline_id = tokenizer("\n", add_special_tokens=False)["input_ids"][0]
        self.chat_template = chat_template
        self.image_processor = self  # what pipelines check for "takes images"

    # ------------------------------------------------------------------ persistence
    def save_pretrained(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)
        self.tokenizer.save_pretrained(path)
        with open(os.path.join(path, "processor_config.json"), "w") as f:
            json.dump({"processor_class": type(self).__name__, "image_token": self.image_token,
                       "tile": TILE, "strip": STRIP, "line_px": LINE_PX, "chat_template": self.chat_template},
                      f, indent=2)

    @classmethod
    def from_pretrained(cls, path: str, **kwargs) -> "PageReaderProcessor":
        from transformers import AutoTokenizer

        with open(os.path.join(path, "processor_config.json")) as f:
            cfg = json.load(f)
        tok = AutoTokenizer.from_pretrained(path)
        return cls(tok, image_token=cfg.get("image_token", "<empty_output>"),
                   chat_template=cfg.get("chat_template", READER_CHAT_TEMPLATE))

    @staticmethod
    def is_reader_folder(path) -> bool:
        """Whether ``path`` holds a reader's processor config (what :class:`VLMPipeline` checks).

        Example:
            >>> PageReaderProcessor.is_reader_folder("/no/such/dir")
            False
        """
        try:
            with open(os.path.join(str(path), "processor_config.json")) as f:
                return json.load(f).get("processor_class") == "PageReaderProcessor"
        except (OSError, ValueError):
            return False

    # ------------------------------------------------------------------ text
    def apply_chat_template(self, messages, add_generation_prompt: bool = False, tokenize: bool = False, **kw):
        from jinja2 import Template

        text = Template(self.chat_template).render(messages=messages, add_generation_prompt=add_generation_prompt)
        if tokenize:
            raise InvalidInputError("PageReaderProcessor.apply_chat_template returns text; call the processor")
        return text

    def batch_decode(self, *a, **kw):
        return self.tokenizer.batch_decode(*a, **kw)

    def decode(self, *a, **kw):
        return self.tokenizer.decode(*a, **kw)

    # ------------------------------------------------------------------ call
    def layout_ids(self, layout: PageLayout) -> list:
        """The token ids a page stands for in the prompt (image tokens and newlines)."""
        return [self.image_token_id if t == "img" else self.newline_id for t in layout.token_pattern()]

    def encode_prompt(self, text: str, layouts: list) -> list:
        """Token ids of one prompt with its ``<image>`` placeholders replaced by ``layouts`` in order."""
        parts = text.split(self.image_placeholder)
        if len(parts) - 1 != len(layouts):
            raise InvalidInputError(f"the prompt has {len(parts) - 1} image placeholders for {len(layouts)} images")
        ids = []
        for k, part in enumerate(parts):
            if part:
                ids += self.tokenizer(part, add_special_tokens=False)["input_ids"]
            if k < len(layouts):
                ids += self.layout_ids(layouts[k])
        return ids

    def __call__(self, images=None, text=None, return_tensors="pt", padding=True, **kwargs):
        import torch

        if text is None:
            raise InvalidInputError("the reader's processor needs text (a prompt with one <image> per page)")
        texts = [text] if isinstance(text, str) else list(text)
        images = [] if images is None else ([images] if not isinstance(images, (list, tuple)) else list(images))
        counts = [t.count(self.image_placeholder) for t in texts]
        if sum(counts) != len(images):
            raise InvalidInputError(f"{sum(counts)} <image> placeholders in the prompts for {len(images)} images")
        layouts, k = [], 0
        rows = []
        for t, n in zip(texts, counts):
            mine = []
            for j in range(n):
                check_page(images[k], k)
                lay = page_layout(images[k])
                if not len(lay.tiles):
                    raise InvalidImageError(f"image {k}: the reader found no text on it (blank, or no contrast)")
                mine.append(lay)
                k += 1
            layouts.append(mine)
            rows.append(self.encode_prompt(t, mine))
        width = max(len(r) for r in rows)
        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        left = self.tokenizer.padding_side == "left"
        ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for r, row in enumerate(rows):
            sl = slice(width - len(row), width) if left else slice(0, len(row))
            ids[r, sl] = torch.tensor(row)
            mask[r, sl] = 1
        out = {"input_ids": ids, "attention_mask": mask}
        n_tiles = [sum(len(lay.tiles) for lay in mine) for mine in layouts]
        if max(n_tiles, default=0):
            pix = torch.zeros((len(rows), max(n_tiles), 1, TILE, TILE))
            for r, mine in enumerate(layouts):
                if mine:
                    t = np.concatenate([lay.tiles for lay in mine])
                    pix[r, :len(t)] = tiles_to_pixels(t)
            out["pixel_values"] = pix
        from transformers import BatchFeature

        return BatchFeature(out, tensor_type=return_tensors)
