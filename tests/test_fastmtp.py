"""FastMTP: one MTP block shared recursively across K steps. Losslessness (greedy equals ``generate`` on tiny
Qwen2 and Qwen2-VL at batch > 1, chain and tree; the sampling law), that training raises tau, the step-weighted
loss against a value computed by hand, saving / loading / ``auto``, and ``mmspec train --kind fastmtp`` end to end
(with the ``fastmtp`` system of ``mmspec bench --workload docs``)."""

import json

import pytest
import torch

import mmspec
from mmspec.drafters import EagleDrafter
from mmspec.drafters.eagle import collate_eagle, collect_eagle_data
from mmspec.drafters.fastmtp import FastMTPDrafter, FastMTPLoss, FastMTPTrainer, step_weights
from mmspec.errors import DrafterMismatchError, InvalidInputError
from mmspec.registry import make_drafter
from mmspec.train import TrainConfig, get_trainer

import _tiny_archs
import _tiny_qwen_vl as T
import _tiny_text
from test_eagle import _eos_mid, _left_pad, _perm_target, _prompts
from test_sampling_e2e import _check, model  # noqa: F401  (model: the V = 6 Llama fixture of the law tests)

NEW = 24


def _train(target, drafter, data, steps=80, lr=1e-2, seed=0):
    """A few steps of FastMTP's objective (the loss ``mmspec train --kind fastmtp`` optimises), in memory."""
    import random

    rng = random.Random(seed)
    module = FastMTPLoss(drafter, drafter.num_draft_tokens).train()
    params = [p for p in module.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr)
    for _ in range(steps):
        losses, _ = module(collate_eagle(rng.sample(data, 8)))
        opt.zero_grad()
        losses.sum().backward()
        opt.step()
    return drafter.eval()


@pytest.fixture(scope="module")
def perm():
    """(target, random head, trained head, held-out inputs) on the permutation Llama of the EAGLE tests."""
    torch.manual_seed(0)
    target = _perm_target()
    rand = FastMTPDrafter.from_target(target, seed=0)
    data = collect_eagle_data(target, _prompts(30, seed=1), rand.layer_ids, max_new_tokens=32)
    trained = _train(target, FastMTPDrafter.from_target(target, seed=0), data, steps=80)
    return target, rand, trained, _left_pad(_prompts(10, seed=7))


# --------------------------------------------------------------------------- losslessness
def test_greedy_equals_generate_qwen2_batch4_chain_and_tree():
    arch = _tiny_archs.qwen2_text()
    inputs = arch.make_inputs(4)
    ref = arch.model.generate(**inputs, max_new_tokens=NEW, do_sample=False)
    for opts in ({}, {"topk": 3, "tree_nodes": 8}):
        drafter = FastMTPDrafter.from_target(arch.model, seed=1, **opts)
        assert drafter.hidden_layers == (2,)  # the last layer of the 2-layer target
        out = mmspec.generate(arch.model, inputs, drafter=drafter, max_new_tokens=NEW)
        assert torch.equal(out.sequences, ref), opts
        assert out.stats.lossless


def test_greedy_equals_generate_qwen2_vl_batch2():
    model = T.build("qwen2_vl")
    drafter = FastMTPDrafter.from_target(model, seed=0)
    inputs = T.make_inputs("qwen2_vl", [{"pre": 3, "images": [(56, 56)], "post": 5},
                                        {"pre": 2, "images": [(28, 56), (56, 28)], "post": 3}])
    ref = model.generate(**inputs, max_new_tokens=NEW, do_sample=False)
    assert torch.equal(mmspec.generate(model, inputs, drafter=drafter, max_new_tokens=NEW).sequences, ref)


@pytest.mark.parametrize("opts", [{}, {"topk": 2, "tree_nodes": 6}])
def test_trained_head_greedy_equals_generate_with_an_early_eos(perm, opts):
    """Batch 3, left-padded, one row ending early on an eos (padding after it); chain and tree."""
    target, _, trained, _ = perm
    for k, v in opts.items():
        setattr(trained, k, v)
    try:
        three = _left_pad(_prompts(3, seed=12, lo=4, hi=12))
        eos = _eos_mid(target, three)
        ref = target.generate(**three, max_new_tokens=NEW, do_sample=False, eos_token_id=eos)
        out = mmspec.generate(target, three, drafter=trained, max_new_tokens=NEW, eos_token_id=eos)
        assert torch.equal(out.sequences, ref)
    finally:
        trained.topk, trained.tree_nodes = 1, None


LAW = {
    # An untrained head sampling a chain of K = 3 from its own softmax (q attached).
    "fastmtp-stoch-chain": (lambda cond, m: FastMTPDrafter.from_target(m, seed=0), 4, {}, 3, 2048),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(LAW))
def test_sampling_matches_exact_law(model, name):  # noqa: F811
    _check(model, name, LAW[name], seed=2026)


# --------------------------------------------------------------------------- it learns
def test_training_raises_tau(perm):
    target, rand, trained, held = perm

    def tau(d):
        out = mmspec.generate(target, held, drafter=d, max_new_tokens=32)
        assert torch.equal(out.sequences, target.generate(**held, max_new_tokens=32, do_sample=False))
        return out.stats.tau

    t_rand, t_trained = tau(rand), tau(trained)
    print(f"fastmtp tau random {t_rand:.3f} trained {t_trained:.3f}")
    assert t_trained > 2.0 and t_trained > t_rand + 1.0, (t_rand, t_trained)


# --------------------------------------------------------------------------- the loss, by hand
def test_step_weights_are_fastmtps():
    w = step_weights(3)
    assert w.tolist() == pytest.approx([1 / 1.96, 0.6 / 1.96, 0.36 / 1.96])  # 0.51, 0.31, 0.18 (beta 0.6)
    assert step_weights(1).tolist() == [1.0] and step_weights(4, 1.0).tolist() == [0.25] * 4
    with pytest.raises(ValueError):
        step_weights(0)


def test_weighted_loss_equals_a_hand_computed_recursion():
    """The loss ``fit`` minimises, against cross-entropies computed here one chain at a time with the head's own
    cache, as decoding runs it: step 1 over the committed prefix; step k reads the true token and the block's
    output of step k - 1, and attends to the prefix's step-1 keys and its own chain. Weighted by 1, 0.6, 0.36
    over 1.96."""
    torch.manual_seed(0)
    target = _tiny_text.model(50, hidden=32, layers=2, seed=3)
    head = FastMTPDrafter.from_target(target, seed=5)
    T_, H = 9, 32
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(3, 50, (T_,), generator=g)
    labels = torch.randint(3, 50, (T_,), generator=g)
    labels[0] = -100  # a position without a label is left out of every step
    feats = torch.randn(T_, H, generator=g)
    batch = collate_eagle([{"tokens": tokens, "labels": labels, "features": feats}])
    losses, accs = FastMTPLoss(head, 3)(batch)

    ce = [[], [], []]
    with torch.no_grad():
        pos = torch.arange(T_)[None]
        causal = torch.ones(T_, T_, dtype=torch.bool).tril()[None]
        f_prev = torch.cat([torch.zeros(1, H), feats[:-1]])[None]  # input i reads the state of i - 1
        logits1, out1, k1, v1 = head(tokens[None], f_prev, pos, causal)
        for j in range(T_):
            if labels[j] >= 0:
                ce[0].append(torch.nn.functional.cross_entropy(logits1[0, j], labels[j]))
        for c in range(T_):  # a chain from committed position c: step 1 at c, step 2 at c + 1, step 3 at c + 2
            pk, pv, state = k1[:, :, : c + 1], v1[:, :, : c + 1], out1[:, c: c + 1]
            for s in (2, 3):
                j = c + s - 1
                if j >= T_:
                    break
                lg, state, k, v = head(tokens[None, j: j + 1], state, pos[:, j: j + 1], None, pk, pv)
                pk, pv = torch.cat([pk, k], 2), torch.cat([pv, v], 2)
                if labels[j] >= 0:
                    ce[s - 1].append(torch.nn.functional.cross_entropy(lg[0, 0], labels[j]))
    ce = torch.stack([torch.stack(x).mean() for x in ce])
    alpha = torch.tensor([1.0, 0.6, 0.36]) / 1.96
    assert losses.detach() == pytest.approx((alpha * ce).tolist(), abs=1e-5)
    assert float(losses.detach().sum()) == pytest.approx(float((alpha * ce).sum()), abs=1e-5)
    assert accs.shape == (3,)


# --------------------------------------------------------------------------- saving, the registry, auto
def test_save_load_fingerprint_registry_and_auto(perm, tmp_path):
    from mmspec.drafters.validation import write_validation

    target, _, trained, held = perm
    trained.save_pretrained(tmp_path / "heads" / "fastmtp")
    cfg = json.loads((tmp_path / "heads" / "fastmtp" / "config.json").read_text())
    assert cfg["drafter_kind"] == "fastmtp" and cfg["target_fingerprint"]["layer_ids"] == [2]
    assert cfg["config"]["num_draft_tokens"] == 3 and cfg["config"]["layer_ids"] == [2]
    loaded = FastMTPDrafter.from_pretrained(tmp_path / "heads" / "fastmtp", target=target)
    assert loaded.config_dict() == trained.config_dict()
    for (k, a), (_, b) in zip(sorted(trained.state_dict().items()), sorted(loaded.state_dict().items())):
        assert torch.equal(a, b), k
    a = mmspec.generate(target, held, drafter=trained, max_new_tokens=16)
    b = mmspec.generate(target, held, drafter=loaded, max_new_tokens=16)
    assert torch.equal(a.sequences, b.sequences) and a.stats.tau == b.stats.tau
    made = make_drafter(f"fastmtp:{tmp_path / 'heads' / 'fastmtp'};num_draft_tokens=4;topk=2", target)
    assert type(made) is FastMTPDrafter and (made.num_draft_tokens, made.topk) == (4, 2)
    other = _tiny_text.model(200, hidden=32, layers=2)
    with pytest.raises(DrafterMismatchError):
        make_drafter(f"fastmtp:{tmp_path / 'heads' / 'fastmtp'}", other)
    with pytest.raises(InvalidInputError, match="holds a 'fastmtp' drafter, not 'eagle'"):
        EagleDrafter.from_pretrained(tmp_path / "heads" / "fastmtp")
    with pytest.raises(InvalidInputError, match="'fastmtp' names no trained head"):
        make_drafter("fastmtp", target)
    assert type(make_drafter("fastmtp;untrained=true", target)) is FastMTPDrafter
    # drafter="auto" over a folder of saved drafters: the fastmtp head with the best validation tau is chosen
    EagleDrafter.from_target(target, seed=0).save_pretrained(tmp_path / "heads" / "eagle")
    write_validation(tmp_path / "heads" / "eagle", {"tau": 1.5, "accept_rate": [0.5]})
    write_validation(tmp_path / "heads" / "fastmtp", {"tau": 2.5, "accept_rate": [0.8, 0.8]})
    auto = make_drafter(f"auto:{tmp_path / 'heads'};cache=false", target)
    assert type(auto) is FastMTPDrafter and auto.auto_choice.chosen.kind == "fastmtp"


def test_trainer_config_checks(tmp_path):
    from mmspec.demo import tiny_vlm_path

    def cfg(**kw):
        return TrainConfig(kind="fastmtp", target=tiny_vlm_path(), out=str(tmp_path / "o"), **kw)

    c = cfg().validate_target()
    assert c.num_draft_tokens == 3 and c.unroll == 3  # FastMTP's K = 3 unless told otherwise
    assert TrainConfig(kind="eagle", target=tiny_vlm_path(), out=str(tmp_path / "e")).validate().num_draft_tokens == 4
    assert isinstance(get_trainer("fastmtp"), FastMTPTrainer)
    assert get_trainer("fastmtp").layer_ids(c, _tiny_config()) == (2,)
    for kw, msg in [({"layer_ids": (1, 2)}, "reads one target layer"), ({"options": {"beta": 0}}, "beta must be"),
                    ({"options": {"gamma": 1}}, "unknown fastmtp training options")]:
        with pytest.raises(InvalidInputError, match=msg):
            cfg(**kw).validate()


def _tiny_config():
    from transformers import AutoConfig

    from mmspec.demo import tiny_vlm_path

    return AutoConfig.from_pretrained(tiny_vlm_path())


# --------------------------------------------------------------------------- mmspec train / bench, end to end
@pytest.mark.slow
def test_cli_train_fastmtp_end_to_end_and_bench_docs(tmp_path):
    from mmspec import MMSpecPipeline
    from mmspec.bench import BenchConfig, run_bench
    from mmspec.cli import main
    from mmspec.demo import tiny_vlm_path
    from mmspec.workloads import get_workload

    out = tmp_path / "fastmtp"
    rc = main(["train", "--kind", "fastmtp", "--target", tiny_vlm_path(), "--workload", "testbed-docs,testbed-charts", "--n-train", "4",
               "--max-new-tokens", "6", "--steps", "3", "--batch-size", "2", "--shard-size", "2", "--save-every", "2",
               "--val-shards", "1", "--out", str(out), "--no-progress", "--threads", "1"])
    assert rc == 0
    log = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3] and all(len(r["loss"]) == 3 for r in log)  # K = 3 steps
    saved = json.loads((out / "config.json").read_text())
    assert saved["drafter_kind"] == "fastmtp" and saved["target_fingerprint"]["layer_ids"] == [2]
    assert saved["config"]["num_draft_tokens"] == 3 and "tau" in saved["validation"]
    index = json.loads((out / "data" / "index.json").read_text())
    assert index["kind"] == "fastmtp" and index["layer_ids"] == [2]
    # resumable: a finished run resumed does nothing more
    assert main(["train", "--kind", "fastmtp", "--stage", "fit", "--target", tiny_vlm_path(),
                 "--workload", "testbed-docs,testbed-charts", "--n-train", "4",
                 "--shard-size", "2", "--steps", "3", "--batch-size", "2", "--out", str(out), "--resume",
                 "--no-progress"]) == 0
    assert len((out / "train_log.jsonl").read_text().splitlines()) == 3
    pipe = MMSpecPipeline.from_pretrained(tiny_vlm_path())
    drafter = make_drafter(f"fastmtp:{out}", pipe.model)
    ex = get_workload("testbed-docs").example("test", 0)
    inputs = pipe.prepare(images=ex.images, prompt=ex.prompt)
    ref = pipe.model.generate(**inputs, max_new_tokens=12, do_sample=False)
    assert torch.equal(mmspec.generate(pipe.model, inputs, drafter=drafter, max_new_tokens=12).sequences, ref)
    report = run_bench(BenchConfig(model=tiny_vlm_path(), workloads=["testbed-docs"], systems=[f"fastmtp:{out}"], n=2,
                                   max_new_tokens=8, batch_sizes=[1, 2]), progress=False)
    recs = {(r["system"], r["batch_size"]): r for r in report.results}
    for bs in (1, 2):
        r = recs[("fastmtp", bs)]
        assert r["status"] == "ok" and r["identical_to_ar"] and r["spec"].startswith("fastmtp:"), r
