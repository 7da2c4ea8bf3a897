"""Prompt lookup (n-gram) drafting that proposes a tree from several matches.

The copy regime of OCR, grounded VQA and editing: the continuation of the last ``n`` tokens has often
been seen before in the prompt or in what was generated. For ``n`` from ``max_ngram`` down to
``min_ngram`` the drafter finds earlier occurrences of the row's last ``n`` tokens, most recent first,
and takes the ``num_draft_tokens`` tokens that followed each (a continuation that runs into the end of the
sequence is extended with the period of the match, so repeated text gets full-depth drafts). Up to ``max_matches`` distinct
continuations are merged into one prefix tree (``max_matches=1`` gives the classic PLD chain), so when
the same n-gram was followed by different text the target can still accept the right branch.

With ``history_tokens > 0`` the drafter also remembers what the target generated for earlier requests (the
last ``history_tokens`` tokens, request by request) and looks the tail up there too, after the row's own
matches of the same length: SuffixDecoding's cross-request memory, for batch jobs whose outputs share
phrases (form fields, boilerplate, table headers). Only committed target output is remembered, so the
drafts change and the output does not.

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
        history_tokens: how many tokens of earlier requests' outputs to remember and search (0: none).

    Example:
        >>> d = PromptLookupDrafter(num_draft_tokens=2, max_matches=1, history_tokens=100)
        >>> d.remember([5, 6, 7, 8])                 # an earlier request's output
        >>> d.candidates([1, 2, 6])                  # nothing in the row itself follows 6
        [[7, 8]]
    """

    kind = "lookup"

    def __init__(self, num_draft_tokens: int = 8, max_ngram: int = 4, min_ngram: int = 1, max_matches: int = 4,
                 budget: int | None = None, history_tokens: int = 0):
        if num_draft_tokens < 1 or min_ngram < 1 or max_ngram < min_ngram or max_matches < 1 or history_tokens < 0:
            raise ValueError("need num_draft_tokens >= 1, 1 <= min_ngram <= max_ngram, max_matches >= 1, "
                             "history_tokens >= 0")
        self.num_draft_tokens = num_draft_tokens
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.max_matches = max_matches
        self.budget = budget or num_draft_tokens * max_matches
        self.history_tokens = int(history_tokens)
        self.forget()  # the history: earlier outputs, each followed by a -1 separator, and its n-gram index

    def forget(self) -> None:
        self._history = np.empty(0, dtype=np.int64)
        self._history_index = _NgramIndex(self.min_ngram, self.max_ngram)

    def remember(self, tokens) -> None:
        """Add one finished request's generated tokens to the cross-request memory (oldest dropped first)."""
        if not self.history_tokens or len(tokens) == 0:
            return
        self._history = np.concatenate([self._history, np.asarray(tokens, dtype=np.int64), [-1]])
        if len(self._history) > self.history_tokens:
            # Drop whole requests from the front, down to three quarters of the budget, and re-index once.
            cut = len(self._history) - (3 * self.history_tokens) // 4
            seps = np.flatnonzero(self._history[:cut] == -1)
            drop = max(int(seps[-1]) + 1 if len(seps) else cut, len(self._history) - self.history_tokens)
            self._history = self._history[drop:]
            self._history_index = _NgramIndex(self.min_ngram, self.max_ngram)
        self._history_index.extend(self._history)

    def candidates(self, sequence, index: "_NgramIndex | None" = None) -> list[list[int]]:
        """Distinct continuations of the sequence's tail, best (longest n-gram, most recent) first.

        ``index`` is the row's incremental n-gram index (kept across rounds by :meth:`propose`, so a round
        costs O(new tokens) rather than a scan of the whole sequence); without one a fresh index is built.
        """
        seq = np.asarray(sequence, dtype=np.int64)
        if index is None:
            index = _NgramIndex(self.min_ngram, self.max_ngram)
        index.extend(seq)
        length = len(seq)
        found: list[list[int]] = []
        seen: set[tuple] = set()
        longest = min(self.max_ngram, length if len(self._history) else length - 1)  # a row needs a token after it
        for n in range(longest, self.min_ngram - 1, -1):
            for key in self._matches(seq, index, n):
                if not key or key in seen:
                    continue
                seen.add(key)
                found.append(list(key))
                if len(found) >= self.max_matches:
                    return found
        return found

    def _matches(self, seq: np.ndarray, index: "_NgramIndex", n: int):
        """Continuations of the tail ``n``-gram, lazily: the row's own (most recent first), then the history's."""
        length, tail = len(seq), seq[len(seq) - n:]
        for s in reversed(index.starts(tail)):
            if s + n < length:  # (not the tail itself)
                yield self._continuation(seq, s + n)
        hist = self._history
        for s in reversed(self._history_index.starts(tail) if len(hist) else []):
            cont = hist[s + n: s + n + self.num_draft_tokens]
            stop = np.flatnonzero(cont == -1)  # an earlier request's output ends there
            yield tuple(cont[: stop[0] if len(stop) else len(cont)].tolist())

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

    def begin(self, ctx: DraftContext) -> None:
        self._indexes = {r: _NgramIndex(self.min_ngram, self.max_ngram) for r in ctx.rows}

    def propose(self, ctx: DraftContext) -> list[DraftTree]:
        indexes = getattr(self, "_indexes", {})
        return [DraftTree.from_sequences(self.candidates(seq, indexes.get(r)), budget=self.budget)
                for r, seq in zip(ctx.rows, ctx.sequences)]

    def observe(self, ctx: DraftContext, result) -> None:
        if not self.history_tokens:
            return
        for i, done in enumerate(result.finished):
            if done:  # what the row generated: its tokens before this round and what it kept in it
                self.remember(np.concatenate([np.asarray(ctx.sequences[i][ctx.prompt_lengths[i]:], dtype=np.int64),
                                              np.asarray(result.committed[i], dtype=np.int64)]))


class _NgramIndex:
    """Start positions of every n-gram (``min_n <= n <= max_n``) of a growing sequence, in order."""

    def __init__(self, min_n: int, max_n: int):
        self.min_n, self.max_n = min_n, max_n
        self.length = 0
        self.table: dict[tuple, list[int]] = {}

    def extend(self, seq: np.ndarray) -> None:
        """Index the n-grams that end in ``seq[self.length:]`` (the tokens added since the last call)."""
        if len(seq) <= self.length:
            return
        base = max(0, self.length - self.max_n + 1)  # earlier tokens can still start a new n-gram
        toks = seq[base:].tolist()
        for end in range(self.length + 1, len(seq) + 1):  # n-grams ending at position end - 1
            for n in range(self.min_n, min(self.max_n, end) + 1):
                self.table.setdefault(tuple(toks[end - n - base:end - base]), []).append(end - n)
        self.length = len(seq)

    def starts(self, gram: np.ndarray) -> list[int]:
        return self.table.get(tuple(gram.tolist()), [])
