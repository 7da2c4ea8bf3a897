"""``mmspec.lean``: the decoder stack's forward without the transformers call stack gives the model's numbers bit
for bit (logits, every hidden state, the cache it appends to) in float32 and bfloat16, for the layer kinds it
claims, with and without a mask, for one new token and several; the target adapter's verify passes through it are
the model's own passes (scores, hidden states and committed caches equal over rounds of random trees at batch 2);
models it cannot run are named with the reason. ``mmspec.lean_vision``: Qwen2-VL's vision tower without the call stack
gives ``get_image_features``' per-image features bit for bit (fp32, bf16; one image, two of different grids, a
two-frame grid), its per-grid set-up cached and reused; the patch matmul is close, not the default; towers it
cannot run (eager or flash attention, Qwen2.5-VL's windowed tower) are named with the reason."""

import numpy as np
import pytest
import torch
from transformers import DynamicCache

import _tiny_archs as A
import _tiny_qwen_vl as Q


def _model(name):
    if name == "qwen2":
        return A.qwen2_text().model
    if name == "llama":
        from transformers import LlamaForCausalLM

        torch.manual_seed(0)
        return LlamaForCausalLM(A._llama_text(64, 2, attn_implementation="sdpa")).eval()
    return Q.build("qwen2_vl")


def _same(a, b) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", ["qwen2", "llama", "qwen2_vl"])
def test_lean_forward_is_the_model_bit_for_bit(name, dtype):
    from mmspec.lean import LeanForward, why_not

    m = _model(name).to(dtype)
    assert why_not(m) == ""
    assert m.config.get_text_config().num_attention_heads > m.config.get_text_config().num_key_value_heads  # GQA
    lean = LeanForward(m)
    torch.manual_seed(1)
    B, L = 2, 7
    mrope = name == "qwen2_vl"

    def positions(a, b):
        p = torch.arange(a, b)[None].expand(B, -1)
        return p[None].expand(3, B, -1) if mrope else p

    # no mask over an empty cache: transformers runs SDPA's is_causal, so does lean
    c1, c2 = DynamicCache(config=m.config), DynamicCache(config=m.config)
    ids = torch.randint(3, 100, (B, L))
    ref = m(input_ids=ids, position_ids=positions(0, L), cache=c1, use_cache=True, output_hidden_states=True)
    got = lean(ids, position_ids=positions(0, L), attention_mask=None, cache=c2, output_hidden_states=True)
    assert torch.equal(ref.logits, got.logits) and _same(ref.hidden_states, got.hidden_states)
    ref_cache, lean_cache = DynamicCache(config=m.config), DynamicCache(config=m.config)
    causal = torch.ones(B, 1, L, L, dtype=torch.bool).tril()
    ref = m(input_ids=ids, position_ids=positions(0, L), attention_mask=causal, cache=ref_cache, use_cache=True,
            output_hidden_states=True)
    got = lean(ids, position_ids=positions(0, L), attention_mask=causal, cache=lean_cache, output_hidden_states=True)
    assert torch.equal(ref.logits, got.logits) and _same(ref.hidden_states, got.hidden_states)
    # verify-like passes: a random tree mask over the cache, several tokens, then one (transformers packs a single
    # masked query's heads, another kernel path), then no mask (causal among the new tokens)
    for q, masked in ((5, True), (3, True), (1, True), (4, False)):
        new = torch.randint(3, 100, (B, q))
        mask = None
        if masked:
            tree = (torch.rand(B, 1, q, q) > 0.3) | torch.eye(q, dtype=torch.bool)
            mask = torch.cat([torch.ones(B, 1, q, L, dtype=torch.bool), tree], dim=-1)
        ref = m(input_ids=new, position_ids=positions(L, L + q), attention_mask=mask, cache=ref_cache, use_cache=True,
                output_hidden_states=True)
        got = lean(new, position_ids=positions(L, L + q), attention_mask=mask, cache=lean_cache,
                   output_hidden_states=True)
        assert torch.equal(ref.logits, got.logits), (q, masked, (ref.logits - got.logits).abs().max())
        assert _same(ref.hidden_states, got.hidden_states)
        assert all(torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
                   for a, b in zip(ref_cache.layers, lean_cache.layers))
        L += q


def _inputs(name):
    if name == "qwen2_vl":
        return Q.make_inputs("qwen2_vl", [{"pre": 3, "images": [(56, 56)], "post": 5}, {"pre": 2, "post": 4}])
    return A.left_pad([[A.BOS, 5, 9, 14, 3, 22, 7], [A.BOS, 8, 30, 2]])


@pytest.mark.parametrize("name", ["qwen2", "qwen2_vl"])
def test_lean_verify_passes_are_the_models_over_rounds_at_batch_2(name):
    """Two adapters on one model, one lean: the same random trees each round give the same scores and hidden states
    bit for bit, and after the same commits the same caches, over rows of different lengths (left padding)."""
    from mmspec.target import TargetAdapter
    from mmspec.tree import DraftTree

    m = _model(name)
    inputs = _inputs(name)
    ids = inputs.pop("input_ids")
    plain, lean = TargetAdapter(m, hidden_layers=(1, 2)), TargetAdapter(m, hidden_layers=(1, 2), lean=True)
    assert lean._lean is not None and plain._lean is None
    s1, l1, h1 = plain.prefill(ids, dict(inputs))
    s2, l2, h2 = lean.prefill(ids, dict(inputs))
    rng = np.random.default_rng(0)
    for _ in range(4):
        trees = []
        for _ in range(ids.shape[0]):
            n = int(rng.integers(0, 6))
            trees.append(DraftTree(rng.integers(3, 100, n), [int(rng.integers(-1, i)) for i in range(n)]))
        a, _ = plain.score(s1, trees)
        b, _ = lean.score(s2, trees)
        assert torch.equal(a.logits, b.logits) and all(torch.equal(a.hidden_states[k], b.hidden_states[k]) for k in (1, 2))
        # an accepted path: the last node and its ancestors (not always a prefix, so the commit's gathers run)
        paths = []
        for t in trees:
            node, path = len(t) - 1, []
            while node >= 0:
                path.insert(0, node)
                node = int(t.parents[node])
            paths.append(path)
        nxt = a.logits[:, 0].argmax(-1)
        plain.commit(s1, paths, nxt)
        lean.commit(s2, paths, nxt)
        assert all(torch.equal(x.keys, y.keys) and torch.equal(x.values, y.values)
                   for x, y in zip(s1.cache.layers, s2.cache.layers))


def test_lean_says_what_it_cannot_run():
    from mmspec.lean import LeanForward, why_not
    from mmspec.errors import UnsupportedModelError
    from mmspec.target import TargetAdapter

    eager = A.qwen2_text(attn_implementation="eager").model
    assert "eager" in why_not(eager)
    with pytest.raises(UnsupportedModelError, match="eager"):
        LeanForward(eager)
    assert TargetAdapter(eager, lean=True)._lean is None  # the model's own forward runs
    assert why_not(torch.nn.Linear(2, 2)) == "no decoder layers"
    assert "are not transformers'" in why_not(A.paligemma().model)  # Gemma layers: another norm, another MLP
    # from_pretrained kernelizes by default where the kernels package is installed, yet a layer keeps its own forward
    # where the device has no hub kernel (every layer on CPU): the lean forward still runs; a replaced one is refused
    kernelized = A.qwen2_text().model
    kernelized._use_kernels = True
    assert why_not(kernelized) == ""
    kernelized.model.layers[0].mlp.forward = lambda x: x
    assert "hub kernels" in why_not(kernelized)


def test_generate_with_lean_verify_passes_equals_generate_at_batch_2():
    """``mmspec.generate(..., lean=True)``: token for token the target's own greedy ``generate`` (left-padded batch
    of 2, a lookup drafter's trees), and under classifier-free guidance the lean adapter's guided scores are the
    model's."""
    from mmspec import generate
    from mmspec.target import Guidance, TargetAdapter
    from mmspec.tree import DraftTree

    m = _model("qwen2")
    inputs = A.left_pad([[A.BOS, 5, 9, 14, 5, 9, 14, 5, 9], [A.BOS, 8, 30, 2, 8, 30]])
    ref = m.generate(**inputs, max_new_tokens=24, do_sample=False, pad_token_id=A.PAD)
    out = generate(m, inputs, drafter="lookup", lean=True, max_new_tokens=24, do_sample=False)
    assert torch.equal(out.sequences, ref) and out.stats.rounds < 24  # the lookup drafts were used
    ids = inputs["input_ids"]
    g = Guidance(1.5, torch.where(inputs["attention_mask"].bool(), torch.full_like(ids, 3), ids))
    plain, lean = TargetAdapter(m, guidance=g), TargetAdapter(m, guidance=g, lean=True)
    assert lean._lean is not None
    s1, _, _ = plain.prefill(ids, {"attention_mask": inputs["attention_mask"]})
    s2, _, _ = lean.prefill(ids, {"attention_mask": inputs["attention_mask"]})
    trees = [DraftTree([7, 8, 9], [-1, 0, 0]), DraftTree([4], [-1])]
    a, _ = plain.score(s1, trees)
    b, _ = lean.score(s2, trees)
    assert a.logits.shape[0] == 2 and torch.equal(a.logits, b.logits)


def _vision_inputs():
    """``(pixel_values, grid_thw)`` for one image, for two images of different grids, and for one two-frame grid
    (per-frame attention: two SDPA segments in one item), as the Qwen2-VL image processor lays them out."""
    one = Q.make_inputs("qwen2_vl", [{"images": [(56, 56)]}])
    two = Q.make_inputs("qwen2_vl", [{"images": [(56, 56), (28, 56)]}], seed=1)
    grid = torch.tensor([[2, 4, 4]])
    frames = torch.randn(int(grid.prod()), one["pixel_values"].shape[1], generator=torch.Generator().manual_seed(2))
    return [(one["pixel_values"], one["image_grid_thw"]), (two["pixel_values"], two["image_grid_thw"]),
            (frames, grid)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lean_vision_is_get_image_features_bit_for_bit(dtype):
    from mmspec.lean_vision import LeanVision, why_not

    m = Q.build("qwen2_vl").to(dtype)
    assert why_not(m) == "" and why_not(m.model) == "" and why_not(m.model.visual) == ""
    lean = LeanVision(m)
    assert not lean.patch_matmul  # the inexact patch embedding is opt-in
    for pv, grid in _vision_inputs():
        ref = m.get_image_features(pv.to(dtype), grid).pooler_output
        got = lean(pv.to(dtype), grid)
        assert isinstance(got, tuple) and len(got) == len(ref) == grid.shape[0]
        assert all(a.dtype == dtype and torch.equal(a, b) for a, b in zip(got, ref))
    # the set-up is cached per grid: the same grid again (as a tensor or triples) reuses it and gives the same bits
    n = len(lean._setup)
    assert n == 3
    pv, grid = _vision_inputs()[1]
    again, triples = lean(pv.to(dtype), grid), lean(pv.to(dtype), [tuple(g) for g in grid.tolist()])
    assert len(lean._setup) == n
    assert all(torch.equal(a, b) and torch.equal(a, c)
               for a, b, c in zip(again, triples, m.get_image_features(pv.to(dtype), grid).pooler_output))


def test_lean_vision_patch_matmul_is_close_not_the_default():
    """The patch embedding as one matmul over the flattened patches: the conv's sum in another order, so close to the
    model's features in fp32 (not claimed equal)."""
    from mmspec.lean_vision import LeanVision

    m = Q.build("qwen2_vl")
    lean, exact = LeanVision(m, patch_matmul=True), LeanVision(m)
    assert lean.patch_matmul and not exact.patch_matmul
    for pv, grid in _vision_inputs():
        ref = m.get_image_features(pv, grid).pooler_output
        assert torch.allclose(lean.embed(pv), exact.embed(pv), rtol=1e-5, atol=1e-5)
        assert all(torch.allclose(a, b, rtol=1e-4, atol=1e-5) for a, b in zip(lean(pv, grid), ref))


def test_lean_vision_says_what_it_cannot_run():
    import copy

    from mmspec.errors import UnsupportedModelError
    from mmspec.lean_vision import LeanVision, why_not

    m = Q.build("qwen2_vl")
    for impl in ("eager", "flash_attention_2"):
        other = copy.deepcopy(m)
        other.model.visual.config._attn_implementation = impl
        assert why_not(other) == f"vision attention {impl!r}, not sdpa"
        with pytest.raises(UnsupportedModelError, match=impl):
            LeanVision(other)
    assert "Qwen2_5_VisionTransformerPretrainedModel" in why_not(Q.build("qwen2_5_vl"))  # the windowed tower
    assert "Linear" in why_not(torch.nn.Linear(2, 2))
    wrapped = copy.deepcopy(m)
    wrapped.model.visual.blocks[0].attn.qkv = torch.nn.Sequential(wrapped.model.visual.blocks[0].attn.qkv)
    assert "plain Linear" in why_not(wrapped)  # its weights are read directly: a wrapper would be skipped
    # from_pretrained kernelizes by default where the kernels package is installed: the tower keeps its own forwards
    # (none of its layers has a kernel on this device), so it still runs; a replaced forward is refused
    kernelized = copy.deepcopy(m)
    kernelized._use_kernels = True
    assert why_not(kernelized) == ""
    kernelized.model.visual.blocks[0].norm1.forward = lambda x: x
    assert "replaced forward" in why_not(kernelized)
