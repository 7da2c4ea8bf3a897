"""Spatial 2-D drafting (image_ar/ssd.py, ssd_head.py, ssd_train.py): the lossless mode equals plain AR token for
token under greedy (batch 3, with and without guidance, a newline grid too) and keeps the target's law under
sampling (chi-square on the exact law of tests/test_image_sjd.py, guided and not); the lossy verify-and-correct
mode is labelled lossy and really commits corrected blocks; the drafter's run-time inputs equal the trainer's
(one reference); save / load / fingerprint refusal; ``mmspec train --kind spatial`` end to end on a tiny target.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from mmspec.errors import DrafterMismatchError, InvalidInputError
from mmspec.image_ar.generator import ImageARPipeline, _request_ids, generate_codes, speculative_codes
from mmspec.image_ar.spatial import GridScheduler, RasterMap
from mmspec.image_ar.ssd import SpatialDrafter, check_spec
from mmspec.image_ar.ssd_head import slot_inputs
from mmspec.registry import make_drafter

from _chisq import chisq_pvalue
from test_image_sjd import CODES, N_CODES, PROMPT, PROMPTS, _Tok, exact_law, small, tiny  # noqa: F401 (fixtures)

ALPHA = 1e-3


def _drafter(model, **kw):
    kw.setdefault("grid", 4)
    return SpatialDrafter.from_target(model, seed=0, **kw)


# ================================================================================== lossless mode, greedy
@pytest.mark.parametrize("cfg_scale", [1.0, 1.5])
def test_spatial_greedy_equals_ar_at_batch(small, cfg_scale):
    model, tok, vq = small
    ids, mask = _request_ids(tok, PROMPTS)  # three prompts of different lengths: left padding
    ar = generate_codes(model, ids, mask, tok, 16, cfg_scale, do_sample=False)
    for kw in (dict(k_h=2, k_v=1, draft_len=6), dict(k_h=3, k_v=2, draft_len=16, jacobi=True)):
        d = _drafter(model, **kw)
        codes, stats = speculative_codes(model, ids, mask, tok, 16, d, cfg_scale=cfg_scale, do_sample=False)
        assert torch.equal(codes, ar), kw
        assert stats.lossless and stats.rule == "greedy" and stats.drafter == "spatial"
        assert stats.drafter_counters["drafted"] > 16 and stats.rounds < 16, stats  # drafts were kept


def test_spatial_newline_grid_greedy(small):
    """A 3 x 4 grid whose rows end in a forced newline slot: the drafter drafts the newline token itself and
    reads codes across it; the output is still AR's."""
    model, tok, vq = small
    ids, mask = _request_ids(tok, PROMPTS[:2])
    nl = int(model.generation_config.image_code_offset)  # code 0 plays the newline token
    ar = generate_codes(model, ids, mask, tok, 15, 1.0, do_sample=False)
    d = SpatialDrafter.from_target(model, grid=(3, 4), newline=True, newline_token=nl, k_h=2, k_v=1, seed=0)
    codes, stats = speculative_codes(model, ids, mask, tok, 15, d, do_sample=False)
    assert torch.equal(codes, ar) and stats.lossless


# ================================================================================== lossless mode, sampling law
LAW = {"T1": dict(scale=1.0, temperature=1.0, top_k=None, drafter={}),
       "cfg1.5-T0.9-top2-jacobi": dict(scale=1.5, temperature=0.9, top_k=2, drafter=dict(jacobi=True)),
       "T1-argmax-jacobi": dict(scale=1.0, temperature=1.0, top_k=None, drafter=dict(jacobi=True, draft="argmax"))}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(LAW))
def test_spatial_sampling_matches_exact_law(tiny, name):
    opts = LAW[name]
    law = exact_law(tiny, opts["scale"], opts["temperature"], opts["top_k"])
    batch, calls = 1024, 2
    ids = torch.tensor([PROMPT] * batch)
    g = torch.Generator().manual_seed(99)
    counts, pooled = Counter(), None
    for _ in range(calls):
        d = SpatialDrafter.from_target(tiny, grid=2, k_h=1, k_v=1, draft_len=3, seed=0, **opts["drafter"])
        codes, stats = speculative_codes(tiny, ids, torch.ones_like(ids), _Tok(), N_CODES, d, cfg_scale=opts["scale"],
                                         temperature=opts["temperature"], top_k=opts["top_k"], generator=g)
        counts.update(tuple(r) for r in codes.tolist())
        pooled = stats if pooled is None else pooled.merge(stats)
    assert pooled.lossless and pooled.accept_rate[0] > 0.2 and len(pooled.depth_accepted) >= 2, pooled
    pval = chisq_pvalue(counts, law, batch * calls)
    assert pval > ALPHA, f"{name}: spatial drafting's codes differ from the target's law (p={pval:.2e})"


# ================================================================================== lossy verify-and-correct
def test_verify_and_correct_is_labelled_lossy_and_commits_blocks(small):
    model, tok, vq = small
    ids, mask = _request_ids(tok, PROMPTS)
    for rounds in (0, 2):
        d = _drafter(model, k_h=3, k_v=1, draft_len=8, rounds=rounds)
        assert d.make_rule(True).name == "ssd_correct"
        codes, stats = speculative_codes(model, ids, mask, tok, 16, d, cfg_scale=1.5,
                                         generator=torch.Generator().manual_seed(0))
        assert codes.shape == (3, 16) and int(codes.min()) >= 0 and int(codes.max()) < 16
        assert not stats.lossless and stats.rule == "ssd_correct"
        assert stats.drafter_counters["committed_whole"] > 0, stats.drafter_counters
    # Greedy, r = 0: a block's later slots are replaced by the target's argmax on the stale prefix, then kept.
    codes, stats = speculative_codes(model, ids, mask, tok, 16, _drafter(model, k_h=3, draft_len=8, rounds=0),
                                     do_sample=False)
    assert not stats.lossless and stats.target_forwards < 16


def _correct_law(p: list, q: list | None, x: int) -> dict:
    """SSD's per-position correction written out: keep ``x`` with ``min(1, p(x) / q(x))``, else draw from
    ``norm(max(0, p - q))`` (``q`` one-hot at ``x`` for a deterministic draft)."""
    q = q if q is not None else [1.0 if i == x else 0.0 for i in range(len(p))]
    keep = min(1.0, p[x] / q[x])
    res = [max(0.0, a - b) for a, b in zip(p, q)]
    law = {(i,): (1 - keep) * r / sum(res) for i, r in enumerate(res)}
    law[(x,)] += keep
    return law


def test_ssd_correction_against_written_out_reference():
    """SpatialCorrectRule.correct on hand-built distributions: node j is tested against scores[j] on its own, by the
    written-out law (sampled and deterministic drafts), greedy takes the argmax, and the walk's hooks decide."""
    from mmspec.acceptance import SpeculativeSamplingRule
    from mmspec.image_ar.ssd import SpatialCorrectRule
    from mmspec.tree import DraftTree

    p = [torch.tensor([0.1, 0.2, 0.3, 0.4]), torch.tensor([0.6, 0.1, 0.2, 0.1]), torch.tensor([0.25, 0.25, 0.4, 0.1])]
    q = [torch.tensor([0.25] * 4), torch.tensor([0.1, 0.7, 0.1, 0.1]), torch.tensor([0.0, 0.5, 0.0, 0.5])]
    scores = torch.log(torch.stack(p + [torch.full((4,), 0.25)]))
    n = 1500
    for drafts, probs in (([1, 1, 3], torch.stack(q)), ([3, 0, 2], None)):  # sampled, then deterministic drafts
        tree = DraftTree.from_chain(drafts, probs)
        rule, g = SpatialCorrectRule(), torch.Generator().manual_seed(0)
        draws = [rule.correct(tree, scores, 1, g) for _ in range(n)]
        for k, j in enumerate((1, 2)):  # node 0 is the walk's: correction starts past the bonus
            law = _correct_law(p[j].tolist(), None if probs is None else q[j].tolist(), drafts[j])
            counts = Counter((d[k][0],) for d in draws)
            assert chisq_pvalue(counts, law, n) > ALPHA, (drafts, j, counts, law)
            assert torch.allclose(draws[0][k][1], p[j])  # the law it was drawn from goes to the next pass as q
    tree = DraftTree.from_chain([0, 0, 0])
    assert SpatialCorrectRule(greedy=True).correct(tree, scores, 0) == [(3, None), (0, None), (2, None)]

    class KeepAll(SpeculativeSamplingRule):
        def accept_prob(self, p, q, x):
            return 1.0

    rule = SpatialCorrectRule()
    rule._walk = KeepAll()
    assert [y for y, _ in rule.correct(DraftTree.from_chain([3, 3, 0]), scores, 0)] == [3, 3, 0]


def test_verify_and_correct_with_enough_rounds_is_ar(small):
    """rounds >= draft_len - 1: every position is consumed by the sequential test before a block could be committed
    whole, so the corrected carries are only drafts and greedy output is AR's token for token (what rules out a
    misaligned carry); rounds=0 commits the head's drafts whole, unverified."""
    model, tok, vq = small
    ids, mask = _request_ids(tok, PROMPTS)
    ar = generate_codes(model, ids, mask, tok, 16, 1.5, do_sample=False)
    d = _drafter(model, k_h=3, k_v=1, draft_len=6, rounds=5)
    codes, stats = speculative_codes(model, ids, mask, tok, 16, d, cfg_scale=1.5, do_sample=False)
    assert torch.equal(codes, ar) and not stats.lossless
    assert stats.drafter_counters["committed_whole"] == 0 and stats.drafter_counters["corrected"] > 0
    d = _drafter(model, k_h=3, k_v=1, draft_len=6, rounds=0)
    codes, stats = speculative_codes(model, ids, mask, tok, 16, d, cfg_scale=1.5, do_sample=False)
    c = stats.drafter_counters
    assert c["corrected"] == 0 and c["committed_whole"] > 0 and not torch.equal(codes, ar)


@pytest.mark.slow
def test_verify_and_correct_with_enough_rounds_keeps_the_law(tiny):
    """Sampling, rounds >= draft_len - 1: every corrected position goes through the sequential test again with the law
    it was drawn from as q (nothing is committed whole), so the codes follow the target's law; a wrong carried q would
    show here."""
    law = exact_law(tiny, 1.0, 1.0, None)
    batch = 2048
    ids = torch.tensor([PROMPT] * batch)
    d = SpatialDrafter.from_target(tiny, grid=2, k_h=1, k_v=1, draft_len=3, rounds=2, seed=0)
    codes, stats = speculative_codes(tiny, ids, torch.ones_like(ids), _Tok(), N_CODES, d,
                                     generator=torch.Generator().manual_seed(7))
    c = stats.drafter_counters
    assert not stats.lossless and c["committed_whole"] == 0 and c["corrected"] > 0, c
    pval = chisq_pvalue(Counter(tuple(r) for r in codes.tolist()), law, batch)
    assert pval > ALPHA, f"verify-and-correct with enough rounds left the target's law (p={pval:.2e})"


def test_ssd_correct_follows_the_greedy_mode(small):
    """rule="ssd_correct" in a greedy run walks greedily (deterministic, the same codes as the drafter's own rule);
    a rule built for the other mode is refused, by speculative_codes and, through mmspec.generate, by the rule."""
    from mmspec import generate
    from mmspec.acceptance import get_rule

    model, tok, vq = small
    ids, mask = _request_ids(tok, PROMPTS)
    own, _ = speculative_codes(model, ids, mask, tok, 16, _drafter(model, k_h=3, draft_len=8, rounds=0),
                               do_sample=False)
    for _ in range(2):
        codes, stats = speculative_codes(model, ids, mask, tok, 16, _drafter(model, k_h=3, draft_len=8, rounds=0),
                                         rule="ssd_correct", do_sample=False)
        assert torch.equal(codes, own) and stats.rule == "ssd_correct" and not stats.lossless
    assert get_rule("ssd_correct;greedy=true", False).mode == "greedy"
    with pytest.raises(InvalidInputError, match="built for sample runs"):
        speculative_codes(model, ids, mask, tok, 16, _drafter(model, rounds=0), rule="ssd_correct;greedy=false",
                          do_sample=False)
    off = int(model.generation_config.image_code_offset)
    with pytest.raises(InvalidInputError, match="greedy=true"):
        generate(model, {"input_ids": ids, "attention_mask": mask}, drafter=_drafter(model, k_h=3, rounds=0),
                 rule="ssd_correct", do_sample=False, max_new_tokens=16, suppress_tokens=list(range(off)))


def test_lossy_spec_string_uses_the_lossy_rule(small):
    """A spec string with rounds=r runs the lossy rule in speculative_codes; mmspec.generate, which does not ask the
    drafter for a rule, refuses a lossy spatial drafter walked by the lossless rule instead of silently running it."""
    from mmspec import generate

    model, tok, vq = small
    ids, mask = _request_ids(tok, PROMPTS[:1])
    spec = "spatial;untrained=true;grid=4;rounds=0;k_h=3;draft_len=8"
    codes, stats = speculative_codes(model, ids, mask, tok, 16, spec, do_sample=False)
    assert stats.rule == "ssd_correct" and not stats.lossless and stats.drafter_counters["committed_whole"] > 0
    off = int(model.generation_config.image_code_offset)
    with pytest.raises(InvalidInputError, match="make_rule"):
        generate(model, {"input_ids": ids, "attention_mask": mask}, drafter=_drafter(model, k_h=3, rounds=0),
                 do_sample=False, max_new_tokens=16, suppress_tokens=list(range(off)))


def test_untrained_head_takes_its_shape_from_the_spec(small):
    model, tok, vq = small
    d = make_drafter("spatial;untrained=true;k_v=2;num_layers=1;grid=4", model)
    assert d.k_v == 2 and d.head.dv_embed.num_embeddings - 1 == 2 and d.num_layers == 1
    check_spec("spatial;untrained=true;k_v=2;num_layers=1")  # what bench checks before loading
    with pytest.raises(InvalidInputError, match="unknown spatial options"):
        check_spec("spatial;num_layers=1")  # a saved head's shape is its own
    with pytest.raises(InvalidInputError, match="--workload images`"):  # the CLI's flag, not --workloads
        make_drafter("spatial", model)


# ================================================================================== inputs: run time == training
def _reference_inputs(H, W, k_h, k_v, n):
    """Slot inputs written out from the grid alone: raster continuation after n codes, stopping at the first cell
    neither the current row's reach nor a committed cell within k_v rows above covers."""
    out = []
    lr, lc = divmod(n - 1, W)
    for s in range(n, H * W):
        r, c = divmod(s, W)
        above = next(((r - d) * W + c for d in range(1, k_v + 1) if r - d >= 0 and (r - d) * W + c < n), -1)
        if not (r == lr and 1 <= c - lc <= k_h) and above < 0:
            break
        out.append((s, n - 1, above, s - n + 1, 0 if above < 0 else r - above // W, r, c))
    return out


@pytest.mark.parametrize("k_h,k_v", [(1, 1), (2, 2), (5, 1)])
def test_slot_inputs_against_reference(k_h, k_v):
    s = GridScheduler(RasterMap(4, 5), k_h=k_h, k_v=k_v)
    for n in range(1, 20):
        ins = slot_inputs(s.plan(n), n, s.raster, k_v)
        got = list(zip(*(ins[k] for k in ("seq", "last", "above", "delta", "dv", "row", "col"))))
        assert got == _reference_inputs(4, 5, k_h, k_v, n), n


def test_cached_feats_equal_teacher_forced_recompute(small):
    """The states the drafter collects round by round (root and accepted nodes of each verify pass) equal one
    teacher-forced pass over the same codes, which is what the trainer's records hold; the loss runs on a record."""
    from mmspec.image_ar.ssd_train import SpatialLoss, spatial_record

    model, tok, vq = small
    d = _drafter(model, k_h=2, k_v=1, draft_len=6)
    ids, mask = _request_ids(tok, PROMPTS[:1])
    rec = spatial_record(model, {"input_ids": ids, "attention_mask": mask}, 16, seed=3)
    # Teacher-forced feats match the feats a run through generate collects for the same codes (greedy here).
    codes, _ = speculative_codes(model, ids, mask, tok, 16, d, do_sample=False)
    rec_g = _greedy_record(model, ids, mask, codes)
    n = d._n[0]  # the last round's states are never ingested (no round follows)
    assert n >= 8
    assert torch.allclose(d._feats[0, :n].float(), rec_g[:n], atol=1e-4)
    # The code half of the state table the head reads: each committed slot's own code embedded, written once.
    nc, H = d._n_codes[0], d.hidden_size
    assert nc >= n and torch.equal(d._states[0, :nc, H:], d.head.code_embed(codes[0, :nc].to(d._states.device)))
    assert rec["feats"].shape == (16, 32) and rec["logits"].shape == (16, 16)
    loss = SpatialLoss(d, rounds_per_record=4)
    losses, accs = loss({"tokens": rec["tokens"][None], "feats": rec["feats"][None].float(),
                         "logits": rec["logits"][None].float()})
    assert losses.shape == (3,) and bool(torch.isfinite(losses).all())


def _greedy_record(model, ids, mask, codes):
    from mmspec.image_ar.generator import _with_codes

    off = int(model.generation_config.image_code_offset)
    seq, full, pos = _with_codes(ids, mask, codes[:, :-1] + off)
    with torch.no_grad():
        hs = model(input_ids=seq, attention_mask=full, position_ids=pos, output_hidden_states=True).hidden_states
    return hs[-1][0, ids.shape[1] - 1:].float()


def test_janus_image_mode_through_spatial():
    """transformers' Janus (tiny random config) in image mode, through JanusImageLM: the spatial drafter reads its
    language model's states and reproduces Janus's own guided greedy image loop at batch 2."""
    from test_image_generator import tiny_janus

    model, tok = tiny_janus(PROMPTS)
    plain = ImageARPipeline(model, tok)
    pipe = ImageARPipeline(model, tok, drafter="spatial;untrained=true;seed=0;k_h=2")
    assert pipe.drafter.kind == "spatial" and pipe.drafter.n_codes == 64
    plain(PROMPTS[:2], seed=0, cfg_scale=3.0, do_sample=False)
    pipe(PROMPTS[:2], seed=0, cfg_scale=3.0, do_sample=False)
    assert torch.equal(pipe.last_codes, plain.last_codes) and pipe.last_stats.lossless


# ================================================================================== saving, registry, errors
def test_save_load_registry_and_refusal(small, tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    model, tok, vq = small
    d = _drafter(model, k_h=2)
    d.save_pretrained(tmp_path / "h")
    loaded = make_drafter(f"spatial:{tmp_path / 'h'};draft_len=5;rounds=1", model)
    assert loaded.draft_len == 5 and loaded.rounds == 1 and loaded.k_h == 2
    for a, b in zip(d.state_dict().values(), loaded.state_dict().values()):
        assert torch.equal(a, b)
    other = LlamaForCausalLM(LlamaConfig(vocab_size=model.config.vocab_size, hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=2, num_attention_heads=2))
    with pytest.raises(DrafterMismatchError):
        make_drafter(f"spatial:{tmp_path / 'h'}", other)
    with pytest.raises(InvalidInputError):
        check_spec("spatial;draft_len=0")
    with pytest.raises(InvalidInputError):
        check_spec("spatial;bogus=1")
    with pytest.raises(InvalidInputError):
        check_spec("spatial;jacobi=maybe")
    with pytest.raises(InvalidInputError):
        make_drafter(f"spatial:{tmp_path / 'h'};k_v=3", model)  # trained for k_v <= 1
    pipe = ImageARPipeline(model, tok, vq, grid=4, drafter=f"spatial:{tmp_path / 'h'}")
    plain = ImageARPipeline(model, tok, vq, grid=4)
    pipe(PROMPTS[:2], seed=0, do_sample=False)
    plain(PROMPTS[:2], seed=0, do_sample=False)
    assert torch.equal(pipe.last_codes, plain.last_codes) and pipe.last_stats.lossless


@pytest.mark.slow
def test_mmspec_train_spatial_end_to_end(small, tmp_path):
    """``mmspec train --kind spatial`` on a saved tiny generator: data from its own samples, a fit that lowers the
    loss, a resumable checkpoint, and a head that loads by spec and drafts losslessly."""
    from mmspec.train import TrainConfig, train

    model, tok, vq = small
    gen = tmp_path / "gen"
    ImageARPipeline(model, tok, vq, grid=4).save_pretrained(str(gen))
    cfg = TrainConfig(kind="spatial", target=str(gen), out=str(tmp_path / "head"), workloads=("images",), n_train=8,
                      shard_size=4, steps=30, batch_size=4, lr=3e-3, save_every=15, progress=False, dtype="float32",
                      options={"k_h": 2, "rounds_per_record": 4})
    train(cfg)
    import json

    log = [json.loads(line) for line in open(tmp_path / "head" / "train_log.jsonl")]
    assert len(log) == 30 and sum(log[-1]["loss"]) < sum(log[0]["loss"])
    d = make_drafter(f"spatial:{tmp_path / 'head'}", model)
    assert d.k_h == 2
    ids, mask = _request_ids(tok, PROMPTS)
    ar = generate_codes(model, ids, mask, tok, 16, 1.0, do_sample=False)
    codes, _ = speculative_codes(model, ids, mask, tok, 16, d, do_sample=False)
    assert torch.equal(codes, ar)


@pytest.mark.slow
def test_bundled_head_on_the_bundled_generator():
    """The shipped head loads by name for the shipped generator and drafts its greedy images exactly, many codes a
    pass (a head that drafted nothing useful would show tau near 1)."""
    from mmspec.image_ar.generator import bundled_generator

    torch.set_num_threads(1)
    pipe = ImageARPipeline.from_pretrained(bundled_generator(), dtype=torch.float32)
    d = make_drafter("spatial", pipe.model)
    assert d.jacobi and d.draft == "argmax"
    ids, mask = _request_ids(pipe.tokenizer, PROMPTS[:2])
    ar = generate_codes(pipe.model, ids, mask, pipe.tokenizer, 256, 1.0, do_sample=False)
    codes, stats = speculative_codes(pipe.model, ids, mask, pipe.tokenizer, 256, d, do_sample=False)
    assert torch.equal(codes, ar) and stats.lossless and stats.tau > 3, stats
