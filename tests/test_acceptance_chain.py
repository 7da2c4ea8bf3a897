"""The lossless sampling rule's one-pass chain walk (SpeculativeSamplingRule._chain) against its node-by-node walk
(_walk_nodes): for the same seed, the same accepted path, the same next token and the same generator state after,
with deterministic and sampled drafts, early rejections and whole chains kept, impossible drafts, filtered targets,
an explicit generator and the default one."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from mmspec.acceptance import SpeculativeSamplingRule, _first_rejection
from mmspec.tree import DraftTree

RULE = SpeculativeSamplingRule()


def _case(trial: int):
    """A chain the target often keeps (drafted from p or its argmax), some scores filtered to -inf (top-k)."""
    n, v = 1 + trial % 9, 12
    scores = torch.randn(n + 1, v) * (0.5 + trial % 4)
    if trial % 5 == 0:  # top-k style filtering: zeros in p, drafts on filtered tokens rejected for sure
        scores[:, 6:] = -float("inf")
    p = torch.softmax(scores, dim=-1)
    tokens = (p[:n].argmax(-1) if trial % 3 == 0 else torch.multinomial(torch.softmax(torch.randn(n, v), -1) + p[:n],
                                                                       1).squeeze(-1)).tolist()
    q = None
    if trial % 2:
        q = torch.softmax(torch.randn(n, v), dim=-1)
        if trial % 4 == 1:
            q[0, tokens[0]] = 0.0  # a token its q could not have made: walked as a one-hot proposal
    return DraftTree.from_chain(tokens, q), scores


def test_chain_draws_what_the_node_walk_draws():
    torch.manual_seed(0)
    seen = Counter()
    for trial in range(400):
        tree, scores = _case(trial)
        probs = torch.softmax(scores.float(), dim=-1)
        g_new, g_old = torch.Generator().manual_seed(trial), torch.Generator().manual_seed(trial)
        got = RULE.accept(tree, scores, g_new)
        want = RULE._walk_nodes(tree, probs, g_old)
        assert got == want, (trial, got, want)
        assert torch.equal(g_new.get_state(), g_old.get_state()), trial  # the same number of draws
        # and the next draws agree: nothing of the two streams differs
        assert torch.equal(torch.rand(3, generator=g_new), torch.rand(3, generator=g_old)), trial
        seen["all kept" if len(got.path) == len(tree) else "rejected"] += 1
        seen["first rejected"] += not got.path
    assert min(seen.values()) > 30, seen


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_chain_on_a_device_generator_draws_node_by_node():
    """A device generator's stream depends on how draws are batched: there the chain tests node by node, and must
    still equal the walk."""
    for trial in range(60):
        tree, scores = _case(trial)
        scores = scores.cuda()
        g_new = torch.Generator(device="cuda").manual_seed(trial)
        g_old = torch.Generator(device="cuda").manual_seed(trial)
        got = RULE.accept(tree, scores, g_new)
        want = RULE._walk_nodes(tree, torch.softmax(scores.float(), dim=-1), g_old)
        assert got == want and torch.equal(g_new.get_state(), g_old.get_state()), trial


def test_chain_with_the_default_generator():
    for trial in range(40):
        tree, scores = _case(trial)
        torch.manual_seed(1000 + trial)
        got = RULE.accept(tree, scores)
        after = torch.get_rng_state()
        torch.manual_seed(1000 + trial)
        want = RULE._walk_nodes(tree, torch.softmax(scores.float(), dim=-1), None)
        assert got == want and torch.equal(after, torch.get_rng_state()), trial


def test_first_rejection_counts_the_walks_draws():
    g = torch.Generator().manual_seed(5)
    assert _first_rejection([1.0, 1.0, 0.0, 1.0], g, torch.device("cpu")) == 2  # a uniform is < 1, never < 0
    assert torch.equal(g.get_state(), _advanced(5, 3))
    assert _first_rejection([1.0, 1.0], g, torch.device("cpu")) == 2
    assert torch.equal(g.get_state(), _advanced(5, 5))


def _advanced(seed: int, draws: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    for _ in range(draws):
        torch.rand((), generator=g)
    return g.get_state()


def test_hook_rule_without_batched_keeps_the_node_walk():
    """A subclass overriding accept_prob without declaring batched never reaches the one-pass walk (which would
    apply the lossless test instead of its own)."""
    calls = []

    class Counting(SpeculativeSamplingRule):
        def accept_prob(self, p, q, x):
            calls.append(x)
            return super().accept_prob(p, q, x)

    tree, scores = DraftTree.from_chain([1, 2, 3]), torch.zeros(4, 5)
    res = Counting().accept(tree, scores, torch.Generator().manual_seed(0))
    assert len(calls) == min(len(res.path) + 1, 3)


@pytest.mark.parametrize("deterministic", [True, False])
def test_tree_that_is_not_a_chain_takes_the_node_walk(deterministic):
    tree = DraftTree([1, 2, 3], [-1, -1, 0], None if deterministic else torch.full((3, 5), 0.2))
    scores = torch.randn(4, 5)
    for seed in range(20):
        got = RULE.accept(tree, scores, torch.Generator().manual_seed(seed))
        want = RULE._walk_nodes(tree, torch.softmax(scores, -1), torch.Generator().manual_seed(seed))
        assert got == want
