"""Losslessness and M-RoPE correctness on tiny Qwen2-VL, Qwen2.5-VL and Qwen3-VL (fp32, random init)."""

import pytest
import torch

import mmspec
from mmspec.drafters import DraftModelDrafter, NoisyOracleDrafter, PromptLookupDrafter

import _tiny_qwen_vl as T

NEW = 24
BATCHES = {
    1: [{"pre": 3, "images": [(56, 56)], "post": 5, "repeat": True}],
    4: [{"pre": 3, "images": [(56, 56)], "post": 5}, {"pre": 1, "post": 2},
        {"pre": 6, "images": [(28, 56), (56, 28)], "post": 3}, {"pre": 2, "images": [(56, 56)], "post": 9, "repeat": True}],
}


@pytest.fixture(scope="module", params=T.FAMILIES)
def family(request):
    fam = request.param
    return fam, T.build(fam), T.build(fam, hidden=32, layers=1, seed=1)


def _drafter(name, target, small, ref, prompt_len):
    if name == "lookup":
        return PromptLookupDrafter()
    if name == "draft-model":
        return DraftModelDrafter(small, num_draft_tokens=3)
    if name == "oracle-chain":
        return NoisyOracleDrafter(ref[:, prompt_len:], depth=4, corrupt_p=0.3, vocab_size=T.VOCAB, seed=1)
    return NoisyOracleDrafter(ref[:, prompt_len:], depth=4, corrupt_p=0.3, extra_branches=3, vocab_size=T.VOCAB, seed=2)


@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("drafter", ["lookup", "draft-model", "oracle-chain", "oracle-tree"])
def test_greedy_equals_generate(family, batch, drafter):
    fam, model, small = family
    inputs = T.make_inputs(fam, BATCHES[batch])
    ref = model.generate(**inputs, max_new_tokens=NEW, do_sample=False)
    plen = inputs["input_ids"].shape[1]
    out = mmspec.generate(model, inputs, drafter=_drafter(drafter, model, small, ref, plen), max_new_tokens=NEW)
    assert torch.equal(out.sequences, ref)
    assert out.stats.lossless and out.stats.generated == batch * NEW


def test_rows_finish_at_different_times(family):
    """An eos that one row hits early: that row is padded, the others go on, exactly as generate does."""
    fam, model, small = family
    inputs = T.make_inputs(fam, BATCHES[4])
    plen = inputs["input_ids"].shape[1]
    free = model.generate(**inputs, max_new_tokens=NEW, do_sample=False)
    eos = int(free[0, plen + 5])  # a token row 0 produces mid-way
    ref = model.generate(**inputs, max_new_tokens=NEW, do_sample=False, eos_token_id=eos)
    lengths = [(row[plen:] == eos).nonzero()[0].item() + 1 if (row[plen:] == eos).any() else NEW for row in ref]
    assert len(set(lengths)) > 1
    for d in (PromptLookupDrafter(), NoisyOracleDrafter(ref[:, plen:], depth=5, corrupt_p=0.2, vocab_size=T.VOCAB)):
        out = mmspec.generate(model, inputs, drafter=d, max_new_tokens=NEW, eos_token_id=eos)
        assert torch.equal(out.sequences, ref)


def test_self_drafting_accepts_everything(family):
    """The target drafting for itself must be accepted at every depth: any M-RoPE or cache slip in the
    draft-model path (vLLM issue 54498's failure mode) shows up here as a rejected round."""
    fam, model, _ = family
    inputs = T.make_inputs(fam, BATCHES[4])
    out = mmspec.generate(model, inputs, drafter=DraftModelDrafter(model, num_draft_tokens=4), max_new_tokens=NEW)
    s = out.stats
    assert s.committed == s.row_rounds + s.drafted  # every drafted chain node was kept, each round
    assert s.ceiling_rounds >= s.row_rounds - 4  # only the last round per row is cut by max_new_tokens
    assert s.accept_rate and min(s.accept_rate) == 1.0


def _capture_positions(model):
    """Record (input_ids, position_ids) of every language-model call."""
    calls = []

    def hook(module, args, kwargs):
        calls.append((kwargs.get("input_ids"), kwargs["position_ids"].clone(), kwargs.get("inputs_embeds")))

    return calls, model.model.language_model.register_forward_pre_hook(hook, with_kwargs=True)


def test_mrope_positions_of_drafted_tokens_equal_generate(family):
    """Direct check: every drafted token after an image is scored at the position generate gives it."""
    fam, model, _ = family
    inputs = T.make_inputs(fam, BATCHES[4])
    plen = inputs["input_ids"].shape[1]
    calls, handle = _capture_positions(model)
    try:
        ref = model.generate(**inputs, max_new_tokens=NEW, do_sample=False)
        gen_calls = list(calls)
        calls.clear()
        drafter = NoisyOracleDrafter(ref[:, plen:], depth=4, corrupt_p=0.0, vocab_size=T.VOCAB)
        mmspec.generate(model, inputs, drafter=drafter, max_new_tokens=NEW)
        spec_calls = list(calls)
    finally:
        handle.remove()
    # generate: prefill, then one call per new token; call t (t >= 1) scores sequence index plen + t - 1.
    want = {}
    for t, (_, pos, _) in enumerate(gen_calls[1:], start=1):
        for r in range(ref.shape[0]):
            want[(r, plen + t - 1)] = pos[:, r, 0].tolist()
    assert gen_calls[0][1].shape[0] == 4  # text axis + 3 M-RoPE axes, as transformers 5 lays them out
    # mmspec: with a perfect oracle every round scores [pending] + a chain; token j of the call sits at
    # sequence index (tokens committed before the round) + j.
    committed = [plen] * ref.shape[0]
    checked = 0
    for _, pos, _ in spec_calls[1:]:
        q = pos.shape[-1]
        for r in range(ref.shape[0]):
            for j in range(q):
                key = (r, committed[r] + j)
                if key in want:
                    assert pos[:, r, j].tolist() == want[key], key
                    checked += 1
            committed[r] += q  # every node accepted, plus the bonus token
    assert checked >= ref.shape[0] * (NEW - 1)
    # After an image the three M-RoPE axes run behind the sequence index (the rope delta is negative).
    row = 0
    assert want[(row, plen)][1] < plen
