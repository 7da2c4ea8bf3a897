"""SpecStats: what a speculative run did, in the project's one τ convention.

Conventions (DESIGN.md):

* **τ (mean accepted length)** counts the bonus token: the tokens one row commits per target verify
  pass, pooled over every (row, round) pair: ``tau = committed tokens / row-rounds``. The prefill (which
  commits the first token with no draft) is counted in ``target_forwards`` but not in τ.
* **Per-position acceptance**: ``accept_rate[d]`` is the fraction of row-rounds whose draft reached depth
  ``d + 1`` in which the accepted path also reached it.
* **Histogram**: ``accepted_hist[a]`` counts row-rounds that accepted ``a`` drafted tokens (τ-length
  ``a + 1``); ``ceiling_rounds`` counts those that accepted the whole depth of their tree (the "ceiling
  bin": the drafter, not the target, limited the round).

Example:
    >>> s = SpecStats()
    >>> s.record_row(accepted=2, depth=3); s.record_row(accepted=3, depth=3)
    >>> round(s.tau, 2), s.accepted_hist, s.ceiling_rounds
    (3.5, [0, 0, 1, 1], 1)
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

__all__ = ["SpecStats"]


@dataclass
class SpecStats:
    """Counters and timings of one :func:`mmspec.generate` call (or several, merged)."""

    rule: str = ""
    lossless: bool = True
    drafter: str = ""
    rounds: int = 0
    """Target verify passes (each covers every active row)."""
    row_rounds: int = 0
    """(row, round) pairs: the denominator of τ."""
    committed: int = 0
    """Tokens committed by verify passes (accepted drafts + one bonus each row-round)."""
    drafted: int = 0
    """Draft tree nodes scored by the target."""
    target_forwards: int = 0
    """All target passes, prefill included (one pass covers the whole batch)."""
    prefill_rows: int = 0
    """Rows prefilled (each commits its first token without a draft)."""
    generated: int = 0
    """Tokens returned to the user (prefill's first token included, padding excluded)."""
    accepted_hist: list = field(default_factory=list)
    depth_reached: list = field(default_factory=list)
    depth_accepted: list = field(default_factory=list)
    ceiling_rounds: int = 0
    prefill_time: float = 0.0
    draft_time: float = 0.0
    verify_time: float = 0.0
    accept_time: float = 0.0
    commit_time: float = 0.0
    total_time: float = 0.0
    audit_time: float = 0.0
    """Seconds spent on measurement only (``record_entropy``), included in ``total_time``; a benchmark takes them
    out of its clock."""
    drafter_counters: dict = field(default_factory=dict)
    """The drafter's own counts over the run (:meth:`mmspec.drafters.Drafter.counters`), summed by :meth:`merge`."""
    entropy_trace: list = field(default_factory=list)
    """``[entropy, committed]`` per row-round when ``generate(..., record_entropy=True)``: the target's
    next-token entropy (nats) at the round's root and the tokens that row-round committed (see
    :meth:`draftability`)."""

    # ------------------------------------------------------------------ recording
    def record_row(self, accepted: int, depth: int, nodes: int | None = None, committed: int | None = None,
                   ceiling: bool | None = None) -> None:
        """Record one row's round: ``accepted`` drafted tokens kept out of a tree of ``depth``.

        ``committed`` defaults to ``accepted + 1`` (the bonus token); a stop inside the path commits fewer.
        ``ceiling`` defaults to "the whole depth was accepted"; the loop passes False when the length limit,
        not the drafter, bounded the tree.
        """
        self.row_rounds += 1
        self.committed += accepted + 1 if committed is None else committed
        self.drafted += depth if nodes is None else nodes
        _bump(self.accepted_hist, accepted)
        for d in range(depth):
            _bump(self.depth_reached, d)
        for d in range(accepted):
            _bump(self.depth_accepted, d)
        if (depth > 0 and accepted == depth) if ceiling is None else ceiling:
            self.ceiling_rounds += 1

    # ------------------------------------------------------------------ derived
    @property
    def tau(self) -> float:
        """Mean accepted length, bonus token included (0 when no round ran)."""
        return self.committed / self.row_rounds if self.row_rounds else 0.0

    mean_accepted_length = tau

    @property
    def accept_rate(self) -> list:
        """Per-depth acceptance: accepted / drafted-at-that-depth."""
        acc = self.depth_accepted + [0] * (len(self.depth_reached) - len(self.depth_accepted))
        return [a / r if r else 0.0 for a, r in zip(acc, self.depth_reached)]

    @property
    def forwards_per_token(self) -> float:
        """Per-row target passes per generated token (1.0 for plain autoregressive decoding)."""
        return (self.row_rounds + self.prefill_rows) / self.generated if self.generated else 0.0

    def draftability(self) -> dict | None:
        """Least-squares fit of tokens committed per row-round against the target's next-token entropy at the
        round's root (from :attr:`entropy_trace`): ``{"n", "mean_entropy", "slope", "intercept", "r2"}``, or
        ``None`` with fewer than 3 rounds or no spread in entropy. A steep negative slope says acceptance is
        limited by how uncertain the target is, not by the drafter (the draftability law).

        Example:
            >>> s = SpecStats(entropy_trace=[[0.0, 5], [1.0, 3], [2.0, 1]])
            >>> {k: round(v, 3) for k, v in s.draftability().items()}
            {'n': 3, 'mean_entropy': 1.0, 'slope': -2.0, 'intercept': 5.0, 'r2': 1.0}
        """
        pts = self.entropy_trace
        n = len(pts)
        if n < 3:
            return None
        mx = sum(p[0] for p in pts) / n
        my = sum(p[1] for p in pts) / n
        sxx = sum((p[0] - mx) ** 2 for p in pts)
        if sxx <= 0:
            return None
        sxy = sum((p[0] - mx) * (p[1] - my) for p in pts)
        syy = sum((p[1] - my) ** 2 for p in pts)
        slope = sxy / sxx
        return {"n": n, "mean_entropy": mx, "slope": slope, "intercept": my - slope * mx,
                "r2": (sxy * sxy / (sxx * syy)) if syy > 0 else 0.0}

    def merge(self, other: "SpecStats") -> "SpecStats":
        """Add another run's counters into this one (for pooling over a workload); returns self."""
        for name in ("rounds", "row_rounds", "committed", "drafted", "target_forwards", "prefill_rows", "generated",
                     "ceiling_rounds"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for name in ("prefill_time", "draft_time", "verify_time", "accept_time", "commit_time", "total_time",
                     "audit_time"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for name in ("accepted_hist", "depth_reached", "depth_accepted"):
            mine, theirs = getattr(self, name), getattr(other, name)
            for i, v in enumerate(theirs):
                _bump(mine, i, v)
        self.entropy_trace = self.entropy_trace + list(other.entropy_trace)
        self.drafter_counters = {k: self.drafter_counters.get(k, 0) + other.drafter_counters.get(k, 0)
                                 for k in {**self.drafter_counters, **other.drafter_counters}}
        self.lossless = self.lossless and other.lossless
        for name in ("rule", "drafter"):  # a fresh SpecStats takes the labels of what is merged into it
            mine, theirs = getattr(self, name), getattr(other, name)
            if theirs and mine != theirs:
                setattr(self, name, theirs if not mine else "mixed")
        return self

    # ------------------------------------------------------------------ output
    def to_dict(self) -> dict:
        """JSON-ready dict with the derived figures next to the counters."""
        d = asdict(self)
        d.update(tau=self.tau, accept_rate=self.accept_rate, forwards_per_token=self.forwards_per_token)
        return d

    def to_json(self, **kw) -> str:
        """``json.dumps`` of :meth:`to_dict`."""
        return json.dumps(self.to_dict(), **kw)

    def __str__(self) -> str:
        hist = " ".join(f"{a + 1}:{n}" for a, n in enumerate(self.accepted_hist))
        rates = " ".join(f"{r:.2f}" for r in self.accept_rate[:8])
        label = "lossless" if self.lossless else "LOSSY"
        t = self.total_time or 1e-9
        return (
            f"SpecStats[{self.drafter or 'no drafter'} / {self.rule}, {label}] tau={self.tau:.2f} "
            f"rounds={self.rounds} generated={self.generated} forwards/token={self.forwards_per_token:.2f}\n"
            f"  accepted-length histogram (tau-length:count): {hist}  ceiling={self.ceiling_rounds}\n"
            f"  per-position acceptance: {rates}\n"
            f"  time: prefill {self.prefill_time:.3f}s draft {self.draft_time:.3f}s verify {self.verify_time:.3f}s "
            f"accept {self.accept_time:.3f}s commit {self.commit_time:.3f}s total {t:.3f}s "
            f"({self.generated / t:.1f} tok/s)"
        )


def _bump(counts: list, i: int, by: int = 1) -> None:
    while len(counts) <= i:
        counts.append(0)
    counts[i] += by
