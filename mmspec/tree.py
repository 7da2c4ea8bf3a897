"""Draft trees: what a drafter proposes and the verifier scores in one target pass.

A :class:`DraftTree` is stored flat, parents first: ``tokens[i]`` is the token of node ``i`` and
``parents[i]`` the index of its parent, or ``-1`` when the node hangs off the root. The root itself is
not a node: it is the last committed token of the row (the "pending" token, whose logits give the
target's distribution for depth-1 nodes). A chain is a tree of width one.

The structure is host-pure (plain Python lists and numpy); only the optional ``draft_probs`` (the
distribution each node's token was *sampled* from, shape ``[n, V]``) is a torch tensor. A node without
``draft_probs`` is a deterministic draft; the sampling rule treats it as a one-hot proposal, which keeps
speculative sampling lossless for lookup and top-k trees.

Example:
    >>> t = DraftTree.from_chain([5, 7, 9])
    >>> t.depth.tolist(), t.paths()
    ([1, 2, 3], [[0, 1, 2]])
    >>> t = DraftTree.from_sequences([[1, 2, 3], [1, 4]])
    >>> t.tokens.tolist(), t.parents.tolist()
    ([1, 2, 4, 3], [-1, 0, 0, 1])
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

__all__ = ["DraftTree"]


@dataclass
class DraftTree:
    """A prefix tree of drafted tokens, packed parents-first.

    Attributes:
        tokens: ``int64[n]`` token id of each node.
        parents: ``int64[n]`` parent node index, ``-1`` for children of the root; ``parents[i] < i``.
        draft_probs: optional ``torch.Tensor[n, V]``: the distribution node ``i``'s token was sampled
            from, conditional on everything drawn before it (siblings drawn i.i.d. share their parent's
            ``q``; siblings drawn without replacement must carry the renormalised ``q`` they were drawn
            from, not the marginal). ``None`` means every node is a deterministic proposal.
    """

    tokens: np.ndarray
    parents: np.ndarray
    draft_probs: object = None
    _children: list | None = field(default=None, repr=False, compare=False)
    _depth: np.ndarray | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.tokens = np.asarray(self.tokens, dtype=np.int64).reshape(-1)
        self.parents = np.asarray(self.parents, dtype=np.int64).reshape(-1)
        if self.tokens.shape != self.parents.shape:
            raise ValueError("tokens and parents must have the same length")
        idx = np.arange(len(self.parents))
        if np.any(self.parents >= idx) or np.any(self.parents < -1):
            raise ValueError("parents must point to earlier nodes (or -1 for the root)")
        if self.draft_probs is not None and self.draft_probs.shape[0] != len(self.tokens):
            raise ValueError("draft_probs must have one row per node")

    # ------------------------------------------------------------------ constructors
    @classmethod
    def empty(cls) -> "DraftTree":
        """A tree with no nodes: the round degenerates to one plain decoding step."""
        return cls(np.zeros(0, np.int64), np.zeros(0, np.int64))

    @classmethod
    def from_chain(cls, tokens: Sequence[int], draft_probs=None) -> "DraftTree":
        """A width-1 tree: node ``i`` is the child of node ``i - 1``.

        Example:
            >>> DraftTree.from_chain([3, 4]).parents.tolist()
            [-1, 0]
        """
        n = len(tokens)
        return cls(np.asarray(list(tokens), np.int64), np.arange(n, dtype=np.int64) - 1, draft_probs)

    @classmethod
    def from_sequences(cls, sequences: Iterable[Sequence[int]], budget: int | None = None) -> "DraftTree":
        """Merge candidate continuations into one prefix tree (a trie), shared prefixes once.

        Nodes are added breadth-first in the order sequences are given, so earlier (better) candidates
        win when ``budget`` (the maximum node count) cuts the tree.

        Example:
            >>> DraftTree.from_sequences([[1, 2], [1, 3], [4]], budget=3).tokens.tolist()
            [1, 4, 2]
        """
        seqs = [list(s) for s in sequences if len(s) > 0]
        tokens: list[int] = []
        parents: list[int] = []
        index: dict[tuple[int, int], int] = {}  # (parent, token) -> node
        cursors = [-1] * len(seqs)
        depth = 0
        limit = budget if budget is not None else float("inf")
        while len(tokens) < limit:
            progressed = False
            for s, seq in enumerate(seqs):
                if depth >= len(seq) or cursors[s] is None:
                    continue
                key = (cursors[s], seq[depth])
                node = index.get(key)
                if node is None:
                    if len(tokens) >= limit:
                        cursors[s] = None
                        continue
                    node = len(tokens)
                    index[key] = node
                    tokens.append(seq[depth])
                    parents.append(cursors[s])
                cursors[s] = node
                progressed = True
            if not progressed:
                break
            depth += 1
        return cls(np.asarray(tokens, np.int64), np.asarray(parents, np.int64))

    @classmethod
    def best_first(cls, top_ids, top_logprobs, budget: int, branch_k: int | None = None) -> "DraftTree":
        """Best-first tree from per-position top-k marginals (the DDTree/GLANCE construction).

        ``top_ids[d, r]`` and ``top_logprobs[d, r]`` are the rank-``r`` candidate at depth ``d + 1``,
        sorted by decreasing log-probability. A path's score is the sum of its nodes' log-probabilities
        (a product of marginals); the ``budget`` best prefix-closed nodes are kept. Expanding a node
        pushes its next sibling and its first child, so the heap never holds more than ``2 * budget``
        entries. Ties break by insertion order, so the tree is deterministic.

        Example:
            >>> import numpy as np
            >>> ids = np.array([[5, 6], [7, 8]])
            >>> lp = np.log(np.array([[0.9, 0.1], [0.6, 0.4]]))
            >>> DraftTree.best_first(ids, lp, budget=3).tokens.tolist()
            [5, 7, 8]
        """
        top_ids = np.asarray(top_ids)
        top_logprobs = np.asarray(top_logprobs, dtype=np.float64)
        depth_max, k = top_ids.shape
        if branch_k is not None:
            k = min(k, branch_k)
        if budget <= 0 or depth_max == 0 or k == 0:
            return cls.empty()
        counter = itertools.count()
        # entry: (-score, tie, depth index, rank, parent node, parent score)
        heap = [(-top_logprobs[0, 0], next(counter), 0, 0, -1, 0.0)]
        tokens: list[int] = []
        parents: list[int] = []
        while heap and len(tokens) < budget:
            neg, _, d, r, parent, parent_score = heapq.heappop(heap)
            node = len(tokens)
            tokens.append(int(top_ids[d, r]))
            parents.append(parent)
            score = -neg
            if r + 1 < k:
                sib = parent_score + top_logprobs[d, r + 1]
                heapq.heappush(heap, (-sib, next(counter), d, r + 1, parent, parent_score))
            if d + 1 < depth_max:
                child = score + top_logprobs[d + 1, 0]
                heapq.heappush(heap, (-child, next(counter), d + 1, 0, node, score))
        return cls(np.asarray(tokens, np.int64), np.asarray(parents, np.int64))

    # ------------------------------------------------------------------ structure
    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def depth(self) -> np.ndarray:
        """``int64[n]``: depth of each node; children of the root have depth 1 (computed once: read-only)."""
        if self._depth is None:
            d = np.zeros(len(self), np.int64)
            for i, p in enumerate(self.parents):
                d[i] = 1 if p < 0 else d[p] + 1
            d.setflags(write=False)
            self._depth = d
        return self._depth

    @property
    def max_depth(self) -> int:
        """Depth of the deepest node (0 for an empty tree)."""
        return int(self.depth.max()) if len(self) else 0

    def children(self) -> list[list[int]]:
        """``children()[p + 1]`` lists the children of node ``p`` (``p = -1`` is the root)."""
        if self._children is None:
            kids: list[list[int]] = [[] for _ in range(len(self) + 1)]
            for i, p in enumerate(self.parents):
                kids[p + 1].append(i)
            self._children = kids
        return self._children

    def ancestor_mask(self) -> np.ndarray:
        """``bool[n, n]``: ``mask[i, j]`` is true when node ``j`` is node ``i`` or one of its ancestors."""
        n = len(self)
        m = np.zeros((n, n), dtype=bool)
        for i, p in enumerate(self.parents):
            if p >= 0:
                m[i] = m[p]
            m[i, i] = True
        return m

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root's child down to ``node`` (inclusive)."""
        path = []
        while node >= 0:
            path.append(int(node))
            node = int(self.parents[node])
        return path[::-1]

    def paths(self) -> list[list[int]]:
        """Every root-to-leaf path, as lists of node indices, in node order of the leaves."""
        has_child = np.zeros(len(self), dtype=bool)
        has_child[self.parents[self.parents >= 0]] = True
        return [self.path_to(i) for i in range(len(self)) if not has_child[i]]

    def token_paths(self) -> list[list[int]]:
        """Like :meth:`paths` but with token ids."""
        return [[int(self.tokens[i]) for i in p] for p in self.paths()]

    def prune(self, max_depth: int) -> "DraftTree":
        """The sub-tree of nodes at depth ``<= max_depth`` (parents-first order is kept).

        Example:
            >>> DraftTree.from_chain([1, 2, 3]).prune(2).tokens.tolist()
            [1, 2]
        """
        if max_depth >= self.max_depth:
            return self
        keep = np.nonzero(self.depth <= max_depth)[0]
        remap = -np.ones(len(self) + 1, np.int64)  # remap[p + 1]: new index of old node p
        remap[keep + 1] = np.arange(len(keep))
        probs = None if self.draft_probs is None else self.draft_probs[keep]
        return DraftTree(self.tokens[keep], remap[self.parents[keep] + 1], probs)
