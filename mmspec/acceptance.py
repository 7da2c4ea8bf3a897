"""Acceptance rules: which drafted tokens the target keeps, and the one token it adds.

Terms (as in vLLM's rejection sampler): for one row and one round, the verifier scores the root (the
pending token) and every node of the :class:`~mmspec.tree.DraftTree` in one pass. ``scores[0]`` are the
target's processed logits after the root and ``scores[i + 1]`` after node ``i``, already passed through
the same logits processors ``generate`` would apply (repetition penalty, temperature, top-k, top-p, ...).
A rule walks down from the root and returns the *accepted path* (node indices) and the *next token*:
the bonus token when the walk ends at a node whose children all failed or that has none, drawn from the
target (greedy: its argmax; sampling: the residual distribution).

Rules declare ``lossless``. The two here are lossless:

* :class:`GreedyRule`: accept a child iff its token is the target's argmax. Output equals greedy
  ``generate`` token for token.
* :class:`SpeculativeSamplingRule`: recursive rejection sampling over the children of each node
  (SpecInfer's multi-draft rule; for a chain it is exactly Leviathan et al. / Chen et al.). Child ``c``
  with token ``x`` drawn from ``q_c`` is accepted with probability ``min(1, p'(x) / q_c(x))``; on
  rejection the residual becomes ``p' <- norm(max(0, p' - q_c))``. A deterministic child (no
  ``draft_probs``) is a one-hot ``q``, so rejection removes its token from ``p'``: sampling without
  replacement, which is lossless for any fixed set of proposals. The committed tokens are distributed
  exactly as plain sampling from the target.

Example:
    >>> import torch
    >>> from mmspec.tree import DraftTree
    >>> tree = DraftTree.from_chain([2, 3])
    >>> scores = torch.tensor([[0., 0., 9., 0.], [0., 0., 0., 9.], [9., 0., 0., 0.]])
    >>> GreedyRule().accept(tree, scores)
    AcceptResult(path=[0, 1], next_token=0)
"""

from __future__ import annotations

import json

from dataclasses import dataclass

import numpy as np
import torch

from .tree import DraftTree

__all__ = ["AcceptResult", "AcceptanceRule", "GreedyRule", "SpeculativeSamplingRule", "SampleThenMatchRule", "get_rule",
           "register_rule", "rule_names"]


@dataclass
class AcceptResult:
    """Outcome of one row's round: accepted node indices (root to leaf) and the next token."""

    path: list
    next_token: int


class AcceptanceRule:
    """Base class. Subclasses set ``name``, ``lossless`` and ``mode`` and implement :meth:`accept`.

    ``mode`` is the decoding mode the rule is lossless for (``"greedy"`` or ``"sample"``); ``None`` means
    the rule decides for itself. Used in the other mode, a rule's output is labelled lossy.
    """

    name = "base"
    lossless = False
    mode: str | None = None

    def accept(self, tree: DraftTree, scores: torch.Tensor, generator: torch.Generator | None = None) -> AcceptResult:
        """Walk ``tree`` under the target's processed ``scores`` (``[len(tree) + 1, V]``)."""
        raise NotImplementedError  # abstract: every concrete rule overrides it

    def accept_batch(self, trees: list, scores, generator: torch.Generator | None = None) -> list:
        """One :class:`AcceptResult` per row; ``scores`` is ``[B, Q, V]`` or a list of ``[n_r + 1, V]``."""
        return [self.accept(t, scores[i][: len(t) + 1], generator) for i, t in enumerate(trees)]


# What a subclass may override to change how a row is walked: ``accept`` (the whole walk) or the sampling walk's
# per-node hooks. Overriding any of them keeps the batched shortcuts (fused launch, one-argmax walk) away.
_WALK_HOOKS = ("accept", "accept_prob", "residual")


def _own_accept(rule, cls) -> bool:
    """Whether ``rule`` walks with ``cls``'s own walk: a subclass that overrides :meth:`~AcceptanceRule.accept` (the
    documented extension point) or a hook of the sampling walk (``accept_prob``, ``residual``: how relaxed rules
    plug in) must get its own walk per row, never ``cls``'s batched shortcuts."""
    return all(getattr(type(rule), h, None) is getattr(cls, h, None) for h in _WALK_HOOKS)


def _fused(scores, trees) -> bool:
    """Whether a batch's walk runs as one fused kernel launch (:mod:`mmspec.kernels.acceptance`): ``scores`` a
    ``[B, Q, V]`` tensor on a device whose kernel backend is Triton (CUDA by default; ``MMSPEC_KERNELS``
    forces either), one query row per node. Elsewhere the plain walk below runs, the kernels' own reference."""
    if not isinstance(scores, torch.Tensor) or scores.dim() != 3 or not trees:
        return False
    from .kernels.dispatch import backend

    return backend(scores.device) == "triton" and scores.shape[1] >= 1 + max(len(t) for t in trees)


def _packed(trees, device) -> tuple:
    """``tokens[B, N], parents[B, 1 + N], n_nodes[B]`` of ``trees`` on ``device`` (the verify pass's layout)."""
    from .target import pack_trees

    packed = pack_trees(trees)
    return packed.tokens.to(device), packed.parents.to(device), packed.n_nodes.to(device)


def _results(out) -> list:
    """A fused kernel's :class:`~mmspec.kernels.acceptance.AcceptOutput` -> one :class:`AcceptResult` per row
    (one device-to-host copy for the batch)."""
    lengths, path, committed = (t.tolist() for t in (out.lengths, out.path, out.committed))
    return [AcceptResult(path[r][:k], int(committed[r][k])) for r, k in enumerate(lengths)]


def _first_rejection(acc: list, generator, device) -> int:
    """Index of the first of ``n`` chain nodes whose uniform fails its test (``u < acc[i]``), ``n`` if none does,
    drawing from ``generator`` exactly what a node-by-node walk draws: one uniform per node up to and including
    the failing one. On a CPU generator ``rand(n)`` yields the values of ``n`` scalar draws in order, so the draws
    are made at once and the generator rewound and advanced by the walk's count; elsewhere (a device generator's
    stream depends on how draws are batched) node by node."""
    n = len(acc)
    if device.type != "cpu":
        for i in range(n):
            if not float(torch.rand((), generator=generator, device=device)) < acc[i]:
                return i
        return n
    gen = torch.default_generator if generator is None else generator
    state = gen.get_state()
    u = torch.rand(n, generator=gen, device=device).tolist()
    k = next((i for i in range(n) if not u[i] < acc[i]), n)
    if k + 1 < n:  # the walk stops drawing at the first rejection
        gen.set_state(state)
        torch.rand(k + 1, generator=gen, device=device)
    return k


class GreedyRule(AcceptanceRule):
    """Exact match to the target's argmax, for chains and trees (first matching child wins)."""

    name = "greedy"
    lossless = True
    mode = "greedy"

    def accept(self, tree, scores, generator=None):
        return self._walk(tree, scores.argmax(dim=-1).tolist())

    def accept_batch(self, trees, scores, generator=None):
        if not _own_accept(self, GreedyRule):
            return super().accept_batch(trees, scores, generator)
        if _fused(scores, trees):
            from .kernels.acceptance import greedy_accept

            tokens, parents, n_nodes = _packed(trees, scores.device)
            ids = scores[:, : tokens.shape[1] + 1].argmax(dim=-1)
            return _results(greedy_accept(tokens, parents, n_nodes, ids))
        if isinstance(scores, torch.Tensor):  # one argmax and one device sync for the whole batch
            best = scores.argmax(dim=-1).tolist()
            return [self._walk(t, best[i]) for i, t in enumerate(trees)]
        return super().accept_batch(trees, scores, generator)

    @staticmethod
    def _walk(tree: DraftTree, best: list) -> AcceptResult:
        kids = tree.children()
        tokens = tree.tokens
        path: list[int] = []
        cur = -1
        while True:
            want = best[cur + 1]
            nxt = next((c for c in kids[cur + 1] if tokens[c] == want), None)
            if nxt is None:
                return AcceptResult(path, int(want))
            path.append(nxt)
            cur = nxt


class SpeculativeSamplingRule(AcceptanceRule):
    """Lossless speculative sampling: Leviathan/Chen on chains, recursive rejection on trees."""

    name = "speculative_sampling"
    lossless = True
    mode = "sample"

    def accept_batch(self, trees, scores, generator=None):
        """As :meth:`accept` per row; on a fused-kernel device (see :func:`_fused`) one launch for the batch,
        with its draws made beforehand from ``generator`` (a uniform per node, an exponential race for the
        next token): the same law, other draws than the per-row walk makes from the same seed."""
        if (not _own_accept(self, SpeculativeSamplingRule) or not _fused(scores, trees)
                or (generator is not None and generator.device != scores.device)):
            return super().accept_batch(trees, scores, generator)
        from .kernels.acceptance import draw_randomness, sampling_accept

        tokens, parents, n_nodes = _packed(trees, scores.device)
        b, n = tokens.shape
        probs = torch.softmax(scores[:, : n + 1].float(), dim=-1)
        v = probs.shape[-1]
        draft = None
        if any(t.draft_probs is not None for t in trees):  # a row without them proposes deterministically: q = 0
            draft = torch.zeros(b, n, v, device=scores.device)
            for r, t in enumerate(trees):
                if t.draft_probs is not None and len(t):
                    draft[r, : len(t)] = t.draft_probs.to(scores.device, torch.float32)
        uniforms, exponentials = draw_randomness(b, n, v, generator, scores.device)
        return _results(sampling_accept(tokens, parents, n_nodes, probs, uniforms, exponentials, draft))

    def accept_prob(self, p: torch.Tensor, q: torch.Tensor, x: int) -> float:
        """Probability of accepting draft token ``x`` proposed from ``q`` under the target's ``p`` (both ``[V]``,
        ``q[x] > 0``; a deterministic draft comes as a one-hot ``q``): ``min(1, p(x) / q(x))``, the lossless test.
        Relaxed (lossy) rules override this hook and :meth:`residual`, and keep the walk.

        Example:
            >>> round(SpeculativeSamplingRule().accept_prob(torch.tensor([0.2, 0.8]), torch.tensor([0.5, 0.5]), 0), 3)
            0.4
        """
        return min(1.0, float(p[x]) / float(q[x]))

    def residual(self, p: torch.Tensor, q: torch.Tensor, x: int) -> torch.Tensor:
        """What the target draws from after rejecting ``x`` (unnormalised): ``max(0, p - q)``.

        Example:
            >>> SpeculativeSamplingRule().residual(torch.tensor([0.25, 0.75]), torch.tensor([0.5, 0.5]), 0).tolist()
            [0.0, 0.25]
        """
        return torch.clamp(p - q, min=0.0)

    # A rule that overrides the hooks sets this when its accept_probs scores a chain's nodes in one call (the
    # lossless hooks always can); then chains take the one-pass walk (:meth:`_chain`), other trees the node walk.
    batched = False

    def accept_probs(self, p: torch.Tensor, q: torch.Tensor, x: torch.Tensor) -> list:
        """:meth:`accept_prob` of ``n`` chain nodes at once, a list of floats: ``p``, ``q`` ``[n, V]`` (node ``i``'s
        target and draft distributions; a one-hot ``q`` row for a deterministic draft), ``x`` ``[n]`` the drafted
        tokens. Here ``min(1, p(x) / q(x))``, computed as the per-node test computes it (doubles of the float32
        values); a ``batched`` relaxed rule overrides it.

        Example:
            >>> p, q = torch.tensor([[0.2, 0.8], [0.6, 0.4]]), torch.tensor([[0.5, 0.5], [0.0, 1.0]])
            >>> [round(a, 3) for a in SpeculativeSamplingRule().accept_probs(p, q, torch.tensor([0, 1]))]
            [0.4, 0.4]
        """
        rows = torch.arange(len(x), device=p.device)
        return [min(1.0, a / b) for a, b in zip(p[rows, x].tolist(), q[rows, x].tolist())]

    def accept(self, tree, scores, generator=None):
        """Walk ``tree`` (see the class); a chain, under the lossless hooks or a ``batched`` rule, in one pass
        (:meth:`_chain`: the same draws, so the same result and generator state for any seed)."""
        if generator is not None and generator.device != scores.device:
            scores = scores.to(generator.device)  # draws must come from the caller's generator
        probs = torch.softmax(scores.float(), dim=-1)
        n = len(tree)
        if n and (self.batched or _own_accept(self, SpeculativeSamplingRule)) \
                and (tree.parents == np.arange(-1, n - 1)).all():
            return self._chain(tree, probs, generator)
        return self._walk_nodes(tree, probs, generator)

    def _chain(self, tree: DraftTree, probs: torch.Tensor, generator) -> AcceptResult:
        """:meth:`_walk_nodes` on a chain in one pass: every node's acceptance probability at once (``p(x)`` in one
        gather for deterministic drafts under the lossless test, else one :meth:`accept_probs` call), the uniforms
        tested at once (:func:`_first_rejection`), then the next token from
        the rejected node's normalised residual (the target's ``p`` there if it is empty) or, past the last node,
        from ``p``. The draws are the walk's, value for value and in its order."""
        n, v = len(tree), probs.shape[-1]
        dev = probs.device
        q = tree.draft_probs
        if q is None and _own_accept(self, SpeculativeSamplingRule):
            # Deterministic drafts under the lossless test: min(1, p(x) / 1) = p(x), one gather at flat indices.
            acc = torch.take(probs, torch.from_numpy(tree.tokens + np.arange(0, n * v, v)).to(dev)).tolist()
        else:
            # The hooks read q as [n, V]: a deterministic draft, or a token its q could not have produced
            # (underflow, filtering after sampling), is a one-hot proposal.
            x = torch.as_tensor(tree.tokens, dtype=torch.long, device=dev)
            rows = torch.arange(n, device=dev)
            onehot = torch.zeros(n, v, device=dev)
            onehot[rows, x] = 1.0
            q = onehot if q is None else torch.where((q.to(dev, torch.float32)[rows, x] > 0)[:, None],
                                                     q.to(dev, torch.float32), onehot)
            acc = self.accept_probs(probs[:n], q, x)
        k = _first_rejection(acc, generator, dev)
        if k == n:
            return AcceptResult(list(range(n)), int(torch.multinomial(probs[n], 1, generator=generator).item()))
        xk = int(tree.tokens[k])
        p = probs[k].clone()
        if q is None:  # max(0, p - onehot(x)) without a vocabulary-sized q
            p[xk] = 0.0
        else:
            p = self.residual(p, q[k], xk)
        total = p.sum()
        p = probs[k].clone() if total <= 0 else p / total  # as the walk: an empty residual draws from p
        return AcceptResult(list(range(k)), int(torch.multinomial(p, 1, generator=generator).item()))

    def _walk_nodes(self, tree: DraftTree, probs: torch.Tensor, generator) -> AcceptResult:
        """The walk node by node, for any tree (``probs``: the softmax of the processed scores, on the generator's
        device): each node's children in order, a uniform per child tested, a rejection turning ``p`` into the
        normalised residual; :meth:`_chain`'s reference."""
        q_all = tree.draft_probs
        kids = tree.children()
        tokens = tree.tokens
        own = _own_accept(self, SpeculativeSamplingRule)  # the lossless hooks: one-hot drafts take an O(1) path
        path: list[int] = []
        cur = -1
        while True:
            p = probs[cur + 1].clone()
            accepted = None
            for c in kids[cur + 1]:
                x = int(tokens[c])
                u = torch.rand((), generator=generator, device=p.device)
                q = None if q_all is None else q_all[c].to(p.device, torch.float32)
                if q is None or q[x] <= 0:
                    # A deterministic draft, or a token its q could not have produced (underflow, filtering
                    # after sampling): a one-hot proposal, which is lossless for any token.
                    if own:  # min(1, p(x) / 1) and max(0, p - onehot(x)), without a vocabulary-sized q
                        if u < p[x]:
                            accepted = c
                            break
                        p[x] = 0.0
                        q = None
                    else:
                        q = torch.zeros_like(p)
                        q[x] = 1.0
                if q is not None:
                    if float(u) < self.accept_prob(p, q, x):
                        accepted = c
                        break
                    p = self.residual(p, q, x)
                total = p.sum()
                if total <= 0:
                    # Nothing left to draw from. For the lossless rule p' == q_c exactly, so rejection had
                    # probability 0 and any p' is correct; a relaxed rule's residual can also come out empty:
                    # then it draws from the target's own p.
                    p = probs[cur + 1].clone()
                else:
                    p = p / total
            if accepted is None:
                nxt = torch.multinomial(p, 1, generator=generator).item()
                return AcceptResult(path, int(nxt))
            path.append(accepted)
            cur = accepted


class SampleThenMatchRule(AcceptanceRule):
    """GLANCE's sampling rule, kept as a named baseline: at each node draw the target's token ``y ~ p`` and go
    down to the child holding ``y`` if there is one, else stop and emit ``y``.

    Lossless by construction (every emitted token is a draw from the target's processed ``p``, whatever was
    proposed), and it ignores the draft's ``q``: a child ``x`` is accepted with probability ``p(x)``, where
    the speculative-sampling rule accepts a sampled draft with ``min(1, p(x) / q(x))``; for deterministic
    proposals the two have the same law and the same acceptance.

    Example:
        >>> from mmspec.tree import DraftTree
        >>> scores = torch.tensor([[0.0, 20.0, 0.0], [20.0, 0.0, 0.0]])  # the target is sure: token 1, then 0
        >>> SampleThenMatchRule().accept(DraftTree.from_chain([1]), scores)
        AcceptResult(path=[0], next_token=0)
    """

    name = "sample_then_match"
    lossless = True
    mode = "sample"

    def accept(self, tree, scores, generator=None):
        if generator is not None and generator.device != scores.device:
            scores = scores.to(generator.device)
        probs = torch.softmax(scores.float(), dim=-1)
        kids = tree.children()
        tokens = tree.tokens
        path: list[int] = []
        cur = -1
        while True:
            y = int(torch.multinomial(probs[cur + 1], 1, generator=generator).item())
            nxt = next((c for c in kids[cur + 1] if int(tokens[c]) == y), None)
            if nxt is None:
                return AcceptResult(path, y)
            path.append(nxt)
            cur = nxt


_RULES = {"greedy": GreedyRule, "speculative_sampling": SpeculativeSamplingRule,
          "sample_then_match": SampleThenMatchRule}


def register_rule(name: str, cls) -> None:
    """Make acceptance rule class ``cls`` (an :class:`AcceptanceRule` subclass) available by ``name`` wherever a
    rule is named (``mmspec.generate(..., rule=NAME)``, ``"NAME;option=value"`` with options passed to ``cls``).
    A rule declares ``lossless``; a lossy one is labelled so in every stats record it produces.

    Example:
        >>> class Strict(GreedyRule):
        ...     name = "strict"
        >>> register_rule("strict", Strict)
        >>> get_rule("strict", do_sample=False).name
        'strict'
    """
    if not isinstance(name, str) or not name or ";" in name:
        raise ValueError(f"a rule name must be a non-empty string without ';' (got {name!r})")
    if not (isinstance(cls, type) and issubclass(cls, AcceptanceRule)):
        raise ValueError(f"rule {name!r}: {cls!r} is not an AcceptanceRule subclass")
    _RULES[name] = cls


def rule_names() -> list:
    """Registered acceptance rule names.

    Example:
        >>> "sample_then_match" in rule_names()
        True
    """
    return sorted(_RULES)


def get_rule(rule: "str | AcceptanceRule | None", do_sample: bool) -> AcceptanceRule:
    """Resolve a rule by name, ``"name;option=value"`` (values read as JSON), or pass one through; ``None``
    picks the lossless rule for the mode.

    Example:
        >>> get_rule(None, do_sample=True).name
        'speculative_sampling'
        >>> get_rule("sample_then_match", do_sample=True).lossless
        True
    """
    if isinstance(rule, AcceptanceRule):
        return rule
    if rule is None:
        rule = "speculative_sampling" if do_sample else "greedy"
    name, *pairs = [part.strip() for part in str(rule).split(";")]
    if name not in _RULES:
        raise ValueError(f"unknown acceptance rule {name!r}; known: {sorted(_RULES)}")
    options = {}
    for pair in pairs:
        if not pair:
            continue
        key, sep, value = pair.partition("=")
        if not sep:
            raise ValueError(f"rule option {pair!r} is not key=value")
        try:
            options[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            options[key.strip()] = value.strip()
    try:
        made = _RULES[name](**options)
    except TypeError as e:
        raise ValueError(f"bad options for acceptance rule {name!r}: {e}") from e
    if options:  # stats carry the rule's name: let records with other settings read apart
        made.name = ";".join([made.name] + [f"{k}={json.dumps(v)}" for k, v in sorted(options.items())])
    return made
