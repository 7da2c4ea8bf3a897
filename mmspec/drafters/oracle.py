"""An audit drafter: proposes the true continuation with random corruptions.

Given the reference output (e.g. from ``model.generate``), it proposes the next ``depth`` true tokens per
row, corrupting each with probability ``corrupt_p``, and (as a tree) adds ``extra_branches`` random
siblings at random depths, with the true child placed at a random rank. Every depth of acceptance and
every rejection position gets exercised, for chains and trees; losslessness tests use it. It is not a
speed tool.

Example:
    >>> import torch
    >>> d = NoisyOracleDrafter(torch.tensor([[4, 5, 6, 7]]), depth=3, corrupt_p=0.0, vocab_size=10)
    >>> ctx = DraftContext(sequences=[[1, 2, 4]], rows=[0], remaining=[3], prompt_lengths=[2])
    >>> d.propose(ctx)[0].tokens.tolist()
    [5, 6, 7]
"""

from __future__ import annotations

import numpy as np

from ..tree import DraftTree
from .base import DraftContext, Drafter

__all__ = ["NoisyOracleDrafter"]


class NoisyOracleDrafter(Drafter):
    """Propose reference tokens with corruptions, as a chain or a tree.

    Args:
        reference: ``[B, T]`` generated tokens (without the prompt) of each row.
        depth: draft depth per round.
        corrupt_p: probability that a proposed true token is replaced by a random one.
        extra_branches: random sibling branches added per round (0 gives a chain).
        vocab_size: range of random tokens.
        seed: seed of the drafter's own random stream.
    """

    kind = "noisy-oracle"

    def __init__(self, reference, depth: int = 4, corrupt_p: float = 0.3, extra_branches: int = 0,
                 vocab_size: int = 100, seed: int = 0):
        self.reference = [list(map(int, row)) for row in np.asarray(reference)]
        self.depth = depth
        self.corrupt_p = corrupt_p
        self.extra_branches = extra_branches
        self.vocab_size = vocab_size
        self.rng = np.random.default_rng(seed)

    def _noisy(self, true: list[int]) -> list[int]:
        return [int(self.rng.integers(self.vocab_size)) if self.rng.random() < self.corrupt_p else t for t in true]

    def propose(self, ctx: DraftContext) -> list[DraftTree]:
        trees = []
        for seq, row, plen in zip(ctx.sequences, ctx.rows, ctx.prompt_lengths):
            done = len(seq) - plen  # generated so far, pending included
            true = self.reference[row][done: done + self.depth]
            chain = self._noisy(true)
            seqs = [chain]
            for _ in range(self.extra_branches):
                if not chain:
                    break
                fork = int(self.rng.integers(len(chain)))
                branch = chain[:fork] + [int(self.rng.integers(self.vocab_size))] + self._noisy(true[fork + 1:])
                seqs.insert(int(self.rng.integers(len(seqs) + 1)), branch)
            trees.append(DraftTree.from_sequences(seqs))
        return trees
