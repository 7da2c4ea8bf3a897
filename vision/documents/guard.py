"""The repetition guard: stop a decode that has fallen into a loop, so the batch job can retry it.

Why: OCR models loop (a header or a row of dots repeated until the length cap; 9-25% of pages in public
reports, see research/anchors_domains.md §3.7), and under speculative decoding a loop is highly draftable,
so a fast wrong answer only gets faster. The guard runs *inside verification*: it is a logits processor, so
the decode loop applies it to every draft-tree node on that node's own history, exactly as ``generate``
would apply it to each step. When the tokens generated so far end in a loop it leaves the end-of-turn token
as the only choice, and the row stops at that node. :func:`mmspec.generate` with the guard equals
``model.generate`` with the guard, token for token under greedy decoding.

It changes outputs (a page that loops is cut, then decoded again with sampling), so it is on by default
in ``mmspec parse-docs`` only, every record it touched says so, and nothing that measures identity with AR
uses it.

A loop is a suffix of the generated tokens with period ``p <= max_period`` that covers at least
``min_repeats`` periods and at least ``min_tokens`` tokens. Both floors matter: a table rule
(``|---|---|---|``) or a dotted leader is periodic but short, a repeated line is long but may legitimately
occur twice.

Example:
    >>> find_loop([5, 6, 1, 2, 3, 1, 2, 3, 1, 2, 3], min_repeats=3, min_tokens=6)
    (3, 2)
    >>> find_loop([1, 2, 3, 4, 5, 6], min_repeats=3, min_tokens=6) is None
    True
"""

from __future__ import annotations

import numpy as np
import torch

from mmspec.errors import InvalidInputError

__all__ = ["find_loop", "RepetitionGuard", "GuardSettings", "OLMOCR_LADDER", "DEFAULT_LADDER"]

OLMOCR_LADDER = (0.1, 0.1, 0.2, 0.3, 0.5, 0.8, 0.9, 1.0)
"""olmOCR's retry temperatures (``allenai/olmocr``, ``pipeline.py``): eight attempts, each warmer."""

DEFAULT_LADDER = (0.0,) + OLMOCR_LADDER[1:]
"""parse-docs' retry temperatures: olmOCR's ladder with its first rung at 0 (greedy), so a page that does
not loop reads as the target's own greedy transcription, and the retries are olmOCR's."""


def find_loop(tokens, min_repeats: int = 3, min_tokens: int = 32, max_period: int = 256):
    """``(period, start)`` of the shortest-period loop the sequence ``tokens`` ends in, or ``None``.

    ``tokens[start:]`` is periodic with ``period``, covers at least ``min_repeats`` periods and at least
    ``min_tokens`` tokens, and ``start`` is as early as the periodicity reaches. Cost: one vectorised
    comparison per candidate period, and only periods at which the last token recurs are candidates.

    Example:
        >>> find_loop([9] * 40)
        (1, 0)
        >>> find_loop([9] * 10, min_tokens=32) is None
        True
    """
    t = np.asarray(tokens, dtype=np.int64)
    n = len(t)
    if n < max(min_tokens, 2):
        return None
    # The loop must cover min_repeats periods and min_tokens tokens, so only this tail can hold the proof.
    span = max(min_repeats * max_period, min_tokens + max_period)
    w = t[-span:] if n > span else t
    m = len(w)
    top = min(max_period, m // max(min_repeats, 1), m - 1)
    if top < 1:
        return None
    # Candidates: periods p with w[-1-p] == w[-1].
    tail = w[: m - 1][::-1]  # tail[p - 1] = w[m - 1 - p]
    cand = np.nonzero(tail[:top] == w[-1])[0] + 1
    for p in cand.tolist():
        need = max(min_repeats * p, min_tokens)
        if need > m:
            continue
        seg = w[m - need:]
        if not np.array_equal(seg[p:], seg[:-p]):
            continue
        # Extend back over the whole sequence to find where the periodicity starts.
        ne = np.nonzero(t[: n - p] != t[p:])[0]
        return p, int(ne[-1] + 1) if len(ne) else 0
    return None


class GuardSettings:
    """The loop definition and the retry ladder of a job (validated once, stored in its records).

    Example:
        >>> GuardSettings(temperatures=(0, 0.5)).to_dict()["temperatures"]
        [0.0, 0.5]
    """

    def __init__(self, min_repeats: int = 3, min_tokens: int = 32, max_period: int = 256,
                 temperatures=DEFAULT_LADDER):
        for name, v, lo in (("min_repeats", min_repeats, 2), ("min_tokens", min_tokens, 2),
                            ("max_period", max_period, 1)):
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise InvalidInputError(f"repetition guard: {name} must be an integer >= {lo} (got {v!r})")
        temps = [float(x) for x in temperatures]
        if not temps or any(not (0.0 <= x <= 2.0) for x in temps):
            raise InvalidInputError(f"repetition guard: temperatures must be a non-empty list in [0, 2] (got {temps})")
        self.min_repeats, self.min_tokens, self.max_period = min_repeats, min_tokens, max_period
        self.temperatures = tuple(temps)

    def find(self, tokens):
        """:func:`find_loop` with these settings."""
        return find_loop(tokens, self.min_repeats, self.min_tokens, self.max_period)

    def to_dict(self) -> dict:
        return {"min_repeats": self.min_repeats, "min_tokens": self.min_tokens, "max_period": self.max_period,
                "temperatures": list(self.temperatures)}


class RepetitionGuard:
    """Logits processor: where the generated tokens end in a loop, only ``eos_token_id`` may come next.

    It follows transformers' ``LogitsProcessor`` protocol (``__call__(input_ids, scores) -> scores``) without
    subclassing it, so that importing :mod:`mmspec.vision` does not import transformers.

    Give ``generate`` (transformers' or mmspec's) a fresh one per call: it takes the prompt length from the
    first call it sees (the prefill's ``input_ids``), so that the prompt (hundreds of identical image
    tokens) is never read as a loop.

    Example:
        >>> g = RepetitionGuard(eos_token_id=0, settings=GuardSettings(min_repeats=3, min_tokens=4))
        >>> s = g(torch.tensor([[7, 7]]), torch.zeros(1, 5))          # the prompt: 2 tokens
        >>> s = g(torch.tensor([[7, 7, 1, 2, 1, 2, 1, 2]]), torch.zeros(1, 5))
        >>> s.argmax(-1).item(), bool(torch.isinf(s[0, 1]))
        (0, True)
    """

    def __init__(self, eos_token_id: int, settings: GuardSettings | None = None, prompt_length: int | None = None):
        self.eos = int(eos_token_id)
        self.settings = settings or GuardSettings()
        self.prompt_length = prompt_length
        self._memo: dict = {}  # the decode loop may hand the same history over for every row of a batch

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.prompt_length is None:
            self.prompt_length = input_ids.shape[1]
            return scores
        gen = input_ids[:, self.prompt_length:].cpu().numpy()
        hit = []
        for i, row in enumerate(gen):
            key = row.tobytes()
            found = self._memo.get(key)
            if found is None:
                if len(self._memo) > 4096:
                    self._memo.clear()
                found = self._memo[key] = self.settings.find(row) is not None
            if found:
                hit.append(i)
        if hit:
            scores = scores.clone()
            keep = scores[hit, self.eos].clone()
            scores[hit] = float("-inf")
            scores[hit, self.eos] = torch.where(torch.isfinite(keep), keep, torch.zeros_like(keep))
        return scores
