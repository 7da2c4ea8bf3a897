"""Acceptance rules: GreedyRule exactly, SpeculativeSamplingRule statistically against EXACT targets.

Statistical design (SpeculativeSamplingRule)
--------------------------------------------
A tiny "target model" is a table of next-token distributions ``p(. | history)`` over ``V = 5`` tokens
(some rows with zeros, as after top-k). One *round* is simulated exactly as the decode loop does it:
the drafter's tree is built (stochastic nodes are really *sampled* from their ``q``), the rule is given
``scores[0] = log p(.|root)`` and ``scores[i + 1] = log p(.|path to node i)``, and its committed tokens
(accepted path + bonus) are completed to ``L`` tokens by plain sampling from the same table (what the
next rounds would do). The exact law of those ``L`` tokens is ``prod_j p(x_j | x_<j)``; a lossless rule
reproduces it whatever the tree.

Each case draws ``N = 20_000`` rounds from fixed seeds (deterministic) and applies two Pearson
chi-square tests (cells with expected count < 5 pooled): the first committed token and the joint of
the ``L`` tokens, each at ``ALPHA / 2`` (Bonferroni, family rate ``ALPHA = 1e-3`` per case). Outcomes of
probability zero must never occur. Where the depth-1 acceptance probability is known in closed form
(it is for every case here) a two-sided binomial test at ``ALPHA`` checks it too, so a rule that never
accepts (lossless but useless) fails. Negative controls run deliberately lossy rules through the same
harness and require p < 1e-6: the tests have power against the classic mistakes.
"""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest
import torch
from scipy import stats

from mmspec.acceptance import AcceptResult, GreedyRule, SpeculativeSamplingRule, get_rule
from mmspec.tree import DraftTree

from _chisq import chisq_pvalue

ALPHA = 1e-3
N = 20_000
V = 5


# ================================================================================== GreedyRule (exact)
def onehot_scores(argmaxes, vocab=10):
    s = torch.randn(len(argmaxes), vocab) * 0.1
    for i, a in enumerate(argmaxes):
        s[i, a] = 5.0
    return s


def test_greedy_chain_all_accepted_bonus_from_last_node():
    tree = DraftTree.from_chain([2, 3, 4])
    # rows: root, after node0, after node1, after node2
    res = GreedyRule().accept(tree, onehot_scores([2, 3, 4, 7]))
    assert res == AcceptResult(path=[0, 1, 2], next_token=7)


def test_greedy_chain_rejection_midway():
    tree = DraftTree.from_chain([2, 3, 4])
    res = GreedyRule().accept(tree, onehot_scores([2, 9, 4, 7]))
    assert res.path == [0] and res.next_token == 9
    res = GreedyRule().accept(tree, onehot_scores([1, 3, 4, 7]))
    assert res.path == [] and res.next_token == 1


def test_greedy_empty_tree():
    res = GreedyRule().accept(DraftTree.empty(), onehot_scores([6]))
    assert res.path == [] and res.next_token == 6


def test_greedy_tree_first_matching_child_wins():
    # root children: 5 (idx0), 3 (idx1), 3 (idx2, duplicate); idx2 has a deeper matching subtree
    tree = DraftTree([5, 3, 3, 8, 8], [-1, -1, -1, 2, 1])
    # rows: root, n0, n1, n2, n3, n4 ; node4 (child of n1) is token 8 and target after n1 wants 8
    scores = onehot_scores([3, 0, 8, 8, 1, 4])
    res = GreedyRule().accept(tree, scores)
    assert res.path == [1, 4] and res.next_token == 4  # n1 (first 3) then its child n4, bonus after n4


def test_greedy_tree_picks_matching_branch_not_first():
    tree = DraftTree.from_sequences([[1, 2], [3, 4], [3, 5]])  # tokens [1, 3, 2, 4, 5]
    assert tree.tokens.tolist() == [1, 3, 2, 4, 5]
    # target: root->3, after (3)->5, after (3,5)->0
    scores = onehot_scores([3, 9, 5, 9, 9, 0])
    res = GreedyRule().accept(tree, scores)
    assert res.path == [1, 4] and res.next_token == 0


def ref_greedy(tree: DraftTree, scores: torch.Tensor):
    kids = {p: [i for i in range(len(tree)) if tree.parents[i] == p] for p in range(-1, len(tree))}
    cur, path = -1, []
    while True:
        want = int(torch.argmax(scores[cur + 1]))
        match = [c for c in kids[cur] if int(tree.tokens[c]) == want]
        if not match:
            return path, want
        cur = min(match)
        path.append(cur)


@pytest.mark.parametrize("seed", range(50))
def test_greedy_random_trees_against_reference(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 12))
    vocab = 3  # tiny vocab: matches are frequent
    tree = DraftTree(rng.integers(0, vocab, n), [int(rng.integers(-1, i)) for i in range(n)])
    scores = torch.from_numpy(rng.normal(size=(n + 1, vocab))).float()
    res = GreedyRule().accept(tree, scores)
    assert (res.path, res.next_token) == ref_greedy(tree, scores)
    assert isinstance(res.next_token, int)


def test_get_rule():
    assert isinstance(get_rule(None, do_sample=False), GreedyRule)
    assert isinstance(get_rule(None, do_sample=True), SpeculativeSamplingRule)
    assert isinstance(get_rule("greedy", do_sample=True), GreedyRule)
    r = SpeculativeSamplingRule()
    assert get_rule(r, do_sample=False) is r
    with pytest.raises(ValueError):
        get_rule("nope", do_sample=True)
    assert GreedyRule.lossless and SpeculativeSamplingRule.lossless


# ================================================================================== statistical harness
class TableModel:
    """Next-token distributions ``p(.|history)`` over ``V`` tokens, drawn lazily from a seed.

    ``zero_frac`` of the rows have some tokens removed (probability exactly 0), like top-k/top-p.
    """

    def __init__(self, seed, vocab=V, concentration=0.7, zero_frac=0.3):
        self.rng = np.random.default_rng(seed)
        self.vocab, self.conc, self.zero_frac = vocab, concentration, zero_frac
        self.table: dict[tuple, np.ndarray] = {}

    def __call__(self, hist) -> np.ndarray:
        hist = tuple(int(h) for h in hist)
        if hist not in self.table:
            p = self.rng.dirichlet(np.full(self.vocab, self.conc))
            if self.rng.random() < self.zero_frac:
                p[self.rng.choice(self.vocab, size=2, replace=False)] = 0.0
            self.table[hist] = p / p.sum()
        return self.table[hist]

    def exact(self, length) -> dict[tuple, float]:
        out = {}
        for seq in itertools.product(range(self.vocab), repeat=length):
            pr = 1.0
            for j in range(length):
                pr *= self(seq[:j])[seq[j]]
                if pr == 0:
                    break
            out[seq] = pr
        return out


def tree_scores(tree: DraftTree, model: TableModel) -> torch.Tensor:
    rows = [model(())]
    for i in range(len(tree)):
        rows.append(model(tree.tokens[tree.path_to(i)]))
    with np.errstate(divide="ignore"):
        return torch.from_numpy(np.log(np.stack(rows))).float()


def simulate(rule, make_tree, model: TableModel, length: int, n: int = N, seed: int = 0):
    """Run ``n`` rounds; return (counts of the first ``length`` tokens, number of rounds accepting >= 1 node)."""
    g = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed + 1)
    draft_rng = np.random.default_rng(seed + 2)
    counts: Counter = Counter()
    accepted_any = 0
    score_cache: dict = {}
    cum_cache: dict = {}
    for _ in range(n):
        tree = make_tree(draft_rng)
        key = (tree.tokens.tobytes(), tree.parents.tobytes())
        scores = score_cache.get(key)
        if scores is None:
            scores = score_cache[key] = tree_scores(tree, model)
        res = rule.accept(tree, scores, g)
        # the path must be a root-to-node chain of the tree
        prev = -1
        for node in res.path:
            assert int(tree.parents[node]) == prev
            prev = node
        accepted_any += bool(res.path)
        out = [int(tree.tokens[i]) for i in res.path] + [int(res.next_token)]
        out = out[:length]
        while len(out) < length:  # later rounds: plain sampling from the target
            h = tuple(out)
            cum = cum_cache.get(h)
            if cum is None:
                cum = cum_cache[h] = np.cumsum(model(h))
            out.append(min(int(np.searchsorted(cum, rng.random() * cum[-1], side="right")), model.vocab - 1))
        counts[tuple(out)] += 1
    return counts, accepted_any


def check_lossless(rule, make_tree, model, length, accept_prob=None, n=N, seed=0):
    counts, accepted_any = simulate(rule, make_tree, model, length, n, seed)
    joint = model.exact(length)
    first = Counter()
    for k, c in counts.items():
        first[k[:1]] += c
    p_first = chisq_pvalue(first, model.exact(1), n)
    p_joint = chisq_pvalue(counts, joint, n)
    assert p_first > ALPHA / 2, f"first-token law differs from the target (p={p_first:.2e})"
    assert p_joint > ALPHA / 2, f"joint law of {length} tokens differs from the target (p={p_joint:.2e})"
    if accept_prob is not None:
        pb = stats.binomtest(accepted_any, n, accept_prob).pvalue
        assert pb > ALPHA, f"depth-1 acceptance {accepted_any / n:.4f} != {accept_prob:.4f} (p={pb:.2e})"
    return counts, accepted_any


def fixed(tree: DraftTree):
    return lambda rng: tree


def stochastic_tree(parents, q_of):
    """Tree builder: node ``i`` hangs off ``parents[i]`` and its token is SAMPLED from ``q_of(i, prefix)``.

    Siblings sharing a ``q`` are i.i.d. draws with replacement (duplicates kept as separate nodes). The
    draft randomness is a numpy stream of its own, independent of the rule's torch generator.
    """
    cache: dict = {}

    def get(i, prefix):
        hit = cache.get((i, prefix))
        if hit is None:
            q = np.asarray(q_of(i, prefix), dtype=np.float64)
            hit = cache[(i, prefix)] = (np.cumsum(q), torch.from_numpy(q).float())
        return hit

    def make(rng):
        tokens, rows = [], []
        for i, p in enumerate(parents):
            prefix = () if p < 0 else tuple(tokens[j] for j in _path(parents, p))
            cum, row = get(i, prefix)
            tokens.append(min(int(np.searchsorted(cum, rng.random() * cum[-1], side="right")), len(cum) - 1))
            rows.append(row)
        return DraftTree(tokens, parents, torch.stack(rows))

    return make


def _path(parents, node):
    out = []
    while node >= 0:
        out.append(node)
        node = parents[node]
    return out[::-1]


def residual_reject_all(p: np.ndarray, qs) -> float:
    """Probability that SpecInfer rejects every child drawn from ``qs`` (in order), starting from ``p``."""
    r, prob = p.copy(), 1.0
    for q in qs:
        rest = np.maximum(r - q, 0.0)
        mass = rest.sum()
        prob *= mass
        if mass <= 0:
            return 0.0
        r = rest / mass
    return prob


class DraftTable(TableModel):
    """Draft distributions ``q(.|slot, history)``: a noisy mix with the target (so acceptance is common)."""

    def __init__(self, seed, target: TableModel, mix=0.5):
        super().__init__(seed, zero_frac=0.2)
        self.target, self.mix = target, mix

    def q(self, slot, hist):
        noise = self((slot,) + tuple(hist))
        q = self.mix * self.target(hist) + (1 - self.mix) * noise
        return q / q.sum()


# ================================================================================== SpeculativeSamplingRule
RULE = SpeculativeSamplingRule()


def top_tokens(p, k):
    return [int(t) for t in np.argsort(-p)[:k]]


def test_empty_tree_samples_target():
    model = TableModel(1)
    check_lossless(RULE, fixed(DraftTree.empty()), model, length=2, accept_prob=0.0)


def test_deterministic_chain_depth2():
    model = TableModel(2)
    a = top_tokens(model(()), 1)[0]
    b = top_tokens(model((a,)), 1)[0]
    tree = DraftTree.from_chain([a, b])
    counts, _ = check_lossless(RULE, fixed(tree), model, length=3, accept_prob=model(())[a])


def test_deterministic_chain_with_impossible_tokens():
    # drafted tokens the target gives probability 0 (e.g. outside top-k) are never committed
    model = TableModel(3, zero_frac=1.0)
    p0 = model(())
    bad = int(np.nonzero(p0 == 0)[0][0])
    good = top_tokens(p0, 1)[0]
    for chain in ([bad, 0], [good, int(np.nonzero(model((good,)) == 0)[0][0])]):
        check_lossless(RULE, fixed(DraftTree.from_chain(chain)), model, length=3, accept_prob=p0[chain[0]], n=8000)


def test_deterministic_tree_branches_and_grandchild():
    model = TableModel(4)
    p0 = model(())
    a, b, c = top_tokens(p0, 3)
    b2 = top_tokens(model((b,)), 2)
    a1 = top_tokens(model((a,)), 1)[0]
    tree = DraftTree.from_sequences([[a, a1], [b, b2[0]], [b, b2[1]], [c]])
    assert tree.max_depth == 2 and len(tree) == 6
    check_lossless(RULE, fixed(tree), model, length=3, accept_prob=p0[[a, b, c]].sum())


def test_deterministic_tree_duplicate_siblings():
    # the same token proposed twice (a trie would merge them; a drafter may not): the second copy must never
    # be accepted after the first was rejected, and the accepted copy's subtree is walked
    model = TableModel(5)
    p0 = model(())
    a, b = top_tokens(p0, 2)
    x = top_tokens(model((a,)), 1)[0]
    y = top_tokens(model((a,)), 2)[1]
    tree = DraftTree([a, a, b, x, y], [-1, -1, -1, 1, 0])
    check_lossless(RULE, fixed(tree), model, length=3, accept_prob=p0[[a, b]].sum())


def test_stochastic_chain_depth2():
    model = TableModel(6)
    draft = DraftTable(60, model, mix=0.6)
    parents = [-1, 0]
    make = stochastic_tree(parents, lambda i, pre: draft.q(0, pre))
    acc = 1.0 - residual_reject_all(model(()), [draft.q(0, ())])
    check_lossless(RULE, make, model, length=3, accept_prob=acc)


def test_stochastic_tree_iid_children():
    # three i.i.d. draws (with replacement) from the same q at the root, each with a sampled child
    model = TableModel(7)
    draft = DraftTable(70, model, mix=0.3)
    parents = [-1, -1, -1, 0, 1, 2]
    make = stochastic_tree(parents, lambda i, pre: draft.q(0, pre))
    q0 = draft.q(0, ())
    acc = 1.0 - residual_reject_all(model(()), [q0, q0, q0])
    check_lossless(RULE, make, model, length=3, accept_prob=acc)


def test_stochastic_tree_different_q_per_child():
    model = TableModel(8)
    draft = DraftTable(80, model, mix=0.4)
    parents = [-1, -1, 0, 0, 1]
    make = stochastic_tree(parents, lambda i, pre: draft.q(i, pre))
    acc = 1.0 - residual_reject_all(model(()), [draft.q(0, ()), draft.q(1, ())])
    check_lossless(RULE, make, model, length=3, accept_prob=acc)


def test_stochastic_q_equals_p_always_accepts():
    # degenerate case q == p: every drafted token is accepted, and the law is still the target's
    model = TableModel(9)

    def q_exact(i, pre):  # bitwise the rule's own softmax of the scores, so p - q == 0 exactly
        with np.errstate(divide="ignore"):
            return torch.softmax(torch.from_numpy(np.log(model(pre))).float(), -1).double().numpy()

    make = stochastic_tree([-1, 0, -1], q_exact)
    counts, accepted = check_lossless(RULE, make, model, length=3, accept_prob=1.0, n=5000)
    assert accepted == 5000
    # and with a chain the whole depth is accepted every round
    g = torch.Generator().manual_seed(0)
    rng = np.random.default_rng(0)
    chain = stochastic_tree([-1, 0], q_exact)
    for _ in range(200):
        tree = chain(rng)
        assert RULE.accept(tree, tree_scores(tree, model), g).path == [0, 1]


def test_deterministic_one_hot_target_always_accepts():
    model = TableModel(10)
    model.table[()] = np.eye(V)[3]
    model.table[(3,)] = np.eye(V)[1]
    g = torch.Generator().manual_seed(0)
    tree = DraftTree.from_chain([3, 1])
    scores = tree_scores(tree, model)
    for _ in range(200):
        assert RULE.accept(tree, scores, g).path == [0, 1]


def test_stochastic_children_of_rejected_branch_never_used():
    # root child with q = one-hot on a token the target forbids: always rejected, its subtree never accepted,
    # then the residual equals p (max(p - onehot, 0) renormalised == p when p[x] == 0)
    model = TableModel(11, zero_frac=1.0)
    p0 = model(())
    bad = int(np.nonzero(p0 == 0)[0][0])
    onehot = np.eye(V)[bad]
    make = stochastic_tree([-1, 0], lambda i, pre: onehot if i == 0 else np.full(V, 1.0 / V))
    check_lossless(RULE, make, model, length=2, accept_prob=0.0, n=5000)


# ================================================================================== negative controls
class ResampleFromTargetRule(SpeculativeSamplingRule):
    """LOSSY on purpose: on rejection it samples the bonus from p itself instead of the residual."""

    def accept(self, tree, scores, generator=None):
        probs = torch.softmax(scores.float(), dim=-1)
        kids = tree.children()
        q_all = tree.draft_probs
        path, cur = [], -1
        while True:
            p = probs[cur + 1]
            acc = None
            for c in kids[cur + 1]:
                x = int(tree.tokens[c])
                u = float(torch.rand((), generator=generator))
                ratio = p[x] if q_all is None else min(1.0, float(p[x] / q_all[c][x]))
                if u < ratio:
                    acc = c
                    break
            if acc is None:
                return AcceptResult(path, int(torch.multinomial(p, 1, generator=generator)))
            path.append(acc)
            cur = acc


def _power(make, model, length):
    counts, _ = simulate(ResampleFromTargetRule(), make, model, length, n=N, seed=0)
    return chisq_pvalue(counts, model.exact(length), N)


def test_negative_control_deterministic_tree_is_detected():
    model = TableModel(4)
    p0 = model(())
    a, b, c = top_tokens(p0, 3)
    tree = DraftTree.from_sequences([[a, top_tokens(model((a,)), 1)[0]], [b], [c]])
    assert _power(fixed(tree), model, 3) < 1e-6


def test_negative_control_stochastic_iid_tree_is_detected():
    model = TableModel(7)
    draft = DraftTable(70, model, mix=0.3)
    make = stochastic_tree([-1, -1, -1, 0, 1, 2], lambda i, pre: draft.q(0, pre))
    assert _power(make, model, 3) < 1e-6


def test_negative_control_wrong_row_for_deep_nodes_is_detected():
    """A rule fed the root row for every node (a verifier indexing bug) must fail the joint test."""
    model = TableModel(2)
    a = top_tokens(model(()), 1)[0]
    tree = DraftTree.from_chain([a, top_tokens(model((a,)), 1)[0]])

    class RootRowEverywhere(SpeculativeSamplingRule):
        def accept(self, tree, scores, generator=None):
            return super().accept(tree, scores[:1].expand_as(scores), generator)

    counts, _ = simulate(RootRowEverywhere(), fixed(tree), model, 3, n=N, seed=0)
    assert chisq_pvalue(counts, model.exact(3), N) < 1e-6


# ================================================================================== known issue
def test_stochastic_node_with_zero_q_is_not_accepted_when_target_forbids_it():
    # Such q rows happen when draft_probs are stored at low precision (bf16 underflow) or filtered after
    # sampling. Treating the node as a one-hot proposal would be lossless; accepting it is not.
    p = torch.tensor([0.5, 0.5, 0.0, 0.0])
    q = torch.tensor([[0.5, 0.5, 0.0, 0.0]])  # token 2 is drafted but q[2] == 0
    tree = DraftTree.from_chain([2], draft_probs=q)
    g = torch.Generator().manual_seed(0)
    with np.errstate(divide="ignore"):
        scores = torch.log(torch.stack([p, p]))
    hits = sum(RULE.accept(tree, scores, g).path == [0] for _ in range(50))
    assert hits == 0
