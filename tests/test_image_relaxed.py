"""Relaxed acceptance rules for image tokens (image_ar/relaxed.py): LANTERN++, CSD and GSD, each against a
reference written out here in plain Python on hand-built distributions (anchors_domains.md §1), registered through
the core's registry as lossy, and their walk checked end to end (acceptance frequency and the law of the
corrected token)."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from mmspec.acceptance import get_rule, rule_names
from mmspec.image_ar.relaxed import CSDRule, GSDRule, LanternRule, code_neighbours
from mmspec.tree import DraftTree

from _chisq import chisq_pvalue

# Six tokens: 0 and 1 are text, 2..5 the image codes (offset 2), codebook on a line: 0, 1, 3, 7.
OFFSET = 2
CODEBOOK = torch.tensor([[0.0], [1.0], [3.0], [7.0]])
P = [0.0, 0.05, 0.30, 0.25, 0.15, 0.25]
Q = [0.0, 0.0, 0.10, 0.60, 0.20, 0.10]


def _nearest(x: int, k: int) -> list:
    """Token ids of code x's k nearest other codes, nearest first (ties: lower index), written out."""
    cx = float(CODEBOOK[x - OFFSET, 0])
    others = [(abs(float(CODEBOOK[i, 0]) - cx), i) for i in range(len(CODEBOOK)) if i != x - OFFSET]
    return [OFFSET + i for _, i in sorted(others)[:k]]


def ref_lantern(p, q, x, lam, k):
    """(accept probability, residual) of LANTERN++ with the moved-mass residual, from the written-out rule."""
    nb = _nearest(x, k)
    total, moved = 0.0, []
    for y in nb:
        if total + p[y] <= (lam - 1) * p[x] + 1e-12:
            total += p[y]
            moved.append(y)
        else:
            break
    relaxed = list(p)
    for y in moved:
        relaxed[y] = 0.0
    relaxed[x] = p[x] + total
    return min(1.0, (p[x] + total) / q[x]), [max(0.0, a - b) for a, b in zip(relaxed, q)], moved


def ref_csd(p, q, x, weight=0.5, gate=0.65):
    tv = 0.5 * sum(abs(a - b) for a, b in zip(p, q))
    h = -sum(a * math.log(a) for a in p if a > 0)
    bonus = weight * h if tv < gate else 0.0
    return min(1.0, p[x] / q[x] + bonus), [max(0.0, a - b) for a, b in zip(p, q)]


def ref_gsd(p, q, x, ranks=7, gap=0.15):
    order = sorted(range(len(p)), key=lambda i: (-p[i], i))  # the target's order, ties by index (stable)
    r = order.index(x)
    group = [y for y in order[max(0, r - ranks): r + ranks + 1] if abs(p[y] - p[x]) < gap or y == x]
    return min(1.0, sum(p[y] for y in group) / sum(q[y] for y in group)), group


def _t(v):
    return torch.tensor(v, dtype=torch.float64)


def test_code_neighbours_against_sorted_distances():
    nb = code_neighbours(CODEBOOK, 3)
    for i in range(4):
        assert (nb[i] + OFFSET).tolist() == _nearest(OFFSET + i, 3)


@pytest.mark.parametrize("lam,k", [(2.0, 3), (1.5, 3), (3.0, 1), (4.0, 2)])
@pytest.mark.parametrize("x", [2, 3, 4, 5])
def test_lantern_against_reference(lam, k, x):
    rule = LanternRule(**{"lambda": lam, "k": k})
    rule.bind_codebook(CODEBOOK, OFFSET)
    want_a, want_r, moved = ref_lantern(P, Q, x, lam, k)
    assert rule.accept_prob(_t(P), _t(Q), x) == pytest.approx(want_a)
    assert rule.residual(_t(P), _t(Q), x).tolist() == pytest.approx(want_r)
    # The repository's literal residual: max(0, p - q) with all k neighbours zeroed once any mass moved.
    lit = LanternRule(**{"lambda": lam, "k": k, "residual": "neighbourhood"})
    lit.bind_codebook(CODEBOOK, OFFSET)
    want = [max(0.0, a - b) for a, b in zip(P, Q)]
    if moved:
        for y in _nearest(x, k):
            want[y] = 0.0
    assert lit.residual(_t(P), _t(Q), x).tolist() == pytest.approx(want)


def test_lantern_bound_and_cases():
    rule = LanternRule(**{"lambda": 2.0, "k": 3})
    rule.bind_codebook(CODEBOOK, OFFSET)
    # x = 3 (code 1 at 1.0): neighbours 2 (dist 1), 4 (dist 2), 5 (dist 6); bound (2 - 1) * 0.25 = 0.25 admits
    # nothing (p[2] = 0.30 > 0.25): no relaxation, the exact test.
    assert rule.accept_prob(_t(P), _t(Q), 3) == pytest.approx(0.25 / 0.60)
    # x = 4 (code 2 at 3.0): neighbours 3 (dist 2), 2 (dist 3); 0.15 bound admits nothing either; at lambda 3
    # the bound is 0.30: nothing (p[3] = 0.25 <= 0.30 moves, then 0.25 + 0.30 > 0.30 stops).
    r3 = LanternRule(**{"lambda": 3.0, "k": 3})
    r3.bind_codebook(CODEBOOK, OFFSET)
    assert r3.accept_prob(_t(P), _t(Q), 4) == pytest.approx(min(1.0, (0.15 + 0.25) / 0.20))
    # A text token has no latent neighbours: the exact test.
    assert rule.accept_prob(_t(P), _t([0, 1.0, 0, 0, 0, 0]), 1) == pytest.approx(0.05)
    # The relaxed law never puts more than lambda * p(x) on x.
    for x in range(2, 6):
        assert float(rule.relaxed(_t(P), x)[x]) <= 2.0 * P[x] + 1e-12
    unbound = LanternRule()
    with pytest.raises(Exception, match="codebook"):
        unbound.accept_prob(_t(P), _t(Q), 2)


@pytest.mark.parametrize("gate", [0.65, 0.1])
@pytest.mark.parametrize("x", [2, 3, 4, 5])
def test_csd_against_reference(gate, x):
    rule = CSDRule(tv_gate=gate)
    want_a, want_r = ref_csd(P, Q, x, gate=gate)
    assert rule.accept_prob(_t(P), _t(Q), x) == pytest.approx(want_a)
    assert rule.residual(_t(P), _t(Q), x).tolist() == pytest.approx(want_r)


def test_csd_gate_opens_on_close_distributions():
    p, q = [0.0, 0.0, 0.4, 0.3, 0.2, 0.1], [0.0, 0.0, 0.35, 0.35, 0.2, 0.1]  # TV 0.05: the bonus applies
    assert CSDRule(weight=0.1).accept_prob(_t(p), _t(q), 3) == pytest.approx(ref_csd(p, q, 3, weight=0.1)[0])
    assert CSDRule(weight=0.1).accept_prob(_t(p), _t(q), 3) > 0.3 / 0.35


@pytest.mark.parametrize("ranks,gap", [(7, 0.15), (1, 0.15), (1, 0.07), (0, 0.5)])
@pytest.mark.parametrize("x", [2, 3, 4, 5])
def test_gsd_against_reference(ranks, gap, x):
    rule = GSDRule(ranks=ranks, prob_gap=gap)
    want_a, group = ref_gsd(P, Q, x, ranks, gap)
    assert sorted(rule.group(_t(P), x).tolist()) == sorted(group)
    assert rule.accept_prob(_t(P), _t(Q), x) == pytest.approx(want_a)
    assert rule.residual(_t(P), _t(Q), x).tolist() == pytest.approx([max(0.0, a - b) for a, b in zip(P, Q)])


def test_gsd_latent_test():
    rule = GSDRule(ranks=7, prob_gap=0.5, latent_dist=4.5)  # squared distance < 4.5: codes within 2.1
    rule.bind_codebook(CODEBOOK, OFFSET)
    # x = 4 (at 3.0): 3 (at 1.0, d^2 4) is in, 2 (at 0.0, d^2 9) and 5 (at 7.0, d^2 16) are out; text 1 is out.
    assert sorted(rule.group(_t(P), 4).tolist()) == [3, 4]


def test_registered_lossy_with_options():
    assert {"lantern++", "csd", "gsd"} <= set(rule_names())
    for spec, name in (("lantern++;lambda=2", "lantern++;lambda=2"), ("csd", "csd"), ("gsd;ranks=12", "gsd;ranks=12")):
        rule = get_rule(spec, do_sample=True)
        assert rule.name == name and rule.lossless is False and rule.mode == "sample"
    assert get_rule("lantern++;lambda=3;k=8", do_sample=True).lam == 3.0
    for bad in ("lantern++;lambda=1", "lantern++;k=0", "lantern++;residual=none", "csd;weight=-1", "gsd;ranks=-1",
                "gsd;colour=1"):
        with pytest.raises(ValueError, match="bad options"):
            get_rule(bad, do_sample=True)


@pytest.mark.parametrize("make", [lambda: CSDRule(), lambda: GSDRule(ranks=1),
                                  lambda: LanternRule(**{"lambda": 3.0, "k": 3})])
def test_walk_follows_the_rule(make):
    """One sampled draft under accept(): accepted as often as accept_prob says, and after a rejection the token
    follows the normalised residual (chi-square)."""
    rule = make()
    if hasattr(rule, "bind_codebook"):
        rule.bind_codebook(CODEBOOK, OFFSET)
    x = 4
    scores = torch.log(torch.tensor([P, P], dtype=torch.float32).clamp_min(1e-30))
    tree = DraftTree.from_chain([x], torch.tensor([Q], dtype=torch.float32))
    g = torch.Generator().manual_seed(0)
    n, accepted, rejected = 2500, 0, Counter()
    for _ in range(n):
        res = rule.accept(tree, scores, g)
        if res.path:
            accepted += 1
        else:
            rejected[res.next_token] += 1
    a = rule.accept_prob(_t(P), _t(Q), x)
    assert abs(accepted / n - a) < 4 * math.sqrt(a * (1 - a) / n) + 1e-9
    if sum(rejected.values()) > 100:
        r = rule.residual(_t(P), _t(Q), x)
        r = (r / r.sum()).tolist()
        assert chisq_pvalue(rejected, dict(enumerate(r)), sum(rejected.values())) > 1e-3


def test_batched_chain_walk_draws_what_the_core_walk_draws():
    """CSD (batched) scores a chain's nodes in one call and takes the core's one-pass chain walk; it must draw exactly
    what the core's node-by-node walk draws from the same seed (path, next token, generator state after), with
    sampled and deterministic drafts, with early rejections and whole chains accepted."""
    torch.manual_seed(0)
    seen = Counter()
    for trial in range(300):
        n, v = 1 + trial % 7, 10
        scores = torch.randn(n + 1, v) * (0.5 + trial % 3)
        p = torch.softmax(scores, dim=-1)
        tokens = torch.multinomial(p[:n], 1).squeeze(-1).tolist()  # drafts the target often keeps
        q = torch.softmax(torch.randn(n, v), dim=-1) if trial % 2 else None
        if q is not None and trial % 4 == 1:
            q[0, tokens[0]] = 0.0  # a token its q could not have made: walked as a one-hot proposal
        tree = DraftTree.from_chain(tokens, q)
        rule = CSDRule(weight=0.3, tv_gate=0.9)
        g_new, g_old = torch.Generator().manual_seed(trial), torch.Generator().manual_seed(trial)
        got = rule.accept(tree, scores, g_new)
        want = rule._walk_nodes(tree, torch.softmax(scores, dim=-1), g_old)
        assert got == want, (trial, got, want)
        assert torch.equal(g_new.get_state(), g_old.get_state()), trial
        seen[len(got.path) == n] += 1
    assert seen[True] > 20 and seen[False] > 20, seen
