"""EAGLE-3-style feature drafter: losslessness (text and Qwen2-VL), that training raises τ, saving/loading."""

import pytest
import torch

import mmspec
from mmspec.drafters import EagleDrafter
from mmspec.drafters.eagle import collect_eagle_data, train_eagle
from mmspec.errors import DrafterMismatchError
from mmspec.registry import make_drafter

import _tiny_qwen_vl as T
import _tiny_text

NEW = 24


def _perm_target():
    """A tiny Llama whose greedy continuation mostly follows a fixed permutation of the vocabulary
    (its LM head is its embedding table permuted, scaled so the residual path dominates): predictable
    enough that a few seconds of training make a good drafter, still a real Llama with real layers."""
    m = _tiny_text.model(200, hidden=48, layers=2)
    with torch.no_grad():
        perm = torch.randperm(197, generator=torch.Generator().manual_seed(3)) + 3
        inv = torch.arange(200)
        inv[perm] = torch.arange(3, 200)
        m.model.embed_tokens.weight.mul_(3.0)
        m.lm_head.weight.copy_(m.model.embed_tokens.weight[inv])
    return m


def _prompts(n, seed, lo=6, hi=14):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 200, (int(torch.randint(lo, hi, (1,), generator=g)),), generator=g) for _ in range(n)]


def _left_pad(rows):
    L = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), L, dtype=torch.long)
    mask = torch.zeros(len(rows), L, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, L - len(r):], mask[i, L - len(r):] = r, 1
    return {"input_ids": ids, "attention_mask": mask}


@pytest.fixture(scope="module")
def perm():
    """(target, random drafter, trained drafter, held-out inputs)."""
    torch.manual_seed(0)
    target = _perm_target()
    train = _prompts(50, seed=1)
    rand = EagleDrafter.from_target(target, seed=0)
    data = collect_eagle_data(target, train, rand.layer_ids, max_new_tokens=32)
    trained = train_eagle(target, None, steps=120, data=data, seed=0, lr=1e-2)
    held = _left_pad(_prompts(10, seed=7))
    return target, rand, trained, held


def _tau(target, drafter, inputs):
    out = mmspec.generate(target, inputs, drafter=drafter, max_new_tokens=32)
    ref = target.generate(**inputs, max_new_tokens=32, do_sample=False)
    assert torch.equal(out.sequences, ref)
    return out.stats.tau


# --------------------------------------------------------------------------- losslessness
def _eos_mid(model, inputs, row=1, at=5):
    plen = inputs["input_ids"].shape[1]
    free = model.generate(**inputs, max_new_tokens=NEW, do_sample=False)
    return int(free[row, plen + at])


@pytest.mark.parametrize("which", ["random", "trained"])
def test_greedy_equals_generate_text(perm, which):
    """Batch 1, and batch 3 left-padded with an eos that ends one row early (pad filling after it)."""
    target, rand, trained, _ = perm
    drafter = rand if which == "random" else trained
    one = _left_pad(_prompts(1, seed=11))
    ref = target.generate(**one, max_new_tokens=NEW, do_sample=False)
    out = mmspec.generate(target, one, drafter=drafter, max_new_tokens=NEW)
    assert torch.equal(out.sequences, ref)
    three = _left_pad(_prompts(3, seed=12, lo=4, hi=12))
    eos = _eos_mid(target, three)
    ref = target.generate(**three, max_new_tokens=NEW, do_sample=False, eos_token_id=eos)
    plen = three["input_ids"].shape[1]
    ends = [int((r[plen:] == eos).nonzero()[0]) + 1 if (r[plen:] == eos).any() else NEW for r in ref]
    assert len(set(ends)) > 1, ends
    out = mmspec.generate(target, three, drafter=drafter, max_new_tokens=NEW, eos_token_id=eos)
    assert torch.equal(out.sequences, ref)
    assert out.stats.lossless


def test_greedy_equals_generate_random_target():
    """A plain random tiny Llama (no structure): the random head accepts little, the output is still exact."""
    target = _tiny_text.model(200, hidden=48, layers=3, seed=4)
    drafter = EagleDrafter.from_target(target, seed=1, num_draft_tokens=3)
    assert drafter.hidden_layers == (1, 2)
    inputs = _left_pad(_prompts(3, seed=5))
    ref = target.generate(**inputs, max_new_tokens=NEW, do_sample=False)
    assert torch.equal(mmspec.generate(target, inputs, drafter=drafter, max_new_tokens=NEW).sequences, ref)


def test_greedy_equals_generate_qwen2_vl():
    model = T.build("qwen2_vl")
    drafter = EagleDrafter.from_target(model, seed=0)
    inputs = T.make_inputs("qwen2_vl", [{"pre": 3, "images": [(56, 56)], "post": 5},
                                        {"pre": 2, "images": [(28, 56), (56, 28)], "post": 3}])
    ref = model.generate(**inputs, max_new_tokens=NEW, do_sample=False)
    out = mmspec.generate(model, inputs, drafter=drafter, max_new_tokens=NEW)
    assert torch.equal(out.sequences, ref)


def test_sampling_attaches_draft_probs(perm):
    """When the target samples, the chain is sampled from the head's softmax and q is attached."""
    target, _, trained, held = perm
    seen = []
    orig = trained.propose

    def spy(ctx):
        trees = orig(ctx)
        seen.extend(t.draft_probs for t in trees)
        return trees

    trained.propose = spy
    try:
        out = mmspec.generate(target, held, drafter=trained, max_new_tokens=16, do_sample=True, seed=0)
    finally:
        del trained.propose
    assert out.stats.lossless and out.sequences.shape[1] == held["input_ids"].shape[1] + 16
    assert seen and all(q is not None and q.shape[-1] == 200 for q in seen)
    assert torch.allclose(seen[0].sum(-1), torch.ones(seen[0].shape[0]), atol=1e-4)


# --------------------------------------------------------------------------- it learns
def test_training_raises_tau(perm):
    target, rand, trained, held = perm
    tau_rand = _tau(target, rand, held)
    tau_trained = _tau(target, trained, held)
    print(f"tau random {tau_rand:.3f} trained {tau_trained:.3f}")
    assert tau_trained > 2.0 and tau_trained > tau_rand + 1.0, (tau_rand, tau_trained)


# --------------------------------------------------------------------------- saving
def test_save_load_round_trip_and_registry(perm, tmp_path):
    target, _, trained, held = perm
    trained.save_pretrained(tmp_path / "head")
    loaded = EagleDrafter.from_pretrained(tmp_path / "head", target=target)
    assert loaded.config_dict() == trained.config_dict()
    assert loaded.fingerprint == trained.fingerprint and loaded.fingerprint["layer_ids"] == list(trained.layer_ids)
    for (k, a), (_, b) in zip(sorted(trained.state_dict().items()), sorted(loaded.state_dict().items())):
        assert torch.equal(a, b), k
    made = make_drafter(f"eagle:{tmp_path / 'head'}", target, num_draft_tokens=3)
    assert isinstance(made, EagleDrafter) and made.num_draft_tokens == 3
    a = mmspec.generate(target, held, drafter=trained, max_new_tokens=16)
    b = mmspec.generate(target, held, drafter=loaded, max_new_tokens=16)
    assert torch.equal(a.sequences, b.sequences) and a.stats.tau == b.stats.tau
    other = _tiny_text.model(200, hidden=32, layers=2)
    with pytest.raises(DrafterMismatchError):
        make_drafter(f"eagle:{tmp_path / 'head'}", other)
    with pytest.raises(DrafterMismatchError):
        mmspec.generate(other, held, drafter=loaded, max_new_tokens=4)


# --------------------------------------------------------------------------- KV cache and dynamic tree
def _full_logits(drafter, target, seq):
    """The head's logits at every position of ``seq`` from one uncached pass with the target's features."""
    from mmspec.drafters.eagle import collate_eagle, target_record

    batch = collate_eagle([target_record(target, seq, drafter.layer_ids, max_new_tokens=1)])
    fused = drafter.fuse_features(list(batch["features"].chunk(3, dim=-1)))
    feats = torch.cat([torch.zeros(1, 1, drafter.hidden_size), fused[:, :-1]], dim=1)
    T_ = batch["tokens"].shape[1]
    with torch.no_grad():
        logits, _, _, _ = drafter(batch["tokens"], feats, torch.arange(T_)[None],
                                  torch.ones(T_, T_, dtype=torch.bool).tril()[None])
    return logits[0]


@pytest.mark.parametrize("topk,nodes", [(1, None), (3, 8)])
def test_cached_head_matches_full_recompute(perm, topk, nodes):
    """The head's KV cache, fed from verify passes round by round, gives at every round the same
    pending-position logits as one uncached pass over the whole committed sequence with the target's
    features from a single forward (what training sees)."""
    target, _, trained, held = perm
    drafter = trained
    drafter.topk, drafter.tree_nodes = topk, nodes
    seen = []
    orig = drafter._extend_cache

    def spy(ctx, room=0):
        out = orig(ctx, room)
        seen.append((ctx.sequences[0].copy(), out[1][0].clone()))
        return out

    drafter._extend_cache = spy
    try:
        one = _left_pad(_prompts(1, seed=21))
        out = mmspec.generate(target, one, drafter=drafter, max_new_tokens=20)
    finally:
        del drafter._extend_cache
        drafter.topk, drafter.tree_nodes = 1, None
    assert len(seen) >= 3
    logits = _full_logits(drafter, target, out.sequences[0])[None]
    for seq, root_logits in seen:
        n = len(seq) - 1
        assert torch.equal(torch.as_tensor(seq), out.sequences[0, : n + 1])
        assert torch.allclose(root_logits, logits[0, n], atol=1e-4), n


@pytest.mark.parametrize("topk,nodes", [(1, None), (3, 8)])
def test_batched_head_cache_matches_full_recompute_past_its_first_buffer(perm, topk, nodes):
    """Batch 3 with uneven (left-padded) prompts and 80 new tokens, more than each row's first key/value
    buffer holds (prompt + 64): at every round each row's pending-position logits equal an uncached pass
    over its committed tokens, so the batched write-back and the buffer growth keep the cache exact."""
    target, _, trained, _ = perm
    three = _left_pad(_prompts(3, seed=31, lo=4, hi=12))
    seen = []
    orig = trained._extend_cache

    def spy(ctx, room=0):
        out = orig(ctx, room)
        seen.extend((r, seq.copy(), out[1][b].clone()) for b, (r, seq) in enumerate(zip(ctx.rows, ctx.sequences)))
        return out

    trained._extend_cache = spy
    trained.topk, trained.tree_nodes = topk, nodes
    try:
        out = mmspec.generate(target, three, drafter=trained, max_new_tokens=80)
    finally:
        del trained._extend_cache
        trained.topk, trained.tree_nodes = 1, None
    assert torch.equal(out.sequences, target.generate(**three, max_new_tokens=80, do_sample=False))
    pad = three["input_ids"].shape[1] - three["attention_mask"].sum(1)
    full = {r: _full_logits(trained, target, out.sequences[r, int(pad[r]):]) for r in range(3)}
    grown = [len(seq) for r, seq, _ in seen if len(seq) > int(three["attention_mask"][r].sum()) + 65]
    assert len({r for r, _, _ in seen}) == 3 and grown
    for r, seq, root_logits in seen:
        n = len(seq) - 1
        assert torch.allclose(root_logits, full[r][n], atol=1e-4), (r, n)


@pytest.mark.parametrize("topk,nodes", [(2, 5), (3, 10)])
def test_tree_greedy_equals_generate(perm, topk, nodes):
    target, _, trained, _ = perm
    trained.topk, trained.tree_nodes = topk, nodes
    try:
        three = _left_pad(_prompts(3, seed=12, lo=4, hi=12))
        eos = _eos_mid(target, three)
        ref = target.generate(**three, max_new_tokens=NEW, do_sample=False, eos_token_id=eos)
        seen = []
        orig = trained.propose
        trained.propose = lambda ctx: seen.extend(orig(ctx)) or seen[-len(ctx.rows):]
        out = mmspec.generate(target, three, drafter=trained, max_new_tokens=NEW, eos_token_id=eos)
    finally:
        trained.topk, trained.tree_nodes = 1, None
        trained.__dict__.pop("propose", None)
    assert torch.equal(out.sequences, ref)
    assert max(len(t) for t in seen) == nodes and max(t.max_depth for t in seen) == trained.num_draft_tokens
    widths = [max(len(c) for c in t.children()) for t in seen if len(t)]
    assert max(widths) > 1  # a real tree, not a chain


def test_tree_not_worse_than_chain_and_qwen2_vl(perm):
    target, _, trained, held = perm
    chain = _tau(target, trained, held)
    trained.topk, trained.tree_nodes = 3, 12
    try:
        tree = _tau(target, trained, held)
        model = T.build("qwen2_vl")
        vl = EagleDrafter.from_target(model, seed=0, topk=3, tree_nodes=9, num_draft_tokens=3)
        inputs = T.make_inputs("qwen2_vl", [{"pre": 3, "images": [(56, 56)], "post": 5},
                                            {"pre": 2, "images": [(28, 56), (56, 28)], "post": 3}])
        ref = model.generate(**inputs, max_new_tokens=NEW, do_sample=False)
        assert torch.equal(mmspec.generate(model, inputs, drafter=vl, max_new_tokens=NEW).sequences, ref)
        sampled = mmspec.generate(target, held, drafter=trained, max_new_tokens=16, do_sample=True, seed=0)
        assert sampled.stats.lossless
    finally:
        trained.topk, trained.tree_nodes = 1, None
    print(f"tau chain {chain:.2f} tree {tree:.2f}")
    assert tree >= chain - 0.05, (chain, tree)


def test_unroll_from_the_answer_start_equals_the_full_unroll():
    """Training-time test unrolled only from the first labelled position gives the same losses as the full
    unroll (labels before it are masked either way): the prompt is skipped, nothing else changes."""
    from mmspec.drafters.eagle import eagle_unroll_loss

    target = _tiny_text.model(200, hidden=48, layers=2, seed=2)
    head = EagleDrafter.from_target(target, seed=0)
    g = torch.Generator().manual_seed(0)
    B, T, P = 3, 20, 9
    batch = {"tokens": torch.randint(3, 200, (B, T), generator=g),
             "labels": torch.randint(3, 200, (B, T), generator=g),
             "features": torch.randn(B, T, 3 * 48, generator=g),
             "valid": torch.ones(B, T, dtype=torch.bool)}
    batch["valid"][2, -4:] = False
    batch["labels"][2, -4:] = -100
    batch["labels"][:, : P + 3] = -100  # what neither version may score
    with torch.no_grad():
        full, acc_full = eagle_unroll_loss(head, {**batch, "start": 0}, unroll=4)
        part, acc_part = eagle_unroll_loss(head, {**batch, "start": P}, unroll=4)
    assert torch.allclose(full, part, atol=1e-5) and torch.allclose(acc_full, acc_part)


def test_union_with_lookup_and_an_oracle_keeps_the_head_in_step(perm):
    """In a union the accepted path often runs through another member's nodes: the head must still take
    the states of the nodes that were accepted (it raises if it loses track), output stays exact, and the
    union accepts at least what the head alone does."""
    from mmspec.drafters import NoisyOracleDrafter, PromptLookupDrafter, UnionDrafter

    target, _, trained, held = perm
    three = _left_pad(_prompts(3, seed=12, lo=4, hi=12))
    eos = _eos_mid(target, three)
    ref = target.generate(**three, max_new_tokens=NEW, do_sample=False, eos_token_id=eos)
    plen = three["input_ids"].shape[1]
    oracle = NoisyOracleDrafter(ref[:, plen:], depth=6, corrupt_p=0.2, vocab_size=target.config.vocab_size)
    union = UnionDrafter([trained, oracle, PromptLookupDrafter(history_tokens=500)])
    assert union.hidden_layers == trained.hidden_layers and union.members == "eagle & noisy-oracle & lookup"
    out = mmspec.generate(target, three, drafter=union, max_new_tokens=NEW, eos_token_id=eos)
    assert torch.equal(out.sequences, ref) and out.stats.lossless
    alone = mmspec.generate(target, three, drafter=trained, max_new_tokens=NEW, eos_token_id=eos)
    assert out.stats.tau >= alone.stats.tau
    model = T.build("qwen2_vl")
    from mmspec.registry import make_drafter

    vl = make_drafter("eagle;untrained=true;num_draft_tokens=3 & lookup;history_tokens=50", model)  # an untrained head
    assert isinstance(vl.drafters[0], EagleDrafter) and vl.drafters[1].history_tokens == 50
    inputs = T.make_inputs("qwen2_vl", [{"pre": 3, "images": [(56, 56)], "post": 5},
                                        {"pre": 2, "images": [(28, 56), (56, 28)], "post": 3}])
    ref = model.generate(**inputs, max_new_tokens=NEW, do_sample=False)
    assert torch.equal(mmspec.generate(model, inputs, drafter=vl, max_new_tokens=NEW).sequences, ref)


# --------------------------------------------------------------------------- early stop on the head's confidence
def _spied(drafter):
    seen, orig = [], drafter.propose

    def spy(ctx):
        trees = orig(ctx)
        seen.extend(trees)
        return trees

    drafter.propose = spy
    return seen


@pytest.mark.parametrize("topk,nodes", [(1, None), (3, 8)])
def test_min_confidence_shortens_drafts_and_stays_exact(perm, topk, nodes):
    """A threshold on the head's cumulative probability drops its unsure drafts (fewer head steps, fewer
    verified tokens per round); the output stays exactly the target's, at batch 1 and batch 3 with an eos."""
    from mmspec.budget import ConfidenceStop

    target, _, trained, _ = perm
    three = _left_pad(_prompts(3, seed=12, lo=4, hi=12))
    eos = _eos_mid(target, three)
    ref = target.generate(**three, max_new_tokens=NEW, do_sample=False, eos_token_id=eos)
    one = _left_pad(_prompts(1, seed=11))
    ref1 = target.generate(**one, max_new_tokens=NEW, do_sample=False)
    trained.topk, trained.tree_nodes = topk, nodes
    sizes = {}
    try:
        for thr in (None, 0.9):
            trained.stop = ConfidenceStop.parse(thr)
            seen = _spied(trained)
            out = mmspec.generate(target, three, drafter=trained, max_new_tokens=NEW, eos_token_id=eos)
            assert torch.equal(out.sequences, ref), thr
            assert torch.equal(mmspec.generate(target, one, drafter=trained, max_new_tokens=NEW).sequences, ref1)
            del trained.propose
            sizes[thr] = [len(t) for t in seen]
    finally:
        trained.topk, trained.tree_nodes, trained.stop = 1, None, None
        trained.__dict__.pop("propose", None)
    full = nodes or trained.num_draft_tokens
    assert max(sizes[None]) == full
    cut = sizes[0.9]
    assert min(cut) < full and max(cut) > 0 and sum(cut) / len(cut) < 0.9 * full, cut


def test_min_confidence_auto_learns_a_threshold_and_saves(perm, tmp_path):
    """``auto`` starts from its initial guess, then derives the threshold from the rounds it timed; the
    choice is saved with the head and can be overridden from the registry spec."""
    target, _, trained, held = perm
    trained.save_pretrained(tmp_path / "h")
    auto = make_drafter(f"eagle:{tmp_path / 'h'};min_confidence=auto", target)
    assert auto.stop is not None and auto.stop.auto and auto.stop.threshold() == auto.stop.initial
    ref = target.generate(**held, max_new_tokens=NEW, do_sample=False)
    for _ in range(3):
        assert torch.equal(mmspec.generate(target, held, drafter=auto, max_new_tokens=NEW).sequences, ref)
    thr = auto.stop.threshold()
    assert auto.stop.cost.n >= 8 and 0.01 <= thr <= 0.9 and thr != auto.stop.initial
    auto.save_pretrained(tmp_path / "auto")
    again = EagleDrafter.from_pretrained(tmp_path / "auto", target=target)
    assert again.stop.auto and again.config_dict()["min_confidence"] == "auto"
    assert make_drafter(f"eagle:{tmp_path / 'auto'};min_confidence=none", target).stop is None
    assert make_drafter(f"eagle:{tmp_path / 'auto'};min_confidence=0.4", target).stop.threshold() == 0.4
    assert EagleDrafter.from_pretrained(tmp_path / "h", target=target).stop is None  # saved without one
    with pytest.raises(mmspec.InvalidInputError, match="min_confidence"):
        make_drafter(f"eagle:{tmp_path / 'h'};min_confidence=sometimes", target)


def test_min_confidence_on_qwen2_vl_batch():
    model = T.build("qwen2_vl")
    drafter = EagleDrafter.from_target(model, seed=0, min_confidence=0.02)
    inputs = T.make_inputs("qwen2_vl", [{"pre": 3, "images": [(56, 56)], "post": 5},
                                        {"pre": 2, "images": [(28, 56), (56, 28)], "post": 3}])
    ref = model.generate(**inputs, max_new_tokens=NEW, do_sample=False)
    seen = _spied(drafter)
    out = mmspec.generate(model, inputs, drafter=drafter, max_new_tokens=NEW)
    assert torch.equal(out.sequences, ref)
    assert min(len(t) for t in seen) < drafter.num_draft_tokens


def test_target_record_with_a_reference_is_the_targets_own_rollout(perm):
    """The reference shortcut regenerates losslessly: the same record as plain ``generate`` (a reference that is
    half right and half wrong, so both accepted and rejected drafts occur), with fewer target passes."""
    from mmspec.drafters.eagle import target_record

    target, rand, _, _ = perm
    prompt = _prompts(1, seed=11)[0]
    plain = target_record(target, prompt, rand.layer_ids, max_new_tokens=20)
    answer = plain["tokens"][len(prompt):].tolist()
    reference = answer[:10] + [(t + 1) % 200 for t in answer[10:]]
    fast = target_record(target, prompt, rand.layer_ids, max_new_tokens=20, reference=reference)
    assert torch.equal(fast["tokens"], plain["tokens"]) and torch.equal(fast["labels"], plain["labels"])
    torch.testing.assert_close(fast["features"], plain["features"])


def test_text_records_batch_as_the_target_generates_each_prompt_alone():
    """The batched text rollout (one left-padded generate, then each prompt's own forward) gives every prompt the
    record of its own batch-1 ``generate`` and forward: same tokens (cut at its end-of-turn token), labels and
    features, with prompts of three lengths and one response stopped early by the end-of-turn token."""
    from mmspec.drafters.eagle import text_target_records

    model = _tiny_text.model(200, layers=3, seed=4)
    prompts = [torch.tensor(p) for p in ([5, 9, 14], [30, 31, 32, 33, 34, 35, 36], [7, 70, 17, 71, 8])]

    def alone(p):
        full = model.generate(input_ids=p[None], attention_mask=torch.ones(1, len(p), dtype=torch.long),
                              max_new_tokens=12, do_sample=False)[0]
        out = model(input_ids=full[None], output_hidden_states=True)
        return full, out.logits[0].argmax(-1), torch.cat([out.hidden_states[i][0] for i in (1, 2, 3)], -1)

    model.generation_config.eos_token_id = int(alone(prompts[1])[0][len(prompts[1]) + 4])  # row 1 stops by 5
    want = [alone(p) for p in prompts]
    assert len(want[1][0]) <= len(prompts[1]) + 5 and len({len(w[0]) - len(p) for w, p in zip(want, prompts)}) > 1
    recs = text_target_records(model, prompts, (1, 2, 3), max_new_tokens=12)
    for p, (full, labels, feats), r in zip(prompts, want, recs):
        assert int(r["prompt_len"]) == len(p)
        assert torch.equal(r["tokens"], full) and torch.equal(r["labels"], labels)
        torch.testing.assert_close(r["features"], feats, atol=1e-5, rtol=1e-4)


def test_trainer_batches_plain_text_requests_and_keeps_the_rest_one_at_a_time(monkeypatch):
    """``EagleTrainer.records``: plain text requests without a reference go through one batched rollout, a request
    with a reference or a padded mask goes alone, the records come back in request order and equal
    :meth:`record`'s; a trainer whose ``record`` is its own (GLANCE's, TIGER's) gets it called per request, and
    FastMTP (EAGLE's record) batches."""
    import mmspec.drafters.eagle as eagle_mod
    from mmspec.drafters.fastmtp.train import FastMTPTrainer
    from mmspec.train import EagleTrainer, TrainConfig

    model = _tiny_text.model(200, layers=3, seed=4)
    cfg = TrainConfig(kind="eagle", target="unused", out="unused", max_new_tokens=10)

    def req(ids, ref=None, mask=None):
        ids = torch.tensor([ids])
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids) if mask is None else torch.tensor([mask])}, ref

    requests = [req([5, 9, 14]), req([30, 31, 32, 33], ref=[40, 41, 42]), req([7, 70, 17, 71, 8]),
                req([0, 0, 12, 13], mask=[0, 0, 1, 1])]
    batched = []
    real = eagle_mod.text_target_records
    monkeypatch.setattr(eagle_mod, "text_target_records",
                        lambda m, prompts, *a, **k: batched.append(len(prompts)) or real(m, prompts, *a, **k))
    got = EagleTrainer().records(cfg, model, requests, (1, 2, 3))
    assert batched == [2]  # the two plain ones, together (the single ones route through it at batch 1 below)
    batched.clear()
    want = [EagleTrainer().record(cfg, model, inputs, (1, 2, 3), reference=ref) for inputs, ref in requests]
    for g, w in zip(got, want):
        assert torch.equal(g["tokens"], w["tokens"]) and torch.equal(g["labels"], w["labels"])
        torch.testing.assert_close(g["features"], w["features"], atol=1e-5, rtol=1e-4)
    batched.clear()
    FastMTPTrainer().records(cfg, model, requests[:1] + requests[2:3], (1, 2, 3))
    assert batched == [2]
    calls = []

    class OwnRecord(EagleTrainer):
        def record(self, cfg, model, inputs, layer_ids, reference=None):
            calls.append(reference)
            return super().record(cfg, model, inputs, layer_ids, reference=reference)

    batched.clear()
    OwnRecord().records(cfg, model, requests, (1, 2, 3))
    assert len(calls) == len(requests) and batched == [1, 1]  # per request (plain ones through record at batch 1)
