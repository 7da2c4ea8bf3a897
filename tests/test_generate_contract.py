"""mmspec.generate follows generate()'s argument contract: what it honours matches, what it can't, it refuses."""

import pytest
import torch

import mmspec
from mmspec.drafters import DraftModelDrafter, Drafter, NoisyOracleDrafter, PromptLookupDrafter
from mmspec.tree import DraftTree

import _tiny_archs as A
import _tiny_qwen_vl as Q
import _tiny_text as T


@pytest.fixture(scope="module")
def text():
    arch = A.qwen2_text()
    return arch.model, arch.draft, arch.make_inputs(4)


def _same(model, inputs, drafter=None, **kw):
    ref = model.generate(**inputs, do_sample=False, **kw)
    out = mmspec.generate(model, inputs, drafter=drafter, **kw)
    assert torch.equal(out.sequences, ref)
    return out


def test_default_length_as_generate(text):
    """No max_new_tokens: the same default length generate picks."""
    model, _, inputs = text
    _same(model, inputs, PromptLookupDrafter())


def test_missing_attention_mask_is_inferred_from_pads(text):
    model, _, inputs = text
    bare = {"input_ids": inputs["input_ids"]}
    ref = model.generate(**bare, max_new_tokens=12, do_sample=False, pad_token_id=A.PAD)
    out = mmspec.generate(model, bare, PromptLookupDrafter(), max_new_tokens=12, pad_token_id=A.PAD)
    assert torch.equal(out.sequences, ref)


def test_forced_eos_and_prefix_allowed_tokens(text):
    model, _, inputs = text
    plen = inputs["input_ids"].shape[1]
    ref = model.generate(**inputs, max_new_tokens=10, do_sample=False)
    oracle = NoisyOracleDrafter(ref[:, plen:], depth=4, corrupt_p=0.2, extra_branches=2, vocab_size=A.VOCAB)
    _same(model, inputs, oracle, max_new_tokens=10, forced_eos_token_id=A.EOS)
    allowed = list(range(3, 40))
    _same(model, inputs, PromptLookupDrafter(), max_new_tokens=10, prefix_allowed_tokens_fn=lambda b, ids: allowed)


@pytest.mark.parametrize("kw", [
    {"num_return_sequences": 2, "do_sample": True},
    {"num_beams": 2},
    {"return_dict_in_generate": True, "output_scores": True},
    {"stopping_criteria": [lambda ids, scores: False]},
    {"max_new_token": 8},  # a typo generate refuses too
])
def test_arguments_mmspec_cannot_honour_are_refused(text, kw):
    model, _, inputs = text
    with pytest.raises(mmspec.InvalidInputError):
        mmspec.generate(model, inputs, max_new_tokens=4, **kw)


def test_rule_used_in_the_other_mode_is_labelled_lossy(text):
    model, _, inputs = text
    out = mmspec.generate(model, inputs, max_new_tokens=4, do_sample=True, rule="greedy", seed=0)
    assert out.stats.lossless is False
    out = mmspec.generate(model, inputs, max_new_tokens=4, rule="speculative_sampling", seed=0)
    assert out.stats.lossless is False
    assert mmspec.generate(model, inputs, max_new_tokens=4).stats.lossless is True


def test_max_time_stops_every_row(text):
    model, _, inputs = text
    out = mmspec.generate(model, inputs, max_new_tokens=200, max_time=0.0)
    assert out.sequences.shape[1] <= inputs["input_ids"].shape[1] + 2


class _Recorder(Drafter):
    """Proposes nothing; records what it was given."""

    kind = "recorder"
    hidden_layers = (-1,)

    def __init__(self, bad_token=None):
        self.seen = []
        self.bad_token = bad_token

    def begin(self, ctx):
        self.seen.append((list(ctx.rows), {k: v.shape[0] for k, v in ctx.hidden.items()}))

    def propose(self, ctx):
        self.seen.append((list(ctx.rows), {k: v.shape[0] for k, v in ctx.hidden.items()}))
        tok = self.bad_token
        return [DraftTree.from_chain([tok]) if tok is not None else DraftTree.empty() for _ in ctx.rows]


def test_hidden_states_follow_the_active_rows(text):
    """When rows finish, the hidden states a drafter reads still line up with ctx.rows."""
    model, _, inputs = text
    plen = inputs["input_ids"].shape[1]
    free = model.generate(**inputs, max_new_tokens=12, do_sample=False)
    eos = int(free[0, plen])  # row 0 stops on its first token, others later or never
    rec = _Recorder()
    mmspec.generate(model, inputs, rec, max_new_tokens=12, eos_token_id=eos)
    assert any(len(rows) < 4 for rows, _ in rec.seen)
    for rows, sizes in rec.seen:
        assert sizes == {-1: len(rows)}


def test_drafted_ids_outside_the_vocabulary_are_refused(text):
    model, _, inputs = text
    with pytest.raises(mmspec.InvalidInputError, match="vocabulary"):
        mmspec.generate(model, inputs, _Recorder(bad_token=A.VOCAB + 5), max_new_tokens=4)


def test_dynamic_rope_refused_only_past_its_threshold():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                      max_position_embeddings=32, rope_parameters={"rope_type": "dynamic", "factor": 2.0,
                                                                   "rope_theta": 10000.0}, initializer_range=0.2)
    model = LlamaForCausalLM(cfg).eval()
    inputs = {"input_ids": torch.randint(3, 64, (1, 10)), "attention_mask": torch.ones(1, 10, dtype=torch.long)}
    with pytest.raises(mmspec.UnsupportedModelError, match="dynamic"):
        mmspec.generate(model, inputs, PromptLookupDrafter(), max_new_tokens=30)
    _same(model, inputs, PromptLookupDrafter(), max_new_tokens=12, pad_token_id=0)


def test_text_model_eager_under_sdpa_top_config():
    """A VLM whose text model is eager while the top-level config says sdpa gets an additive mask."""
    model = Q.build("qwen2_vl")
    model.set_attn_implementation({"text_config": "eager", "vision_config": "sdpa"})
    assert model.config.get_text_config(decoder=True)._attn_implementation == "eager"
    inputs = Q.make_inputs("qwen2_vl", [{"pre": 3, "images": [(56, 56)], "post": 5}, {"pre": 1, "post": 2}])
    plen = inputs["input_ids"].shape[1]
    ref = model.generate(**inputs, max_new_tokens=16, do_sample=False)
    oracle = NoisyOracleDrafter(ref[:, plen:], depth=4, corrupt_p=0.3, extra_branches=2, vocab_size=Q.VOCAB)
    out = mmspec.generate(model, inputs, oracle, max_new_tokens=16)
    assert torch.equal(out.sequences, ref)


def test_draft_model_with_padded_embeddings(text):
    """A draft whose embedding table has extra padding rows works when the shared vocabulary is named."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    model, _, inputs = text
    torch.manual_seed(3)
    cfg = Qwen2Config(vocab_size=A.VOCAB + 16, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, initializer_range=0.2)
    wide = Qwen2ForCausalLM(cfg).eval()
    with pytest.raises(mmspec.DrafterMismatchError, match="vocab_size"):
        mmspec.generate(model, inputs, DraftModelDrafter(wide), max_new_tokens=4)
    _same(model, inputs, DraftModelDrafter(wide, vocab_size=A.VOCAB), max_new_tokens=12)
    seen = []
    d = DraftModelDrafter(wide, vocab_size=A.VOCAB)
    orig = d.propose
    d.propose = lambda ctx: [seen.append(t.draft_probs.shape) or t for t in orig(ctx)]
    mmspec.generate(model, inputs, d, max_new_tokens=6, do_sample=True, seed=1)
    assert seen and all(s[-1] == A.VOCAB for s in seen)
