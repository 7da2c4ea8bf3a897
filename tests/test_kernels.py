"""mmspec.kernels: every Triton kernel against its plain-torch reference, each reference against today's path.

The Triton kernels run in Triton's CPU interpreter (``TRITON_INTERPRET=1``, set per test by the
``interpret`` fixture; :mod:`mmspec.kernels._launch` makes the interpreter work even when torch or
transformers imported Triton earlier in the same process). Sizes stay small: the interpreter runs every
program instance in numpy. Tolerances for attention: 2e-5 in float32, 2e-3 in float16 (the kernel rounds
the softmax weights to float16 before the second matmul, as flash attention does).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mmspec
from mmspec import kernels
from mmspec.kernels import attention as attn_mod
from mmspec.kernels import dispatch
from mmspec.target import TargetAdapter, pack_trees
from mmspec.tree import DraftTree

from _tiny_archs import PAD, left_pad

pytest.importorskip("triton")

TOL = {torch.float32: 2e-5, torch.float16: 2e-3}


@pytest.fixture
def interpret(monkeypatch):
    """Force the Triton backend on CPU tensors, through Triton's interpreter."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with dispatch.using("triton"):
        yield


def random_tree(rng: np.random.Generator, n: int, vocab: int = 50) -> DraftTree:
    parents = [-1 if i == 0 or rng.random() < 0.25 else int(rng.integers(0, i)) for i in range(n)]
    return DraftTree(rng.integers(0, vocab, n), parents)


def random_batch(rng, sizes, prefix: int):
    """Packed trees of the given sizes and a left-padded validity row per tree (row r has r + 1 fewer slots)."""
    packed = pack_trees([random_tree(rng, n) if n else DraftTree.empty() for n in sizes])
    valid = torch.zeros(len(sizes), prefix, dtype=torch.bool)
    for r in range(len(sizes)):
        valid[r, min(prefix - 1, r) :] = True  # left padding; every row keeps at least one slot
    if prefix > 4:
        valid[0, 1] = False  # a hole inside a row (the validity row, not contiguity, decides)
    return packed, valid


def qkv(b, hq, hkv, nq, prefix, d, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, hq, nq, d, generator=g).to(dtype)
    k = torch.randn(b, hkv, prefix + nq, d, generator=g).to(dtype)
    v = torch.randn(b, hkv, prefix + nq, d, generator=g).to(dtype)
    return q, k, v


# ---------------------------------------------------------------------------------------------- dispatch
def test_dispatch_defaults_and_forcing(monkeypatch):
    monkeypatch.setattr(dispatch, "_chosen", {})
    monkeypatch.delenv(dispatch.ENV, raising=False)
    assert dispatch.backend("cpu") == "reference"
    assert dispatch.backend(torch.device("cuda:1")) == ("triton" if dispatch.triton_available() else "reference")
    monkeypatch.setattr(dispatch, "_chosen", {})
    monkeypatch.setenv(dispatch.ENV, "reference")
    assert dispatch.backend("cuda") == "reference"
    monkeypatch.setenv(dispatch.ENV, "triton")
    assert dispatch.backend("cuda") == "reference"  # chosen once: the first answer stands
    monkeypatch.setattr(dispatch, "_chosen", {})
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        dispatch.backend("cpu")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert dispatch.backend("cpu") == "triton"
    monkeypatch.setattr(dispatch, "_chosen", {})
    monkeypatch.setenv(dispatch.ENV, "fast")
    with pytest.raises(ValueError, match="MMSPEC_KERNELS='fast'"):
        dispatch.backend("cpu")
    with pytest.raises(ValueError):
        with dispatch.using("fast"):
            pass


# ---------------------------------------------------------------------------------------------- attention
@pytest.mark.parametrize("seed", range(4))
def test_visibility_from_parents_equals_dense_tree_mask(seed):
    """The parent arrays pack_trees carries give exactly the dense mask the sdpa path builds."""
    rng = np.random.default_rng(seed)
    packed = pack_trees([random_tree(rng, int(n)) if n else DraftTree.empty() for n in rng.integers(0, 12, 4)])
    assert torch.equal(kernels.tree_visibility(packed.parents, packed.max_depth), packed.tree_mask)
    assert torch.equal(kernels.tree_visibility(packed.parents), packed.tree_mask)


def test_reference_equals_dense_sdpa_path():
    """The reference equals transformers' sdpa attention fed the dense mask TargetAdapter builds today (GQA)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    rng = np.random.default_rng(0)
    packed, valid = random_batch(rng, [5, 0, 9], prefix=6)
    nq = packed.offsets.shape[1]
    q, k, v = qkv(3, 4, 2, nq, 6, 16, torch.float32)
    dense = torch.cat([valid[:, None, :].expand(3, nq, 6), packed.tree_mask], dim=2)[:, None]
    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal, module.training = 2, True, False
    want, _ = sdpa_attention_forward(module, q, k, v, dense, scaling=0.3)
    got = kernels.tree_attention_reference(q, k, v, valid, packed.parents, scale=0.3)
    torch.testing.assert_close(got.transpose(1, 2), want, atol=2e-6, rtol=1e-5)


CASES = {
    # name: (tree sizes per row, cached prefix length)
    "ragged": ([6, 0, 11, 3], 9),
    "empty-draft": ([0, 0], 5),
    "one-token-prefix": ([4, 7], 1),
    "long-prefix": ([13], 70),  # two prefix tiles, one of them partly padded
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("dtype,d,hq,hkv", [(torch.float32, 64, 4, 2), (torch.float16, 128, 2, 1),
                                            (torch.float32, 128, 3, 3)])
def test_tree_attention_kernel_equals_reference(interpret, case, dtype, d, hq, hkv):
    sizes, prefix = CASES[case]
    rng = np.random.default_rng(len(case))
    packed, valid = random_batch(rng, sizes, prefix)
    nq = packed.offsets.shape[1]
    q, k, v = qkv(len(sizes), hq, hkv, nq, prefix, d, dtype, seed=d)
    want = kernels.tree_attention_reference(q, k, v, valid, packed.parents)
    got = kernels.tree_attention(q, k, v, valid, packed.parents, max_depth=packed.max_depth)
    assert got.dtype == dtype and got.shape == want.shape
    torch.testing.assert_close(got.float(), want.float(), atol=TOL[dtype], rtol=TOL[dtype])


def test_kernel_runs_for_covered_inputs_and_falls_back_otherwise(interpret, monkeypatch):
    calls = []
    real = attn_mod._tree_attention_triton
    monkeypatch.setattr(attn_mod, "_tree_attention_triton", lambda *a: calls.append(1) or real(*a))
    parents = torch.tensor([[-1, 0, 1]])
    for d in (64, 32):
        q, k, v = qkv(1, 2, 1, 3, 4, d, torch.float32)
        out = kernels.tree_attention(q, k, v, torch.ones(1, 4, dtype=torch.bool), parents)
        torch.testing.assert_close(out, kernels.tree_attention_reference(q, k, v, torch.ones(1, 4, dtype=torch.bool),
                                                                         parents), atol=2e-5, rtol=1e-5)
    assert calls == [1]  # head dim 64 ran the kernel, 32 the reference
    assert "head dim 32" in kernels.tree_attention_supported(q, k)
    q16 = torch.zeros(1, 1, 1, 64, dtype=torch.bfloat16)
    assert "bfloat16" in kernels.tree_attention_supported(q16, q16)
    with pytest.raises(ValueError, match="do not fit"):
        kernels.tree_attention(q, k, v, torch.ones(1, 3, dtype=torch.bool), parents)


# ---------------------------------------------------------------------------------------------- end to end
def _tiny_qwen2(attn: str):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=64, max_position_embeddings=512,
                      pad_token_id=PAD, bos_token_id=1, eos_token_id=2, initializer_range=0.2,
                      tie_word_embeddings=False, attn_implementation=attn)
    return Qwen2ForCausalLM(cfg).eval()


def test_registered_attention_scores_like_sdpa(interpret):
    """One verify pass through 'mmspec_tree' (the Triton kernel) gives the dense sdpa path's logits."""
    kernels.register_tree_attention()
    model = _tiny_qwen2("sdpa")
    inputs = left_pad([[1, 5, 9, 4, 7, 3], [1, 8, 8]])
    trees = [DraftTree.from_sequences([[3, 4, 5], [6], [3, 9]]), DraftTree.empty()]
    logits = {}
    for impl in ("sdpa", kernels.TREE_ATTENTION):
        model.set_attn_implementation(impl)
        adapter = TargetAdapter(model)
        state, _, _ = adapter.prefill(inputs["input_ids"], {"attention_mask": inputs["attention_mask"]})
        out, packed = adapter.score(state, trees)
        logits[impl] = out.logits
    torch.testing.assert_close(logits[kernels.TREE_ATTENTION], logits["sdpa"], atol=1e-4, rtol=1e-4)


def test_greedy_equals_generate_through_tree_attention(interpret, monkeypatch):
    """mmspec.generate with the model on 'mmspec_tree' (kernel in the interpreter) equals sdpa generate."""
    from mmspec.drafters import NoisyOracleDrafter

    calls = []
    real = attn_mod._tree_attention_triton
    monkeypatch.setattr(attn_mod, "_tree_attention_triton", lambda *a: calls.append(1) or real(*a))
    model = _tiny_qwen2("sdpa")
    inputs = left_pad([[1, 5, 9, 4, 7, 3, 5, 9], [1, 8, 8, 6]])
    new = 10
    ref = model.generate(**inputs, max_new_tokens=new, do_sample=False, pad_token_id=PAD, eos_token_id=None)
    kernels.use_tree_attention(model)
    assert model.config._attn_implementation == kernels.TREE_ATTENTION
    drafter = NoisyOracleDrafter(ref[:, inputs["input_ids"].shape[1]:], depth=3, corrupt_p=0.3, vocab_size=96,
                                 extra_branches=2)
    out = mmspec.generate(model, inputs, drafter=drafter, max_new_tokens=new, pad_token_id=PAD, eos_token_id=None)
    assert torch.equal(out.sequences, ref)
    assert calls and len(calls) == 2 * out.stats.rounds  # every verify pass, both layers, ran the kernel
    assert out.stats.mean_accepted_length > 1
