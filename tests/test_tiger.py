"""TIGER (``mmspec.vision.tiger``): the router's mask, ``visual_top_k=all`` equal to dense attention (GLANCE with
the same weights), the routed drafting cache equal to the routed training forward on Qwen2-VL (two separate
implementations of the routing: per row at run time, batched in training), greedy equality with ``generate``
(chain and tree, batch 2, Qwen-VL families), the sampling law on a page, the read fraction in the stats,
saving and options, both training stages (distillation, then group policy from it) through ``mmspec train``."""

import json

import pytest
import torch

import mmspec
from mmspec.drafters.block import block_forward
from mmspec.errors import InvalidInputError
from mmspec.registry import make_drafter
from mmspec.vision.glance import GlanceDrafter
from mmspec.vision.tiger import TigerDrafter, VisualRouter, tiger_record
from mmspec.vision.tiger.train import routing_mask

import _tiny_qwen_vl as T
from test_glance import _spy_blocks as _spy

NEW = 20
VL_PROMPTS = [{"pre": 3, "images": [(56, 56)], "post": 5}, {"pre": 2, "images": [(28, 56), (56, 28)], "post": 3}]


def test_router_bias_keeps_text_and_the_top_k_visual_keys():
    torch.manual_seed(0)
    r = VisualRouter(hidden_size=8, dim=4)
    c = torch.randn(2, 7, 8)
    routable = torch.tensor([[0, 1, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1, 1]], dtype=torch.bool)
    visible = torch.ones(2, 3, 7, dtype=torch.bool)
    visible[0, 2, 6] = False  # a position one block may not see
    visible[1, :, 5:] = False  # two visual positions not visible at all
    with torch.no_grad():
        s = r.scores(c[:, :3], c)
        bias, read = r.bias(s, routable, visible, k=2)
    for b in range(2):
        for n in range(3):
            vis_vis = [t for t in range(7) if routable[b, t] and visible[b, n, t]]
            top = sorted(vis_vis, key=lambda t: -float(s[b, n, t]))[:2]
            for t in range(7):
                v = float(bias[b, n, t])
                if not visible[b, n, t]:
                    assert v == float("-inf")
                elif not routable[b, t]:
                    assert v == 0.0
                elif t in top:
                    assert v == pytest.approx(float(torch.nn.functional.logsigmoid(s[b, n, t])))
                else:
                    assert v == float("-inf")
    assert int(read) == 2 * 3 * 2


def test_visual_top_k_all_is_glance_dense_attention():
    """With ``visual_top_k=all`` there is no router: the drafter's blocks equal GLANCE's with the same weights."""
    model = T.build("qwen2_vl")
    tiger = TigerDrafter.from_target(model, seed=0, block_size=4, visual_top_k="all", anchor_feature=True)
    glance = GlanceDrafter.from_target(model, seed=1, block_size=4, anchor_feature=True)
    assert tiger.router is None
    glance.load_state_dict(tiger.state_dict())
    inputs = T.make_inputs("qwen2_vl", VL_PROMPTS)
    a, b = _spy(tiger), _spy(glance)
    oa = mmspec.generate(model, inputs, drafter=tiger, max_new_tokens=NEW)
    ob = mmspec.generate(model, inputs, drafter=glance, max_new_tokens=NEW)
    assert torch.equal(oa.sequences, ob.sequences) and len(a) == len(b)
    for (ra, sa, la), (rb, sb, lb) in zip(a, b):
        assert ra == rb and list(sa) == list(sb) and torch.equal(la, lb)
    assert oa.stats.drafter_counters == {"visual_read": 0, "visual_available": 0}


@pytest.mark.parametrize("k", [1, 3])
def test_routed_drafting_equals_the_routed_training_forward(k):
    """Run time routes each row per round from its cache; training routes every block of a record at once.
    Their block logits agree at every round's anchor (so the head drafts with what it was trained on)."""
    model = T.build("qwen2_vl")
    head = TigerDrafter.from_target(model, seed=0, block_size=4, visual_top_k=k, router_dim=8, anchor_feature=True)
    with torch.no_grad():  # scores far from 0, so the gate matters and a wrong pick shows
        head.router.query_proj.weight.mul_(8.0)
    inputs = T.make_inputs("qwen2_vl", VL_PROMPTS[:1])
    seen = _spy(head)
    out = mmspec.generate(model, inputs, drafter=head, max_new_tokens=NEW)
    ref = model.generate(**inputs, max_new_tokens=NEW, do_sample=False)
    assert torch.equal(out.sequences, ref)
    rec = tiger_record(model, inputs, head.layer_ids, NEW, teacher_top_k=4, feature_dtype=torch.float32)
    assert torch.equal(rec["tokens"], ref[0]) and int(rec["routable"].sum()) > k
    assert int(rec["routable"].sum()) == int((inputs["input_ids"][0] == model.config.image_token_id).sum())
    from mmspec.drafters.block import collate_blocks

    anchors = [len(seq) - 1 for _, seq, _ in seen]
    batch = collate_blocks([rec], head.block_size, 1, n_axes=3)
    batch["anchors"] = torch.tensor([anchors])
    route = routing_mask(head.router, head.visual_top_k)
    with torch.no_grad():
        full, _ = block_forward(head.head, batch, route)
    for (_, seq, lg), want in zip(seen, full[0]):
        assert torch.allclose(lg, want, atol=1e-4), len(seq)
    n_img = int(rec["routable"].sum())
    c = out.stats.drafter_counters
    assert c["visual_available"] == n_img * len(seen) and c["visual_read"] == k * len(seen)
    assert route.read == k * len(seen) and route.available == n_img * len(seen)


@pytest.mark.parametrize("family", T.FAMILIES)
@pytest.mark.parametrize("spec", ["tiger;seed=0;block_size=4;visual_top_k=3",
                                  "tiger;seed=0;block_size=5;visual_top_k=2;branch_k=3;tree_budget=9"])
def test_greedy_equals_generate_qwen_vl(family, spec):
    model = T.build(family)
    drafter = make_drafter(spec, model)
    inputs = T.make_inputs(family, VL_PROMPTS)  # batch 2, uneven image counts
    ref = model.generate(**inputs, max_new_tokens=NEW, do_sample=False)
    out = mmspec.generate(model, inputs, drafter=drafter, max_new_tokens=NEW)
    assert torch.equal(out.sequences, ref)
    c = out.stats.drafter_counters
    assert 0 < c["visual_read"] < c["visual_available"]


@pytest.mark.slow
def test_sampling_law_on_a_page():
    """A sampled routed chain on a page (temperature 0.3): the second generated token, the first one a round
    of drafts decides, follows its exact marginal sum_t1 p(t1) p(t2 | t1) by chi-square over 300 seeds (a
    wrong q, or an acceptance that depends on the router, would show)."""
    from collections import Counter

    from _chisq import chisq_pvalue

    model = T.build("qwen2_vl")
    drafter = make_drafter("tiger;seed=0;block_size=3;visual_top_k=2", model)
    inputs = T.make_inputs("qwen2_vl", VL_PROMPTS[:1])
    temp, n = 0.3, 300
    # A random tiny VLM may sample its own image token, which it cannot decode; suppress the vision ids (the
    # target's logits processors apply to p, q and the residual alike, so the law is the suppressed one).
    banned = [T.VISION_START, T.VISION_END, T.IMAGE, T.VIDEO]
    P = inputs["input_ids"].shape[1]

    def law_of(logits):
        logits = logits.float() / temp
        logits[..., banned] = float("-inf")
        return torch.softmax(logits, -1)

    with torch.no_grad():
        p1 = law_of(model(**inputs).logits[0, -1])
        V = p1.shape[0]
        firsts = torch.tensor([t for t in range(V) if t not in banned])  # p1 is 0 on the banned ids
        m = len(firsts)
        ext = {k: v for k, v in inputs.items() if k not in ("input_ids", "attention_mask")}
        ids = torch.cat([inputs["input_ids"].expand(m, -1), firsts[:, None]], dim=1)
        per_row = {k: (torch.cat([v] * m) if k == "pixel_values" else v.repeat(m, 1) if k == "image_grid_thw"
                       else torch.cat([v.expand(m, -1), v[:, -1:].expand(m, -1)], dim=1)) for k, v in ext.items()}
        p2 = law_of(model(input_ids=ids, attention_mask=torch.ones_like(ids), **per_row).logits[:, -1])
    law = (p1[firsts, None] * p2).sum(0)
    counts = Counter()
    for s in range(n):
        out = mmspec.generate(model, inputs, drafter=drafter, max_new_tokens=3, do_sample=True, temperature=temp,
                              seed=s, suppress_tokens=banned)
        counts[int(out.sequences[0, P + 1])] += 1
    p = chisq_pvalue(counts, {t: float(law[t]) for t in range(V)}, n)
    assert p > 1e-3, (p, counts.most_common(5))


def test_save_load_and_options(tmp_path):
    model = T.build("qwen2_vl")
    d = TigerDrafter.from_target(model, seed=0, block_size=4, visual_top_k=6, router_dim=8)
    d.save_pretrained(tmp_path / "h")
    cfg = json.loads((tmp_path / "h" / "config.json").read_text())
    assert cfg["drafter_kind"] == "tiger" and cfg["config"]["visual_top_k"] == 6
    loaded = make_drafter(f"tiger:{tmp_path / 'h'};visual_top_k=2;branch_k=2", model)
    assert isinstance(loaded, TigerDrafter) and loaded.visual_top_k == 2 and loaded.branch_k == 2
    for (k, a), (_, b) in zip(sorted(d.state_dict().items()), sorted(loaded.state_dict().items())):
        assert torch.equal(a, b), k
    with pytest.raises(InvalidInputError, match="trained with a router"):
        make_drafter(f"tiger:{tmp_path / 'h'};visual_top_k=all", model)
    for bad in ("visual_top_k=0", "visual_top_k=many"):
        with pytest.raises(InvalidInputError, match="visual_top_k"):
            make_drafter(f"tiger:/no/such/head;{bad}", model)


@pytest.mark.slow
def test_mmspec_train_tiger_distill_then_policy(tmp_path):
    """Stage 1 with the routing flags and the target's top-K, the distillation fit, then the policy stage from
    the distilled head on the same data (--data, --init-drafter), resumed once; the head stays exact."""
    from mmspec import MMSpecPipeline
    from mmspec.demo import tiny_vlm_path
    from mmspec.train import TrainConfig, fit, read_shard, train
    from mmspec.workloads import get_workload

    base = dict(kind="tiger", target=tiny_vlm_path(), out=str(tmp_path / "distill"), workloads=("testbed-docs",), n_train=4,
                max_new_tokens=8, steps=3, batch_size=2, shard_size=2, save_every=2, num_draft_tokens=3,
                val_shards=1, progress=False,
                options={"num_anchors": 4, "num_layers": 1, "visual_top_k": 8, "router_dim": 8, "teacher_top_k": 4})
    with pytest.raises(InvalidInputError, match="unknown tiger training options"):
        TrainConfig(**{**base, "options": {"top_k": 3}}).validate()
    with pytest.raises(InvalidInputError, match="init-drafter"):
        TrainConfig(**{**base, "options": {**base["options"], "stage": "policy"}}).validate()
    train(TrainConfig(**base))
    log = [json.loads(line) for line in (tmp_path / "distill" / "train_log.jsonl").read_text().splitlines()]
    assert all(torch.isfinite(torch.tensor(r["loss"])).all() for r in log)
    rec = read_shard(str(tmp_path / "distill" / "data" / "shard-00000.safetensors"))[0]
    assert rec["routable"].any() and rec["top_ids"].shape == (len(rec["tokens"]), 4)
    pol = dict(base, out=str(tmp_path / "policy"), data=str(tmp_path / "distill" / "data"),
               init_drafter=str(tmp_path / "distill"), steps=2,
               options={**base["options"], "stage": "policy", "group": 3})
    fit(TrainConfig(**pol))
    fit(TrainConfig(**{**pol, "steps": 3, "resume": True}))
    log = [json.loads(line) for line in (tmp_path / "policy" / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3] and all(len(r["loss"]) == 2 for r in log)
    assert not (tmp_path / "policy" / "data").exists()
    pipe = MMSpecPipeline.from_pretrained(tiny_vlm_path())
    drafter = make_drafter(f"tiger:{tmp_path / 'policy'}", pipe.model)
    ex = get_workload("testbed-docs").example("test", 0)
    inputs = pipe.prepare(images=ex.images, prompt=ex.prompt)
    ref = pipe.model.generate(**inputs, max_new_tokens=12, do_sample=False)
    out = mmspec.generate(pipe.model, inputs, drafter=drafter, max_new_tokens=12)
    assert torch.equal(out.sequences, ref) and out.stats.drafter_counters["visual_read"] > 0


def test_init_drafter_of_another_shape_than_the_options_is_refused(tmp_path):
    """``--init-drafter`` with kind options asking for another head shape would train the saved shape under a
    config that says otherwise: refused, naming the options."""
    from mmspec.train import TrainConfig, fit

    model = T.build("qwen2_vl")
    d = TigerDrafter.from_target(model, seed=0, block_size=4, visual_top_k=6, router_dim=8)
    d.save_pretrained(tmp_path / "init")
    data = tmp_path / "data"
    (data / "drafter-init").mkdir(parents=True)
    d.save_pretrained(data / "drafter-init", with_target_tensors=True)  # as the data stage writes it
    (data / "index.json").write_text(json.dumps({"kind": "tiger", "layer_ids": list(d.layer_ids)}))
    cfg = TrainConfig(kind="tiger", target=str(tmp_path), out=str(tmp_path / "out"), data=str(data),
                      init_drafter=str(tmp_path / "init"), num_draft_tokens=3, progress=False,
                      options={"visual_top_k": 6, "router_dim": 16})
    with pytest.raises(InvalidInputError, match="router_dim"):
        fit(cfg)
