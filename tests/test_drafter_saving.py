"""Trained drafters save like HF models and refuse another target (fingerprint check)."""

import json
import os

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import mmspec
from mmspec.drafters.saving import TrainableDrafter, target_fingerprint
from mmspec.tree import DraftTree


class LinearHead(TrainableDrafter):
    """A one-layer head over the target's last hidden state: enough to exercise save/load and bind."""

    kind = "linear-head-test"
    hidden_layers = (-1,)

    def __init__(self, hidden_size=16, vocab_size=32, **kw):
        super().__init__(**kw)
        self.hidden_size, self.vocab_size = hidden_size, vocab_size
        self.proj = torch.nn.Linear(hidden_size, vocab_size)

    def config_dict(self):
        return {"hidden_size": self.hidden_size, "vocab_size": self.vocab_size}

    def propose(self, ctx):
        h = ctx.hidden[-1][:, -1]
        return [DraftTree.from_chain([int(t)]) for t in self.proj(h).argmax(-1)]


def _llama(vocab=32, hidden=16, seed=0):
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=32,
                                        num_hidden_layers=2, num_attention_heads=2, initializer_range=0.2)).eval()


def test_round_trip_and_use(tmp_path):
    target = _llama()
    head = LinearHead(fingerprint=target_fingerprint(target, layer_ids=(-1,)))
    torch.nn.init.normal_(head.proj.weight)
    head.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["drafter_kind"] == "linear-head-test" and cfg["target_fingerprint"]["vocab_size"] == 32
    assert (tmp_path / "model.safetensors").is_file() and not any(p.suffix in (".bin", ".pt") for p in tmp_path.iterdir())
    back = LinearHead.from_pretrained(tmp_path, target=target)
    assert torch.equal(back.proj.weight, head.proj.weight)
    inputs = {"input_ids": torch.randint(1, 32, (2, 6)), "attention_mask": torch.ones(2, 6, dtype=torch.long)}
    ref = target.generate(**inputs, max_new_tokens=10, do_sample=False)
    assert torch.equal(mmspec.generate(target, inputs, back, max_new_tokens=10).sequences, ref)


def test_another_target_is_refused(tmp_path):
    head = LinearHead(fingerprint=target_fingerprint(_llama(), layer_ids=(-1,)))
    head.save_pretrained(tmp_path)
    other = _llama(vocab=48)
    with pytest.raises(mmspec.DrafterMismatchError, match="vocab_size: trained for 32, got 48"):
        LinearHead.from_pretrained(tmp_path, target=other)
    loaded = LinearHead.from_pretrained(tmp_path)  # no target given: loads, then refuses when paired
    with pytest.raises(mmspec.DrafterMismatchError):
        mmspec.generate(other, {"input_ids": torch.ones(1, 3, dtype=torch.long)}, loaded, max_new_tokens=2)


def test_tokenizer_hash_is_checked(tmp_path):
    import _tiny_text as T

    tok = T.tokenizer()
    target = _llama(vocab=len(tok))
    head = LinearHead(vocab_size=len(tok), fingerprint=target_fingerprint(target, tok, layer_ids=(-1,)))
    head.save_pretrained(tmp_path)
    LinearHead.from_pretrained(tmp_path, target=target, tokenizer=tok)
    other_tok = T.tokenizer()
    other_tok.add_tokens(["<extra>"])  # same size class, different vocabulary
    with pytest.raises(mmspec.DrafterMismatchError, match="tokenizer_hash"):
        LinearHead.from_pretrained(tmp_path, target=target, tokenizer=other_tok)


def test_missing_or_wrong_kind(tmp_path):
    with pytest.raises(mmspec.InvalidInputError, match="no saved drafter"):
        LinearHead.from_pretrained(tmp_path)
    LinearHead().save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["drafter_kind"] = "eagle"
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(mmspec.InvalidInputError, match="'eagle' drafter"):
        LinearHead.from_pretrained(tmp_path)


def test_a_saved_head_leaves_the_targets_embeddings_out_and_takes_them_back(tmp_path):
    """EAGLE's and the block heads' embeddings and LM head are the target's: the saved file holds only a probe of
    them (a fraction of the size), loading against the target restores them bit for bit in use, loading
    without a target is refused by name, and a same-shaped model with other embeddings is refused."""
    from mmspec.drafters.eagle import EagleDrafter
    from mmspec.drafters.saving import saved_state
    from mmspec.errors import DrafterMismatchError, InvalidInputError
    from mmspec.registry import make_drafter
    from safetensors.torch import load_file

    target = _llama(vocab=512, hidden=16)
    head = EagleDrafter.from_target(target, seed=0)
    head.save_pretrained(tmp_path / "slim")
    head.save_pretrained(tmp_path / "full", with_target_tensors=True)
    slim = load_file(str(tmp_path / "slim" / "model.safetensors"))
    assert "embed_tokens.weight" not in slim and "lm_head.weight" not in slim
    assert slim["target_probe.embed_tokens.weight"].shape == (16, 16)
    size = lambda p: os.path.getsize(p / "model.safetensors")  # noqa: E731
    assert size(tmp_path / "slim") < 0.5 * size(tmp_path / "full")
    cfg = json.loads((tmp_path / "slim" / "config.json").read_text())
    assert cfg["target_tensors"] == {"embed_tokens.weight": "input", "lm_head.weight": "output"}

    loaded = make_drafter(f"eagle:{tmp_path / 'slim'}", target)
    for k, v in head.state_dict().items():
        assert torch.equal(v, loaded.state_dict()[k].to(v.dtype)), k
    with pytest.raises(InvalidInputError, match="target's own weights"):
        EagleDrafter.from_pretrained(tmp_path / "slim")
    assert EagleDrafter.from_pretrained(tmp_path / "full").fingerprint == head.fingerprint  # whole: no target needed
    other = _llama(vocab=512, hidden=16, seed=1)  # same fingerprint, other weights
    with pytest.raises(DrafterMismatchError, match="embed_tokens"):
        make_drafter(f"eagle:{tmp_path / 'slim'}", other)
    # a bf16 copy of the target still matches its probe (rounding is far below the tolerance)
    bf16 = _llama(vocab=512, hidden=16).to(torch.bfloat16)
    assert make_drafter(f"eagle:{tmp_path / 'slim'}", bf16).embed_tokens.weight.dtype == torch.bfloat16
    # training's resume path: the head's own copies stand in for the target
    state = saved_state(tmp_path / "slim", head, shared=head.held_target_tensors())
    assert set(state) == set(head.state_dict())
