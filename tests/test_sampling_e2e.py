"""End-to-end losslessness of ``mmspec.generate(do_sample=True)`` on a tiny real Llama.

Statistical design
------------------
The target is a 2-layer ``LlamaForCausalLM`` with ``V = 6`` tokens (random init, ``initializer_range=0.3``:
next-token entropy about 1.2 nats, far from flat). The reference is EXACT: one forward pass over all
``V**3`` continuations of the prompt gives every conditional ``p(x_k | prompt, x_<k)``, processed by a
re-implementation written here of what ``generate`` applies (repetition penalty on the history, then
temperature, then top-k), so ``P(x1, x2, x3) = prod_k p(x_k | ...)`` is known for all 216 outcomes.

``mmspec.generate`` runs on ``B`` identical prompt rows per call (rows sample independently; the
"padded" configurations mix in a longer prompt so the checked rows are left-padded) and the empirical
law of the first three generated tokens over ``n = 6144..8192`` rows is compared with the exact one by
a Pearson chi-square test (cells with expected count < 5 pooled into one) at ``ALPHA = 1e-3`` per
configuration.
Seeds are fixed, so each run is deterministic; ``ALPHA`` is the chance that a correct implementation
fails for a freshly chosen seed. Configurations with ``max_new_tokens = 4`` let round 1 verify depth-2
trees, so acceptance deep in a tree shapes ``x2`` and ``x3``; the ``max_new_tokens = 3`` one checks the
whole output (trees pruned to the remaining budget). A negative control (a deliberately lossy rule
through the same pipeline) must be rejected with p < 1e-6, so the test has power.
"""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest
import torch

import mmspec
from mmspec.acceptance import AcceptResult, SpeculativeSamplingRule
from mmspec.drafters import DraftModelDrafter, Drafter, EagleDrafter, NoisyOracleDrafter, UnionDrafter
from mmspec.tree import DraftTree

from _chisq import chisq_pvalue

ALPHA = 1e-3
V = 6
PROMPT = [1, 2, 3, 4, 5, 1, 2]  # no pad token (0): a penalty wrongly applied to padding shows up
P = len(PROMPT)


# ================================================================================== model and exact reference
@pytest.fixture(scope="module")
def model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, max_position_embeddings=64, pad_token_id=0, eos_token_id=None,
                      bos_token_id=None, initializer_range=0.3)
    return LlamaForCausalLM(cfg).eval()


def process(logits: np.ndarray, history, temperature=1.0, top_k=0, repetition_penalty=1.0) -> np.ndarray:
    """The sampling distribution ``generate`` draws from, written out (float64)."""
    x = logits.astype(np.float64).copy()
    if repetition_penalty != 1.0:
        for t in set(history):
            x[t] = x[t] * repetition_penalty if x[t] < 0 else x[t] / repetition_penalty
    x = x / temperature
    if top_k and top_k < len(x):
        kth = np.sort(x)[::-1][top_k - 1]
        x[x < kth] = -np.inf
    e = np.exp(x - x.max())
    return e / e.sum()


def exact_tables(model, depth=3, **proc):
    """``cond[h]`` = processed next-token law after the prompt and generated tokens ``h`` (``len(h) <= depth``)."""
    conts = torch.tensor(list(itertools.product(range(V), repeat=depth)))
    ids = torch.cat([torch.tensor(PROMPT).expand(len(conts), -1), conts], dim=1)
    with torch.no_grad():
        logits = model(input_ids=ids).logits.double().numpy()
    cond = {}
    for row, cont in enumerate(conts.tolist()):
        for k in range(depth + 1):
            h = tuple(cont[:k])
            if h not in cond:
                cond[h] = process(logits[row, P - 1 + k], PROMPT + list(h), **proc)
    return cond


def joint(cond, length=3) -> dict:
    out = {}
    for seq in itertools.product(range(V), repeat=length):
        pr = 1.0
        for k in range(length):
            pr *= cond[seq[:k]][seq[k]]
        out[seq] = pr
    return out


# ================================================================================== drafters written for the test
class TableDrafter(Drafter):
    """Drafts from a "draft model" ``q(slot, history)``: a noisy mix with the target's exact conditionals.

    ``template`` lists nodes as ``(parent, rank)``. Deterministic mode: the node's token is the
    ``rank``-th most likely token under ``q`` (a repeated rank gives duplicate siblings); stochastic mode:
    the token is SAMPLED from ``q`` with the run's generator (siblings are i.i.d. draws with replacement)
    and ``draft_probs`` carries the ``q`` rows.
    """

    kind = "test-table"

    def __init__(self, cond, template, stochastic, mix=0.6, seed=0):
        self.cond, self.template, self.stochastic, self.mix = cond, template, stochastic, mix
        self.rng = np.random.default_rng(seed)
        self.noise: dict = {}
        self.calls = 0

    def q(self, hist):
        # q depends on the history only: siblings share it, so stochastic siblings are i.i.d. draws
        if hist not in self.noise:
            self.noise[hist] = self.rng.dirichlet(np.full(V, 0.5))
        target = self.cond.get(hist, np.full(V, 1.0 / V))
        q = self.mix * target + (1 - self.mix) * self.noise[hist]
        return q / q.sum()

    def propose(self, ctx):
        self.calls += 1
        trees = []
        for seq, plen in zip(ctx.sequences, ctx.prompt_lengths):
            hist = tuple(seq[plen:])  # generated tokens, pending included
            tokens, rows = [], []
            for i, (parent, rank) in enumerate(self.template):
                prefix = hist
                if parent >= 0:
                    prefix = hist + tuple(tokens[j] for j in _path(self.template, parent))
                q = self.q(prefix)
                if self.stochastic:
                    u = float(torch.rand((), generator=ctx.generator))
                    tok = min(int(np.searchsorted(np.cumsum(q), u, side="right")), V - 1)
                else:
                    tok = int(np.argsort(-q, kind="stable")[rank])
                tokens.append(tok)
                rows.append(q)
            probs = torch.tensor(np.stack(rows), dtype=torch.float32) if self.stochastic and rows else None
            trees.append(DraftTree(tokens, [p for p, _ in self.template], probs))
        return trees


def _path(template, node):
    out = []
    while node >= 0:
        out.append(node)
        node = template[node][0]
    return out[::-1]


CHAIN3 = [(-1, 0), (0, 0), (1, 0)]
# root: top-1, top-2, top-1 again (duplicate sibling), top-3; grandchildren under the first two and the duplicate
TREE = [(-1, 0), (-1, 1), (-1, 0), (-1, 2), (0, 0), (0, 1), (1, 0), (2, 1), (4, 0)]
IID_TREE = [(-1, 0), (-1, 0), (-1, 0), (0, 0), (1, 0), (2, 0), (3, 0)]


# ================================================================================== the check
OTHER = [3, 1, 4, 1, 5, 2, 2, 3, 4]  # a longer prompt that forces left padding on the PROMPT rows


def make_inputs(batch, padded):
    """``batch`` rows of PROMPT; with ``padded``, every 4th row is OTHER and the PROMPT rows are left-padded.

    Returns ``(inputs, target_rows, width)``: the rows whose law is checked and the padded prompt width.
    """
    if not padded:
        ids = torch.tensor([PROMPT] * batch)
        return dict(input_ids=ids, attention_mask=torch.ones_like(ids)), list(range(batch)), P
    width = len(OTHER)
    pad = width - P
    ids = torch.tensor([OTHER if r % 4 == 0 else [0] * pad + PROMPT for r in range(batch)])
    mask = torch.tensor([[1] * width if r % 4 == 0 else [0] * pad + [1] * P for r in range(batch)])
    return dict(input_ids=ids, attention_mask=mask), [r for r in range(batch) if r % 4], width


def run_config(model, drafter_factory, n_calls, batch, max_new_tokens, seed, rule=None, padded=False, **proc):
    """Sample ``n_calls`` batches; return (counts of the first 3 tokens, exact law, pooled stats, samples)."""
    cond = exact_tables(model, **proc)
    drafter = drafter_factory(cond, model)
    gen_kwargs = dict(temperature=proc.get("temperature", 1.0), top_k=proc.get("top_k", 0),
                      repetition_penalty=proc.get("repetition_penalty", 1.0))
    inputs, rows, width = make_inputs(batch, padded)
    g = torch.Generator().manual_seed(seed)
    counts: Counter = Counter()
    pooled = None
    for _ in range(n_calls):
        out = mmspec.generate(model, inputs, drafter=drafter, do_sample=True, max_new_tokens=max_new_tokens,
                              generator=g, rule=rule, **gen_kwargs)
        assert out.sequences.shape == (batch, width + max_new_tokens)
        assert torch.equal(out.sequences[:, :width], inputs["input_ids"])
        for row in out.sequences[rows, width:width + 3].tolist():
            counts[tuple(row)] += 1
        pooled = out.stats if pooled is None else pooled.merge(out.stats)
    return counts, joint(cond), pooled, n_calls * len(rows)


def table(template, stochastic, mix=0.6):
    return lambda cond, model: TableDrafter(cond, template, stochastic=stochastic, mix=mix)


def noisy_oracle(cond, model):
    # reference: the greedy continuation of PROMPT (what an oracle drafter would know), corrupted at random
    ids = torch.tensor([PROMPT])
    ref = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=8,
                         top_k=None)[0, P:]
    return NoisyOracleDrafter(ref.expand(4096, -1), depth=3, corrupt_p=0.3, extra_branches=2, vocab_size=V)


# name: (drafter factory, max_new_tokens, options, calls, batch)
CONFIGS = {
    "det-chain-T1": (table(CHAIN3, False), 3, {}, 4, 2048),
    "det-tree-T0.7-top4": (table(TREE, False), 4, dict(temperature=0.7, top_k=4), 3, 2048),
    "stoch-chain-T1.3": (table(CHAIN3, True), 4, dict(temperature=1.3), 3, 2048),
    "stoch-iid-tree-T1": (table(IID_TREE, True, mix=0.3), 4, {}, 3, 2048),
    "det-tree-padded-batch-T0.9": (table(TREE, False), 4, dict(temperature=0.9, padded=True), 4, 2048),
    # GLANCE's "sample from the target, then match" rule, on a deterministic tree and on a sampled chain (whose
    # q it ignores): every emitted token is a draw from p, so the law holds either way.
    "sample-then-match-det-tree-T0.7-top4": (table(TREE, False), 4,
                                             dict(temperature=0.7, top_k=4, rule="sample_then_match"), 3, 2048),
    # A union drops its members' q: a sampled chain merged with a deterministic tree is verified as a
    # deterministic proposal.
    "union-stoch-chain-det-tree-T1": (lambda cond, model: UnionDrafter([table(CHAIN3, True)(cond, model),
                                                                        table(TREE, False)(cond, model)]),
                                      4, {}, 3, 2048),
    # An EAGLE head (untrained: its softmax is far from the target's) sampling a chain that stops at the
    # first draft below a cumulative probability of 0.3 (chains of 0, 1 and 2 drafts): the stopping rule
    # must not bias the law.
    "eagle-stoch-chain-min-confidence": (lambda cond, model: EagleDrafter.from_target(
        model, seed=0, num_draft_tokens=3, min_confidence=0.3), 4, {}, 3, 2048),
    # The target as its own draft model at temperature 1.3 (q != p), chains cut below 0.3.
    "draft-model-stoch-chain-min-confidence": (lambda cond, model: DraftModelDrafter(
        model, num_draft_tokens=3, temperature=1.3, min_confidence=0.3), 4, {}, 3, 2048),
}
# A repetition penalty holds per-row state (the prompt's padding lengths), so mmspec scores each node in a
# full-batch processor call: cost grows with batch**2, hence the small batches.
SLOW_CONFIGS = {
    "sample-then-match-stoch-chain-T1.3": (table(CHAIN3, True), 4, dict(temperature=1.3, rule="sample_then_match"),
                                           3, 2048),
    "det-tree-rep1.5": (table(TREE, False), 4, dict(repetition_penalty=1.5), 24, 256),
    "stoch-iid-tree-T0.8-top5-rep1.4": (table(IID_TREE, True, mix=0.3), 4,
                                         dict(temperature=0.8, top_k=5, repetition_penalty=1.4), 24, 256),
    "det-tree-padded-rep1.3-top4": (table(TREE, False), 4, dict(repetition_penalty=1.3, top_k=4, padded=True), 32,
                                    256),
    "noisy-oracle-tree-T0.9-top3": (noisy_oracle, 4, dict(temperature=0.9, top_k=3), 4, 2048),
    "stoch-tree-T0.6": (table(TREE, True), 4, dict(temperature=0.6), 4, 2048),
    "stoch-chain-max3-top4": (table(CHAIN3, True), 3, dict(top_k=4), 4, 2048),
    "no-drafter-T1.1-top4": (lambda cond, model: None, 3, dict(top_k=4, temperature=1.1), 4, 2048),
}


def _check(model, name, cfg, seed):
    factory, max_new, options, calls, batch = cfg
    counts, law, st, n = run_config(model, factory, calls, batch, max_new, seed, **options)
    pval = chisq_pvalue(counts, law, n)
    assert pval > ALPHA, f"{name}: first-3-token law differs from plain sampling (chi-square p={pval:.2e}, n={n})"
    if st.drafter:
        # the drafts were really exercised: depth 1 was often accepted and, when trees may be 2 deep, depth 2 too
        assert st.accept_rate and st.accept_rate[0] > 0.2, st
        if max_new >= 4:
            assert len(st.depth_accepted) >= 2 and st.depth_accepted[1] > 0.05 * n, st


@pytest.mark.parametrize("name", list(CONFIGS))
def test_sampling_matches_exact_law(model, name):
    _check(model, name, CONFIGS[name], seed=1234)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SLOW_CONFIGS))
def test_sampling_matches_exact_law_more(model, name):
    _check(model, name, SLOW_CONFIGS[name], seed=4321)


# ================================================================================== power and reproducibility
class LossyRule(SpeculativeSamplingRule):
    """LOSSY on purpose: after rejecting deterministic drafts it samples from p, not from the residual."""

    lossless = False

    def accept(self, tree, scores, generator=None):
        probs = torch.softmax(scores.float(), dim=-1)
        kids, path, cur = tree.children(), [], -1
        while True:
            p = probs[cur + 1]
            nxt = next((c for c in kids[cur + 1] if float(torch.rand((), generator=generator)) < p[tree.tokens[c]]),
                       None)
            if nxt is None:
                return AcceptResult(path, int(torch.multinomial(p, 1, generator=generator)))
            path.append(nxt)
            cur = nxt


def test_negative_control_lossy_rule_is_detected(model):
    counts, law, _, n = run_config(model, table(CHAIN3, False), 2, 2048, 3, seed=99, rule=LossyRule())
    assert chisq_pvalue(counts, law, n) < 1e-6


def test_reference_agrees_with_hf_processors(model):
    """The hand-written ``process`` equals what transformers' own processors give (guards the oracle)."""
    from transformers import (LogitsProcessorList, RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper,
                              TopKLogitsWarper)

    hist = torch.tensor([PROMPT + [3, 3]])
    with torch.no_grad():
        logits = model(input_ids=hist).logits[:, -1]
    procs = LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.4), TemperatureLogitsWarper(0.8),
                                 TopKLogitsWarper(top_k=4)])
    want = torch.softmax(procs(hist, logits.clone()), -1)[0].double().numpy()
    got = process(logits[0].double().numpy(), hist[0].tolist(), temperature=0.8, top_k=4, repetition_penalty=1.4)
    np.testing.assert_allclose(got, want, atol=1e-6)


def test_seed_reproducible(model):
    ids = torch.tensor([PROMPT] * 64)
    inputs = dict(input_ids=ids, attention_mask=torch.ones_like(ids))
    cond = exact_tables(model, depth=2)
    kw = dict(do_sample=True, max_new_tokens=6, temperature=0.9, top_k=5)

    def run(**extra):
        return mmspec.generate(model, inputs, drafter=TableDrafter(cond, IID_TREE, stochastic=True), **kw, **extra)

    a, b = run(seed=7), run(seed=7)
    assert torch.equal(a.sequences, b.sequences)
    assert a.stats.accepted_hist == b.stats.accepted_hist
    c = run(generator=torch.Generator().manual_seed(7))
    assert torch.equal(a.sequences, c.sequences)  # seed=s is generator=Generator().manual_seed(s)
    d = run(seed=8)
    assert not torch.equal(a.sequences, d.sequences)
    # the rows really sample independently (64 identical prompts do not give 64 identical rows)
    assert len({tuple(r) for r in a.sequences[:, P:].tolist()}) > 10
