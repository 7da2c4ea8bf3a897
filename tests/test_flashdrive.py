"""FlashDrive on the driving VLA: exact re-rotation, streaming reuse (exact where the model allows it), reset
semantics, clip replay through decord, the flow head's step cache, and ``mmspec drive-sim``."""

import functools
import json

import numpy as np
import pytest
import torch

from mmspec.errors import InvalidInputError


def _tiny(layers: int, cameras=None, seed: int = 0):
    from mmspec.drivers import train_vla

    spec = dict(train_vla.VLA_SIZES["tiny"])
    spec["text"] = dict(spec["text"], num_hidden_layers=layers)
    train_vla.VLA_SIZES["_test"] = spec
    try:
        torch.manual_seed(seed)
        vla = train_vla.build_vla("_test", tokenizer_texts=40, vocab_size=300, seed=seed).eval()
    finally:
        del train_vla.VLA_SIZES["_test"]
    vla.expert.num_steps = 3
    if cameras:
        vla.backbone.config.mmspec_cameras = list(cameras)
    return vla


@pytest.fixture(scope="module")
def one_layer():
    """A 1-layer VLA over two cameras: its only cached states (layer 0) depend on no context, so streaming with
    re-rotated keys must be exact on it."""
    return _tiny(1, cameras=("front", "left"))


@pytest.fixture(scope="module")
def two_layer():
    return _tiny(2)


@pytest.fixture(scope="module")
def world():
    from mmspec.drivers.world import render_frame, scenario_for, simulate

    sim = simulate(scenario_for("test", 1, 0, "lead_brake"), 2.6)
    frames = {(cam, k): render_frame(sim, k, cam) for cam in ("front", "left") for k in range(sim.ticks)}
    return sim, frames


def _step(pipe, world, k, cameras=("front",), **kw):
    from mmspec.drivers.clips import ego_history

    sim, frames = world
    imgs = [frames[(cam, t)] for cam in cameras for t in range(k - 3, k + 1)]
    return pipe.step(imgs, ego_history(sim.ego, k), float(sim.ego[k][3]), seed=k, cameras=cameras, **kw)


def _pipe(vla, flashdrive=None, cameras=("front",)):
    from mmspec.drivers import DrivingPipeline

    return DrivingPipeline(vla, cameras=cameras, max_reasoning_tokens=5, flashdrive=flashdrive)


STREAM = {"step_cache": None, "system": True}


def test_rerotated_keys_equal_keys_rotated_at_the_new_positions():
    from transformers import Qwen2VLTextConfig
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLRotaryEmbedding, apply_rotary_pos_emb

    from mmspec.drivers.flashdrive import rerotate_keys

    cfg = Qwen2VLTextConfig(hidden_size=128, num_attention_heads=2, num_key_value_heads=2,
                            rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                             "mrope_section": [8, 12, 12]})
    rot = Qwen2VLRotaryEmbedding(cfg)
    g = torch.Generator().manual_seed(0)
    n = 40
    raw = torch.randn(1, 2, n, 64, generator=g)
    pos = torch.randint(0, 300, (3, 1, n), generator=g)  # M-RoPE: the three axes differ (image tokens)
    delta = torch.randint(-60, 60, (3, n), generator=g)

    def at(p):
        cos, sin = rot(raw, p)
        return apply_rotary_pos_emb(raw, raw, cos, sin)[1]

    moved, fresh = rerotate_keys(at(pos), delta, rot), at(pos + delta[:, None])
    assert torch.allclose(moved, fresh, atol=1e-4, rtol=0)
    assert not torch.allclose(at(pos), fresh, atol=1e-2)  # the shift (no rotation) is not at the new positions


def test_streamed_layer0_keys_equal_a_fresh_prefill_and_deeper_layers_drift(two_layer, world):
    """Re-rotated moved keys equal the keys a full prefill computes at the new positions (layer 0, whose keys
    depend on no context); layer 1's do not (a kept frame attended to the frame that left): the approximation."""
    streamed, fresh, shifted = _pipe(two_layer, STREAM), _pipe(two_layer, STREAM), \
        _pipe(two_layer, {**STREAM, "rerotate": False})
    for k in (20, 21):
        assert _step(streamed, world, k, tick=k)["stream"] == ("reuse" if k == 21 else "first tick of a stream")
        _step(shifted, world, k, tick=k)
    _step(fresh, world, 21, tick=21)
    a, b, c = (p.engine._stream.cache.layers for p in (streamed, fresh, shifted))
    assert a[0].keys.shape == b[0].keys.shape
    assert torch.allclose(a[0].keys, b[0].keys, atol=1e-5) and torch.allclose(a[0].values, b[0].values, atol=1e-5)
    assert not torch.allclose(c[0].keys, b[0].keys, atol=1e-3)
    assert not torch.allclose(a[1].keys, b[1].keys, atol=1e-3)


def test_streaming_is_exact_on_a_one_layer_model_with_two_cameras(one_layer, world):
    """Moved slots, re-rotation, the two-camera mask (new frames sit between kept ones) and the positions are
    all right: on a model whose cached states are context-free the stream equals plain; the shift does not."""
    cams = ("front", "left")
    plain, stream, shift = _pipe(one_layer, None, cams), _pipe(one_layer, STREAM, cams), \
        _pipe(one_layer, {**STREAM, "rerotate": False}, cams)
    for k in (20, 21, 22):
        ref, got, sh = (_step(p, world, k, cams, tick=k) for p in (plain, stream, shift))
        assert got["reasoning"] == ref["reasoning"]
        assert torch.allclose(got["first_logits"], ref["first_logits"], atol=1e-4, rtol=0)
        assert np.allclose(got["trajectory"], ref["trajectory"], atol=1e-3)
        if k > 20:
            assert got["stream"] == "reuse"
            assert (sh["first_logits"] - ref["first_logits"]).abs().max() > 1e-3


def test_frame_mask_leaves_nothing_of_a_departed_frame(two_layer, world):
    """With ``frame_mask`` (frames prefilled under the streaming mask) a streamed tick does not depend on the frame
    that left the window: two streams that differ only in it give the same next tick; without the mask they do
    not. The engine's mask over the whole prompt is ``streaming_attention_mask``'s."""
    from mmspec.drivers.clips import ego_history
    from mmspec.drivers.train_vla import streaming_attention_mask
    from mmspec.drivers.vla import attention_mask_for

    sim, frames = world

    def tick(pipe, k, oldest=None):
        imgs = [frames[("front", t)] for t in range(k - 3, k + 1)]
        if oldest is not None:
            imgs[0] = frames[("front", oldest)]
        return pipe.step(imgs, ego_history(sim.ego, k), float(sim.ego[k][3]), seed=k, cameras=("front",), tick=k)

    out = {}
    for fm in (True, False):
        a, b = _pipe(two_layer, {**STREAM, "frame_mask": fm}), _pipe(two_layer, {**STREAM, "frame_mask": fm})
        tick(a, 20), tick(b, 20, oldest=3)  # the window's oldest frame differs
        ra, rb = tick(a, 21), tick(b, 21)
        assert ra["stream"] == rb["stream"] == "reuse"
        out[fm] = float((ra["first_logits"] - rb["first_logits"]).abs().max())
    assert out[True] < 1e-5 and out[False] > 1e-3, out
    eng = a.engine
    tpl = next(iter(eng._templates.values()))
    idx = torch.arange(tpl.ids.shape[0])
    cfg = two_layer.backbone.config
    want = streaming_attention_mask(tpl.ids[None], torch.ones(1, len(idx), dtype=torch.long), cfg.vision_start_token_id,
                                    cfg.vision_end_token_id)
    impl = cfg.get_text_config()._attn_implementation
    assert torch.equal(eng._frame_mask(tpl, idx, idx, torch.float32), attention_mask_for(want, impl, torch.float32))
    assert not _pipe(two_layer, {**STREAM, "frame_mask": True, "stream": False}).flashdrive.exact


def test_frame_mask_stream_equals_a_masked_full_prefill_with_two_cameras(one_layer, world):
    """Two cameras: the new frames sit between kept ones, so the streamed prefill's mask goes by prompt index. On a
    model whose cached states are context-free the masked stream equals a full prefill under the same mask."""
    from mmspec.drivers.flashdrive import FlashDriveConfig

    cams = ("front", "left")
    stream = _pipe(one_layer, {**STREAM, "frame_mask": True}, cams)
    full = _pipe(one_layer, {"stream": False, "step_cache": None, "frame_mask": True}, cams)
    for k in (20, 21):
        got, ref = (_step(p, world, k, cams, tick=k) for p in (stream, full))
    assert got["stream"] == "reuse"
    assert torch.allclose(got["first_logits"], ref["first_logits"], atol=1e-4, rtol=0)
    assert stream.engine.frame_mask and full.engine.frame_mask  # (one layer: the mask cannot change its output)
    assert FlashDriveConfig.parse("stream").frame_mask is False  # a list names what it turns on
    assert FlashDriveConfig.parse("stream,frame_mask").frame_mask is True
    with pytest.raises(InvalidInputError, match="frame_mask"):
        FlashDriveConfig(frame_mask=1)


def test_frame_mask_auto_follows_how_the_vla_was_trained(two_layer, tmp_path):
    """``frame_mask="auto"``: on with streaming for a VLA whose folder says it was fine-tuned with the streaming
    mask; off without streaming (exact settings stay exact), for other VLAs, and for one with no folder."""
    from mmspec.drivers.train_vla import DrivingVLA

    path = str(tmp_path / "vla")
    two_layer.save_pretrained(path)
    assert not _pipe(DrivingVLA.from_pretrained(path), STREAM).engine.frame_mask  # no train_config: not trained so
    with open(f"{path}/train_config.json", "w") as f:
        json.dump({"stream_mask": 0.5}, f)
    vla = DrivingVLA.from_pretrained(path)
    on = _pipe(vla, STREAM).engine
    assert on.frame_mask and "streaming mask" in on.describe()
    assert not _pipe(vla, {**STREAM, "frame_mask": False}).engine.frame_mask
    exact = _pipe(vla, "vision_cache,system")
    assert not exact.engine.frame_mask and exact.engine.exact
    assert not _pipe(two_layer, STREAM).engine.frame_mask  # not loaded from a folder
    with pytest.raises(InvalidInputError, match="frame_mask"):
        _pipe(two_layer, {**STREAM, "frame_mask": "yes"})


def test_exact_mechanisms_equal_plain_generate(two_layer, world):
    plain, exact = _pipe(two_layer), _pipe(two_layer, "vision_cache,system")
    assert exact.flashdrive.exact
    for k in (20, 21):  # the second tick takes three frames' features from the vision cache
        ref, got = _step(plain, world, k, tick=k), _step(exact, world, k, tick=k)
        assert got["reasoning"] == ref["reasoning"] and got["num_decode_tokens"] == ref["num_decode_tokens"]
        assert torch.allclose(got["first_logits"], ref["first_logits"], atol=1e-5, rtol=0)
        assert np.allclose(got["trajectories"], ref["trajectories"], atol=1e-4)
    assert exact.engine.stats["vision_hits"] == 3 and exact.engine.stats["vision_misses"] == 5


def _glance(vla, layer_ids=(1, 2), **kw):
    """An untrained GLANCE head for ``vla`` (exactness does not depend on what it learnt)."""
    from mmspec.vision.glance import GlanceDrafter

    return GlanceDrafter.from_target(vla.backbone, layer_ids=layer_ids, block_size=5, seed=0, anchor_feature="all", **kw)


SPEC = {"stream": False, "step_cache": None, "spec": True}
ORACLE = {**SPEC, "reuse_reasoning": False}  # oracle tests count the drafter's own rounds


def _varied(vla):
    """``vla`` with a random untied language head: an untrained tiny VLA otherwise repeats one token."""
    bb = vla.backbone
    bb.lm_head.weight = torch.nn.Parameter(torch.randn(bb.lm_head.weight.shape, generator=torch.Generator().manual_seed(0)))
    return vla


@pytest.mark.parametrize("branch_k,head", [(1, {}), (3, {}), (1, {"rope": "flat", "context": "text"})])
def test_speculative_reasoning_equals_the_vlas_own_greedy(two_layer, world, branch_k, head):
    """A block drafter's chain or tree, verified by the core over the tick's cache: token for token the VLA's own
    greedy reasoning (generate), and the action expert reads the same context (same trajectory, same noise). Also
    for a FlatRoPE head that attends to text positions only (the two-reasoner variant's routine reasoner)."""
    plain = _pipe(two_layer)
    spec = _pipe(two_layer, {**SPEC, "drafter": _glance(two_layer, branch_k=branch_k, **head)})
    spec.max_reasoning_tokens = spec.engine.max_reasoning_tokens = plain.max_reasoning_tokens = 9
    assert spec.flashdrive.exact and spec.engine.exact and "spec" in spec.engine.describe()  # fp32
    for k in (20, 21):
        ref, got = _step(plain, world, k), _step(spec, world, k)
        assert got["tokens"] == ref["tokens"] and got["reasoning"] == ref["reasoning"]
        assert 1 <= got["spec_rounds"] <= len(got["tokens"]) - 1
        assert np.allclose(got["trajectories"], ref["trajectories"], atol=1e-4)


def test_speculative_reasoning_claims_exactness_in_fp32_only():
    """Greedy verification is token for token the VLA's own decoding in fp32; in bf16 a block pass rounds unlike
    one-token passes, so an engine with a drafter on a bf16 VLA does not claim exactness (one without does)."""
    vla = _tiny(1).to(torch.bfloat16)
    spec, exact = _pipe(vla, {**SPEC, "drafter": _glance(vla, layer_ids=(0, 1))}), _pipe(vla, "vision_cache,system")
    assert spec.flashdrive.exact and not spec.engine.exact and exact.engine.exact
    assert "fp32" in spec.engine.SPEC_EXACT_NOTE


def test_speculative_reasoning_commits_blocks_and_stops_inside_one():
    """Fast oracle test on a tiny VLA (random untied head, so its greedy reasoning varies): an oracle drafter proposes
    the true reasoning then junk. Whole blocks are committed in one pass each; an end token accepted inside a block
    stops the reasoning there, and the drafted tokens after it leave the cache before the action expert reads it
    (same trajectory as plain generate); an end token as the very first token makes no round; a noisy tree too."""
    from mmspec.drafters.oracle import NoisyOracleDrafter
    from mmspec.drivers.world import render_frame, scenario_for, simulate

    vla = _varied(_tiny(2))
    bb = vla.backbone
    sim = simulate(scenario_for("test", 1, 0, "lead_brake"), 2.3)
    world = (sim, {("front", k): render_frame(sim, k, "front") for k in range(17, 21)})
    plain = _pipe(vla)
    plain.max_reasoning_tokens = 14
    free = _step(plain, world, 20)["tokens"]
    first = {}
    for i, t in enumerate(free):
        first.setdefault(t, i)
    inside = [i for i in first.values() if i >= 8 and i % 7]  # a second block, ended inside
    assert inside and len(free) == 14
    oracle = NoisyOracleDrafter([[0]], depth=6, corrupt_p=0.0, vocab_size=bb.config.text_config.vocab_size)
    try:
        for stop_at in (inside[-1], 0):
            bb.generation_config.eos_token_id = free[stop_at]
            ref = _step(plain, world, 20)
            assert ref["tokens"] == free[: stop_at + 1]
            spec = _pipe(vla, {**ORACLE, "drafter": oracle})
            spec.max_reasoning_tokens = spec.engine.max_reasoning_tokens = 14
            for p, extra in ((0.0, 0), (0.4, 2)):
                oracle.reference, oracle.corrupt_p, oracle.extra_branches = [free + [7] * 6], p, extra
                got = _step(spec, world, 20)
                assert got["tokens"] == ref["tokens"]
                assert np.allclose(got["trajectories"], ref["trajectories"], atol=1e-4)
                if p == 0.0:
                    assert got["spec_rounds"] == -(-stop_at // 7)  # 6 drafts + 1 bonus per pass
    finally:
        bb.generation_config.eos_token_id = None


def test_reasoning_reuse_drafts_the_last_ticks_reasoning_and_falls_back_exactly():
    """At 10 Hz consecutive ticks mostly reason alike: the first round drafts the rest of the last tick's reasoning (one
    pass when it holds); from a mismatch the block drafter takes over, begun late with the tick's prompt states and the
    reuse round's result. Every tick's reasoning and trajectory equal plain generate's."""
    from mmspec.drivers.world import render_frame, scenario_for, simulate

    vla = _varied(_tiny(2))
    sim = simulate(scenario_for("test", 1, 0, "lead_brake"), 2.4)
    world = (sim, {("front", k): render_frame(sim, k, "front") for k in range(17, 22)})
    plain = _pipe(vla)
    spec = _pipe(vla, {**SPEC, "drafter": _glance(vla)})
    assert "last tick's reasoning" in spec.engine.describe()
    plain.max_reasoning_tokens = spec.max_reasoning_tokens = spec.engine.max_reasoning_tokens = 14
    stats = spec.engine.stats
    for k in (20, 21):
        ref, got = _step(plain, world, k), _step(spec, world, k)
        assert got["tokens"] == ref["tokens"] and np.allclose(got["trajectories"], ref["trajectories"], atol=1e-4)
    assert ref["tokens"] == spec.engine.drafter.previous and len(ref["tokens"]) == 14  # the two ticks reason alike
    assert got["spec_rounds"] == 1 and stats["reuse_rounds"] == 1 and stats["fallback_starts"] == 1  # tick 20's
    wrong = list(ref["tokens"])
    wrong[4] = (wrong[4] + 1) % 300  # same start, a mismatch at the fifth token
    spec.engine.drafter.previous = wrong
    got = _step(spec, world, 21)
    assert got["tokens"] == ref["tokens"] and np.allclose(got["trajectories"], ref["trajectories"], atol=1e-4)
    assert got["spec_rounds"] >= 2 and stats["reuse_rounds"] == 2 and stats["fallback_starts"] == 2
    spec.reset()  # a new drive: nothing of the last one's reasoning is drafted again
    assert spec.engine.drafter.previous == []
    got = _step(spec, world, 21)
    assert got["tokens"] == ref["tokens"] and stats["reuse_rounds"] == 2 and stats["fallback_starts"] == 3  # no reuse round
    off = _pipe(vla, {**SPEC, "drafter": _glance(vla), "reuse_reasoning": False})
    assert "last tick" not in off.engine.describe()


def test_reasoning_reuse_counts_only_this_calls_fallback():
    """Counters are the last call's (the Drafter contract): a call drafted from the last reasoning alone never began
    the fallback, so the fallback's counts, left from an earlier call, are not reported again."""
    from mmspec.drafters import PromptLookupDrafter
    from mmspec.drafters.base import DraftContext
    from mmspec.drivers.flashdrive import ReasoningReuseDrafter

    class Counting(PromptLookupDrafter):
        def begin(self, ctx):
            super().begin(ctx)
            self.proposals = 0

        def propose(self, ctx):
            self.proposals += 1
            return super().propose(ctx)

        def counters(self):
            return {"proposals": self.proposals}

    d = ReasoningReuseDrafter(Counting())
    ctx = DraftContext(sequences=[np.array([1, 2, 5])], rows=[0], remaining=[8], prompt_lengths=[2])
    d.begin(ctx)
    d.propose(ctx)  # nothing to reuse: the fallback drafts
    assert d.counters()["proposals"] == 1 and d.counters()["fallback_starts"] == 1
    d.previous = [5, 6, 7, 8]
    d.begin(ctx)
    assert d.propose(ctx)[0].tokens.tolist() == [6, 7, 8]
    assert d.counters() == {"reuse_rounds": 1, "reuse_tokens": 0, "fallback_starts": 0, "proposals": 0}


def test_streaming_mask_under_eager_attention_is_additive():
    """``vla_losses(stream_mask=True)`` under eager attention: a bool mask added to the scores would mask nothing, so
    it is converted; the loss equals sdpa's under the same (bool) mask, and differs from the unmasked loss."""
    from mmspec.drivers.train_vla import vla_losses
    from mmspec.drivers.world import LABELS
    from mmspec.vision.testbed_train import PatchReader
    from mmspec.workloads import get_workload

    vla = _tiny(2)
    examples = get_workload("driving", labels=True).examples("train", 1)
    reader = PatchReader(vla.backbone.config.text_config.hidden_size, len(LABELS))
    with torch.no_grad():
        sdpa = vla_losses(vla, examples, reader, stream_mask=True)["lm"]
        vla.backbone.set_attn_implementation("eager")
        assert vla.backbone.config.get_text_config()._attn_implementation == "eager"
        eager = vla_losses(vla, examples, reader, stream_mask=True)["lm"]
        unmasked = vla_losses(vla, examples, reader)["lm"]
    assert torch.allclose(eager, sdpa, atol=1e-5) and not torch.allclose(eager, unmasked, atol=1e-4)


@pytest.fixture(scope="module")
def bundled():
    from mmspec.drivers.train_vla import DrivingVLA, bundled_vla

    if bundled_vla() is None:
        pytest.skip("no bundled driving VLA")
    return DrivingVLA.from_pretrained(bundled_vla(), dtype=torch.float32).eval()


@pytest.mark.slow
def test_speculative_reasoning_accepts_and_stops_inside_a_block(bundled):
    """On the bundled VLA (real end-of-reasoning tokens) an oracle drafter proposing the true reasoning and then
    junk: whole blocks are accepted, the end token is accepted inside a block (the tokens drafted after it must
    leave the cache before the action expert reads it), a noisy tree exercises every rejection depth."""
    from mmspec.drafters.oracle import NoisyOracleDrafter
    from mmspec.workloads import get_workload

    from mmspec.drivers import DrivingPipeline

    plain = DrivingPipeline(bundled)
    oracle = NoisyOracleDrafter([[0]], depth=6, corrupt_p=0.0, vocab_size=bundled.backbone.config.text_config.vocab_size)
    spec = DrivingPipeline(bundled, flashdrive={**ORACLE, "drafter": oracle})
    examples = get_workload("driving").examples("test", 2)
    inside = 0
    for i, ex in enumerate(examples):
        ref = plain.step(ex.images, ex.meta["history"], ex.meta["speed"], seed=i)
        for p, extra in ((0.0, 0), (0.4, 2)):
            oracle.reference, oracle.corrupt_p, oracle.extra_branches = [ref["tokens"] + [7, 8, 9, 10, 11, 12]], p, extra
            got = spec.step(ex.images, ex.meta["history"], ex.meta["speed"], seed=i)
            assert got["tokens"] == ref["tokens"]
            assert np.allclose(got["trajectories"], ref["trajectories"], atol=1e-4)
            if p == 0.0:
                assert got["spec_rounds"] == -(-(len(ref["tokens"]) - 1) // 7)  # 6 drafts + 1 bonus per pass
                inside += (len(ref["tokens"]) - 1) % 7 != 0
    assert inside  # at least one reasoning ended inside an accepted block


@pytest.mark.slow
def test_bundled_drafter_through_from_pretrained(bundled):
    """``from_pretrained(vla, drafter="auto")``: the bundled drafter fits the bundled VLA, runs on the exact
    mechanisms, and its reasoning is the VLA's own greedy reasoning while accepting more than one token a pass."""
    from mmspec import MMSpecPipeline
    from mmspec.drivers.flashdrive import bundled_drafter
    from mmspec.drivers.train_vla import bundled_vla
    from mmspec.workloads import get_workload

    if bundled_drafter() is None:
        pytest.skip("no bundled drafter")
    pipe = MMSpecPipeline.from_pretrained(bundled_vla(), drafter="auto", dtype="float32")
    assert pipe.engine.drafter is not None and pipe.flashdrive.exact
    from mmspec.drivers import DrivingPipeline

    plain = DrivingPipeline(bundled)
    tokens = rounds = 0
    for i, ex in enumerate(get_workload("driving").examples("test", 3)):
        ref = plain.step(ex.images, ex.meta["history"], ex.meta["speed"], seed=i)
        got = pipe.step(ex.images, ex.meta["history"], ex.meta["speed"], seed=i)
        assert got["tokens"] == ref["tokens"]
        tokens, rounds = tokens + len(got["tokens"]) - 1, rounds + got["spec_rounds"]
    assert tokens / rounds > 1.5


@pytest.mark.parametrize("head", [{}, {"rope": "flat"}])
def test_streaming_speculative_reasoning_reads_the_prompt_in_prompt_order(one_layer, world, head):
    """With streaming over two cameras the cache holds the new frames after the kept ones; the drafter must still
    get its states in prompt order: its layer-0 states (embeddings, exact under streaming) equal a full
    prefill's, and the reasoning equals the stream's own greedy reasoning (verification is exact on any cache). A
    FlatRoPE head numbers the prompt 0..n-1 whatever order the stream's cache holds it in."""
    cams = ("front", "left")
    seen = []

    from mmspec.vision.glance import GlanceDrafter

    class Recorder(GlanceDrafter):
        def begin(self, ctx):
            seen.append(ctx.hidden[0][0].clone())
            super().begin(ctx)

    d = Recorder.from_target(one_layer.backbone, layer_ids=(0, 1), block_size=4, seed=0, **head)
    both = {**STREAM, "spec": True, "drafter": d, "reuse_reasoning": False}  # the head begins every tick
    spec, stream = _pipe(one_layer, both, cams), _pipe(one_layer, STREAM, cams)
    fresh = _pipe(one_layer, {**both, "stream": False}, cams)
    for k in (20, 21):
        got, ref = _step(spec, world, k, cams, tick=k), _step(stream, world, k, cams, tick=k)
        assert got["tokens"] == ref["tokens"] and got["stream"] == ref["stream"]
    assert got["stream"] == "reuse"
    _step(fresh, world, 21, cams, tick=21)
    assert seen[1].shape == seen[2].shape and torch.allclose(seen[1], seen[2], atol=1e-6)


def test_streaming_attention_mask_matches_a_written_out_reference():
    """FlashDrive's fine-tuning mask: causal over real tokens, a frame sees the head and itself, never another frame;
    text after the frames sees all (checked against plain loops, with a left-padded row)."""
    from mmspec.drivers.train_vla import streaming_attention_mask

    S, E = 3, 4
    rows = [[9, 9, S, 5, 5, E, S, 5, 5, E, S, 5, E, 8, 8], [0, 0, 0, 9, S, 5, E, S, 5, 5, E, 8, 8, 8, 8]]
    ids = torch.tensor(rows)
    valid = torch.tensor([[1] * 15, [0] * 3 + [1] * 12])
    got = streaming_attention_mask(ids, valid, S, E)[:, 0]
    for b, row in enumerate(rows):
        frame, k = [], 0
        inside = False
        for t in row:
            if t == S:
                k, inside = k + 1, True
            frame.append(k if inside else 0)
            if t == E:
                inside = False
        for q in range(len(row)):
            for j in range(len(row)):
                want = j <= q and bool(valid[b, q]) and bool(valid[b, j])
                if frame[q] and frame[j] and frame[q] != frame[j]:
                    want = False
                want = want or q == j
                assert bool(got[b, q, j]) == want, (b, q, j)


def test_prepare_gives_the_inputs_a_plain_step_decodes(two_layer):
    """``mmspec train``'s data stage regenerates the reasoning from ``pipe.prepare``: the same tokens a tick decodes."""
    from mmspec.workloads import get_workload

    pipe = _pipe(two_layer)
    ex = get_workload("driving").example("train", 3)
    inputs = pipe.prepare(images=ex.images, prompt=ex.prompt)
    out = two_layer.backbone.generate(**inputs, max_new_tokens=5, do_sample=False)
    assert out[0, inputs["input_ids"].shape[1]:].tolist() == pipe.step(ex.images, ex.meta["history"],
                                                                       ex.meta["speed"])["tokens"]
    with pytest.raises(InvalidInputError):
        pipe.prepare(images=ex.images[:2], prompt=ex.prompt)


def test_spec_auto_is_off_without_a_fitting_drafter(two_layer):
    from mmspec.drivers.flashdrive import FlashDriveConfig

    pipe = _pipe(two_layer, True)  # the bundled drafter, if any, was trained for another VLA
    assert pipe.engine.drafter is None and "spec" not in pipe.engine.describe().split(" (")[0]
    assert FlashDriveConfig.parse("spec").spec is True
    with pytest.raises(InvalidInputError):
        FlashDriveConfig(spec="sometimes")


def test_reset_semantics(one_layer, world):
    """A gap, an out-of-order or repeated tick, frames that do not continue the window, changed cameras and a
    missing tick index each reset to a full prefill (equal to plain) or, with on_break='error', raise."""
    from mmspec.drivers.flashdrive import StreamBreakError

    plain, pipe = _pipe(one_layer), _pipe(one_layer, {**STREAM, "rerotate": False})  # the shift: reuse shows
    seen = []
    for k, kw in [(20, {}), (21, {}), (23, {}), (22, {}), (22, {}), (23, {"cameras": ("front", "left")}), (24, {}),
                  (25, {"tick": None})]:
        cams = kw.pop("cameras", ("front",))
        res = _step(pipe, world, k, cams, **{"tick": k, **kw})
        seen.append(res["stream"].split(":")[0].split(" (")[0])
        if res["stream"] != "reuse" and cams == ("front",):  # a reset is a full prefill: plain's own result
            ref = _step(plain, world, k)
            assert torch.allclose(res["first_logits"], ref["first_logits"], atol=1e-5)
    assert seen == ["first tick of a stream", "reuse", "gap", "tick 22 out of order", "tick 22 repeated",
                    "cameras changed", "cameras changed", "no tick index"]
    # Frames that do not continue the window (another drive at the next tick index).
    _step(pipe, world, 20, tick=20)
    sim, frames = world
    other = [frames[("left", t)] for t in range(18, 22)]
    from mmspec.drivers.clips import ego_history

    res = pipe.step(other, ego_history(sim.ego, 21), 5.0, tick=21)
    assert res["stream"] == "frames of camera 'front' do not continue the last window"
    strict = _pipe(one_layer, {**STREAM, "on_break": "error"})
    _step(strict, world, 20, tick=20)
    with pytest.raises(StreamBreakError, match="gap: tick 22 after 20"):
        _step(strict, world, 22, tick=22)
    assert _step(strict, world, 21, tick=21)["stream"] == "reuse"  # the refused tick left the stream intact
    strict.reset()
    assert _step(strict, world, 22, tick=22)["stream"] == "first tick of a stream"
    with pytest.raises(InvalidInputError, match="tick must be an integer"):
        _step(strict, world, 23, tick=2.5)


def test_periodic_refresh(one_layer, world):
    pipe = _pipe(one_layer, {**STREAM, "refresh_every": 2})
    seen = [_step(pipe, world, k, tick=k)["stream"] for k in (20, 21, 22, 23)]
    assert seen == ["first tick of a stream", "reuse", "periodic refresh (every 2 ticks)", "reuse"]
    with pytest.raises(InvalidInputError, match="refresh_every"):
        _pipe(one_layer, {"refresh_every": -1})


def test_streaming_replay_of_a_written_clip(one_layer, tmp_path):
    """A clip written as videos (PyAV) and read back with decord, replayed tick by tick through the streaming
    pipeline (two cameras): every tick after the first reuses the stream and equals plain on the same frames."""
    from mmspec.drivers.clips import ego_history, load_clip, write_clip

    clip = load_clip(write_clip(str(tmp_path), "test", 2, seconds=2.0, cameras=("front", "left")))
    cams = ("front", "left")
    plain, stream = _pipe(one_layer, None, cams), _pipe(one_layer, STREAM, cams)
    for k in range(16, clip.ticks):
        frames = [clip.frames[cam][t] for cam in cams for t in range(k - 3, k + 1)]
        args = (frames, ego_history(clip.ego, k), float(clip.ego[k][3]))
        ref, got = plain.step(*args, seed=k), stream.step(*args, seed=k, tick=k)
        assert got["stream"] == ("reuse" if k > 16 else "first tick of a stream")
        assert got["reasoning"] == ref["reasoning"]
        assert torch.allclose(got["first_logits"], ref["first_logits"], atol=1e-4, rtol=0)
    assert stream.engine.stats["stream_ticks"] == clip.ticks - 17


def test_a_clip_on_disk_is_reused_only_when_it_is_the_one_asked_for(tmp_path):
    """drive-sim runs share a clips folder: a shorter run's clip (or another seed's) is written again, not replayed
    past its end."""
    from mmspec.drivers.clips import load_clip, write_clip

    short = load_clip(write_clip(str(tmp_path), "test", 5, seconds=0.5, kind="cruise"))
    longer = load_clip(write_clip(str(tmp_path), "test", 5, seconds=1.0, kind="cruise"))
    again = load_clip(write_clip(str(tmp_path), "test", 5, seconds=0.5, kind="cruise"))
    assert short.ticks < longer.ticks == again.ticks


def test_step_cache_threshold_zero_is_the_uncached_integration(two_layer, world):
    from mmspec.drivers.vla import StepCache

    off = _step(_pipe(two_layer, {"stream": False, "step_cache": None}), world, 20)
    zero = _step(_pipe(two_layer, {"stream": False, "step_cache": "adaptive", "threshold": 0.0}), world, 20)
    fixed = _step(_pipe(two_layer, {"stream": False, "step_cache": "fixed", "cache_steps": (1,)}), world, 20)
    assert np.array_equal(zero["actions"], off["actions"]) and zero["head_calls"] == off["head_calls"] == 3
    assert fixed["head_calls"] == 2 and not np.array_equal(fixed["actions"], off["actions"])
    # The adaptive rule: after two computed steps, skip while the running relative change stays under the threshold.
    plan = StepCache("adaptive", threshold=0.25, warmup=2, max_skip=3).planner(8)
    v = torch.ones(4)
    decisions = []
    for i in range(8):
        c = plan.compute(i)
        decisions.append(c)
        if c:
            plan.observe(i, v * (1.1 ** i))  # 10% change per step
    assert decisions == [True, True, False, False, True, False, False, True]
    with pytest.raises(InvalidInputError):
        StepCache("fixed", cache_steps=(0,))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lean_expert_is_the_decoder_bit_for_bit(two_layer, world, dtype):
    """LeanExpert runs the expert's head calls with the same numbers as the decoder's own path: every call of a
    sample, with every cached position valid (no mask) and with some invalid (the mask), in fp32 and bf16; and the
    mechanism through the engine changes no tick's output."""
    import copy

    from mmspec.drivers.vla import LeanExpert

    vla = two_layer if dtype == torch.float32 else copy.deepcopy(two_layer).to(dtype)
    pipe = _pipe(vla, {"stream": False, "step_cache": None, "spec": False, "lean_expert": False})
    _step(pipe, world, 20)
    cache, start, valid = pipe.engine.last_context
    expert = pipe.engine.expert
    assert expert.decoder.config.num_attention_heads > expert.decoder.config.num_key_value_heads  # GQA is covered
    assert LeanExpert.why_not(expert) == ""
    part = valid.clone()
    part[:, 2:5] = False
    for ok in (valid, part):
        runs = [expert.sample(cache, start, ok, generator=torch.Generator().manual_seed(3), precompute=True,
                              lean=lean) for lean in (False, True)]
        assert runs[0].dtype == torch.float32 and torch.equal(runs[0], runs[1])
    lean = _pipe(vla, {"stream": True, "step_cache": None, "spec": False})
    plain_path = _pipe(vla, {"stream": True, "step_cache": None, "spec": False, "lean_expert": False})
    assert "lean_expert" in lean.engine.describe() and "lean_expert" not in plain_path.engine.describe()
    for k in (20, 21, 22):  # a fresh prefill, then streamed ticks
        a, b = _step(lean, world, k, tick=k), _step(plain_path, world, k, tick=k)
        assert a["reasoning"] == b["reasoning"] and np.array_equal(a["actions"], b["actions"])
    eager = copy.deepcopy(vla)
    eager.expert.decoder.config._attn_implementation = "eager"
    assert "sdpa" in LeanExpert.why_not(eager.expert)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lean_language_model_changes_no_tick(two_layer, one_layer, world, dtype):
    """``lean_lm`` (the language model's prefill, decode and verify passes through mmspec.lean) gives every tick's
    output bit for bit as the transformers path does: first logits, reasoning tokens and actions, through a full
    prefill and streamed ticks, with a speculative tree drafter and the frame mask on one camera, and with the plain
    decode loop over two cameras (the new frames' mask between kept frames)."""
    import copy

    for vla, cams, cfg in ((two_layer, ("front",), {**STREAM, "spec": True, "frame_mask": True}),
                           (one_layer, ("front", "left"), {**STREAM, "spec": False})):
        vla = vla if dtype == torch.float32 else copy.deepcopy(vla).to(dtype)
        if cfg["spec"]:
            cfg = {**cfg, "drafter": _glance(vla, branch_k=3)}
        on, off = _pipe(vla, cfg, cams), _pipe(vla, {**cfg, "lean_lm": False}, cams)
        assert "lean_lm" in on.engine.describe() and "lean_lm" not in off.engine.describe()
        for k in (20, 21, 22):
            a, b = _step(on, world, k, cams, tick=k), _step(off, world, k, cams, tick=k)
            assert a["tokens"] == b["tokens"] and torch.equal(a["first_logits"], b["first_logits"])
            assert np.array_equal(a["actions"], b["actions"]) and a["stream"] == b["stream"]
        assert a["stream"] == "reuse"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lean_vision_changes_no_tick(one_layer, world, dtype):
    """``lean_vision`` (the frames' encodes through mmspec.lean_vision) gives every cached frame feature and every
    tick's output bit for bit as ``get_image_features`` does: a full prefill encoding four frames of each of two
    cameras, then streamed ticks encoding one new frame per camera (the per-grid set-up reused)."""
    import copy

    vla = one_layer if dtype == torch.float32 else copy.deepcopy(one_layer).to(dtype)
    cams, cfg = ("front", "left"), {**STREAM, "spec": False}
    on, off = _pipe(vla, cfg, cams), _pipe(vla, {**cfg, "lean_vision": False}, cams)
    assert on.engine._lean_vision is not None and off.engine._lean_vision is None
    assert "lean_vision" in on.engine.describe() and "lean_vision" not in off.engine.describe()
    assert on.engine.exact == off.engine.exact
    for k in (20, 21, 22):
        a, b = _step(on, world, k, cams, tick=k), _step(off, world, k, cams, tick=k)
        assert a["tokens"] == b["tokens"] and torch.equal(a["first_logits"], b["first_logits"])
        assert np.array_equal(a["actions"], b["actions"]) and a["stream"] == b["stream"]
    # two set-ups, reused: the first tick's eight frames, then each streamed tick's new frame per camera
    assert a["stream"] == "reuse" and len(on.engine._lean_vision._setup) == 2
    fa, fb = on.engine._features, off.engine._features
    assert list(fa) == list(fb) and all(torch.equal(fa[key][0], fb[key][0]) for key in fa)


def test_patch_matmul_is_approximate_and_close(two_layer, world):
    """The patch matmul (opt-in) is labelled approximate by the engine and gives features close to the conv's; a tower
    the lean path cannot run falls back to ``get_image_features``, said by ``describe``."""
    import copy

    cfg = {"stream": False, "step_cache": None, "spec": False}
    pm, exact = _pipe(two_layer, {**cfg, "patch_matmul": True}), _pipe(two_layer, cfg)
    assert pm.engine.patch_matmul and not pm.engine.exact and not exact.engine.patch_matmul and exact.engine.exact
    assert "patch_matmul" in pm.engine.describe() and "approximate" in pm.engine.describe()
    a, b = _step(pm, world, 20), _step(exact, world, 20)
    fa, fb = pm.engine._features, exact.engine._features
    assert list(fa) == list(fb) and all(torch.allclose(fa[k][0], fb[k][0], rtol=1e-4, atol=1e-5) for k in fa)
    assert torch.allclose(a["first_logits"], b["first_logits"], rtol=1e-4, atol=1e-4)
    eager = copy.deepcopy(two_layer)
    eager.backbone.model.visual.config._attn_implementation = "eager"
    off = _pipe(eager, {**cfg, "patch_matmul": True})
    assert off.engine._lean_vision is None and not off.engine.patch_matmul and off.engine.exact
    assert "lean vision tower off: vision attention 'eager'" in off.engine.describe()
    assert "lean_vision" not in off.engine.describe().split(" (")[0]
    _step(off, world, 20)  # the model's own get_image_features runs


def test_flashdrive_config_parsing():
    from mmspec.drivers.flashdrive import FlashDriveConfig

    assert FlashDriveConfig.parse(None) is None and FlashDriveConfig.parse(False) is None
    full = FlashDriveConfig.parse(True)
    assert full.names() == ["vision_cache", "stream", "step_cache", "system", "spec", "lean_expert", "lean_lm",
                            "lean_vision"] and not full.exact
    assert FlashDriveConfig.parse("lean_lm").names() == ["lean_lm"] and FlashDriveConfig.parse("lean-lm").exact
    assert FlashDriveConfig.parse("lean_expert").names() == ["lean_expert"] and FlashDriveConfig.parse("lean-expert").exact
    assert not FlashDriveConfig.parse("system").lean_expert and not FlashDriveConfig.parse("system").lean_lm
    assert FlashDriveConfig.parse("lean_vision").names() == ["lean_vision"]
    assert FlashDriveConfig.parse("lean-vision").exact
    assert not FlashDriveConfig.parse("system").lean_vision and not full.patch_matmul  # the inexact one is opt-in
    # the patch matmul runs inside the lean tower (it turns it on) and is approximate
    dict_pm = {"patch_matmul": True, "lean_vision": False, "stream": False, "step_cache": None}
    for pm in (FlashDriveConfig.parse("patch_matmul"), FlashDriveConfig.parse(dict_pm)):
        assert pm.lean_vision and pm.names()[-2:] == ["lean_vision", "patch_matmul"] and not pm.exact
    assert full.spec == "auto"  # speculative reasoning where a drafter fits the VLA
    assert FlashDriveConfig.parse("system").names() == ["system"] and FlashDriveConfig.parse("system").exact
    assert FlashDriveConfig.parse("vision_cache,system,spec").exact  # greedy verification: exact
    # A dict keeps the defaults of the fields it leaves out: speculation stays "auto" (on where a drafter fits) unless
    # the dict turns it off; a mechanism list names what runs, so there it is off unless listed.
    assert FlashDriveConfig.parse({"step_cache": None}).spec == "auto"
    assert FlashDriveConfig.parse({"step_cache": None, "spec": False}).names() == [
        "vision_cache", "stream", "system", "lean_expert", "lean_lm", "lean_vision"]
    assert FlashDriveConfig.parse("stream").spec is False
    for bad in ("warp", {"nope": 1}, {"step_cache": "sometimes"}, {"on_break": "ignore"}, {"spec": "maybe"}, 3):
        with pytest.raises(InvalidInputError):
            FlashDriveConfig.parse(bad)


@pytest.mark.slow
def test_drive_sim_command_writes_records(two_layer, tmp_path):
    from mmspec.cli import main

    model = str(tmp_path / "vla")
    two_layer.save_pretrained(model)
    _glance(two_layer).save_pretrained(str(tmp_path / "drafter"))
    out = tmp_path / "sim.json"
    rc = main(["drive-sim", "--model", model, "--systems", "plain,flashdrive,stream,spec", "--clips", "1", "--ticks",
               "2", "--warmup", "1", "--closed-loop", "1", "--seconds", "2.3", "--samples", "2", "--threads", "1",
               "--clips-dir", str(tmp_path / "clips"), "--json", str(out), "--no-progress", "--step-study", "1",
               "--drafter", str(tmp_path / "drafter"), "--closed-loop-start", "3"])
    assert rc == 0
    data = json.loads(out.read_text())
    recs, study = data["results"], {r["variant"]: r for r in data["step_cache_study"]}
    assert study["uniform 3"]["drift_m"] == 0.0 and study["uniform 2"]["head_calls"] == 2
    assert study["adaptive 0.1"]["head_calls"] <= 3
    assert [r["system"] for r in recs] == ["plain", "flashdrive", "stream", "spec"]
    for r in recs:
        lat, q = r["latency_ms"], r["quality"]
        assert {"encode", "prefill", "decode", "action", "total", "p50", "p90"} <= set(lat) and r["hz"] > 0
        assert {"min_ade", "min_ade_2", "collision_rate", "offroad_rate", "red_light_rate", "n_scenarios"} <= set(q)
        assert q["n_scenarios"] == 1 and q["first_scenario"] == 3 and q["n_open_loop_ticks"] == 2
    assert recs[0]["exact"] and not recs[1]["exact"] and recs[3]["exact"]
    assert "fp32" in recs[3]["exact_note"] and "exact_note" not in recs[0]  # spec's exactness holds in fp32
    assert recs[0]["quality"]["vs_plain"]["reasoning_identical_rate"] == 1.0
    assert recs[3]["quality"]["vs_plain"]["reasoning_identical_rate"] == 1.0
    sp = recs[3]["speculation"]
    assert sp["tau"] >= 1.0 and sp["target_forwards"] <= sp["target_forwards_plain"]
    assert recs[3]["stage_ratio_vs_plain"]["decode"] > 0 and recs[0]["stage_ratio_vs_plain"]["total"] == 1.0
    assert recs[2]["quality"]["stream_reuse_rate"] > 0.5


def _scenario_key(scn) -> tuple:
    """What tells scenarios apart (the road is drawn from the same seed as these)."""
    return (scn.kind, scn.ego_speed, scn.desired_speed, repr(scn.lead), repr(scn.parked), repr(scn.pedestrian),
            repr(scn.light))


def test_closed_loop_start_drives_exactly_those_scenarios_of_a_run_from_zero(two_layer, tmp_path, monkeypatch,
                                                                             capsys):
    """A chunk (``--closed-loop-start K``, ``n`` scenarios) drives scenarios ``K .. K+n-1`` exactly as a run from 0
    drives them (same scenario, same noise, no state from an earlier drive: the same controls to the last bit), and
    its counts are those drives' incidents, so chunks of a long study add up; a negative start is refused before
    any model loads."""
    from mmspec.cli import main
    from mmspec.drivers import bench, world

    model = str(tmp_path / "vla")
    two_layer.save_pretrained(model)
    drives = []
    simulate = world.simulate

    def spy(scn, seconds, policy=None):
        sim = simulate(scn, seconds, policy)
        drives.append(sim)
        return sim

    monkeypatch.setattr(world, "simulate", spy)  # drive_sim imports it from the module at call time
    # Short reasoning keeps it fast (an untrained VLA reasons to the cap); the controls still read every stage.
    monkeypatch.setattr(bench, "DrivingPipeline", functools.partial(bench.DrivingPipeline, max_reasoning_tokens=3))

    def run(start, n):
        drives.clear()
        recs = bench.drive_sim(model, ("flashdrive",), clips=0, closed=n, closed_start=start, seconds=2.2,
                               samples=1, progress=False)
        return recs[0], list(drives)

    _, full = run(0, 3)
    rec, chunk = run(1, 2)
    assert len({_scenario_key(d.scenario) for d in full}) == 3  # the three differ, so a shifted chunk shows
    for got, want in zip(chunk, full[1:], strict=True):
        assert _scenario_key(got.scenario) == _scenario_key(want.scenario)
        assert len(got.controls) == len(want.controls) > 20  # the model drove after the hand-over at tick 20
        assert got.controls == want.controls and np.array_equal(np.array(got.ego), np.array(want.ego))
    q = rec["quality"]
    assert q["n_scenarios"] == 2 and q["first_scenario"] == 1 and rec["n_examples"] == 2 * 2  # 2 plans a drive
    for k in world.INCIDENTS:
        assert q[f"{k}_count"] == sum(world.safety_events(d, 20)[k] for d in full[1:])
    with pytest.raises(InvalidInputError, match="closed-loop-start >= 0"):
        bench.drive_sim(str(tmp_path / "not-loaded"), ("plain",), clips=0, closed=1, closed_start=-1)
    assert main(["drive-sim", "--model", model, "--clips", "0", "--closed-loop", "1", "--closed-loop-start", "-2",
                 "--no-progress"]) == 2
    assert "closed-loop-start >= 0" in capsys.readouterr().err
