"""DraftTree and pack_trees against naive reference implementations written here.

The references build trees as dicts of children / lists of prefixes, with no shared code with
``mmspec.tree``; random inputs are drawn from fixed seeds so every run checks the same cases.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from mmspec.target import pack_trees
from mmspec.tree import DraftTree


# ---------------------------------------------------------------------------------------------- references
def random_tree(rng: np.random.Generator, n: int, vocab: int = 20) -> DraftTree:
    """A random valid parents-first tree (any parent index < i, or the root)."""
    parents = [int(rng.integers(-1, i)) for i in range(n)]  # integers(-1, 0) == -1 for the first node
    tokens = rng.integers(0, vocab, n)
    return DraftTree(tokens, parents)


def ref_depth(parents) -> list[int]:
    out = []
    for i in range(len(parents)):
        d, p = 1, parents[i]
        while p != -1:
            d, p = d + 1, parents[p]
        out.append(d)
    return out


def ref_ancestors(parents, i) -> set[int]:
    """Node i and all its ancestors (root excluded)."""
    s = {i}
    p = parents[i]
    while p != -1:
        s.add(p)
        p = parents[p]
    return s


def ref_children(parents) -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {p: [] for p in range(-1, len(parents))}
    for i, p in enumerate(parents):
        kids[p].append(i)
    return kids


def ref_paths(parents) -> list[list[int]]:
    kids = ref_children(parents)
    leaves = [i for i in range(len(parents)) if not kids[i]]
    return [sorted(ref_ancestors(parents, leaf), key=lambda j: ref_depth(parents)[j]) for leaf in leaves]


def ref_trie(sequences, budget=None):
    """Prefixes in breadth-first order (depth-major, then sequence order), first ``budget`` of them."""
    seqs = [tuple(s) for s in sequences if len(s)]
    order: list[tuple] = []
    seen = set()
    for d in range(1, max((len(s) for s in seqs), default=0) + 1):
        for s in seqs:
            if len(s) >= d and s[:d] not in seen:
                seen.add(s[:d])
                order.append(s[:d])
    if budget is not None:
        order = order[:budget]
    index = {pre: i for i, pre in enumerate(order)}
    tokens = [pre[-1] for pre in order]
    parents = [index[pre[:-1]] if len(pre) > 1 else -1 for pre in order]
    return tokens, parents


def tree_prefixes(tree: DraftTree) -> list[tuple]:
    """Token prefix (root to node) of every node."""
    return [tuple(int(tree.tokens[j]) for j in tree.path_to(i)) for i in range(len(tree))]


# ---------------------------------------------------------------------------------------------- construction
def test_from_chain():
    t = DraftTree.from_chain([5, 7, 9])
    assert t.tokens.tolist() == [5, 7, 9]
    assert t.parents.tolist() == [-1, 0, 1]
    assert t.depth.tolist() == [1, 2, 3]
    assert t.max_depth == 3
    assert t.paths() == [[0, 1, 2]]
    assert t.token_paths() == [[5, 7, 9]]
    assert t.draft_probs is None
    assert t.tokens.dtype == np.int64 and t.parents.dtype == np.int64
    q = torch.rand(3, 11)
    assert DraftTree.from_chain([1, 2, 3], draft_probs=q).draft_probs is q


def test_empty_tree():
    for t in (DraftTree.empty(), DraftTree.from_chain([]), DraftTree.from_sequences([]),
              DraftTree.from_sequences([[], []])):
        assert len(t) == 0
        assert t.max_depth == 0
        assert t.depth.tolist() == []
        assert t.paths() == [] and t.token_paths() == []
        assert t.children() == [[]]
        assert t.ancestor_mask().shape == (0, 0)
        assert len(t.prune(0)) == 0


def test_from_sequences_doc_examples():
    t = DraftTree.from_sequences([[1, 2, 3], [1, 4]])
    assert t.tokens.tolist() == [1, 2, 4, 3] and t.parents.tolist() == [-1, 0, 0, 1]
    assert DraftTree.from_sequences([[1, 2], [1, 3], [4]], budget=3).tokens.tolist() == [1, 4, 2]


def test_from_sequences_merges_shared_prefixes_and_duplicates():
    seqs = [[1, 2, 3], [1, 2, 4], [1, 2, 3], [5], [1, 6, 3]]
    t = DraftTree.from_sequences(seqs)
    tokens, parents = ref_trie(seqs)
    assert t.tokens.tolist() == tokens and t.parents.tolist() == parents
    # one node per distinct prefix, and every candidate is a root-to-node path
    assert len(t) == len({tuple(s[:d]) for s in seqs for d in range(1, len(s) + 1)})
    assert sorted(set(tree_prefixes(t))) == sorted(tree_prefixes(t))  # no duplicate prefixes
    assert sorted(map(tuple, t.token_paths())) == sorted({(1, 2, 3), (1, 2, 4), (5,), (1, 6, 3)})


@pytest.mark.parametrize("seed", range(40))
def test_from_sequences_random_against_reference(seed):
    rng = np.random.default_rng(seed)
    vocab = int(rng.integers(2, 5))  # small vocab: many shared prefixes
    seqs = [list(rng.integers(0, vocab, int(rng.integers(0, 6)))) for _ in range(int(rng.integers(1, 7)))]
    full_tokens, full_parents = ref_trie(seqs)
    t = DraftTree.from_sequences(seqs)
    assert t.tokens.tolist() == full_tokens and t.parents.tolist() == full_parents
    for budget in range(0, len(full_tokens) + 2):
        tb = DraftTree.from_sequences(seqs, budget=budget)
        tokens, parents = ref_trie(seqs, budget)
        assert tb.tokens.tolist() == tokens and tb.parents.tolist() == parents, budget
        assert len(tb) == min(budget, len(full_tokens))
        # prefix-closed: every kept node's parent is kept (and precedes it)
        assert all(p < i for i, p in enumerate(tb.parents.tolist()))


def test_from_sequences_budget_prefers_earlier_candidates():
    # budget 4 keeps the depth-1 nodes of all candidates, then depth 2 in candidate order
    seqs = [[7, 8, 9], [3, 4], [5, 6]]
    t = DraftTree.from_sequences(seqs, budget=4)
    assert tree_prefixes(t) == [(7,), (3,), (5,), (7, 8)]
    t = DraftTree.from_sequences(seqs, budget=5)
    assert tree_prefixes(t) == [(7,), (3,), (5,), (7, 8), (3, 4)]
    # a candidate sharing an existing node costs nothing at that depth
    t = DraftTree.from_sequences([[1, 2], [1, 3]], budget=2)
    assert tree_prefixes(t) == [(1,), (1, 2)]


# ---------------------------------------------------------------------------------------------- best_first
def brute_force_best(top_ids, top_lp, budget, branch_k=None):
    """All rank sequences up to depth D, the `budget` best by summed log-prob, as token prefixes."""
    depth_max, k = top_ids.shape
    if branch_k is not None:
        k = min(k, branch_k)
    nodes = []
    for d in range(1, depth_max + 1):
        for ranks in itertools.product(range(k), repeat=d):
            score = sum(top_lp[j, r] for j, r in enumerate(ranks))
            nodes.append((score, tuple(int(top_ids[j, r]) for j, r in enumerate(ranks))))
    nodes.sort(key=lambda x: -x[0])
    kept = nodes[: max(budget, 0)]
    if budget < len(nodes) and budget > 0:
        assert kept[-1][0] > nodes[budget][0], "test input has a tie at the cut"
    return {pre for _, pre in kept}


def random_marginals(rng, depth, k, vocab=50):
    ids = np.stack([rng.choice(vocab, size=k, replace=False) for _ in range(depth)])
    probs = rng.dirichlet(np.full(vocab, 0.3), size=depth)
    top = np.sort(probs, axis=1)[:, ::-1][:, :k]  # rank order: decreasing probability
    return ids, np.log(top + 1e-12)


def test_best_first_doc_example():
    ids = np.array([[5, 6], [7, 8]])
    lp = np.log(np.array([[0.9, 0.1], [0.6, 0.4]]))
    t = DraftTree.best_first(ids, lp, budget=3)
    assert t.tokens.tolist() == [5, 7, 8] and t.parents.tolist() == [-1, 0, 0]


@pytest.mark.parametrize("seed", range(60))
def test_best_first_matches_brute_force(seed):
    rng = np.random.default_rng(1000 + seed)
    depth, k = int(rng.integers(1, 5)), int(rng.integers(1, 5))
    ids, lp = random_marginals(rng, depth, k)
    total = sum(k ** d for d in range(1, depth + 1))
    for budget in sorted({0, 1, 2, 3, 5, 8, 13, total - 1, total, total + 3}):
        for branch_k in (None, 2):
            t = DraftTree.best_first(ids, lp, budget=budget, branch_k=branch_k)
            want = brute_force_best(ids, lp, budget, branch_k)
            got = tree_prefixes(t)
            assert len(got) == len(set(got)), "duplicate node"
            assert set(got) == want, (budget, branch_k)
            # prefix-closed and parents-first
            assert all(p < i for i, p in enumerate(t.parents.tolist()))
            assert t.max_depth <= depth


def test_best_first_is_not_just_a_chain_or_top_level():
    # depth-2 child of the top token beats the second root candidate
    ids = np.array([[1, 2, 3], [4, 5, 6]])
    lp = np.log(np.array([[0.95, 0.03, 0.02], [0.9, 0.05, 0.05]]))
    t = DraftTree.best_first(ids, lp, budget=2)
    assert tree_prefixes(t) == [(1,), (1, 4)]
    t = DraftTree.best_first(ids, lp, budget=0)
    assert len(t) == 0
    assert len(DraftTree.best_first(np.zeros((0, 3), np.int64), np.zeros((0, 3)), budget=4)) == 0


# ---------------------------------------------------------------------------------------------- structure
@pytest.mark.parametrize("seed", range(30))
def test_structure_against_reference(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 16))
    t = random_tree(rng, n)
    parents = t.parents.tolist()
    assert len(t) == n
    assert t.depth.tolist() == ref_depth(parents)
    assert t.max_depth == max(ref_depth(parents))
    kids = ref_children(parents)
    assert t.children() == [kids[p] for p in range(-1, n)]
    mask = t.ancestor_mask()
    assert mask.dtype == bool and mask.shape == (n, n)
    for i in range(n):
        assert set(np.nonzero(mask[i])[0].tolist()) == ref_ancestors(parents, i)
        assert t.path_to(i) == sorted(ref_ancestors(parents, i), key=lambda j: ref_depth(parents)[j])
    assert t.paths() == ref_paths(parents)
    assert t.token_paths() == [[int(t.tokens[j]) for j in p] for p in ref_paths(parents)]
    # every node lies on some path; paths end at leaves
    assert set(itertools.chain.from_iterable(t.paths())) == set(range(n))


@pytest.mark.parametrize("seed", range(30))
def test_prune_against_reference(seed):
    rng = np.random.default_rng(100 + seed)
    n = int(rng.integers(1, 16))
    base = random_tree(rng, n)
    q = torch.rand(n, 7)
    t = DraftTree(base.tokens, base.parents, q)
    for max_depth in range(0, t.max_depth + 2):
        p = t.prune(max_depth)
        keep = [i for i in range(n) if ref_depth(t.parents.tolist())[i] <= max_depth]
        assert len(p) == len(keep)
        assert p.tokens.tolist() == [int(t.tokens[i]) for i in keep]
        # the kept nodes have the same token prefixes (structure kept, indices remapped)
        assert tree_prefixes(p) == [tree_prefixes(t)[i] for i in keep]
        assert all(pp < i for i, pp in enumerate(p.parents.tolist()))
        assert p.max_depth == min(max_depth, t.max_depth)
        if keep:
            assert torch.equal(p.draft_probs, q[keep])
        if max_depth >= t.max_depth:
            assert p is t


def test_prune_without_probs():
    t = DraftTree.from_sequences([[1, 2, 3], [4, 5], [6]])
    p = t.prune(1)
    assert p.tokens.tolist() == [1, 4, 6] and p.parents.tolist() == [-1, -1, -1] and p.draft_probs is None
    p = t.prune(2)
    assert sorted(map(tuple, p.token_paths())) == [(1, 2), (4, 5), (6,)]


@pytest.mark.parametrize(
    "tokens, parents",
    [
        ([1, 2], [-1, 1]),     # self-parent
        ([1, 2], [-1, 2]),     # forward reference
        ([1, 2, 3], [0, -1, 1]),  # first node cannot have a parent
        ([1, 2], [-1, -2]),    # below -1
        ([1, 2, 3], [-1, 0]),  # length mismatch
    ],
)
def test_invalid_trees_raise(tokens, parents):
    with pytest.raises(ValueError):
        DraftTree(tokens, parents)


def test_draft_probs_rows_must_match():
    with pytest.raises(ValueError):
        DraftTree([1, 2], [-1, 0], torch.rand(3, 5))
    with pytest.raises(ValueError):
        DraftTree.from_chain([1, 2], draft_probs=torch.rand(1, 5))


# ---------------------------------------------------------------------------------------------- pack_trees
def test_pack_trees_doc_example():
    toks, offs, mask, n = pack_trees([DraftTree.from_chain([4, 5]), DraftTree.from_chain([6])])
    assert toks.tolist() == [[4, 5], [6, 0]]
    assert offs.tolist() == [[0, 1, 2], [0, 1, 1]]
    assert n.tolist() == [2, 1]


@pytest.mark.parametrize("seed", range(10))
def test_pack_trees_layout(seed):
    rng = np.random.default_rng(500 + seed)
    trees = [random_tree(rng, int(rng.integers(0, 9))) if rng.random() > 0.2 else DraftTree.empty()
             for _ in range(int(rng.integers(1, 6)))]
    toks, offs, mask, counts = pack_trees(trees)
    b = len(trees)
    width = max(len(t) for t in trees)
    assert toks.shape == (b, width) and offs.shape == (b, 1 + width) and mask.shape == (b, 1 + width, 1 + width)
    assert mask.dtype == torch.bool and toks.dtype == torch.int64 and offs.dtype == torch.int64
    assert counts.tolist() == [len(t) for t in trees]
    for r, t in enumerate(trees):
        k = len(t)
        parents = t.parents.tolist()
        assert toks[r, :k].tolist() == t.tokens.tolist()
        assert offs[r, 0] == 0
        assert offs[r, 1:1 + k].tolist() == ref_depth(parents)
        assert (offs[r, 1 + k:] == 1).all()  # padding sits at depth 1
        # root row: sees only the root
        assert mask[r, 0].tolist() == [True] + [False] * width
        for i in range(width):
            row = mask[r, 1 + i]
            want = {0} | ({1 + j for j in ref_ancestors(parents, i)} if i < k else {1 + i})
            assert set(torch.nonzero(row).flatten().tolist()) == want, (r, i)


def test_pack_trees_all_empty():
    toks, offs, mask, counts = pack_trees([DraftTree.empty(), DraftTree.empty()])
    assert toks.shape == (2, 0) and offs.tolist() == [[0], [0]] and counts.tolist() == [0, 0]
    assert mask.tolist() == [[[True]], [[True]]]
