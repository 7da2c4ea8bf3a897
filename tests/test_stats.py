"""SpecStats: recording, derived figures, merging, serialisation, and invariants on real runs."""

from __future__ import annotations

import json

import pytest
import torch

import mmspec
from mmspec.drafters import Drafter, NoisyOracleDrafter
from mmspec.stats import SpecStats


# ---------------------------------------------------------------------------------------------- recording
def test_doc_example():
    s = SpecStats()
    s.record_row(accepted=2, depth=3)
    s.record_row(accepted=3, depth=3)
    assert round(s.tau, 2) == 3.5
    assert s.accepted_hist == [0, 0, 1, 1]
    assert s.ceiling_rounds == 1


def test_record_row_counters():
    s = SpecStats()
    s.record_row(accepted=0, depth=2)             # rejected at depth 1
    s.record_row(accepted=1, depth=3, nodes=7)    # a 7-node tree, 3 deep
    s.record_row(accepted=2, depth=2)             # whole depth: ceiling
    s.record_row(accepted=0, depth=0)             # empty tree: plain step, not a ceiling round
    assert s.row_rounds == 4
    assert s.committed == 1 + 2 + 3 + 1
    assert s.drafted == 2 + 7 + 2 + 0
    assert s.accepted_hist == [2, 1, 1]
    assert s.depth_reached == [3, 3, 1]
    assert s.depth_accepted == [2, 1]
    assert s.ceiling_rounds == 1
    assert s.tau == pytest.approx(7 / 4)
    assert s.mean_accepted_length == s.tau
    assert s.accept_rate == pytest.approx([2 / 3, 1 / 3, 0.0])


def test_empty_stats():
    s = SpecStats()
    assert s.tau == 0.0 and s.accept_rate == [] and s.forwards_per_token == 0.0
    assert s.accepted_hist == [] and s.ceiling_rounds == 0
    assert "tau=0.00" in str(s)


def test_accept_rate_pads_unaccepted_depths():
    s = SpecStats()
    for _ in range(4):
        s.record_row(accepted=0, depth=3)
    s.record_row(accepted=1, depth=3)
    assert s.accept_rate == pytest.approx([1 / 5, 0.0, 0.0])
    assert len(s.accept_rate) == len(s.depth_reached) == 3


def test_ceiling_bin():
    s = SpecStats()
    for depth in range(1, 5):
        s.record_row(accepted=depth, depth=depth)    # every one hits its ceiling
        s.record_row(accepted=depth - 1, depth=depth)  # one short
    assert s.ceiling_rounds == 4
    assert s.accepted_hist == [1, 2, 2, 2, 1]
    assert sum(s.accepted_hist) == s.row_rounds == 8


def test_forwards_per_token():
    s = SpecStats(prefill_rows=2, generated=10)
    for _ in range(4):
        s.record_row(accepted=1, depth=1)
    assert s.forwards_per_token == pytest.approx((4 + 2) / 10)


def test_merge():
    a, b = SpecStats(rule="speculative_sampling", drafter="x"), SpecStats(lossless=False)
    a.record_row(accepted=1, depth=2)
    a.rounds, a.target_forwards, a.prefill_rows, a.generated, a.verify_time = 1, 2, 1, 3, 0.5
    for acc in (0, 3, 3):
        b.record_row(accepted=acc, depth=3, nodes=5)
    b.rounds, b.target_forwards, b.prefill_rows, b.generated, b.verify_time = 3, 4, 2, 9, 0.25
    tau_a, tau_b = a.tau, b.tau
    out = a.merge(b)
    assert out is a
    assert a.row_rounds == 4 and a.committed == 2 + (1 + 4 + 4)
    assert a.drafted == 2 + 15
    assert a.rounds == 4 and a.target_forwards == 6 and a.prefill_rows == 3 and a.generated == 12
    assert a.verify_time == pytest.approx(0.75)
    assert a.accepted_hist == [1, 1, 0, 2]
    assert a.depth_reached == [4, 4, 3]
    assert a.depth_accepted == [3, 2, 2]
    assert a.ceiling_rounds == 2
    assert a.lossless is False  # a lossy part makes the pool lossy
    assert a.rule == "speculative_sampling" and a.drafter == "x"
    assert min(tau_a, tau_b) <= a.tau <= max(tau_a, tau_b)
    # b is untouched
    assert b.row_rounds == 3 and b.accepted_hist == [1, 0, 0, 2]


def test_to_dict_and_json_round_trip():
    s = SpecStats(rule="greedy", drafter="lookup", prefill_rows=1, generated=5)
    s.record_row(accepted=2, depth=3, nodes=4)
    s.record_row(accepted=0, depth=1)
    d = s.to_dict()
    assert d["tau"] == s.tau and d["accept_rate"] == s.accept_rate
    assert d["forwards_per_token"] == s.forwards_per_token
    assert d["accepted_hist"] == [1, 0, 1] and d["committed"] == 4 and d["drafter"] == "lookup"
    back = json.loads(s.to_json())
    assert back == json.loads(json.dumps(d))
    assert back["tau"] == pytest.approx(2.0)
    assert json.loads(s.to_json(indent=2)) == back
    # the counters rebuild an equal SpecStats
    fields = {k: v for k, v in back.items() if k not in ("tau", "accept_rate", "forwards_per_token")}
    assert SpecStats(**fields) == s


def test_str():
    s = SpecStats(drafter="lookup", rule="greedy", total_time=1.0, generated=6)
    s.record_row(accepted=3, depth=3)
    s.record_row(accepted=1, depth=3)
    text = str(s)
    assert "tau=3.00" in text
    assert "lookup" in text and "greedy" in text and "lossless" in text
    assert "ceiling=1" in text
    assert "LOSSY" in str(SpecStats(lossless=False))


# ---------------------------------------------------------------------------------------------- real runs
@pytest.fixture(scope="module")
def tiny():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=256, pad_token_id=0, eos_token_id=None,
                      bos_token_id=None, initializer_range=0.2)
    m = LlamaForCausalLM(cfg).eval()
    ids = torch.randint(3, 32, (4, 10))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    mask[2, :6] = 0
    ids[mask == 0] = 0
    return m, dict(input_ids=ids, attention_mask=mask)


class Recorder(Drafter):
    """Wraps a drafter and records what the decode loop reports back (the pruned trees and accepted paths)."""

    def __init__(self, inner):
        self.inner, self.kind = inner, "recorder"
        self.nodes = self.rows = 0
        self.hist: list = []

    def propose(self, ctx):
        return self.inner.propose(ctx)

    def observe(self, ctx, result):
        for tree, path in zip(result.trees, result.paths):
            self.rows += 1
            self.nodes += len(tree)
            while len(self.hist) <= len(path):
                self.hist.append(0)
            self.hist[len(path)] += 1


def _invariants(stats: SpecStats, row_lengths: list[int], batch: int):
    assert stats.committed == sum((a + 1) * c for a, c in enumerate(stats.accepted_hist))
    assert stats.row_rounds == sum(stats.accepted_hist)
    assert stats.generated == sum(row_lengths)
    assert stats.tau >= 1.0
    assert stats.prefill_rows == batch
    assert stats.target_forwards == stats.rounds + 1
    assert sum(stats.depth_accepted) == stats.committed - stats.row_rounds
    assert all(a <= r for a, r in zip(stats.depth_accepted, stats.depth_reached))
    assert stats.ceiling_rounds <= stats.row_rounds
    assert all(0.0 <= r <= 1.0 for r in stats.accept_rate)
    assert stats.total_time > 0


@pytest.mark.parametrize("do_sample", [False, True])
@pytest.mark.parametrize("branches", [0, 2])
def test_invariants_on_real_run(tiny, do_sample, branches):
    model, inputs = tiny
    batch = inputs["input_ids"].shape[0]
    ref = model.generate(**inputs, max_new_tokens=20, do_sample=False, top_k=None)[:, 10:]
    rec = Recorder(NoisyOracleDrafter(ref, depth=4, corrupt_p=0.3, extra_branches=branches, vocab_size=32))
    got: dict = {}
    out = mmspec.generate(model, inputs, drafter=rec, max_new_tokens=20, do_sample=do_sample, seed=0,
                          on_tokens=lambda r, toks: got.setdefault(r, []).extend(toks))
    st = out.stats
    lengths = [len(got[r]) for r in range(batch)]
    assert lengths == [20] * batch  # no eos: every row runs to max_new_tokens
    _invariants(st, lengths, batch)
    # no eos and trees pruned to the remaining budget: nothing committed is ever dropped
    assert st.generated == st.committed + st.prefill_rows
    # the stats agree with what the drafter was told
    assert st.row_rounds == rec.rows and st.drafted == rec.nodes and st.accepted_hist == rec.hist
    assert st.rule == ("speculative_sampling" if do_sample else "greedy") and st.lossless
    assert st.drafter == "recorder"
    if not do_sample:
        assert st.tau > 1.5  # the oracle is 70% right: drafts are accepted
        assert torch.equal(out.sequences[:, 10:], ref)
    d = json.loads(st.to_json())
    assert d["tau"] == pytest.approx(st.tau)


def test_invariants_without_drafter_and_with_eos(tiny):
    model, inputs = tiny
    batch = inputs["input_ids"].shape[0]
    out = mmspec.generate(model, inputs, max_new_tokens=12)
    st = out.stats
    assert st.accepted_hist == [st.row_rounds] and st.tau == 1.0 and st.drafted == 0 and st.accept_rate == []
    _invariants(st, [12] * batch, batch)
    assert st.forwards_per_token == pytest.approx(1.0)
    # with an eos some rows stop early; the counters still add up
    row0 = out.sequences[0, 10:].tolist()
    eos = row0[3]
    got: dict = {}
    out = mmspec.generate(model, inputs, max_new_tokens=12, eos_token_id=eos,
                          on_tokens=lambda r, toks: got.setdefault(r, []).extend(toks))
    lengths = [len(got[r]) for r in range(batch)]
    assert lengths[0] == row0.index(eos) + 1 <= 4
    _invariants(out.stats, lengths, batch)
    assert out.stats.generated <= out.stats.committed + out.stats.prefill_rows
