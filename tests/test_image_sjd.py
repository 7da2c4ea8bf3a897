"""Speculative Jacobi Decoding for the image generator (image_ar/sjd.py) and the guided target it runs on
(mmspec.target.Guidance): greedy equals plain AR token for token at batch > 1, with and without guidance; under
sampling the committed codes follow the target's exact law (chi-square, as tests/test_sampling_e2e.py), guided
at scale 1.5 with temperature and top-k too.

The law is checked on a tiny llama generator built here (6 text tokens, 3 image codes): one forward pass over
every continuation gives the exact guided conditionals, processed as ``generate_codes`` processes them (guidance
``u + s (c - u)``, codes only, temperature, top-k), so the law of the first four codes (81 outcomes) is known.
"""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest
import torch

from mmspec.errors import InvalidInputError
from mmspec.image_ar.generator import ImageARPipeline, _request_ids, _unconditional, generate_codes, speculative_codes
from mmspec.image_ar.sjd import JacobiDrafter
from mmspec.registry import make_drafter

from _chisq import chisq_pvalue

ALPHA = 1e-3
PROMPTS = ["a small red circle in the center on a white background", "the letter A in red on a white background",
           "a blue square"]


# ================================================================================== a small generator, real tokenizer
@pytest.fixture(scope="module")
def small():
    """A random 2-layer llama code generator over a real BPE tokenizer and a 16-code VQ-VAE, grid 4."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from mmspec.image_ar.generator import _tokenizer
    from mmspec.image_ar.vq import VQVAE

    torch.set_num_threads(1)
    tok = _tokenizer(PROMPTS, 80)
    cfg = LlamaConfig(vocab_size=len(tok) + 16, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      bos_token_id=tok.bos_token_id, pad_token_id=tok.pad_token_id,
                      eos_token_id=tok.convert_tokens_to_ids("<eoi>"), initializer_range=0.3)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    model.generation_config.image_code_offset = len(tok)
    torch.manual_seed(1)
    vq = VQVAE(codebook_size=16, code_dim=8, hidden=16).eval()
    return model, tok, vq


@pytest.mark.parametrize("cfg_scale", [1.0, 1.5])
def test_sjd_greedy_equals_ar_at_batch(small, cfg_scale):
    model, tok, vq = small
    ids, mask = _request_ids(tok, PROMPTS)  # three prompts of different lengths: left padding
    ar = generate_codes(model, ids, mask, tok, 24, cfg_scale, do_sample=False)
    for drafter in (JacobiDrafter(draft_len=6, init="random"), JacobiDrafter(draft_len=4, init="repeat", grid=4),
                    JacobiDrafter(draft_len=5, init="random", branch=3)):
        codes, stats = speculative_codes(model, ids, mask, tok, 24, drafter, cfg_scale=cfg_scale, do_sample=False,
                                         generator=torch.Generator().manual_seed(0))
        assert torch.equal(codes, ar), drafter.init
        assert stats.lossless and stats.rule == "greedy"
        # Drafts were kept, and many came from the previous iteration rather than the initialisation.
        assert stats.tau > 1.1 and stats.target_forwards < 24, stats
        assert stats.drafter_counters["carried"] > 0


def test_pipeline_drafter_sjd(small):
    """Through ImageARPipeline: drafter="sjd" by name, greedy equal to plain, sampling reproducible per seed."""
    model, tok, vq = small
    plain = ImageARPipeline(model, tok, vq, grid=4)
    pipe = ImageARPipeline(model, tok, vq, grid=4, drafter="sjd;draft_len=5")
    assert pipe.drafter.kind == "sjd" and model.generation_config.image_grid == 4
    plain(PROMPTS[:2], seed=0, cfg_scale=1.5, do_sample=False)
    pipe(PROMPTS[:2], seed=0, cfg_scale=1.5, do_sample=False)
    assert torch.equal(pipe.last_codes, plain.last_codes)
    assert pipe.drafter.init == "repeat"  # the grid is known: vertical repeat
    assert pipe.last_stats.lossless and pipe.last_timings_ms["target_forwards"] == pipe.last_stats.target_forwards
    a = np.asarray(pipe(PROMPTS[0], seed=5, top_k=8))
    assert pipe.last_stats.lossless and pipe.last_stats.rule == "speculative_sampling"
    assert np.array_equal(a, np.asarray(pipe(PROMPTS[0], seed=5, top_k=8)))
    with pytest.raises(InvalidInputError, match="relaxed sampling rule"):
        ImageARPipeline(model, tok, vq, grid=4, drafter="sjd", rule="csd")(PROMPTS[0], do_sample=False)
    with pytest.raises(InvalidInputError, match="unknown acceptance rule"):
        ImageARPipeline(model, tok, vq, grid=4, drafter="sjd", rule="no-such-rule")
    with pytest.raises(InvalidInputError, match="draft_len"):
        make_drafter("sjd;draft_len=0", model)
    with pytest.raises(InvalidInputError, match="init"):
        make_drafter("sjd;init=diagonal", model)


# ================================================================================== the sampling law
TEXT, CODES = 6, 3  # token ids 0..5 are text (0 pad, 1 bos, 2 boi), 6..8 the image codes
PROMPT = [1, 3, 4, 5, 2]  # <bos> prompt <boi>
N_CODES = 4


class _Tok:
    """What the generator functions read of a tokenizer (the special ids)."""

    bos_token_id, pad_token_id = 1, 0

    def convert_tokens_to_ids(self, name):
        return {"<boi>": 2}[name]


@pytest.fixture(scope="module")
def tiny():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=TEXT + CODES, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64, pad_token_id=0,
                      bos_token_id=1, eos_token_id=None, initializer_range=0.3)
    model = LlamaForCausalLM(cfg).eval()
    model.generation_config.image_code_offset = TEXT
    return model


def _process(c, u, scale, temperature, top_k):
    """The distribution generate_codes draws a code from, written out (float64, codes only)."""
    x = u + scale * (c - u) if scale > 1 else c
    x = x / temperature
    if top_k and top_k < len(x):
        kth = np.sort(x)[::-1][top_k - 1]
        x = np.where(x < kth, -np.inf, x)
    e = np.exp(x - x.max())
    return e / e.sum()


def exact_law(model, scale, temperature, top_k) -> dict:
    conts = list(itertools.product(range(CODES), repeat=N_CODES - 1))
    uncond = [1, 0, 0, 0, 2]
    rows = [PROMPT + [TEXT + t for t in c] for c in conts] + [uncond + [TEXT + t for t in c] for c in conts]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor(rows)).logits.double().numpy()[:, :, TEXT:]
    n, P = len(conts), len(PROMPT)
    cond = {}
    for i, cont in enumerate(conts):
        for k in range(N_CODES):
            h = cont[:k]
            if h not in cond:
                cond[h] = _process(logits[i, P - 1 + k], logits[n + i, P - 1 + k], scale, temperature, top_k)
    law = {}
    for seq in itertools.product(range(CODES), repeat=N_CODES):
        pr = 1.0
        for k in range(N_CODES):
            pr *= cond[seq[:k]][seq[k]]
        law[seq] = pr
    return law


LAW_CONFIGS = {
    # With a sibling for the first carried draft (its next most likely code): a static tree.
    "T1-random-init-branch2": dict(scale=1.0, temperature=1.0, top_k=None, init="random", branch=2),
    # The four codes as a 2x2 grid: initialised slots repeat the code above (or to the left on the first row).
    "cfg1.5-T0.9-top2-repeat-init": dict(scale=1.5, temperature=0.9, top_k=2, init="repeat"),
}


def _sample(model, opts, rule=None, batch=1024, calls=3, seed=1234):
    """Counts of the first ``N_CODES`` codes over ``batch * calls`` SJD rows, and the pooled stats."""
    ids = torch.tensor([PROMPT] * batch)
    mask = torch.ones_like(ids)
    g = torch.Generator().manual_seed(seed)
    counts: Counter = Counter()
    pooled = None
    for _ in range(calls):
        # draft_len 3 with 4 codes: round 1 verifies initialised drafts, round 2 the carried (sampled) ones.
        drafter = JacobiDrafter(draft_len=3, init=opts.get("init", "random"), grid=2, branch=opts.get("branch", 1))
        codes, stats = speculative_codes(model, ids, mask, _Tok(), N_CODES, drafter,
                                         rule=rule, cfg_scale=opts["scale"], temperature=opts["temperature"],
                                         top_k=opts["top_k"], generator=g, codebook=torch.arange(CODES)[:, None] * 1.0)
        counts.update(tuple(r) for r in codes.tolist())
        pooled = stats if pooled is None else pooled.merge(stats)
    return counts, pooled, batch * calls


@pytest.mark.parametrize("name", list(LAW_CONFIGS))
def test_sjd_sampling_matches_exact_law(tiny, name):
    opts = LAW_CONFIGS[name]
    law = exact_law(tiny, opts["scale"], opts["temperature"], opts["top_k"])
    counts, pooled, n = _sample(tiny, opts)
    assert pooled.drafter_counters["initialised"] > 0
    if opts.get("branch", 1) > 1:  # siblings were proposed and some of them kept
        assert pooled.drafter_counters["siblings"] > 0.2 * n
    assert pooled.lossless and pooled.drafter_counters["carried"] > 0.2 * n, pooled
    assert pooled.accept_rate[0] > 0.2 and len(pooled.depth_accepted) >= 2, pooled
    pval = chisq_pvalue(counts, law, n)
    assert pval > ALPHA, f"{name}: SJD's codes differ from the target's law (chi-square p={pval:.2e})"


@pytest.mark.slow
def test_relaxed_rule_through_sjd_is_detected_and_labelled(tiny):
    """Power: the same check rejects a relaxed rule (CSD's entropy bonus) on the same target, and its stats say
    LOSSY."""
    opts = LAW_CONFIGS["T1-random-init-branch2"]
    counts, pooled, n = _sample(tiny, opts, rule="csd")
    assert not pooled.lossless and pooled.rule == "csd" and "LOSSY" in str(pooled)
    law = exact_law(tiny, opts["scale"], opts["temperature"], opts["top_k"])
    assert chisq_pvalue(counts, law, n) < 1e-6


def test_guided_ar_through_the_loop_matches_generate_codes(tiny):
    """The guided target (Guidance in TargetAdapter) with no drafter: greedy equals generate_codes at batch 2 with
    left padding, and the unconditional rows are Janus's."""
    ids = torch.tensor([[0, 0] + PROMPT, [1, 3, 3, 4, 4, 5, 2]])
    mask = (ids != 0).long()
    assert _unconditional(ids, _Tok()).tolist()[1] == [1, 0, 0, 0, 0, 0, 2]
    ar = generate_codes(tiny, ids, mask, _Tok(), 6, cfg_scale=2.0, do_sample=False)
    codes, stats = speculative_codes(tiny, ids, mask, _Tok(), 6, None, cfg_scale=2.0, do_sample=False)
    assert torch.equal(codes, ar) and stats.target_forwards == 6
    unguided = generate_codes(tiny, ids, mask, _Tok(), 6, cfg_scale=1.0, do_sample=False)
    assert not torch.equal(unguided, ar)  # the guidance changes the output: the test can fail


def test_guided_rows_finishing_apart(tiny):
    """Rows that stop at different rounds leave a guided batch with their unconditional twins: each row of the
    batch equals greedy guided AR cut at its first end token (TargetAdapter.select_rows / commit under Guidance)."""
    import mmspec
    from mmspec.target import Guidance

    ids = torch.tensor([[0, 0] + PROMPT, [1, 3, 3, 4, 4, 5, 2], [0, 1, 5, 5, 4, 3, 2]])
    mask = (ids != 0).long()
    ar = generate_codes(tiny, ids, mask, _Tok(), 10, cfg_scale=2.0, do_sample=False) + TEXT
    eos = int(ar[0, 2])  # row 0 stops at its third code; the others wherever this code first appears, if at all
    cuts = [row[: row.index(eos) + 1] if eos in row else row for row in ar.tolist()]
    assert len({len(c) for c in cuts}) > 1  # the rows do finish apart
    want = [c + [0] * (max(map(len, cuts)) - len(c)) for c in cuts]  # padded as generate pads
    for drafter in (None, JacobiDrafter(draft_len=3, init="random")):
        out = mmspec.generate(tiny, {"input_ids": ids, "attention_mask": mask}, drafter=drafter,
                              guidance=Guidance(2.0, _unconditional(ids, _Tok())), do_sample=False, max_new_tokens=10,
                              eos_token_id=eos, pad_token_id=0, suppress_tokens=list(range(TEXT)))
        assert out.sequences[:, ids.shape[1]:].tolist() == want, drafter


# ================================================================================== the bench's image systems
def test_bench_image_systems(small, tmp_path, monkeypatch):
    """``mmspec bench --workload images --systems ...``: SJD and a relaxed rule beside AR, each against the AR of
    its own guidance scale, with the speed and losslessness fields; bad systems refused before loading."""
    from mmspec.bench import BenchConfig, run_bench
    from mmspec.image_ar import quality

    model, tok, vq = small
    ImageARPipeline(model, tok, vq, grid=4).save_pretrained(str(tmp_path / "gen"))
    monkeypatch.setattr(quality, "bundled_classifier", lambda: None)  # fields, not image quality, are checked
    systems = ["sjd;draft_len=4", "sjd;rule=lantern++:lambda=2;cfg_scale=1.5"]
    report = run_bench(BenchConfig(model=str(tmp_path / "gen"), workloads=["images"], systems=systems, n=2,
                                   batch_sizes=[2], dtype="float32", threads=1), progress=False)
    recs = {r["system"]: r for r in report.results}
    assert list(recs) == ["ar", "ar;cfg_scale=1.5"] + systems
    ar, sjd, lantern = recs["ar"], recs[systems[0]], recs[systems[1]]
    assert ar["speedup_vs_ar"] == 1.0 and ar["target_forwards"] == 16 and ar["lossless"]
    assert sjd["reference"] == "ar" and lantern["reference"] == "ar;cfg_scale=1.5"
    assert sjd["lossless"] and sjd["quality"]["lossless"] and sjd["kind"] == "mmspec" and sjd["tau"] > 1
    assert 0 < sjd["target_forwards"] < 16 and sjd["speedup_vs_ar"] > 0 and sjd["speedup_generate"] > 0
    assert not lantern["lossless"] and lantern["rule"] == "lantern++;lambda=2"
    assert lantern["quality"]["cfg_scale"] == 1.5 and "batch doubled" in lantern["note"]
    for rec in recs.values():  # the target's NLL of its codes, and AR against AR on another seed set
        assert rec["quality"]["code_nll"] > 0 and rec["quality"]["code_nll_noise"] >= 0
    assert recs["ar"]["quality"]["code_nll_noise"] == sjd["quality"]["code_nll_noise"]
    assert "images" in report.table()
    for bad, match in ((["sjd;rule=nope"], "unknown acceptance rule"), (["eagle"], "unknown image system"),
                       (["ar;rule=csd"], "ar takes only cfg_scale"), (["sjd;cfg_scale=0.5"], "cfg_scale"),
                       (["sjd;draft_len=-1"], "draft_len")):
        with pytest.raises(InvalidInputError, match=match):
            run_bench(BenchConfig(model=str(tmp_path / "gen"), workloads=["images"], systems=bad, n=1),
                      progress=False)


# ================================================================================== Janus through the same loop
def _tiny_janus():
    from test_image_generator import tiny_janus

    return tiny_janus(PROMPTS)


def test_janus_image_mode_through_sjd():
    """transformers' Janus (tiny random config) in image mode: SJD through JanusImageLM reproduces Janus's own
    guided greedy image loop token for token at batch 2, samples with lossless stats, and a relaxed rule reads
    Janus's VQ codebook and says LOSSY."""
    model, tok = _tiny_janus()
    plain = ImageARPipeline(model, tok)
    pipe = ImageARPipeline(model, tok, drafter="sjd;draft_len=4")
    assert pipe.drafter.kind == "sjd" and pipe._image_lm.generation_config.image_code_offset == len(tok)
    for scale in (2.0, 5.0):
        plain(PROMPTS[:2], seed=0, cfg_scale=scale, do_sample=False)
        pipe(PROMPTS[:2], seed=0, cfg_scale=scale, do_sample=False)
        assert torch.equal(pipe.last_codes, plain.last_codes), scale
        assert pipe.last_stats.lossless and pipe.last_stats.tau > 1
    img = pipe(PROMPTS[0], seed=3, cfg_scale=5.0, top_k=10)
    assert img.size == (8, 8) and pipe.last_stats.lossless and pipe.last_stats.rule == "speculative_sampling"
    pipe.rule = "lantern++;lambda=2;k=4"
    pipe(PROMPTS[0], seed=3, cfg_scale=5.0)
    assert not pipe.last_stats.lossless and "LOSSY" in str(pipe.last_stats)


@pytest.mark.slow
def test_bench_on_janus(tmp_path, monkeypatch):
    """The image bench's systems on a Janus folder (its default guidance, 5): SJD beside Janus's own loop."""
    from mmspec.bench import BenchConfig, run_bench
    from mmspec.image_ar import quality

    model, tok = _tiny_janus()
    model.generation_config._from_model_config = False
    ImageARPipeline(model, tok).save_pretrained(str(tmp_path))  # says "mmspec_task": "images"
    monkeypatch.setattr(quality, "bundled_classifier", lambda: None)
    report = run_bench(BenchConfig(model=str(tmp_path), workloads=["images"], systems=["sjd;draft_len=4"], n=2,
                                   batch_sizes=[2], dtype="float32", threads=1), progress=False)
    ar, sjd = report.results
    assert ar["system"] == "ar" and sjd["system"] == "sjd;draft_len=4" and sjd["reference"] == "ar"
    assert sjd["lossless"] and sjd["quality"]["cfg_scale"] == 5.0 and 0 < sjd["target_forwards"] < 16
    assert sjd["quality"]["code_nll"] > 0 and ar["quality"]["code_nll"] > 0
