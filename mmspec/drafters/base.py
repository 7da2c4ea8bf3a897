"""The drafter protocol: the one small interface every proposer implements.

A drafter sees a :class:`DraftContext` (each active row's committed tokens, how many it may still
generate, the target's hidden states from the last pass when it asked for them) and returns one
:class:`~mmspec.tree.DraftTree` per active row. After the target has verified, :meth:`Drafter.observe`
tells it what was accepted, so stateful drafters (a draft model with its own KV cache, a feature head)
can roll forward. Lookup, draft models, feature heads and block heads all share this one verify loop.

Example:
    >>> from mmspec.tree import DraftTree
    >>> class RepeatLast(Drafter):
    ...     kind = "repeat-last"
    ...     def propose(self, ctx):
    ...         return [DraftTree.from_chain([seq[-1]] * 2) for seq in ctx.sequences]
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..tree import DraftTree

__all__ = ["Drafter", "DraftContext", "RoundResult"]


@dataclass
class DraftContext:
    """What a drafter may read when proposing.

    Attributes:
        sequences: per active row, its committed tokens as a 1-D int64 numpy view (prompt without
            padding, then every generated token; the last one is the pending token the next target pass
            starts from). Views of the loop's buffers: copy them to keep them past the round.
        rows: original batch index of each active row (rows leave when they finish).
        remaining: per active row, tokens it may still generate (a round commits at most depth + 1).
        prompt_lengths: per active row, length of its unpadded prompt.
        do_sample: whether the target samples (drafters then may attach ``draft_probs``).
        generator: the run's random generator, for drafters that sample.
        hidden: target hidden states of the last pass, ``{layer: [B, Q, H]}`` (only layers the drafter
            asked for through ``hidden_layers``); after prefill ``Q`` is the prompt length.
        model_inputs: the processor outputs of the call (drafters with their own model re-read them).
    """

    sequences: list
    rows: list
    remaining: list
    prompt_lengths: list
    do_sample: bool = False
    generator: torch.Generator | None = None
    hidden: dict = field(default_factory=dict)
    model_inputs: dict = field(default_factory=dict)


@dataclass
class RoundResult:
    """What the target kept this round, per active row (same order as the context's rows).

    Attributes:
        trees: the proposals that were scored.
        paths: accepted node indices per row.
        next_tokens: the bonus/corrected token per row (the new pending token).
        finished: per row, whether it stopped this round (eos, max tokens, stop string).
        committed: per row, the tokens it actually kept this round (the path's tokens and the next token,
            cut after a stop).
        scores: the target's processed scores of the pass, per row ``[len(tree) + 1, V]`` (``scores[0]``
            after the root, ``scores[i + 1]`` after node ``i``: what the acceptance rule saw); Jacobi drafting
            samples its next draft from them.
    """

    trees: list
    paths: list
    next_tokens: list
    finished: list
    committed: list
    scores: object = None


class Drafter:
    """Base class of every proposer. Override :meth:`propose`; the rest is optional.

    Class attributes:
        kind: registry name (``"lookup"``, ``"draft-model"``, ...), written into saved configs and stats.
        hidden_layers: target hidden-state layers the drafter reads (empty: none are computed).
    """

    kind = "base"
    hidden_layers: tuple = ()

    def bind(self, model) -> None:
        """Check the drafter fits this target (raise :class:`~mmspec.errors.DrafterMismatchError` if not)."""

    def begin(self, ctx: DraftContext) -> None:
        """Called once after the target's prefill, before the first proposal."""

    def propose(self, ctx: DraftContext) -> list[DraftTree]:
        """One tree per active row of ``ctx``."""
        raise NotImplementedError  # abstract: every concrete drafter overrides it

    def observe(self, ctx: DraftContext, result: RoundResult) -> None:
        """Called after each verify pass with what was accepted."""

    def counters(self) -> dict:
        """Counts the drafter kept during the last :func:`mmspec.generate` call (``{name: number}``), copied into
        ``SpecStats.drafter_counters`` at its end and summed by ``SpecStats.merge``; ratios are left to the
        reader (e.g. TIGER's visual tokens read over visual tokens available). Reset them in :meth:`begin`.

        Example:
            >>> Drafter().counters()
            {}
        """
        return {}

    def forget(self) -> None:
        """Drop whatever was remembered across requests (e.g. a lookup drafter's history of earlier outputs).
        ``mmspec bench`` calls it after its warm-up, so no timed request is drafted from its own output."""
