"""Cost-aware draft depth: verify only as deep as the expected gain pays for.

Verification is far from free on a CPU or at large batch: scoring ``Q`` tokens costs ``a + b * Q`` time
units, with ``b / a`` anywhere from ~0 (a GPU at batch 1) to ~0.05 (a small model on a CPU, measured in
DESIGN.md). A wide or deep tree only pays when acceptance is high. :class:`DepthBudget` cuts each row's
tree at the depth ``D`` that maximises expected committed tokens per unit of verify time, the
marginal criterion of LibraSpec / DFly:

    value(D) = (1 + sum_{d<=D} prod_{k<=d} alpha_k) / (a + b * (1 + nodes(D)))

where ``alpha_k`` is the running probability that depth ``k`` is accepted given depth ``k - 1`` was
(learned from the rounds already verified, Beta(1, 1) prior) and ``a, b`` are fitted online from the
measured verify passes. Cutting a tree never changes what is committed, only how many tokens each round
can commit: losslessness is untouched.

Example:
    >>> b = DepthBudget()
    >>> for q in (2, 5, 9, 17, 33) * 3:
    ...     b.cost.observe(q, 5.0 + 0.3 * q)          # a CPU-like cost curve
    >>> for _ in range(50):
    ...     b.acceptance.observe(depth=8, accepted=1)  # drafts rarely survive past depth 1
    >>> from mmspec.tree import DraftTree
    >>> b.choose(DraftTree.from_chain(list(range(8)))).max_depth
    1
"""

from __future__ import annotations

from .tree import DraftTree

__all__ = ["CostModel", "AcceptanceModel", "DepthBudget"]


class CostModel:
    """Verify time per row as ``a + b * tokens``, a least-squares fit over the passes seen so far.

    ``ready`` is false until the observations span at least two distinct sizes (a single size cannot
    separate ``a`` from ``b``); until then :meth:`slope_ratio` is 0 and nothing is cut.
    """

    def __init__(self, min_observations: int = 8):
        self.n = 0
        self.sx = self.sy = self.sxx = self.sxy = 0.0
        self.min_observations = min_observations

    def observe(self, tokens: float, seconds: float) -> None:
        """Record one verify pass: ``tokens`` scored per row, ``seconds`` it took."""
        self.n += 1
        self.sx += tokens
        self.sy += seconds
        self.sxx += tokens * tokens
        self.sxy += tokens * seconds

    def _fit(self) -> tuple[float, float] | None:
        var = self.n * self.sxx - self.sx * self.sx
        if self.n < self.min_observations or var <= 1e-9 * max(1.0, self.sxx):
            return None
        b = (self.n * self.sxy - self.sx * self.sy) / var
        a = (self.sy - b * self.sx) / self.n
        return (max(a, 1e-9), max(b, 0.0))

    @property
    def ready(self) -> bool:
        return self._fit() is not None

    def slope_ratio(self) -> float:
        """``b / a``: the cost of one more scored token relative to the fixed cost of a pass."""
        fit = self._fit()
        return 0.0 if fit is None else fit[1] / fit[0]


class AcceptanceModel:
    """Per-depth conditional acceptance ``alpha_d = P(depth d accepted | depth d-1 accepted)``."""

    def __init__(self, prior: tuple[float, float] = (1.0, 1.0)):
        self.prior = prior
        self.trials: list[float] = []
        self.successes: list[float] = []

    def observe(self, depth: int, accepted: int) -> None:
        """One row's round: a tree of ``depth`` of which ``accepted`` levels were kept."""
        for d in range(min(accepted + 1, depth)):
            while len(self.trials) <= d:
                self.trials.append(0.0)
                self.successes.append(0.0)
            self.trials[d] += 1
            if d < accepted:
                self.successes[d] += 1

    def alpha(self, d: int) -> float:
        """Posterior mean of ``alpha_{d+1}`` (``d`` is 0-based)."""
        s = self.successes[d] if d < len(self.successes) else 0.0
        t = self.trials[d] if d < len(self.trials) else 0.0
        total = t + self.prior[0] + self.prior[1]
        return (s + self.prior[0]) / total if total > 0 else 0.0


class DepthBudget:
    """Cut draft trees to the depth with the best expected tokens per unit of verify time.

    Pass one instance to several :func:`mmspec.generate` calls (``budget=``) to keep what it learned.
    """

    def __init__(self, cost: CostModel | None = None, acceptance: AcceptanceModel | None = None,
                 min_depth: int = 1):
        self.cost = cost or CostModel()
        self.acceptance = acceptance or AcceptanceModel()
        # Never cut below this depth: with nothing drafted, acceptance could never be observed again.
        self.min_depth = min_depth

    def choose(self, tree: DraftTree) -> DraftTree:
        """``tree`` pruned to its best depth (the tree itself when the costs are not known yet)."""
        depth_max = tree.max_depth
        ratio = self.cost.slope_ratio()
        if depth_max == 0 or ratio == 0.0:
            return tree
        depth = tree.depth
        best_d, best_v = 0, -1.0
        expected, reach = 1.0, 1.0
        for d in range(1, depth_max + 1):
            reach *= self.acceptance.alpha(d - 1)
            expected += reach
            nodes = int((depth <= d).sum())
            value = expected / (1.0 + ratio * (1 + nodes))
            if value > best_v or d <= self.min_depth:
                best_d, best_v = d, max(value, best_v)
        return tree.prune(best_d)

    def observe_pass(self, tokens_per_row: int, seconds: float) -> None:
        """Learn the cost curve from one verify pass (``tokens_per_row`` = 1 + padded tree size)."""
        self.cost.observe(tokens_per_row, seconds)

    def observe_row(self, tree: DraftTree, accepted: int) -> None:
        """Learn acceptance from one verified row: ``accepted`` drafted tokens of ``tree`` were kept."""
        self.acceptance.observe(tree.max_depth, accepted)
