"""Relaxed (lossy) acceptance rules for image tokens, registered with the core's rule registry.

Image codes are redundant: many codes draw nearly the same patch, and the target is often unsure among them, so
the exact test ``min(1, p(x) / q(x))`` rejects drafts that would look the same. Each rule here accepts more, and
declares ``lossless = False`` (every run's ``SpecStats.lossless`` is then false). The walk is the core's: down a
draft tree, at each node the children in order, a child accepted with the rule's probability, a rejection
turning the target's ``p`` into the rule's residual, the next token drawn from what is left (``q`` one-hot for a
deterministic draft). Written out from ``anchors_domains.md`` §1:

* ``lantern++`` (LANTERN++, Park et al.; ``jadohu/LANTERN``): the ``k`` nearest codes of ``x`` in the VQ
  codebook (L2, ``x`` itself excluded), their target mass accumulated in distance order ``c_j``; the largest
  prefix with ``c_j <= (lambda - 1) p(x)`` is added to ``p(x)`` (so ``p~(x) <= lambda p(x)``), accept iff
  ``u <= p~(x) / q(x)``. On rejection, ``residual="moved"`` (default) draws from ``max(0, p~ - q)``, ``p~`` being
  ``p`` with the moved neighbours' mass on ``x``: every position then follows ``p~`` exactly, within
  ``TV <= (lambda - 1) p(x)`` of the target. ``residual="neighbourhood"`` is the repository's literal rule:
  ``max(0, p - q)`` with all ``k`` neighbours zeroed once any mass was moved (on a chain it pushes the corrected
  token away from the likely codes). Options ``lambda`` (> 1, default 2), ``k`` (default 16: the repository's
  1000 of an 8192-16384-code book, scaled to this world's 256 codes), ``residual``.
* ``csd`` (CSD, ``aderfebr/CSD``): accept with ``min(1, p(x)/q(x) + bonus)``, ``bonus = weight * H(p)`` (nats)
  when ``TV(p, q) < tv_gate``, else 0; residual ``norm(max(0, p - q))``. Options ``weight`` (0.5), ``tv_gate``
  (0.65).
* ``gsd`` (GSD, ``junhyukso/GSD``): the candidates within ``ranks`` places of ``x`` in the target's order, kept
  when ``|p(y) - p(x)| < prob_gap`` (and, with ``latent_dist``, when ``||e_y - e_x||^2 < latent_dist`` on the VQ
  codebook vectors): group ``G``; accept with ``min(1, p(G) / q(G))``; residual ``norm(max(0, p - q))``. Options
  ``ranks`` (7), ``prob_gap`` (0.15), ``latent_dist`` (off: the CSD re-implementation drops the embedding test,
  and GSD's threshold is for Lumina-mGPT's embedding scale).

Rules that read the codebook get it from :meth:`bind_codebook` (``ImageARPipeline`` does that). Each rule's
``accept_prob(p, q, x)`` and ``residual(p, q, x)`` are public so tests check them against references.

Example:
    >>> import torch
    >>> rule = CSDRule()
    >>> p = torch.tensor([0.5, 0.5]); q = torch.tensor([0.0, 1.0])
    >>> round(rule.accept_prob(p, q, 1), 3)  # TV 0.5 < 0.65: p/q + 0.5 * ln 2, capped at 1
    0.847
"""

from __future__ import annotations

import math

import torch

from mmspec.acceptance import SpeculativeSamplingRule, register_rule

__all__ = ["RelaxedRule", "LanternRule", "CSDRule", "GSDRule", "code_neighbours"]


class RelaxedRule(SpeculativeSamplingRule):
    """The core's sampling walk (:class:`~mmspec.acceptance.SpeculativeSamplingRule`) with a rule's own
    acceptance probability and residual: subclasses implement :meth:`accept_prob` and may override
    :meth:`residual` (default ``max(0, p - q)``). Lossy, for sampling (``mode = "sample"``)."""

    name = "relaxed"
    lossless = False
    mode = "sample"

    def accept_prob(self, p: torch.Tensor, q: torch.Tensor, x: int) -> float:
        """Probability of accepting draft ``x`` drawn from ``q`` under the target's ``p`` (both ``[V]``)."""
        raise NotImplementedError  # abstract: every rule overrides it

    # A rule that can score every node of a chain in one call sets ``batched = True`` and implements accept_probs;
    # the core's walk then takes a chain in one pass (SpeculativeSamplingRule._chain), drawing what its node walk draws.
    def accept_probs(self, p: torch.Tensor, q: torch.Tensor, x: torch.Tensor) -> list:
        """:meth:`accept_prob` of ``n`` nodes at once (``p``, ``q``: ``[n, V]``, ``x``: ``[n]``): a list of floats.
        Only rules with ``batched = True`` implement it."""
        raise NotImplementedError  # only batched rules override it


def code_neighbours(codebook: torch.Tensor, k: int, chunk: int = 1024) -> torch.Tensor:
    """``[K, min(k, K - 1)]``: each code's nearest other codes in the codebook (L2), nearest first.

    Example:
        >>> code_neighbours(torch.tensor([[0.0], [1.0], [3.0]]), 2).tolist()
        [[1, 2], [0, 2], [1, 0]]
    """
    cb = codebook.float()
    K = cb.shape[0]
    k = min(int(k), K - 1)
    out = []
    for s in range(0, K, chunk):  # a 16384-code book would need a 1 GB distance matrix at once
        d = torch.cdist(cb[s:s + chunk], cb)
        d[torch.arange(d.shape[0]), torch.arange(s, s + d.shape[0])] = float("inf")
        out.append(d.topk(k, dim=1, largest=False).indices)
    return torch.cat(out)


class LanternRule(RelaxedRule):
    """LANTERN++'s latent-neighbour relaxation with the multiplicative bound ``lambda`` (module docstring).

    Example:
        >>> rule = LanternRule(**{"lambda": 2.0, "k": 2})
        >>> rule.bind_codebook(torch.tensor([[0.0], [1.0], [5.0]]), offset=0)
        >>> p = torch.tensor([0.2, 0.15, 0.65])
        >>> round(rule.accept_prob(p, torch.tensor([1.0, 0.0, 0.0]), 0), 3)  # neighbour 1's 0.15 <= 0.2 is added
        0.35
    """

    name = "lantern++"

    def __init__(self, k: int = 16, residual: str = "moved", **options):
        lam = options.pop("lambda", 2.0)
        if options:
            raise TypeError(f"unexpected options {sorted(options)} (lantern++ takes lambda, k, residual)")
        if residual not in ("moved", "neighbourhood"):
            raise TypeError(f"residual must be 'moved' or 'neighbourhood' (got {residual!r})")
        self.residual_mode = residual
        if isinstance(lam, bool) or not isinstance(lam, (int, float)) or not lam > 1.0 or not math.isfinite(lam):
            raise TypeError(f"lambda must be a finite number > 1 (got {lam!r})")
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise TypeError(f"k must be a positive integer (got {k!r})")
        self.lam, self.k = float(lam), k
        self.nbrs, self.offset = None, 0

    def bind_codebook(self, codebook: torch.Tensor, offset: int) -> None:
        """Precompute each code's ``k`` nearest codes; code ``i`` is token ``offset + i``."""
        self.nbrs = code_neighbours(codebook, self.k) + int(offset)
        self.offset = int(offset)

    def _neighbours(self, x: int, device) -> torch.Tensor | None:
        if self.nbrs is None:
            from mmspec.errors import InvalidInputError

            raise InvalidInputError("lantern++ needs the VQ codebook: bind_codebook(codebook, offset) first")
        i = x - self.offset
        if not 0 <= i < self.nbrs.shape[0]:
            return None  # not an image code: no latent neighbours
        return self.nbrs[i].to(device)

    def _used(self, p: torch.Tensor, x: int) -> tuple:
        """``(neighbour ids, how many of them moved their mass, mass added)``: the largest prefix whose
        cumulative mass stays within the bound."""
        nb = self._neighbours(x, p.device)
        if nb is None:
            return None, 0, 0.0
        c = torch.cumsum(p[nb], dim=0)
        j = int((c <= (self.lam - 1.0) * p[x]).sum())  # c is nondecreasing: the count is the prefix length
        return nb, j, (float(c[j - 1]) if j else 0.0)

    def relaxed(self, p: torch.Tensor, x: int) -> torch.Tensor:
        """``p~``: ``p`` with the moved neighbours' mass added to ``x``."""
        nb, j, extra = self._used(p, x)
        out = p.clone()
        if j:
            out[nb[:j]] = 0.0
            out[x] = p[x] + extra
        return out

    def accept_prob(self, p, q, x):
        _, _, extra = self._used(p, x)
        return min(1.0, (float(p[x]) + extra) / float(q[x]))

    def residual(self, p, q, x):
        if self.residual_mode == "moved":
            return torch.clamp(self.relaxed(p, x) - q, min=0.0)
        r = torch.clamp(p - q, min=0.0)
        nb, j, _ = self._used(p, x)
        if j:
            r[nb] = 0.0
        return r


class CSDRule(RelaxedRule):
    """CSD's entropy bonus, gated by the total variation between ``p`` and ``q`` (module docstring).

    Example:
        >>> CSDRule(tv_gate=0.1).accept_prob(torch.tensor([0.5, 0.5]), torch.tensor([0.0, 1.0]), 1)  # gate shut
        0.5
    """

    name = "csd"

    def __init__(self, weight: float = 0.5, tv_gate: float = 0.65):
        for key, v in (("weight", weight), ("tv_gate", tv_gate)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise TypeError(f"{key} must be a finite number >= 0 (got {v!r})")
        self.weight, self.tv_gate = float(weight), float(tv_gate)

    batched = True

    def accept_prob(self, p, q, x):
        tv = 0.5 * float((p - q).abs().sum())
        bonus = 0.0
        if tv < self.tv_gate:
            logp = torch.log(p.clamp_min(1e-30))
            bonus = self.weight * float(-(p * logp).sum())
        return min(1.0, float(p[x]) / float(q[x]) + bonus)

    def accept_probs(self, p, q, x):
        """:meth:`accept_prob` of every row at once, the same sums per row."""
        rows = torch.arange(len(x), device=p.device)
        tv = (p - q).abs().sum(-1).tolist()
        ent = (-(p * torch.log(p.clamp_min(1e-30))).sum(-1)).tolist()
        px, qx = p[rows, x].tolist(), q[rows, x].tolist()
        return [min(1.0, a / b + (self.weight * h if 0.5 * t < self.tv_gate else 0.0))
                for a, b, t, h in zip(px, qx, tv, ent)]


class GSDRule(RelaxedRule):
    """GSD's dynamic group: neighbours in the target's rank order with close probability (module docstring).

    Example:
        >>> p = torch.tensor([0.3, 0.25, 0.05, 0.4])
        >>> round(GSDRule(ranks=1).accept_prob(p, torch.tensor([0.0, 1.0, 0.0, 0.0]), 1), 3)  # G = {1, 0}
        0.55
    """

    name = "gsd"

    def __init__(self, ranks: int = 7, prob_gap: float = 0.15, latent_dist: float | None = None):
        if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 0:
            raise TypeError(f"ranks must be an integer >= 0 (got {ranks!r})")
        if isinstance(prob_gap, bool) or not isinstance(prob_gap, (int, float)) or not prob_gap > 0:
            raise TypeError(f"prob_gap must be a number > 0 (got {prob_gap!r})")
        if latent_dist is not None and (isinstance(latent_dist, bool) or not isinstance(latent_dist, (int, float))
                                        or not latent_dist > 0):
            raise TypeError(f"latent_dist must be a number > 0 or absent (got {latent_dist!r})")
        self.ranks, self.prob_gap, self.latent_dist = ranks, float(prob_gap), latent_dist
        self.codebook, self.offset = None, 0

    def bind_codebook(self, codebook: torch.Tensor, offset: int) -> None:
        """The VQ codebook vectors for the optional latent test; code ``i`` is token ``offset + i``."""
        self.codebook, self.offset = codebook.float(), int(offset)

    def group(self, p: torch.Tensor, x: int) -> torch.Tensor:
        """Token ids of ``x``'s group (``x`` included)."""
        order = torch.sort(p, descending=True, stable=True).indices
        rank = int((order == x).nonzero()[0, 0])
        cand = order[max(0, rank - self.ranks): rank + self.ranks + 1]
        keep = (p[cand] - p[x]).abs() < self.prob_gap
        if self.latent_dist is not None:
            if self.codebook is None:
                from mmspec.errors import InvalidInputError

                raise InvalidInputError("gsd with latent_dist needs the VQ codebook: bind_codebook(codebook, offset)")
            i = cand - self.offset
            ok = (i >= 0) & (i < self.codebook.shape[0])
            cb = self.codebook.to(p.device)
            ix = x - self.offset
            if 0 <= ix < cb.shape[0]:
                d = ((cb[i.clamp(0, cb.shape[0] - 1)] - cb[ix]) ** 2).sum(-1)
                keep &= ok & (d < self.latent_dist)
            else:
                keep &= cand == x
        keep |= cand == x
        return cand[keep]

    def accept_prob(self, p, q, x):
        g = self.group(p, x)
        return min(1.0, float(p[g].sum()) / float(q[g].sum()))


for _cls in (LanternRule, CSDRule, GSDRule):
    register_rule(_cls.name, _cls)
