"""The driving VLA end to end at tiny size: losses, a resumable training run, save/load, the timed pipeline
step, and the evaluation fields."""

import json

import numpy as np
import pytest
import torch

from mmspec.drivers.pipeline import STAGES, DrivingPipeline
from mmspec.drivers.vla import ACTION_MEAN, ACTION_SCALE, LEGACY_NORMALIZATION
from mmspec.drivers.train_vla import (DrivingVLA, RoadReader, VLATrainConfig, constant_velocity, evaluate_vla,
                                     train_vla, vla_losses)
from mmspec.drivers.workload import load_rollouts
from mmspec.drivers.world import LABELS
from mmspec.errors import InvalidInputError
from mmspec.vision.testbed_train import PatchReader
from mmspec.workloads import get_workload


def test_training_resumes_saves_and_drives(tmp_path):
    cfg = VLATrainConfig(out=str(tmp_path), size="tiny", steps=3, stop_after=2, batch_size=2, save_every=1,
                         tokenizer_texts=60, vocab_size=300, warmup=1)
    train_vla(cfg, progress=False)
    cfg.stop_after = 0
    vla = train_vla(cfg, progress=False)  # resumes at step 2
    log = [json.loads(line) for line in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3] and all(r["lm"] > 0 and r["aux"] > 0 and r["flow"] > 0 for r in log)
    loaded = DrivingVLA.from_pretrained(str(tmp_path))
    for (k, a), (_, b) in zip(sorted(vla.expert.state_dict().items()), sorted(loaded.expert.state_dict().items())):
        assert torch.equal(a, b), k
    assert torch.equal(loaded.expert.action_scale, torch.tensor(ACTION_SCALE))
    # A checkpoint from before the normalisation was saved loads with the scale it was trained with.
    conf = tmp_path / "action_expert.json"
    conf.write_text(json.dumps({k: v for k, v in json.loads(conf.read_text()).items() if not k.startswith("action")}))
    legacy = DrivingVLA.from_pretrained(str(tmp_path)).expert
    assert legacy.action_scale.tolist() == pytest.approx(list(LEGACY_NORMALIZATION["action_scale"]))
    conf.write_text(json.dumps({"horizon": 64, "num_steps": 10, "action_mean": list(ACTION_MEAN),
                                "action_scale": list(ACTION_SCALE)}))
    ex = get_workload("driving").example("test", 0)
    out = DrivingPipeline(loaded, max_reasoning_tokens=6).step(ex.images, ex.meta["history"], ex.meta["speed"],
                                                               num_samples=2)
    assert out["trajectory"].shape == (64, 2) and out["trajectories"].shape == (2, 64, 2)
    assert set(out["timings_ms"]) == set(STAGES) and out["timings_ms"]["total"] >= out["timings_ms"]["decode"]
    assert out["timings_ms"]["encode"] > 0 and 0 < out["num_decode_tokens"] <= 6
    res = evaluate_vla(loaded, n=2, samples=2)
    for key in ("reasoning_exact", "hazard_accuracy", "min_ade_1", "min_ade_2", "constant_velocity_ade"):
        assert res[key] is not None and res[key] >= 0
    assert res["min_ade_2"] <= res["min_ade_1"] + 1e-9


def test_road_reader_loss_trains_and_its_reader_resumes(tmp_path):
    """``road_weight`` adds the road-ahead loss (logged), the reader's weights resume with the run, and it
    learns: twenty steps on one batch more than halve the loss; resuming without the loss is refused."""
    cfg = VLATrainConfig(out=str(tmp_path), size="tiny", steps=3, stop_after=2, batch_size=2, save_every=1,
                         tokenizer_texts=60, vocab_size=300, warmup=1, road_weight=1.0)
    train_vla(cfg, progress=False)
    saved = torch.load(tmp_path / "state.pt", weights_only=True)
    assert "road_reader" in saved
    cfg.stop_after = 0
    train_vla(cfg, progress=False)
    log = [json.loads(line) for line in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3] and all(r["road"] > 0 for r in log)
    with pytest.raises(InvalidInputError, match="road_weight"):  # resuming without the loss it started with
        train_vla(VLATrainConfig(**{**vars(cfg), "steps": 4, "road_weight": 0.0}), progress=False)
    vla = DrivingVLA.from_pretrained(str(tmp_path)).train()
    torch.manual_seed(0)
    examples = get_workload("driving", labels=True, perturb=1.0).examples("train", 2)
    reader = PatchReader(vla.backbone.config.text_config.hidden_size, len(LABELS))
    road = RoadReader(vla.backbone.config.text_config.hidden_size)
    opt = torch.optim.Adam(list(road.parameters()) + list(vla.backbone.parameters()), lr=3e-3)
    first = None
    for _ in range(20):
        loss = vla_losses(vla, examples, reader, road_reader=road)["road"]
        first = loss.item() if first is None else first
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.5 * first


def test_constant_velocity_baseline():
    cv = constant_velocity(10.0, 4)
    assert np.allclose(cv, [[1, 0], [2, 0], [3, 0], [4, 0]])


def test_closed_loop_runs_the_model_and_the_expert(tmp_path):
    from mmspec.drivers.train_vla import build_vla, closed_loop

    torch.manual_seed(0)
    vla = build_vla("tiny", tokenizer_texts=40, vocab_size=300).eval()
    vla.expert.num_steps = 2
    res = closed_loop(vla, n=2, seconds=3.0, handover_tick=20, replan_every=5)
    assert res["n"] == 2 and set(res) == {"model", "expert", "n", "model_by_kind"}
    for who in ("model", "expert"):
        assert set(res[who]) == {"collision_rate", "offroad_rate", "red_light_rate", "progress_m"}
    # The per-kind counts add up to the rates (kinds are taken in turn: cruise, then lead_brake).
    assert list(res["model_by_kind"]) == ["cruise", "lead_brake"]
    for key in ("collision", "offroad", "red_light"):
        assert sum(k[key] for k in res["model_by_kind"].values()) == res["model"][f"{key}_rate"] * 2
    assert res["expert"]["collision_rate"] == 0.0 and res["expert"]["progress_m"] > 5.0


def test_rollouts_are_recorded_resumed_and_replayed_as_dagger_items(tmp_path):
    """``collect_rollouts`` records the model's drive (resuming a file), and a workload with ``rollouts``
    replays a recorded drive exactly to a tick inside it: the item's history is the drive's, its future the
    expert's recovery (back towards the lane centre)."""
    from mmspec.drivers.clips import sample_at
    from mmspec.drivers.train_vla import build_vla, collect_rollouts
    from mmspec.drivers.world import scenario_for, simulate

    torch.manual_seed(0)
    vla = build_vla("tiny", tokenizer_texts=40, vocab_size=300).eval()
    vla.expert.num_steps = 2
    path = str(tmp_path / "rollouts.jsonl")
    first = collect_rollouts(vla, path, n=1, seconds=3.0, progress=False)
    with open(path, "a") as f:
        f.write('{"split": "train", "ind')  # a row cut short by a killed job
    rows = collect_rollouts(vla, path, n=2, seconds=3.0, progress=False)
    assert rows[0] == first[0] and [r["kind"] for r in rows] == ["cruise", "lead_brake"]
    assert len(rows[0]["controls"]) == 10 and set(rows[0]["events"]) == {"collision", "offroad", "red_light"}
    assert [r["index"] for r in load_rollouts(path)] == [20_000, 20_001] and rows[0]["seed"] == 0
    with pytest.raises(InvalidInputError, match="before the hand-over"):
        collect_rollouts(vla, path, n=1, seconds=1.0, progress=False)
    # A drive that steers left for 2 s: replayed items show the drift and learn the way back.
    scn = scenario_for("train", 7, 0, "cruise")
    drive = simulate(scn, 11.0, lambda sim, k: (0.0, 0.01) if 20 <= k < 40 else None)
    row = {"split": "train", "index": 7, "kind": "cruise", "handover": 20, "controls": drive.controls[20:40]}
    wl = get_workload("driving", rollouts=[row], rollout_fraction=1.0, size=(112, 56))
    items = [ex for ex in wl.examples("train", 6) if ex.meta["replayed"]]
    assert len(items) >= 4
    for ex in items:
        tick = ex.meta["tick"]
        assert 20 < tick < 40 and not ex.meta["perturbed"] and ex.meta["kind"] == "cruise"
        assert np.allclose(ex.meta["history"], sample_at(drive, tick, cameras=())["history"], atol=1e-5)
    assert not any(ex.meta["replayed"] for ex in wl.examples("test", 4))  # train drives stay in train items
    late = max(items, key=lambda ex: ex.meta["tick"])
    assert late.meta["future"][-1, 1] < late.meta["future"][0, 1] - 0.1  # steers back right, to the centre
    with pytest.raises(InvalidInputError, match="no rollouts file"):
        get_workload("driving", rollouts=str(tmp_path / "missing.jsonl"))
    with pytest.raises(InvalidInputError, match="lack one of"):
        get_workload("driving", rollouts=[{"split": "train", "index": 7}])
    again = get_workload("driving", rollouts=[row], rollout_fraction=1.0, size=(112, 56)).examples("train", 6)
    assert [(ex.meta["tick"], ex.meta["replayed"]) for ex in again] == \
        [(ex.meta["tick"], ex.meta["replayed"]) for ex in wl.examples("train", 6)]


def test_stage_timings_attribute_encode_and_prefill_correctly():
    """Slow the vision tower and the text model's prompt pass by known amounts: each lands in its own stage
    (transformers 5 encodes images before the first forward; the pipeline must not subtract it twice)."""
    import time

    from mmspec.drivers.train_vla import build_vla

    torch.manual_seed(0)
    vla = build_vla("tiny", tokenizer_texts=40, vocab_size=300).eval()
    vla.expert.num_steps = 1
    visual, lm = vla.backbone.model.visual, vla.backbone.model.language_model
    slow_visual, slow_lm = visual.forward, lm.forward

    def visual_forward(*a, **k):
        time.sleep(0.04)
        return slow_visual(*a, **k)

    def lm_forward(*a, **k):
        emb = k.get("inputs_embeds")
        if emb is not None and emb.shape[1] > 1 and k.get("cache") is not None and k["cache"].get_seq_length() == 0:
            time.sleep(0.06)  # the prompt pass only
        return slow_lm(*a, **k)

    visual.forward, lm.forward = visual_forward, lm_forward
    ex = get_workload("driving").example("test", 1)
    t = DrivingPipeline(vla, max_reasoning_tokens=3).step(ex.images, ex.meta["history"], ex.meta["speed"])["timings_ms"]
    assert t["encode"] >= 40 and t["prefill"] >= 60, t
    assert t["encode"] + t["prefill"] + t["decode"] + t["action"] <= t["total"] + 1e-6, t


@pytest.mark.slow
def test_bundled_vla_reads_the_scene_and_stays_on_the_road():
    """The shipped VLA (drivers/assets/driving-vla) against its own claims, at small n: reasoning mostly right,
    trajectories far better than constant velocity, and a cruise and a curve-heavy cut-in drive on the road."""
    from mmspec.drivers.train_vla import bundled_vla, closed_loop

    path = bundled_vla()
    if path is None:
        pytest.skip("this install ships no driving VLA (the repository checkout does)")
    torch.manual_seed(0)
    vla = DrivingVLA.from_pretrained(path)
    res = evaluate_vla(vla, n=6, samples=1)
    assert res["hazard_accuracy"] >= 0.5 and res["min_ade_1"] < 0.8 * res["constant_velocity_ade"]
    loop = closed_loop(vla, n=3, seconds=6.0)  # cruise, lead_brake, cut_in
    assert loop["model"]["offroad_rate"] == 0.0 and loop["expert"]["collision_rate"] == 0.0
