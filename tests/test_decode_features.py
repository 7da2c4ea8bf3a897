"""generate() features beyond plain greedy: stop strings, logits processors on tree nodes, several eos ids,
streamers and callbacks, hidden states from the verify pass."""

import pytest
import torch

import mmspec
from mmspec.drafters import NoisyOracleDrafter, PromptLookupDrafter
from mmspec.target import TargetAdapter
from mmspec.tree import DraftTree

import _tiny_text as T


@pytest.fixture(scope="module")
def setup():
    tok = T.tokenizer()
    model = T.model(len(tok))
    prompts = ["the chart value total page the chart value", "a red blue line", "yes no ok done the a of and to in"]
    inputs = tok(prompts, return_tensors="pt", padding=True)
    return tok, model, dict(inputs)


def _oracle(ref, plen, tree=True):
    return NoisyOracleDrafter(ref[:, plen:], depth=4, corrupt_p=0.25, extra_branches=2 if tree else 0,
                              vocab_size=40, seed=3)


@pytest.mark.parametrize("tree", [False, True])
def test_logits_processors_apply_per_node_history(setup, tree):
    """repetition_penalty and no_repeat_ngram depend on each node's own history: tree nodes must see theirs."""
    tok, model, inputs = setup
    kw = dict(max_new_tokens=30, do_sample=False, repetition_penalty=1.8, no_repeat_ngram_size=2, min_new_tokens=5)
    ref = model.generate(**inputs, **kw)
    plen = inputs["input_ids"].shape[1]
    out = mmspec.generate(model, inputs, drafter=_oracle(ref, plen, tree), **kw)
    assert torch.equal(out.sequences, ref)
    out = mmspec.generate(model, inputs, drafter=PromptLookupDrafter(), **kw)
    assert torch.equal(out.sequences, ref)


def test_several_eos_ids(setup):
    tok, model, inputs = setup
    free = model.generate(**inputs, max_new_tokens=30, do_sample=False)
    plen = inputs["input_ids"].shape[1]
    eos = [int(free[0, plen + 4]), int(free[1, plen + 9])]
    ref = model.generate(**inputs, max_new_tokens=30, do_sample=False, eos_token_id=eos)
    out = mmspec.generate(model, inputs, drafter=_oracle(free, plen), max_new_tokens=30, eos_token_id=eos)
    assert torch.equal(out.sequences, ref)
    assert out.sequences.shape[1] < plen + 30 or (ref[:, plen:] == 0).any()


def test_stop_strings_match_generate(setup):
    tok, model, inputs = setup
    free = model.generate(**inputs, max_new_tokens=30, do_sample=False)
    plen = inputs["input_ids"].shape[1]
    words = tok.decode(free[1, plen + 6: plen + 8])  # a two-word string row 1 produces
    ref = model.generate(**inputs, max_new_tokens=30, do_sample=False, stop_strings=[words], tokenizer=tok)
    out = mmspec.generate(model, inputs, drafter=_oracle(free, plen), max_new_tokens=30, stop_strings=[words],
                          tokenizer=tok)
    assert torch.equal(out.sequences, ref)
    assert words in tok.decode(out.sequences[1, plen:])


def test_stop_strings_need_tokenizer(setup):
    _, model, inputs = setup
    with pytest.raises(mmspec.InvalidInputError):
        mmspec.generate(model, inputs, max_new_tokens=4, stop_strings=["x"])


def test_streamer_and_callback(setup):
    from transformers import TextIteratorStreamer

    tok, model, inputs = setup
    one = {k: v[:1] for k, v in inputs.items()}
    streamer = TextIteratorStreamer(tok, skip_prompt=True)
    got = []
    out = mmspec.generate(model, one, drafter=PromptLookupDrafter(), max_new_tokens=20, streamer=streamer,
                          on_tokens=lambda r, t: got.append((r, list(t))))
    text = "".join(streamer)
    plen = one["input_ids"].shape[1]
    new = out.sequences[0, plen:].tolist()
    assert [t for _, ts in got for t in ts] == new
    assert text.split() == tok.decode(new).split()
    with pytest.raises(mmspec.InvalidInputError):
        mmspec.generate(model, inputs, max_new_tokens=4, streamer=TextIteratorStreamer(tok))


def test_batch_callback_rows(setup):
    tok, model, inputs = setup
    got = {}
    out = mmspec.generate(model, inputs, drafter=PromptLookupDrafter(), max_new_tokens=12,
                          on_tokens=lambda r, t: got.setdefault(r, []).extend(t))
    plen = inputs["input_ids"].shape[1]
    for r in range(3):
        assert got[r] == out.sequences[r, plen:].tolist()


def test_hidden_states_from_verify_pass_equal_plain_forward(setup):
    """The hidden states a drafter reads come from the scoring pass and equal a plain forward's."""
    tok, model, inputs = setup
    one = {k: v[1:2] for k, v in inputs.items()}
    ids = one["input_ids"][one["attention_mask"].bool()][None]
    adapter = TargetAdapter(model, hidden_layers=(1, -1))
    state, _, hidden = adapter.prefill(ids, {"attention_mask": torch.ones_like(ids)})
    state.pending = torch.tensor([5])
    tree = DraftTree.from_sequences([[6, 7], [8]])
    out, _ = adapter.score(state, [tree])
    full = model(torch.cat([ids, torch.tensor([[5, 6, 7]])], dim=1), output_hidden_states=True)
    side = model(torch.cat([ids, torch.tensor([[5, 8]])], dim=1), output_hidden_states=True)
    plen = ids.shape[1]
    for layer in (1, -1):
        assert torch.allclose(hidden[layer][0], full.hidden_states[layer][0, :plen], atol=1e-5)
        h = out.hidden_states[layer][0]  # [root, 6, 8, 7] in node order: tree tokens are [6, 8, 7]
        assert torch.allclose(h[0], full.hidden_states[layer][0, plen], atol=1e-5)
        assert torch.allclose(h[1], full.hidden_states[layer][0, plen + 1], atol=1e-5)
        assert torch.allclose(h[3], full.hidden_states[layer][0, plen + 2], atol=1e-5)
        assert torch.allclose(h[2], side.hidden_states[layer][0, plen + 1], atol=1e-5)
    assert torch.allclose(out.logits[0, 3], full.logits[0, plen + 2], atol=1e-4)
