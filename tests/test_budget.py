"""Cost-aware depth budget: the cost fit, the acceptance estimate, the cut, and losslessness with it."""

import pytest
import torch

import mmspec
from mmspec.budget import AcceptanceModel, ConfidenceStop, CostModel, DepthBudget
from mmspec.errors import InvalidInputError
from mmspec.drafters import NoisyOracleDrafter
from mmspec.tree import DraftTree

import _tiny_archs as A


def test_cost_model_fits_a_line_and_waits_for_spread():
    c = CostModel(min_observations=4)
    for _ in range(6):
        c.observe(5, 2.0)
    assert not c.ready and c.slope_ratio() == 0.0  # one size cannot separate fixed and per-token cost
    for q in (1, 9, 17, 33):
        c.observe(q, 4.0 + 0.5 * q)
    c2 = CostModel(min_observations=4)
    for q in (1, 9, 17, 33):
        c2.observe(q, 4.0 + 0.5 * q)
    assert c2.slope_ratio() == pytest.approx(0.5 / 4.0)


def test_acceptance_model_counts_conditional_trials():
    m = AcceptanceModel(prior=(0.0, 0.0))
    m.observe(depth=4, accepted=2)  # depths 1, 2 accepted; depth 3 tried and rejected; depth 4 never reached
    m.observe(depth=4, accepted=4)
    assert [m.alpha(d) for d in range(4)] == [1.0, 1.0, 0.5, 1.0]
    assert m.trials == [2, 2, 2, 1]


def _budget(ratio, alphas):
    b = DepthBudget(CostModel(min_observations=2), AcceptanceModel(prior=(0.0, 0.0)))
    for q in (1, 11):
        b.cost.observe(q, 1.0 + ratio * q)
    for d, a in enumerate(alphas):
        b.acceptance.trials.append(1000.0)
        b.acceptance.successes.append(1000.0 * a)
    return b


def test_choose_balances_gain_and_cost():
    chain = DraftTree.from_chain(list(range(8)))
    assert _budget(0.0, [0.9] * 8).choose(chain) is chain  # free verification: keep everything
    assert _budget(0.05, [0.95] * 8).choose(chain).max_depth == 8  # high acceptance pays for depth
    assert _budget(0.05, [0.3] * 8).choose(chain).max_depth <= 2
    wide = DraftTree.from_sequences([[i, 1, 2, 3] for i in range(10, 18)])  # 8 branches
    assert _budget(0.2, [0.5] * 4).choose(wide).max_depth == 1  # width makes each level expensive
    assert _budget(0.2, [0.0] * 8).choose(chain).max_depth == 1  # never below min_depth: keeps learning


def test_generate_with_budget_is_lossless_and_cuts():
    arch = A.qwen2_text()
    model, inputs = arch.model, arch.make_inputs(4)
    plen = inputs["input_ids"].shape[1]
    ref = model.generate(**inputs, max_new_tokens=24, do_sample=False)
    budget = _budget(0.3, [0.2] * 8)
    oracle = NoisyOracleDrafter(ref[:, plen:], depth=6, corrupt_p=0.6, extra_branches=2, vocab_size=A.VOCAB)
    out = mmspec.generate(model, inputs, oracle, max_new_tokens=24, budget=budget)
    assert torch.equal(out.sequences, ref)
    assert out.stats.drafted / out.stats.row_rounds < 6  # trees were cut
    assert budget.cost.n > 2 and budget.acceptance.trials[0] > 1000  # it kept learning


def test_confidence_stop_parses_and_derives_its_threshold_from_measured_costs():
    assert ConfidenceStop.parse(None) is None and ConfidenceStop.parse("none") is None
    assert ConfidenceStop.parse(0) is None  # 0: never stop early
    assert ConfidenceStop.parse("0.4").threshold() == 0.4
    for bad in ("often", 1.0, -0.1):
        with pytest.raises(InvalidInputError, match="min_confidence"):
            ConfidenceStop.parse(bad)
    now = [0.0]
    stop = ConfidenceStop("auto", initial=0.25, decay=1.0, clock=lambda: now[0])
    stop.new_run()
    # Rounds on a fake clock: drafting 0.5 s fixed + 1.0 s per drafter step, verifying 4 + 0.5 s per scored
    # token, 2 tokens kept. The threshold charges a step its marginal 1.0 s, not the 1.5-1.75 s mean.
    rounds = [(2, 3), (3, 4), (2, 5), (1, 2), (3, 6)] * 3  # (steps, width)
    seconds = 0.0
    for i, (steps, w) in enumerate(rounds):
        # the verify fit waits for 8 closed rounds
        assert (stop.threshold() == 0.25) == (i < 8)
        stop.draft_started()
        now[0] += 0.5 + 1.0 * steps
        stop.draft_done(steps)
        now[0] += 4.0 + 0.5 * w
        stop.committed(2.0, w)
        seconds += 0.5 + 1.0 * steps + 4.0 + 0.5 * w
    want = (1.0 + 0.5) * (2.0 * len(rounds)) / seconds  # (t_step + b) * rate
    assert stop.threshold() == pytest.approx(want, rel=1e-6)
    # A request that ends between drafting and verifying, then a pause: neither is counted.
    stop.draft_started()
    now[0] += 2.5
    stop.draft_done(2)
    stop.new_run()
    now[0] += 100.0
    stop.draft_started()
    now[0] += 2.5
    stop.draft_done(2)
    now[0] += 5.5
    stop.committed(2.0, 3)
    seconds += 8.0
    assert stop.threshold() == pytest.approx((1.0 + 0.5) * (2.0 * (len(rounds) + 1)) / seconds, rel=1e-6)
