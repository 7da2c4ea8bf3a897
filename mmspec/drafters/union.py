"""Several drafters at once: their proposals merged into one tree, verified in one pass.

Why: drafters fail in different places. A feature head (EAGLE) predicts the next few tokens from the
target's states; a lookup drafter copies long runs that occurred before (in the prompt, the output, or,
with ``history_tokens``, earlier requests' outputs) at no model cost. Merged, each round keeps the better of
the two, and on a CPU, where verifying a few extra nodes costs little next to a pass, that is nearly free.

Each member proposes its tree; the union is the prefix tree of all their root-to-leaf token paths, built
depth by depth (a ``budget`` cut keeps shallower nodes of every member before deeper ones; at one depth,
earlier members first). Every member sees the same contexts and the same verified results: a result's paths
index the merged tree and the target's hidden states in the next context are laid out by it, so a feature
drafter (EAGLE reads the states of the nodes on the accepted path) follows along, and a draft model rebuilds
what was kept from the tree's tokens. The merged tree is a deterministic proposal (a sampled member's ``q`` is
dropped), which speculative sampling verifies exactly: output is unchanged under both modes.

Spelled ``"A & B"`` wherever a drafter is named (``"eagle:DIR & lookup;history_tokens=20000"``).

Example:
    >>> from mmspec.drafters import PromptLookupDrafter
    >>> u = UnionDrafter([PromptLookupDrafter(num_draft_tokens=2, max_matches=1),
    ...                   PromptLookupDrafter(num_draft_tokens=3, max_matches=2)])
    >>> u.kind, [len(t) for t in u.merge([[DraftTree.from_chain([1, 2])], [DraftTree.from_chain([1, 5, 6])]])]
    ('union', [4])
"""

from __future__ import annotations

from ..errors import InvalidInputError
from ..registry import UNION_SEP, make_drafter, register_drafter
from ..tree import DraftTree
from .base import DraftContext, Drafter, RoundResult

__all__ = ["UnionDrafter"]


class UnionDrafter(Drafter):
    """The union of ``drafters``' trees (see the module docstring).

    Args:
        drafters: two or more drafters, best first.
        budget: maximum nodes of the merged tree (``None``: all).
    """

    kind = "union"

    def __init__(self, drafters, budget: int | None = None):
        self.drafters = list(drafters)
        if len(self.drafters) < 2:
            raise ValueError(f"a union needs at least two drafters (got {len(self.drafters)})")
        if budget is not None and budget < 1:
            raise ValueError(f"budget must be >= 1 (got {budget})")
        self.budget = budget

    @property
    def hidden_layers(self) -> tuple:
        return tuple(dict.fromkeys(layer for d in self.drafters for layer in d.hidden_layers))

    @property
    def members(self) -> str:
        """The members' kinds (``"eagle & lookup"``); stats name the drafter ``union``, bench records by spec."""
        return UNION_SEP.join(d.kind for d in self.drafters)

    def bind(self, model) -> None:
        for d in self.drafters:
            d.bind(model)

    def begin(self, ctx: DraftContext) -> None:
        for d in self.drafters:
            d.begin(ctx)

    def merge(self, proposals: list) -> list:
        """``proposals[m][row]`` -> one merged tree per row."""
        return [DraftTree.from_sequences([p for trees in per_row for p in trees.token_paths()], budget=self.budget)
                for per_row in zip(*proposals)]

    def propose(self, ctx: DraftContext) -> list[DraftTree]:
        return self.merge([d.propose(ctx) for d in self.drafters])

    def observe(self, ctx: DraftContext, result: RoundResult) -> None:
        for d in self.drafters:
            d.observe(ctx, result)

    def forget(self) -> None:
        for d in self.drafters:
            d.forget()


def _union_factory(target_model, path=None, drafters=(), budget=None, **options):
    """The ``union`` kind (``"A & B"`` specs come here through :func:`~mmspec.registry.make_drafter`); registered
    by this module, so the registry never imports it."""
    if path or options:
        raise InvalidInputError(f"a union takes 'drafters' and 'budget' only (got path={path!r}, {sorted(options)})")
    if isinstance(drafters, (str, dict)) or len(drafters) < 2:
        raise InvalidInputError(f"a union needs a list of at least two drafter specs (got {drafters!r})")
    try:
        return UnionDrafter([make_drafter(d, target_model) for d in drafters], budget=budget)
    except ValueError as e:
        raise InvalidInputError(f"bad union options: {e}") from e


register_drafter("union", _union_factory)
