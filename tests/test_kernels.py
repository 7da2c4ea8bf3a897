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


@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_greedy_equals_generate_through_tree_attention(monkeypatch, backend):
    """mmspec.generate with the model on 'mmspec_tree' (the kernel in the interpreter, or the reference that
    a CPU run picks by default) equals sdpa generate."""
    from mmspec.drafters import NoisyOracleDrafter

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(dispatch, "_override", [backend])
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
    # every verify pass, both layers, ran the kernel (or none did)
    assert len(calls) == (2 * out.stats.rounds if backend == "triton" else 0) and out.stats.rounds
    assert out.stats.mean_accepted_length > 1



@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen2_vl", "qwen3_vl"])
def test_vlm_greedy_equals_generate_through_tree_attention(interpret, monkeypatch, family):
    """Qwen2-VL / Qwen3-VL (M-RoPE, images, batch 4, trees) with only the text decoder on 'mmspec_tree'."""
    import _tiny_qwen_vl as T
    from mmspec.drafters import NoisyOracleDrafter

    prompts = [{"pre": 3, "images": [(56, 56)], "post": 5}, {"pre": 1, "post": 2},
               {"pre": 6, "images": [(28, 56), (56, 28)], "post": 3}, {"pre": 2, "images": [(56, 56)], "post": 9}]
    calls = []
    real = attn_mod._tree_attention_triton
    monkeypatch.setattr(attn_mod, "_tree_attention_triton", lambda *a: calls.append(1) or real(*a))
    model = T.build(family, hidden=256)  # head dim 64: the kernel's
    inputs = T.make_inputs(family, prompts)
    ref = model.generate(**inputs, max_new_tokens=8, do_sample=False)
    kernels.use_tree_attention(model)
    assert model.config.text_config._attn_implementation == kernels.TREE_ATTENTION
    assert model.config.vision_config._attn_implementation == "sdpa"
    plen = inputs["input_ids"].shape[1]
    drafter = NoisyOracleDrafter(ref[:, plen:], depth=3, extra_branches=2, vocab_size=T.VOCAB)
    out = mmspec.generate(model, inputs, drafter=drafter, max_new_tokens=8)
    assert torch.equal(out.sequences, ref)
    assert len(calls) == 2 * out.stats.rounds and out.stats.mean_accepted_length > 1


# ---------------------------------------------------------------------------------------------- acceptance
def _batch_for_acceptance(rng, sizes, vocab):
    trees = [random_tree(rng, n, vocab) if n else DraftTree.empty() for n in sizes]
    return trees, pack_trees(trees)


def _chain_targets(packed, bonus: int = 0):
    """target_ids that accept every node of a chain: query j predicts node j's token, then ``bonus``."""
    b, n = packed.tokens.shape
    ids = torch.full((b, n + 1), bonus, dtype=torch.long)
    for r in range(b):
        k = int(packed.n_nodes[r])
        ids[r, :k] = packed.tokens[r, :k]
    return ids


@pytest.mark.parametrize("seed", range(3))
def test_greedy_reference_equals_core_rule(seed):
    from mmspec.acceptance import GreedyRule

    rng = np.random.default_rng(seed)
    trees, packed = _batch_for_acceptance(rng, [9, 0, 14, 5, 1], vocab=3)
    scores = torch.randn(len(trees), packed.offsets.shape[1], 3, generator=torch.Generator().manual_seed(seed))
    out = kernels.greedy_accept_reference(packed.tokens, packed.parents, packed.n_nodes, scores.argmax(-1))
    lengths = []
    for r, tree in enumerate(trees):
        want = GreedyRule().accept(tree, scores[r, : len(tree) + 1])
        assert out.path[r, : len(want.path)].tolist() == want.path and int(out.next_tokens[r]) == want.next_token
        lengths.append(len(want.path))
    assert out.lengths.tolist() == lengths and max(lengths) >= 2  # the walk went deeper than one node


def test_greedy_kernel_equals_reference(interpret):
    rng = np.random.default_rng(1)
    trees, packed = _batch_for_acceptance(rng, [9, 0, 14, 5, 1, 3], vocab=3)
    ids = torch.from_numpy(rng.integers(0, 3, packed.offsets.shape))
    chains = pack_trees([DraftTree.from_chain([4, 5, 6]), DraftTree.from_chain([7]), DraftTree.empty()])
    active = torch.tensor([True, True, True, True, False, True])
    for packed, ids, act in ((packed, ids, None), (packed, ids, active), (chains, _chain_targets(chains, 9), None)):
        args = (packed.tokens, packed.parents, packed.n_nodes, ids, act)
        got, want = kernels.greedy_accept(*args), kernels.greedy_accept_reference(*args)
        for a, b in zip(got, want):
            assert torch.equal(a, b), (got, want)
    assert want.lengths.tolist() == [3, 1, 0] and want.next_tokens.tolist() == [9, 9, 9]  # full acceptance
    assert kernels.greedy_accept(*args[:4], torch.tensor([True, False, True])).committed[1].tolist() == [-1, -1, -1, -1]


def _sampling_case(seed: int, sizes, vocab: int, with_q: bool):
    rng = np.random.default_rng(seed)
    trees, packed = _batch_for_acceptance(rng, sizes, vocab)
    g = torch.Generator().manual_seed(seed)
    b, q = packed.offsets.shape
    logits = 2 * torch.randn(b, q, vocab, generator=g)
    for r in range(b):  # the target likes the drafted tokens, so walks go deep and also stop early
        for i in range(int(packed.n_nodes[r])):
            logits[r, packed.parents[r, 1 + i], packed.tokens[r, i]] += 2 + 5 * torch.rand((), generator=g)
    probs = torch.softmax(logits, -1)
    draft = None
    if with_q:
        draft = torch.softmax(2 * torch.randn(b, q - 1, vocab, generator=g), -1)
        draft[0] = 0  # row 0 deterministic (an all-zero q), the others drawn from q
    return trees, packed, probs, draft


@pytest.mark.parametrize("with_q", [False, True])
def test_sampling_kernel_equals_reference(interpret, with_q):
    sizes = [9, 0, 14, 5, 3]
    trees, packed, probs, draft = _sampling_case(2, sizes, vocab=40, with_q=with_q)
    active = torch.tensor([True, True, True, True, False])
    depths = []
    for seed in range(3):
        u, e = kernels.draw_randomness(len(sizes), packed.tokens.shape[1], 40, torch.Generator().manual_seed(seed))
        args = (packed.tokens, packed.parents, packed.n_nodes, probs, u, e, draft, active if seed == 2 else None)
        got, want = kernels.sampling_accept(*args), kernels.sampling_accept_reference(*args)
        for a, b in zip(got, want):
            assert torch.equal(a, b), (got, want)
        depths += want.lengths.tolist()
    assert max(depths) >= 2 and want.committed[4].tolist() == [-1] * 15


def test_sampling_kernel_full_acceptance_and_empty_draft(interpret):
    chains = pack_trees([DraftTree.from_chain([3, 1, 2]), DraftTree.empty()])
    probs = torch.full((2, 4, 5), 1e-3)
    for j, tok in enumerate([3, 1, 2]):
        probs[0, j, tok] = 1.0
    probs = probs / probs.sum(-1, keepdim=True)
    u, e = kernels.draw_randomness(2, 3, 5, torch.Generator().manual_seed(0))
    u = u * probs[0, 0, 3]  # below p(x) at every node: the whole chain is accepted
    args = (chains.tokens, chains.parents, chains.n_nodes, probs, u, e)
    got, want = kernels.sampling_accept(*args), kernels.sampling_accept_reference(*args)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    assert want.lengths.tolist() == [3, 0] and want.committed[0, :3].tolist() == [3, 1, 2]
    assert int(want.next_tokens[1]) == int(torch.argmax(probs[1, 0] / e[1]))


def _tested_order(tree: DraftTree, path: list) -> list:
    """The children SpeculativeSamplingRule tests (one uniform each, in this order) to end on ``path``."""
    kids, order, cur = tree.children(), [], -1
    for step in range(len(path) + 1):
        for c in kids[cur + 1]:
            order.append(c)
            if step < len(path) and c == path[step]:
                break
        if step < len(path):
            cur = path[step]
    return order


@pytest.mark.parametrize("with_q", [False, True])
def test_sampling_reference_walks_like_core_rule(with_q):
    """Fed the uniforms the core rule drew, node by node, the reference accepts the same path."""
    from mmspec.acceptance import SpeculativeSamplingRule

    sizes = [9, 0, 14, 5, 3]
    trees, packed, probs, draft = _sampling_case(3, sizes, vocab=6, with_q=with_q)
    lengths = []
    for seed in range(12):
        uniforms = torch.zeros(packed.tokens.shape)
        paths = []
        for r, tree in enumerate(trees):
            if with_q:
                tree = DraftTree(tree.tokens, tree.parents, draft[r, : len(tree)])
            logits = probs[r, : len(tree) + 1].log()
            res = SpeculativeSamplingRule().accept(tree, logits, torch.Generator().manual_seed(seed))
            replay = torch.Generator().manual_seed(seed)
            for c in _tested_order(tree, res.path):
                uniforms[r, c] = torch.rand((), generator=replay)
            paths.append(res.path)
        e = torch.ones(len(sizes), 6)
        out = kernels.sampling_accept_reference(packed.tokens, packed.parents, packed.n_nodes,
                                                torch.softmax(probs.log(), -1), uniforms, e, draft)
        assert [out.path[r, : len(p)].tolist() for r, p in enumerate(paths)] == paths
        assert out.lengths.tolist() == [len(p) for p in paths]
        lengths += [len(p) for p in paths]
    assert max(lengths) >= 2 and 0 in lengths


def test_sampling_reference_first_token_law():
    """The first committed token follows the target's p at the root (lossless), over a tree whose tokens are
    drawn from their q (two i.i.d. siblings at the root sharing q, one child under each)."""
    from collections import Counter

    from _chisq import chisq_pvalue

    n, v = 1500, 4
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(1, 5, v, generator=g), -1).expand(n, 5, v)
    q = torch.softmax(torch.randn(3, v, generator=g), -1)
    draft = q[[0, 0, 1, 2]].expand(n, 4, v)
    tokens = torch.stack([torch.multinomial(draft[0, i], n, replacement=True, generator=g) for i in range(4)], 1)
    parents = torch.tensor([[-1, 0, 0, 1, 2]]).expand(n, 5)
    u, e = kernels.draw_randomness(n, 4, v, g)
    out = kernels.sampling_accept_reference(tokens, parents, torch.full((n,), 4), probs, u, e, draft)
    counts = Counter(out.committed[:, 0].tolist())
    assert chisq_pvalue(counts, dict(enumerate(probs[0, 0].tolist())), n) > 1e-3
    assert 0 < int((out.lengths == 0).sum()) < n  # both outcomes at the root: acceptances and residual draws


# ---------------------------------------------------------------------------------------------- compaction
@pytest.mark.parametrize("dtype,d", [(torch.float32, 64), (torch.float16, 24)])
def test_gather_slots_kernel_equals_reference(interpret, dtype, d):
    g = torch.Generator().manual_seed(d)
    keys = torch.randn(3, 2, 11, d, generator=g).to(dtype)
    values = torch.randn(3, 2, 11, d, generator=g).to(dtype)
    index = torch.randint(0, 11, (2, 9), generator=g)
    for rows in (None, torch.tensor([2, 0])):
        idx = index if rows is not None else torch.randint(0, 11, (3, 9), generator=g)
        got = kernels.gather_slots(keys, values, idx, rows)
        want = kernels.gather_slots_reference(keys, values, idx, rows)
        assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_commit_with_kernels_equals_reference():
    """TargetAdapter.commit (uneven paths, a finished row leaving) moves the same bytes either way."""
    model = _tiny_qwen2("sdpa")
    inputs = left_pad([[1, 5, 9, 4, 7, 3], [1, 8, 8], [1, 2, 3, 4]])
    trees = [DraftTree.from_sequences([[3, 4, 5], [6]]), DraftTree.empty(), DraftTree.from_chain([7, 7])]
    caches = []
    for name in ("reference", "triton"):
        with dispatch.using("reference"):
            adapter = TargetAdapter(model)
            state, _, _ = adapter.prefill(inputs["input_ids"], {"attention_mask": inputs["attention_mask"]})
            adapter.score(state, trees)
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("TRITON_INTERPRET", "1")
            with dispatch.using(name):
                adapter.commit(state, [[0, 1], [], [0]], torch.tensor([4, 5, 6]), keep_rows=[0, 2])
        caches.append([(layer.keys.clone(), layer.values.clone()) for layer in state.cache.layers] + [state.valid])
    assert caches[0][-1].tolist() == [[True] * 9, [False] * 3 + [True] * 6]  # 6 + 1 + 2 and 4 + 1 + 1 slots
    for a, b in zip(caches[0][:-1], caches[1][:-1]):
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


# ---------------------------------------------------------------------------------------------- CUDA build
_COMPILE_FOR_CUDA = """
import inspect

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from mmspec.kernels import _acceptance_kernel as acc, _attention_kernel as att, _compaction_kernel as comp


def build(fn, types, constexprs):
    sig = dict(zip(inspect.signature(fn).parameters, types + ["constexpr"] * len(constexprs)))
    compiled = triton.compile(ASTSource(triton.jit(fn), sig, constexprs), target=GPUTarget("cuda", 90, 32))
    assert "cubin" in compiled.asm, fn.__name__


build(acc._greedy, ["*i64"] * 4 + ["*i8"] + ["*i64"] * 3 + ["i32"] * 6, {"BLOCK": 64})
sampling = ["*i64"] * 3 + ["*fp32"] * 4 + ["*i8", "*fp32"] + ["*i64"] * 3 + ["i32"] * 11
for has_q in (False, True):
    build(acc._sampling, sampling, {"HAS_Q": has_q, "BLOCK_V": 1024})
build(comp._gather, ["*bf16"] * 4 + ["*i64"] * 2 + ["i32"] * 14, {"BLOCK_T": 32, "BLOCK_D": 128})
for dt, d, precision in (("bf16", 128, "tf32"), ("fp32", 64, "ieee")):  # fp16 builds as bf16 does
    types = [f"*{dt}"] * 4 + ["*i8", "*i32"] + ["i32"] * 21 + ["fp32"]
    build(att._tree_attention, types, {"HEAD_DIM": d, "BLOCK_M": 64, "BLOCK_N": 64 if d == 64 else 32,
                                       "PRECISION": precision})
print("built")
"""


@pytest.mark.slow
def test_kernels_compile_for_cuda_without_a_gpu():
    """The interpreter forgives what the compiler refuses (types of loop-carried values, say): build each
    kernel for an sm_90 GPU with Triton's bundled ptxas, as a GPU run would.

    In a fresh process without ``TRITON_INTERPRET``: Triton fixes interpreted vs compiled mode for its own
    library functions when it is first imported, and the README runs these tests with the variable set (so
    in this process ``triton.jit`` and ``tl.max`` are interpreter objects, which cannot be compiled)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", _COMPILE_FOR_CUDA], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0 and "built" in done.stdout, done.stderr[-3000:]


@pytest.mark.parametrize("with_q", [False, True])
def test_core_rules_run_the_fused_kernels_where_triton_is_the_backend(interpret, monkeypatch, with_q):
    """On a Triton device the core's GreedyRule and SpeculativeSamplingRule walk the whole batch in one kernel
    launch each: greedy gives exactly the per-row walk's results; sampling gives what the kernel reference gives
    for the draws made from the same generator (the kernels' own tests tie that reference to the core rule's
    law). Rows without draft probabilities propose deterministically beside rows with them."""
    from mmspec import acceptance
    from mmspec.kernels import acceptance as kacc

    calls = []
    for name in ("greedy_accept", "sampling_accept"):
        real = getattr(kacc, name)
        monkeypatch.setattr(kacc, name, lambda *a, _real=real, _name=name, **k: calls.append(_name) or _real(*a, **k))
    sizes = [9, 0, 14, 5, 3]
    trees, packed, probs, draft = _sampling_case(4, sizes, vocab=6, with_q=with_q)
    if with_q:
        trees = [DraftTree(t.tokens, t.parents, draft[r, : len(t)]) if r else t for r, t in enumerate(trees)]
    scores = probs.log()
    fused = acceptance.GreedyRule().accept_batch(trees, scores)
    with dispatch.using("reference"):
        plain = acceptance.GreedyRule().accept_batch(trees, scores)
    assert fused == plain and calls == ["greedy_accept"]
    got = acceptance.SpeculativeSamplingRule().accept_batch(trees, scores, torch.Generator().manual_seed(7))
    assert calls == ["greedy_accept", "sampling_accept"]
    b, n = packed.tokens.shape
    u, e = kacc.draw_randomness(b, n, 6, torch.Generator().manual_seed(7))
    q = None if not with_q else torch.cat([torch.zeros(1, n, 6), draft[1:]])
    want = kacc.sampling_accept_reference(packed.tokens, packed.parents, packed.n_nodes, probs, u, e, q)
    assert [r.path for r in got] == [want.path[r, : int(k)].tolist() for r, k in enumerate(want.lengths)]
    assert [r.next_token for r in got] == want.next_tokens.tolist()
    assert max(len(r.path) for r in got) >= 2


def test_sampling_generate_through_the_fused_rule(monkeypatch):
    """mmspec.generate sampling on a tiny Qwen2 with the kernels forced on (interpreter): every round's
    acceptance (and the first token's) is one fused launch and the output is a valid sample (prompt kept, tokens in the vocabulary);
    greedy generation with the fused greedy walk equals generate."""
    from mmspec.drafters import NoisyOracleDrafter
    from mmspec.kernels import acceptance as kacc

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(dispatch, "_override", ["triton"])
    calls, greedy_calls = [], []
    real, real_greedy = kacc.sampling_accept, kacc.greedy_accept
    monkeypatch.setattr(kacc, "sampling_accept", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(kacc, "greedy_accept", lambda *a, **k: greedy_calls.append(1) or real_greedy(*a, **k))
    model = _tiny_qwen2("sdpa")
    inputs = left_pad([[1, 5, 9, 4, 7, 3, 5, 9], [1, 8, 8, 6]])
    ref = model.generate(**inputs, max_new_tokens=8, do_sample=False, pad_token_id=PAD, eos_token_id=None)
    oracle = ref[:, inputs["input_ids"].shape[1]:]
    out = mmspec.generate(model, inputs, drafter=NoisyOracleDrafter(oracle, depth=3, corrupt_p=0.3, vocab_size=96),
                          max_new_tokens=8, pad_token_id=PAD, eos_token_id=None)
    assert torch.equal(out.sequences, ref) and len(greedy_calls) == out.stats.rounds + 1
    out = mmspec.generate(model, inputs, drafter=NoisyOracleDrafter(oracle, depth=3, corrupt_p=0.3, vocab_size=96),
                          max_new_tokens=8, do_sample=True, seed=0, pad_token_id=PAD, eos_token_id=None)
    assert out.stats.rounds and len(calls) == out.stats.rounds + 1  # the first token is an empty tree's walk
    assert torch.equal(out.sequences[:, : inputs["input_ids"].shape[1]], inputs["input_ids"])
    assert int(out.sequences.max()) < model.config.vocab_size


@pytest.mark.parametrize("base", ["greedy", "speculative_sampling"])
def test_a_subclass_overriding_accept_keeps_its_own_walk_on_a_triton_device(interpret, monkeypatch, base):
    """A registered rule that subclasses a core rule and overrides ``accept`` (the documented extension point) is
    walked by its own ``accept`` per row; the core rule's batched shortcuts (the fused launch, the one-argmax walk)
    must not replace it."""
    from mmspec import acceptance
    from mmspec.kernels import acceptance as kacc

    launches = []
    for name in ("greedy_accept", "sampling_accept"):
        monkeypatch.setattr(kacc, name, lambda *a, _name=name, **k: launches.append(_name))
    parent = acceptance.GreedyRule if base == "greedy" else acceptance.SpeculativeSamplingRule

    class Stubborn(parent):  # never accepts, always emits token 0
        def accept(self, tree, scores, generator=None):
            return acceptance.AcceptResult([], 0)

    trees, _, probs, _ = _sampling_case(4, [3, 0, 5], vocab=6, with_q=False)
    got = Stubborn().accept_batch(trees, probs.log(), torch.Generator().manual_seed(0))
    assert got == [acceptance.AcceptResult([], 0)] * 3 and launches == []


@pytest.mark.parametrize("hook", ["accept_prob", "residual"])
def test_a_rule_overriding_a_sampling_hook_keeps_the_walk_on_a_triton_device(interpret, monkeypatch, hook):
    """Relaxed rules (image_ar/relaxed.py) override SpeculativeSamplingRule's per-node hooks, not ``accept``: the
    fused launch (which knows only the lossless test) must not replace their walk, and the walk must call them."""
    from mmspec import acceptance
    from mmspec.kernels import acceptance as kacc

    launches = []
    monkeypatch.setattr(kacc, "sampling_accept", lambda *a, **k: launches.append("sampling_accept"))
    calls = []

    class Generous(acceptance.SpeculativeSamplingRule):
        lossless = False

    if hook == "accept_prob":
        Generous.accept_prob = lambda self, p, q, x: calls.append(x) or 1.0  # accepts every first child
    else:
        Generous.residual = lambda self, p, q, x: calls.append(x) or torch.nn.functional.one_hot(
            torch.tensor(5), p.shape[0]).float()  # after any rejection only token 5 remains
    trees, _, probs, _ = _sampling_case(4, [3, 0, 5], vocab=6, with_q=False)
    flat = torch.zeros_like(probs)  # uniform p: one-hot drafts are accepted 1 time in 6, so rejections happen
    got = Generous().accept_batch(trees, flat, torch.Generator().manual_seed(0))
    assert launches == [] and calls
    if hook == "accept_prob":
        assert got[1].path == [] and all(len(r.path) >= 1 for i, r in enumerate(got) if i != 1)
    else:
        for tree, res in zip(trees, got):
            if tree.children()[(res.path[-1] if res.path else -1) + 1]:  # its last node's children all rejected
                assert res.next_token == 5
