"""Page lookup: prompt lookup over the page as the reader's own eyes read it. Training-free.

Why: the reader's image positions hold, by construction, vectors close to the LM's input embeddings of the
tokens on the page (one per token box, in reading order). The nearest embedding of each is the token the
front end saw; the prompt with its image tokens replaced by those tokens (a space-digit box by its two
tokens) is the page as text. N-gram lookup over that text (:class:`~mmspec.drafters.lookup.PromptLookupDrafter`)
then proposes what comes next in the page: the copy regime of transcription, read from the image rather than
from earlier output. The target's vision tower runs once per request, in the drafter, on the request's tiles
(a few ms a page); nothing is trained, and verification keeps the output the target's own.

Only the reader architecture (an ``Idefics3`` target whose connector emits one LM-space vector per image token)
is supported; :func:`page_lookup_factory` refuses other targets.

Example:
    >>> pipe = MMSpecPipeline.from_pretrained(bundled_reader(), drafter="page-lookup")   # doctest: +SKIP
"""

from __future__ import annotations

import numpy as np
import torch

from mmspec.drafters.lookup import PromptLookupDrafter, _NgramIndex
from mmspec.errors import InvalidInputError

__all__ = ["PageLookupDrafter", "page_lookup_factory", "read_tiles", "is_reader", "space_and_digits"]


@torch.no_grad()
def read_tiles(model, pixels: torch.Tensor, table: torch.Tensor, sq: torch.Tensor) -> np.ndarray:
    """Box classes of ``pixels`` (N x 1 x 64 x 64) as ``model``'s front end reads them (nearest target vector)."""
    vis = model.model.vision_model(pixel_values=pixels.to(model.dtype)).last_hidden_state
    v = model.model.connector(vis).squeeze(1).float()
    return (2 * v @ table.T - sq).argmax(-1).cpu().numpy()


class PageLookupDrafter(PromptLookupDrafter):
    """:class:`PromptLookupDrafter` whose rows' prompts are the pages as read (see the module docstring).

    Args: those of :class:`PromptLookupDrafter` (defaults: chains of 8, up to 2 matches merged), and
        ``space_id`` / ``digit_ids``: the vocabulary's space and digit tokens (default: SmolLM2's, from the
        reader's shipped tokenizer).
    """

    kind = "page-lookup"

    def __init__(self, target, num_draft_tokens: int = 8, max_ngram: int = 4, min_ngram: int = 1,
                 max_matches: int = 2, budget: int | None = None, space_id: int | None = None,
                 digit_ids: list | None = None):
        super().__init__(num_draft_tokens=num_draft_tokens, max_ngram=max_ngram, min_ngram=min_ngram,
                         max_matches=max_matches, budget=budget)
        from .train import target_table

        self.target = target
        cfg = target.config
        self.image_token_id = int(cfg.image_token_id)
        E = target.get_input_embeddings().weight.detach().float()
        tok_space, digits = (space_id, list(digit_ids)) if space_id is not None else space_and_digits(target)
        self.vocab = E.shape[0]
        self.space_id, self.digit_ids = tok_space, digits
        self.table = target_table(E, tok_space, digits)
        self.sq = (self.table * self.table).sum(1)

    def _page_text(self, prompt: np.ndarray, pixels: torch.Tensor) -> np.ndarray:
        """The prompt with its image tokens replaced by the tokens the front end reads in its tiles."""
        n = int((prompt == self.image_token_id).sum())
        if n == 0:
            return prompt.astype(np.int64)
        classes = read_tiles(self.target, pixels[:n], self.table, self.sq)
        out, k = [], 0
        for t in prompt.tolist():
            if t != self.image_token_id:
                out.append(t)
                continue
            c = int(classes[k])
            k += 1
            out += [c] if c < self.vocab else [self.space_id, self.digit_ids[c - self.vocab]]
        return np.asarray(out, dtype=np.int64)

    def begin(self, ctx) -> None:
        pix = ctx.model_inputs.get("pixel_values")
        self._pages, self._indexes = {}, {}
        for i, r in enumerate(ctx.rows):
            prompt = np.asarray(ctx.sequences[i][: ctx.prompt_lengths[i]], dtype=np.int64)
            page = self._page_text(prompt, pix[r]) if pix is not None else prompt
            self._pages[r] = (page, ctx.prompt_lengths[i])
            self._indexes[r] = _NgramIndex(self.min_ngram, self.max_ngram)

    def propose(self, ctx):
        from mmspec.tree import DraftTree

        trees = []
        for r, seq in zip(ctx.rows, ctx.sequences):
            page, plen = self._pages[r]
            text = np.concatenate([page, np.asarray(seq[plen:], dtype=np.int64)])
            trees.append(DraftTree.from_sequences(self.candidates(text, self._indexes[r]), budget=self.budget))
        return trees


def space_and_digits(target):
    """The token ids of a space and the ten digits in the target's vocabulary (SmolLM2's, for the reader).

    Example:
        >>> space_and_digits(reader_model)[0]                                           # doctest: +SKIP
        216
    """
    from .workloads import reader_tokenizer

    tok = reader_tokenizer()
    if len(tok) != target.get_input_embeddings().weight.shape[0]:
        raise InvalidInputError("page-lookup needs the reader's vocabulary (SmolLM2's 49,152 tokens)")
    return (tok(" ", add_special_tokens=False)["input_ids"][0],
            [tok(str(d), add_special_tokens=False)["input_ids"][0] for d in range(10)])


def is_reader(model) -> bool:
    """Whether ``model`` has the reader's architecture: an Idefics3 target reading 64 px token tiles, one image
    token each (its vocabulary is checked where it matters, by :func:`space_and_digits`).

    Example:
        >>> from types import SimpleNamespace
        >>> is_reader(SimpleNamespace(config=SimpleNamespace(model_type="llama")))
        False
    """
    cfg = getattr(model, "config", None) if model is not None else None
    vision = getattr(cfg, "vision_config", None)
    return not (cfg is None or getattr(cfg, "model_type", None) != "idefics3" or getattr(vision, "image_size", None) != 64
                or getattr(cfg, "scale_factor", None) != 4)


def page_lookup_factory(target_model, path=None, **options):
    """``make_drafter("page-lookup", reader)``: refuses targets that are not readers and any path."""
    if path:
        raise InvalidInputError(f"page-lookup takes no path (got 'page-lookup:{path}')")
    if not is_reader(target_model):
        raise InvalidInputError("page-lookup drafts for the reader (an Idefics3 target reading 64 px token tiles, "
                                "one image token each); use 'lookup' for other targets")
    try:
        return PageLookupDrafter(target_model, **options)
    except (TypeError, ValueError) as e:
        raise InvalidInputError(f"bad page-lookup options {options!r}: {e}") from e
