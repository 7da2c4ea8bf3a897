"""The ``docs`` and ``charts`` workloads as the reader reads them: typeset pages and bar charts with Markdown answers.

Why: these are the bench's, the demo's and ``parse-docs``' default worlds, measured on the reader (the default
model). A page is a seeded document (:func:`~.pages.page_spec`: headings, paragraphs, lists, tables, formulas,
one or two columns, framed blocks, five font families, paper tint, blur and noise) typeset token by token
(:mod:`.typeset`); its target is its hard-wrapped Markdown. A chart is a horizontal bar chart with its labels
and values drawn beside the bars; its target is the chart's table in Markdown (title as a ``##`` heading).

The test split draws its prose from paragraphs no training page uses; ``words="heldout"`` builds names,
places and numbers from syllables and digit patterns that never occur in training (the held-out bar of the
reader). Items are pure functions of ``(name, seed, split, index)``, as every seeded workload's.

The typesetting needs the reader's tokenizer, which ships in the reader's folder (no LM download or
conversion to draw a page).

Example:
    >>> ex = ReaderDocsWorkload().example("test", 1000)          # doctest: +SKIP
    >>> ex.prompt, ex.target.splitlines()[0]                       # doctest: +SKIP
"""

from __future__ import annotations

import functools
import os
import random

import numpy as np

from mmspec.errors import InvalidInputError
from mmspec.workloads import Example, SeededWorkload

__all__ = ["ReaderDocsWorkload", "ReaderChartsWorkload", "reader_tokenizer", "PAGE_PROMPTS", "CHART_PROMPTS"]

PAGE_PROMPTS = ("Transcribe this page to Markdown.", "Convert the document in the image to Markdown.",
                "Write out the text of this page in Markdown.", "Read this page and return its content as Markdown.")
CHART_PROMPTS = ("Convert this chart to a Markdown table.", "Read the chart and write its data as a table.")


@functools.lru_cache(maxsize=2)
def reader_tokenizer(path: str | None = None):
    """SmolLM2's tokenizer as shipped with the reader (``vision/assets/reader/tokenizer``), or from ``path``.

    Example:
        >>> reader_tokenizer().convert_tokens_to_ids("<empty_output>")     # doctest: +SKIP
        16
    """
    from transformers import AutoTokenizer

    from .bundled import bundled_reader

    return AutoTokenizer.from_pretrained(path or os.path.join(bundled_reader(), "tokenizer"))


@functools.lru_cache(maxsize=4)
def _typesetter(spacing: str = "token"):
    from .typeset import Typesetter

    return Typesetter(reader_tokenizer(), spacing=spacing)


class _ReaderWorkload(SeededWorkload):
    kind = "doc"
    prompts = PAGE_PROMPTS

    def __init__(self, *, words: str = "normal", clean: bool = False, spacing: str = "token", seed: int = 0):
        if words not in ("normal", "heldout"):
            raise InvalidInputError(f"words must be 'normal' or 'heldout', got {words!r}")
        if spacing not in ("token", "natural"):
            raise InvalidInputError(f"spacing must be 'token' or 'natural', got {spacing!r}")
        self.words, self.clean, self.spacing, self.seed = words, bool(clean), spacing, int(seed)

    def bundled_model(self):
        from .bundled import bundled_reader, is_reader_assets

        path = bundled_reader()
        return path if is_reader_assets(path) else None

    def bundled_drafters(self):
        """The training-free ``page-lookup`` and every head shipped in the reader's ``drafters/`` folder."""
        model = self.bundled_model()
        if not model:
            return []
        specs = ["page-lookup"]
        root = os.path.join(model, "drafters")
        if os.path.isdir(root):
            for name in sorted(os.listdir(root)):
                cfg = os.path.join(root, name, "config.json")
                if os.path.isfile(cfg):
                    import json

                    with open(cfg) as f:
                        kind = json.load(f).get("drafter_kind")
                    if kind:
                        specs.append(f"{kind}:{os.path.join(root, name)}")
        return specs

    def _page(self, rng: random.Random, nrng: np.random.Generator, split: str, draw: bool):
        from .pages import chart_spec, page_spec, render_chart, render_page

        ts = _typesetter(self.spacing)
        for _ in range(20):
            if self.kind == "chart":
                spec = chart_spec(rng, split, words=self.words)
                page = render_chart(ts, rng, nrng, spec, clean=self.clean)
            else:
                spec = page_spec(rng, split, words=self.words)
                page = render_page(ts, rng, nrng, spec, clean=self.clean)
            if page is not None:
                return page
        raise RuntimeError("no page could be typeset in 20 draws")

    def generate(self, rng, nrng, split, index, draw=True) -> Example:
        prompt = self.prompts[rng.randrange(len(self.prompts))]
        page = self._page(rng, nrng, split, draw)
        meta = {"regime": "copy", "kind": "chart" if self.kind == "chart" else "page", "words": self.words,
                **page.meta, "lines": [line.text for line in page.lines],
                "boxes": [[b.cls for b in line.boxes] for line in page.lines]}
        return Example(id="", prompt=prompt, target=page.markdown, images=[page.image] if draw else [], meta=meta)


class ReaderDocsWorkload(_ReaderWorkload):
    """Typeset document pages to transcribe to Markdown (see the module docstring).

    Args:
        words: ``"normal"`` or ``"heldout"`` (names, places and numbers never seen in training).
        clean: no paper tint, blur or noise.
        spacing: ``"token"`` (the reader's pages) or ``"natural"`` (no gaps inside words, plain spaces between
            them: the alternative the reader is measured on).
        seed: another world.

    Example:
        >>> ReaderDocsWorkload(words="heldout").words
        'heldout'
    """

    name = "docs"


class ReaderChartsWorkload(_ReaderWorkload):
    """Horizontal bar charts to turn into Markdown tables (see the module docstring).

    Example:
        >>> ReaderChartsWorkload().name
        'charts'
    """

    name = "charts"
    kind = "chart"
    prompts = CHART_PROMPTS
