"""An audit drafter that knows the reference answer: how much of a target's output is the reference?

Given each request's reference output (a document's true transcription, a chart's true answer), it finds the
output's last 1-4 tokens inside the tokenized reference, longest match first, and proposes the ``depth``
reference tokens that follow. On a target that copies the page faithfully this drafter reaches τ close to
``depth + 1``; on a target that drifts off the page it finds nothing to propose, whatever the drafter
design. So its τ (``reference_tau`` in ``python -m mmspec.vision.testbed eval``) bounds what a drafter that
reads the page could gain on that target. It is not a speed tool (it needs the answer), like
:class:`~mmspec.drafters.oracle.NoisyOracleDrafter`; unlike that one, its proposals depend on the output
only, deterministically, so decoding with it is exactly the target's own output.

``mmspec bench --systems ar,reference-lookup`` hands it each batch's reference answers (the workload
examples' targets); ``python -m mmspec.vision.testbed eval --reference-tau`` reports its τ on the testbed.

When the tail occurs several times in the reference (table rules, repeated words), the occurrence whose
continuation starts closest to the output's own position is taken: an output that follows the reference
is proposed its own next tokens, not those after an earlier repeat.

Example:
    >>> d = ReferenceLookupDrafter([[10, 11, 12, 13, 14]], depth=3)
    >>> d.continuation(0, [10, 11])
    [12, 13, 14]
    >>> d.continuation(0, [99])             # nothing of the output is in the reference
    []
"""

from __future__ import annotations

import numpy as np

from ..errors import InvalidInputError
from ..tree import DraftTree
from .base import DraftContext, Drafter

__all__ = ["ReferenceLookupDrafter"]


class ReferenceLookupDrafter(Drafter):
    """Propose the reference's continuation of the output's tail (a chain of ``depth`` tokens).

    Args:
        references: per batch row (the original row index, as in ``DraftContext.rows``), the reference
            output's token ids, as the target would emit them (end-of-turn token included, so the last round
            can accept it); replace them per batch with :meth:`set_references`.
        depth: tokens proposed per round.
        max_ngram, min_ngram: tail lengths looked up, longest first.

    Example:
        >>> d = ReferenceLookupDrafter(depth=2)
        >>> d.set_references([[1, 2, 3, 1, 2, 4]])
        >>> d.continuation(0, [7, 1, 2])    # "1 2" occurs twice: the repeat at the output's position wins
        [3, 1]
        >>> d.continuation(0, [1, 2, 3, 1, 2])
        [4]
    """

    kind = "reference-lookup"

    def __init__(self, references=(), depth: int = 8, max_ngram: int = 4, min_ngram: int = 1):
        if depth < 1 or min_ngram < 1 or max_ngram < min_ngram:
            raise InvalidInputError(f"reference-lookup needs depth >= 1 and 1 <= min_ngram <= max_ngram (got depth "
                                    f"{depth}, ngrams {min_ngram}..{max_ngram})")
        self.depth, self.max_ngram, self.min_ngram = int(depth), int(max_ngram), int(min_ngram)
        self.set_references(references)

    def set_references(self, references) -> None:
        """The reference token ids of each row of the next batch (row ``i`` of the batch gets ``references[i]``)."""
        self.references = [np.asarray([int(t) for t in ref], dtype=np.int64) for ref in references]
        self._starts = []  # per row: n-gram (as a tuple) -> start positions in the reference
        for ref in self.references:
            table: dict[tuple, list[int]] = {}
            toks = ref.tolist()
            for n in range(self.min_ngram, self.max_ngram + 1):
                for s in range(len(toks) - n + 1):
                    table.setdefault(tuple(toks[s:s + n]), []).append(s)
            self._starts.append(table)

    def continuation(self, row: int, output) -> list[int]:
        """Up to ``depth`` reference tokens after the longest tail of ``output`` (row ``row``'s generated tokens)
        found in its reference; ``[]`` when no tail of at least ``min_ngram`` tokens occurs there."""
        if not 0 <= row < len(self.references):
            raise InvalidInputError(f"reference-lookup has no reference for batch row {row} ({len(self.references)} "
                                    "given): pass one per row with set_references(...)")
        ref, table = self.references[row], self._starts[row]
        out = [int(t) for t in output[max(0, len(output) - self.max_ngram):]]
        position = len(output)  # where the next token goes, if the output has followed the reference
        for n in range(min(self.max_ngram, len(out)), self.min_ngram - 1, -1):
            ends = [s + n for s in table.get(tuple(out[len(out) - n:]), ()) if s + n < len(ref)]
            if ends:
                end = min(ends, key=lambda e: (abs(e - position), e))
                return ref[end:end + self.depth].tolist()
        return []

    def propose(self, ctx: DraftContext) -> list[DraftTree]:
        trees = []
        for seq, row, plen in zip(ctx.sequences, ctx.rows, ctx.prompt_lengths):
            chain = self.continuation(row, seq[plen:])  # the generated tokens, pending one included
            trees.append(DraftTree.from_chain(chain) if chain else DraftTree.empty())
        return trees

