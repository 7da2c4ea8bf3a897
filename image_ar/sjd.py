"""Speculative Jacobi Decoding (SJD, Teng et al., ICLR 2025): the training-free, lossless drafter for image tokens.

The draft is the previous Jacobi iteration. Every verify pass scores the pending token and a window of drafts;
past the first rejected draft the target's distributions at the later window positions are still there (computed
on the old, partly wrong prefix), so a token is drawn from each and carried into the next round as its draft,
with that distribution as its ``q``. New window slots are initialised by ``init``:

* ``"random"``: a uniform random image code with a one-hot ``q`` (the official code's choice: accepted with
  probability ``p(d)``);
* ``"repeat"`` (default when the grid is known): the code one row above in the raster (vertical repeat, which
  the SJD authors found accelerates most), the left neighbour on the first row; one-hot ``q``.

Verification is the core's :class:`~mmspec.acceptance.SpeculativeSamplingRule` (``min(1, p/q)``, residual
``norm(max(0, p - q))``) on the processed scores the decode loop hands every rule (classifier-free guidance,
then the code-only mask, temperature and top-k), so the committed codes follow the target's sampling law
exactly; under greedy decoding the drafts are the previous iteration's argmaxes and the output equals greedy
AR token for token. Relaxed rules (:mod:`mmspec.image_ar.relaxed`) plug into the same loop.

Example:
    >>> d = JacobiDrafter(draft_len=4, init="random")
    >>> d.kind, d.draft_len
    ('sjd', 4)
"""

from __future__ import annotations

import torch

from mmspec.drafters.base import Drafter
from mmspec.errors import InvalidInputError
from mmspec.tree import DraftTree

__all__ = ["JacobiDrafter", "INITS"]

INITS = ("random", "repeat")


class JacobiDrafter(Drafter):
    """SJD's drafter (see the module docstring).

    Args:
        draft_len: drafts per round (the Jacobi window less the pending token); the papers use 16.
        init: how new window slots are filled: ``"random"`` or ``"repeat"``; ``None`` picks ``"repeat"`` when
            the target names its grid (``generation_config.image_grid``), else ``"random"``.
        grid: the image's row length in codes (default: the target's ``generation_config.image_grid``).
        branch: with ``k > 1``, the ``k - 1`` next most likely codes of the first carried position (under the
            previous iteration's distribution) are added as deterministic siblings of the chain's first draft: a
            static tree that turns a rejected first draft into a second chance (lossless: a rejected sibling is
            removed from the residual, sampling without replacement).

    Image codes are the token ids from ``generation_config.image_code_offset`` (0 when absent) to the end of the
    vocabulary.

    Example:
        >>> JacobiDrafter(draft_len=8, init="repeat", grid=16).init
        'repeat'
    """

    kind = "sjd"

    def __init__(self, draft_len: int = 16, init: str | None = None, grid: int | None = None, branch: int = 1):
        if isinstance(draft_len, bool) or not isinstance(draft_len, int) or draft_len < 1:
            raise InvalidInputError(f"sjd draft_len must be a positive integer (got {draft_len!r})")
        if isinstance(branch, bool) or not isinstance(branch, int) or branch < 1:
            raise InvalidInputError(f"sjd branch must be a positive integer (got {branch!r})")
        if init is not None and init not in INITS:
            raise InvalidInputError(f"sjd init must be one of {INITS} (got {init!r})")
        if grid is not None and (isinstance(grid, bool) or not isinstance(grid, int) or grid < 1):
            raise InvalidInputError(f"sjd grid must be a positive integer (got {grid!r})")
        self.draft_len, self.init, self.grid, self.branch = draft_len, init, grid, branch
        self.offset, self.vocab = 0, None
        self._carry: dict = {}
        self._first_alts: dict = {}
        self._alts: dict = {}
        self._counts = {"carried": 0, "initialised": 0, "siblings": 0}

    def bind(self, model) -> None:
        gc = getattr(model, "generation_config", None)
        self.offset = int(getattr(gc, "image_code_offset", 0) or 0)
        self.vocab = int(model.config.get_text_config(decoder=True).vocab_size)  # the logits the target scores
        if self.grid is None:
            self.grid = getattr(gc, "image_grid", None)
        if self.init is None:
            self.init = "repeat" if self.grid else "random"
        if self.init == "repeat" and not self.grid:
            raise InvalidInputError("sjd init='repeat' needs the image grid: pass grid=ROW_LENGTH")

    def config_dict(self) -> dict:
        return {"kind": self.kind, "draft_len": self.draft_len, "init": self.init, "grid": self.grid,
                "branch": self.branch}

    def begin(self, ctx) -> None:
        # Per original row: the carried drafts (token, q or None) for the positions after the pending token.
        self._carry = {r: [] for r in ctx.rows}
        self._first_alts, self._alts = {}, {}
        self._counts = {"carried": 0, "initialised": 0, "siblings": 0}

    def counters(self) -> dict:
        return dict(self._counts)

    def _fresh(self, history: list, n: int, generator) -> list:
        """``n`` new slot tokens after ``history`` (the row's generated codes then its drafts so far)."""
        out = []
        for _ in range(n):
            if self.init == "random":
                tok = self.offset + int(torch.randint(self.vocab - self.offset, (), generator=generator))
            else:
                j = len(history)
                src = j - self.grid if j >= self.grid else j - 1
                tok = int(history[src]) if src >= 0 else self.offset
            history.append(tok)
            out.append(tok)
        return out

    def propose(self, ctx) -> list:
        trees = []
        gen = ctx.generator if ctx.do_sample else None  # greedy: any draft is exact; keep the run's RNG untouched
        self._alts = {}
        for i, r in enumerate(ctx.rows):
            carry = self._carry.get(r, [])
            want = min(self.draft_len, ctx.remaining[i] - 1)
            if want <= 0:
                trees.append(DraftTree.empty())
                continue
            carry = carry[:want]
            history = [int(t) for t in ctx.sequences[i][ctx.prompt_lengths[i]:]] + [t for t, _ in carry]
            fresh = self._fresh(history, want - len(carry), gen)
            self._counts["carried"] += len(carry)
            self._counts["initialised"] += len(fresh)
            tokens = [t for t, _ in carry] + fresh
            # branch > 1: the next most likely tokens of the first carried position, as deterministic siblings of
            # the chain's first node (a static tree: chosen by rank, whatever their probability).
            alts = self._first_alts.get(r, [])[: self.branch - 1] if carry else []
            self._alts[r] = len(alts)
            self._counts["siblings"] += len(alts)
            parents = list(range(-1, len(tokens) - 1)) + [-1] * len(alts)
            probs = None
            if ctx.do_sample:
                # One-hot q for initialised slots and siblings: deterministic proposals (accepted with
                # probability p(d), or p'(d) after the siblings before them were rejected).
                rows = [q if q is not None else _one_hot(t, self.vocab) for t, q in carry]
                rows += [_one_hot(t, self.vocab) for t in fresh + alts]
                probs = torch.stack(rows)
            trees.append(DraftTree(tokens + alts, parents, probs))
        return trees

    def observe(self, ctx, result) -> None:
        scores = result.scores
        carry, first_alts = {}, {}
        for i, r in enumerate(ctx.rows):
            if result.finished[i]:
                continue
            tree = result.trees[i]
            n = len(tree) - self._alts.get(r, 0) if len(tree) else 0  # the chain's nodes (siblings come last)
            a = len(result.paths[i])
            if a >= n or scores is None:  # the whole window was accepted: nothing left to carry
                carry[r] = []
                continue
            # scores[k] is the target's distribution at the depth of chain node k (after node k - 1, whichever
            # node of that depth was kept); the depths past the accepted path and the bonus token (a + 1 .. n)
            # become the next iteration's drafts.
            s = scores[i][a + 1 : n + 1].float()
            if ctx.do_sample:
                gen = ctx.generator
                q = torch.softmax(s, dim=-1)
                dev = gen.device if gen is not None else q.device
                toks = torch.multinomial(q.to(dev), 1, generator=gen).squeeze(-1).tolist()
                carry[r] = [(int(t), q[j].cpu()) for j, t in enumerate(toks)]
            else:
                carry[r] = [(int(t), None) for t in s.argmax(dim=-1).tolist()]
            if self.branch > 1:
                top = s[0].topk(min(self.branch, s.shape[-1])).indices.tolist()
                first_alts[r] = [t for t in top if t != carry[r][0][0] and s[0, t] > float("-inf")]
        self._carry, self._first_alts = carry, first_alts


def _one_hot(token: int, vocab: int) -> torch.Tensor:
    q = torch.zeros(vocab)
    q[token] = 1.0
    return q


def _sjd_factory(target_model, path=None, **options):
    if path:
        raise InvalidInputError(f"sjd is training-free and takes no path (got 'sjd:{path}')")
    try:
        return JacobiDrafter(**options)
    except TypeError as e:
        raise InvalidInputError(f"bad sjd options {sorted(options)}: {e}") from e
