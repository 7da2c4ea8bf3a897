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

import math
import time

from .errors import InvalidInputError
from .tree import DraftTree

__all__ = ["CostModel", "AcceptanceModel", "DepthBudget", "ConfidenceStop"]


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


class ConfidenceStop:
    """Stop drafting once the drafter's own confidence says the next token will not pay for itself.

    A drafter with a softmax (a feature head, a draft model) knows how sure it is: the product ``c_d`` of
    its probabilities for drafts ``1..d`` estimates the chance that all ``d`` are accepted (on the testbed
    head: drafts it gives > 0.8 are accepted 97% of the time, < 0.2 only 10%). Drafting stops at the first
    draft with ``c_d < threshold``, which is dropped. Only the proposal shrinks, so the output is unchanged
    (greedy) and exactly distributed (sampling), provided a sampled draft's confidence is the top
    probability of the distribution it was drawn from, not the probability of the token drawn: keeping a
    draft because of which token came out would bias the kept drafts away from ``q`` (the sampling test
    with a confidence stop fails at p ~ 1e-93 that way).

    ``threshold="auto"`` derives it from measured costs instead of fixing it: one more draft is worth
    its cost when its expected yield ``c_d`` beats what the same time buys at the current rate, i.e.
    ``c_d >= (t_step + b) * rate``, with ``t_step`` the marginal time of one drafter step and ``b`` the
    extra verify time of one more scored token (slopes of :class:`CostModel` fits over every round seen:
    drafting time against steps, the verify part against the width verified) and ``rate`` the committed
    tokens per second of recent rounds (exponentially decayed). While every round ran as many steps the
    mean step time stands in for ``t_step``; while every round verified the same width (as in wide
    batches) ``b`` counts as 0. At batch > 1 drafting continues while any row is above the threshold.
    On the testbed CPU (a drafter step costs a fifth of a target pass) it settles at 0.40 on docs and 0.45
    on charts (``t_step`` 1.0 / 0.9 ms, ``b`` 0.5 / 0.3 ms); the smaller the drafter's and the verify's
    share of a round (a GPU, a large target), the lower it falls and the deeper chains run. Until enough
    rounds are measured it uses ``initial``. Under seeded
    sampling the measured times make draft lengths (not the output distribution) vary between runs; pass
    a number for bit-reproducible runs.

    Example:
        >>> stop = ConfidenceStop.parse("0.3")
        >>> stop.threshold(), ConfidenceStop.parse(None)
        (0.3, None)
        >>> auto = ConfidenceStop.parse("auto")
        >>> auto.threshold()            # nothing measured yet: the initial guess
        0.25
    """

    def __init__(self, threshold: float | str = "auto", initial: float = 0.25, decay: float = 0.95,
                 clock=time.perf_counter):
        self.auto = threshold == "auto"
        self.clock = clock
        self.fixed = None if self.auto else float(threshold)
        self.initial, self.decay = float(initial), float(decay)
        self.cost = CostModel()  # a round's verify part against the width it verified: the slope is b
        # Drafting time against drafter steps: the slope is one step's marginal cost (a round's fixed part,
        # the root pass and tree building, is not saved by stopping early).
        self.draft_cost = CostModel()
        self._tokens = self._seconds = self._draft_s = self._steps = 0.0
        self._round_start = self._draft_end = None

    @classmethod
    def parse(cls, value) -> "ConfidenceStop | None":
        """``None`` / ``"none"`` / ``0``: never stop early; ``"auto"``; or a threshold in (0, 1)."""
        if isinstance(value, ConfidenceStop):
            return value
        if value is None or (isinstance(value, str) and value.lower() in ("", "none")):
            return None
        if isinstance(value, str) and value.lower() == "auto":
            return cls("auto")
        try:
            x = float(value)
        except (TypeError, ValueError):
            raise InvalidInputError(
                f"min_confidence must be 'auto', 'none' or a number in [0, 1) (got {value!r})") from None
        if not 0.0 <= x < 1.0:
            raise InvalidInputError(f"min_confidence must be in [0, 1) (got {x})")
        return None if x == 0.0 else cls(x)

    def spec(self):
        """The value :meth:`parse` rebuilds this from (saved in drafter configs)."""
        return "auto" if self.auto else self.fixed

    def threshold(self) -> float:
        """The cumulative draft probability below which drafting stops now."""
        if not self.auto:
            return self.fixed
        if self.cost.n < self.cost.min_observations or self._seconds <= 0 or self._steps <= 0:
            return self.initial
        fit = self.cost._fit()  # None while every round verified the same width (e.g. wide batches): b = 0
        step = self.draft_cost._fit()  # None while every round ran as many steps: the mean step time
        t_step = step[1] if step else self._draft_s / self._steps
        rate = self._tokens / self._seconds
        return min(0.9, max(0.01, (t_step + (fit[1] if fit else 0.0)) * rate))

    def log_threshold(self) -> float:
        return math.log(self.threshold())

    # -------------------------------------------------------------- measurements (auto only)
    def new_run(self) -> None:
        """A new request starts (nothing of an unfinished round is counted)."""
        self._round_start = self._draft_end = None

    def draft_started(self) -> None:
        """Called as a round's drafting starts."""
        self._round_start, self._draft_end = self.clock(), None

    def draft_done(self, steps: int) -> None:
        """Drafting is over; it ran ``steps`` drafter passes."""
        now = self.clock()
        if self.auto and self._round_start is not None and steps > 0:
            took = now - self._round_start
            self.draft_cost.observe(steps, took)
            self._draft_s = self._draft_s * self.decay + took
            self._steps = self._steps * self.decay + steps
        self._draft_end = now

    def committed(self, tokens_per_row: float, width: int) -> None:
        """The round is verified and committed: ``tokens_per_row`` kept on average, ``width`` tokens per row
        scored (the root and the tree actually verified, after any pruning). Closes the round's timing."""
        now = self.clock()
        if self.auto and self._round_start is not None and self._draft_end is not None:
            self.cost.observe(width, now - self._draft_end)
            self._seconds = self._seconds * self.decay + (now - self._round_start)
            self._tokens = self._tokens * self.decay + float(tokens_per_row)
        self._round_start = self._draft_end = None
