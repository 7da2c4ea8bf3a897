"""Prompt lookup (n-gram) drafting that proposes a tree from several matches.

The copy regime of OCR, grounded VQA and editing: the continuation of the last ``n`` tokens has often
been seen before in the prompt or in what was generated. For ``n`` from ``max_ngram`` down to
``min_ngram`` the drafter finds earlier occurrences of the row's last ``n`` tokens, most recent first,
and takes the ``num_draft_tokens`` tokens that followed each (a continuation that runs into the end of the
sequence is extended with the period of the match, so repeated text gets full-depth drafts). Up to ``max_matches`` distinct
continuations are merged into one prefix tree (``max_matches=1`` gives the classic PLD chain), so when
the same n-gram was followed by different text the target can still accept the right branch.

Example:
    >>> d = PromptLookupDrafter(num_draft_tokens=3, max_matches=2)
    >>> d.candidates([1, 2, 3, 9, 1, 2, 4, 5, 1, 2])
    [[4, 5, 1], [3, 9, 1]]
"""

from __future__ import annotations

import numpy as np

from ..tree import DraftTree
from .base import DraftContext, Drafter

__all__ = ["PromptLookupDrafter"]


class PromptLookupDrafter(Drafter):
    """Training-free n-gram drafter over the row's own prompt and output.

    Args:
        num_draft_tokens: depth of each proposed continuation.
        max_ngram, min_ngram: n-gram sizes tried, longest first.
        max_matches: distinct continuations merged into the tree (1 = chain).
        budget: maximum tree nodes (default ``num_draft_tokens * max_matches``).
    """

    kind = "lookup"

    def __init__(self, num_draft_tokens: int = 8, max_ngram: int = 4, min_ngram: int = 1, max_matches: int = 4,
                 budget: int | None = None):
        if num_draft_tokens < 1 or min_ngram < 1 or max_ngram < min_ngram or max_matches < 1:
            raise ValueError("need num_draft_tokens >= 1, 1 <= min_ngram <= max_ngram, max_matches >= 1")
        self.num_draft_tokens = num_draft_tokens
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.max_matches = max_matches
        self.budget = budget or num_draft_tokens * max_matches

    def candidates(self, sequence) -> list[list[int]]:
        """Distinct continuations of the sequence's tail, best (longest n-gram, most recent) first."""
        seq = np.asarray(sequence, dtype=np.int64)
        length = len(seq)
        found: list[list[int]] = []
        seen: set[tuple] = set()
        for n in range(min(self.max_ngram, length - 1), self.min_ngram - 1, -1):
            tail = seq[length - n:]
            windows = np.lib.stride_tricks.sliding_window_view(seq[: length - 1], n)
            starts = np.nonzero((windows == tail).all(axis=1))[0]
            for s in starts[::-1]:  # most recent first
                key = self._continuation(seq, s + n)
                if key in seen:
                    continue
                seen.add(key)
                found.append(list(key))
                if len(found) >= self.max_matches:
                    return found
        return found

    def _continuation(self, seq: np.ndarray, start: int) -> tuple:
        """The tokens after ``seq[start - 1]``, extended periodically past the end of the sequence.

        A match close to the end (repetitive text, lists, tables) would leave a short continuation; since the
        tail repeats what followed ``start - period`` tokens earlier, the draft continues with the same period
        instead of stopping at the sequence end.
        """
        length = len(seq)
        period = length - start
        k = np.arange(self.num_draft_tokens)
        idx = start + k
        past = idx >= length
        idx[past] = start + (k[past] % period)
        return tuple(seq[idx].tolist())

    def propose(self, ctx: DraftContext) -> list[DraftTree]:
        return [DraftTree.from_sequences(self.candidates(seq), budget=self.budget) for seq in ctx.sequences]
