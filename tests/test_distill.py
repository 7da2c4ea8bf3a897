"""The few-step action expert (:mod:`mmspec.drivers.distill`): its integration is the expert's own, distillation
brings it to the teacher's endpoint, it refuses a backbone it was not distilled on, and FlashDrive and drive-sim run
it (lossy, said so)."""

import json

import pytest
import torch

from mmspec.errors import InvalidInputError


def _tiny(seed: int = 0):
    from test_flashdrive import _tiny as tiny_vla  # the flashdrive tests' 2-layer VLA (3 Euler steps)

    return tiny_vla(2, seed=seed)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A tiny VLA saved like a bundled one (the student checks its backbone's weights file)."""
    path = str(tmp_path_factory.mktemp("vla") / "vla")
    _tiny().save_pretrained(path)
    return path


def _context(vla, split="test", n=2, start=0):
    from mmspec.drivers.train_vla import expert_context
    from mmspec.vision.testbed import make_batch
    from mmspec.workloads import get_workload

    exs = get_workload("driving", labels=True).examples(split, n, start=start)
    with torch.no_grad():
        return expert_context(vla, make_batch(vla.processor, exs))


def test_euler_path_is_what_the_expert_samples(saved):
    from mmspec.drivers.distill import euler_path
    from mmspec.drivers.train_vla import DrivingVLA

    vla = DrivingVLA.from_pretrained(saved, dtype=torch.float32)
    cache, start, valid = _context(vla)
    ex = vla.expert
    want = ex.sample(cache, start, valid, generator=torch.Generator().manual_seed(3))
    x0 = torch.randn(2, ex.horizon, 2, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        path = euler_path(ex, x0, cache, start, valid, ex.num_steps)
    assert len(path) == ex.num_steps
    torch.testing.assert_close(path[-1] * ex.action_scale + ex.action_mean, want)


def _endpoint_error(vla, expert, steps, n=4):
    """Mean squared distance (normalised space) of ``expert``'s ``steps``-step endpoint to the teacher's own, on
    held-out items, from the same noise."""
    from mmspec.drivers.distill import euler_path

    cache, start, valid = _context(vla, "test", n)
    x0 = torch.randn(n, vla.expert.horizon, 2, generator=torch.Generator().manual_seed(11))
    with torch.no_grad():
        ref = euler_path(vla.expert, x0, cache, start, valid, vla.expert.num_steps)[-1]
        got = euler_path(expert, x0, cache, start, valid, steps)[-1]
    return float(torch.nn.functional.mse_loss(got, ref))


@pytest.mark.slow
def test_distillation_brings_one_step_to_the_teachers_endpoint(saved, tmp_path):
    from mmspec.drivers.distill import DistillConfig, distill_expert, load_student
    from mmspec.drivers.train_vla import DrivingVLA

    vla = DrivingVLA.from_pretrained(saved, dtype=torch.float32)
    before = _endpoint_error(vla, vla.expert, 1)  # the teacher itself in one step: where the student starts
    out = str(tmp_path / "fewstep")
    distill_expert(DistillConfig(vla=saved, out=out, student_steps=1, steps=24, batch_size=2, lr=5e-3, warmup=2,
                                 save_every=6, threads=1), progress=False)
    student = load_student(out, vla, saved)
    assert student.num_steps == 1
    after = _endpoint_error(vla, student, 1)
    assert after < 0.5 * before, (before, after)


@pytest.mark.slow
def test_a_killed_run_resumes_exactly_where_it_saved(saved, tmp_path):
    from mmspec.drivers.distill import DistillConfig, distill_expert

    cfg = dict(vla=saved, student_steps=2, steps=4, batch_size=1, lr=1e-3, warmup=1, save_every=2, threads=1)
    whole = distill_expert(DistillConfig(out=str(tmp_path / "a"), **cfg), progress=False)
    out = str(tmp_path / "b")
    distill_expert(DistillConfig(out=out, stop_after=3, **cfg), progress=False)  # saved at 2 and at its stop, 3
    with open(f"{out}/train_log.jsonl", "a") as f:
        f.write(json.dumps({"step": 4, "loss": 9.0}) + "\n")  # logged past the save by a run killed before it
    resumed = distill_expert(DistillConfig(out=out, **cfg), progress=False)
    for a, b in zip(whole.state_dict().values(), resumed.state_dict().values()):
        assert torch.equal(a, b)
    log_a = [json.loads(x) for x in open(tmp_path / "a" / "train_log.jsonl")]
    log_b = [json.loads(x) for x in open(f"{out}/train_log.jsonl")]
    assert [(r["step"], r["loss"], r["lr"]) for r in log_b] == [(r["step"], r["loss"], r["lr"]) for r in log_a]


def test_a_student_serves_only_its_own_backbone(saved, tmp_path):
    from mmspec.drivers.distill import DistillConfig, distill_expert, load_student
    from mmspec.drivers.train_vla import DrivingVLA

    out = str(tmp_path / "fewstep")
    distill_expert(DistillConfig(vla=saved, out=out, student_steps=2, steps=1, batch_size=1, threads=1),
                   progress=False)
    other = str(tmp_path / "other")
    _tiny(seed=1).save_pretrained(other)
    with pytest.raises(InvalidInputError, match="distilled on another backbone"):
        load_student(out, DrivingVLA.from_pretrained(other, dtype=torch.float32), other)
    with pytest.raises(InvalidInputError, match="not a distilled action expert"):
        load_student(saved, DrivingVLA.from_pretrained(saved, dtype=torch.float32), saved)
    base = str(tmp_path / "uniform2")
    distill_expert(DistillConfig(vla=saved, out=base, student_steps=2, steps=0), progress=False)
    vla = DrivingVLA.from_pretrained(saved, dtype=torch.float32)
    st = load_student(base, vla, saved)  # steps=0: the teacher's own weights at 2 uniform steps
    assert st.num_steps == 2 and all(torch.equal(a, b) for a, b in zip(st.state_dict().values(),
                                                                       vla.expert.state_dict().values()))
    with pytest.raises(InvalidInputError, match="student_steps"):
        distill_expert(DistillConfig(vla=saved, out=str(tmp_path / "x"), student_steps=0), progress=False)
    with pytest.raises(InvalidInputError, match="is .inside. a VLA folder"):  # it would overwrite the teacher's expert
        distill_expert(DistillConfig(vla=saved, out=saved, steps=0), progress=False)
    with pytest.raises(InvalidInputError, match="another step count"):
        distill_expert(DistillConfig(vla=saved, out=out, student_steps=3, steps=2, batch_size=1), progress=False)
    with pytest.raises(InvalidInputError, match="folder of its own"):  # a run is not relabelled as the baseline
        distill_expert(DistillConfig(vla=saved, out=out, student_steps=2, steps=0), progress=False)
    with pytest.raises(InvalidInputError, match="not loaded from a folder"):
        load_student(out, _tiny(), None)


@pytest.mark.slow
def test_flashdrive_and_drive_sim_run_the_student(saved, tmp_path, capsys):
    from mmspec.cli import main
    from mmspec.drivers import DrivingPipeline
    from mmspec.drivers.distill import DistillConfig, distill_expert
    from mmspec.drivers.train_vla import DrivingVLA
    from mmspec.drivers.world import render_frame, scenario_for, simulate
    from mmspec.drivers.clips import ego_history

    out = str(tmp_path / "fewstep")
    distill_expert(DistillConfig(vla=saved, out=out, student_steps=2, steps=1, batch_size=1, threads=1),
                   progress=False)
    vla = DrivingVLA.from_pretrained(saved, dtype=torch.float32)
    pipe = DrivingPipeline(vla, max_reasoning_tokens=3,
                           flashdrive={"expert": out, "step_cache": None, "stream": False, "spec": False})
    sim = simulate(scenario_for("test", 1, 0, "cruise"), 2.6)
    k = 20  # 16 ticks of ego history before it
    res = pipe.step([render_frame(sim, t, "front") for t in range(k - 3, k + 1)], ego_history(sim.ego, k),
                    float(sim.ego[k][3]), seed=k, cameras=("front",))
    assert res["head_calls"] == 2  # the student's steps, not the VLA's 3
    assert not pipe.engine.exact and "few-step expert: 2 steps, lossy" in pipe.engine.describe()
    assert "fewstep" in pipe.engine.config.names()

    assert main(["drive-sim", "--model", saved, "--systems", "plain,fewstep", "--clips", "1", "--closed-loop", "0"]) == 2
    assert "need a distilled few-step expert: --expert DIR" in capsys.readouterr().err
    sim_json = tmp_path / "sim.json"
    rc = main(["drive-sim", "--model", saved, "--systems", "plain,fewstep,flashdrive-fewstep", "--clips", "1",
               "--ticks", "1", "--warmup", "1", "--closed-loop", "0", "--samples", "1", "--threads", "1",
               "--clips-dir", str(tmp_path / "clips"), "--json", str(sim_json), "--no-progress", "--step-study", "1",
               "--expert", out])
    assert rc == 0
    data = json.loads(sim_json.read_text())
    recs = {r["system"]: r for r in data["results"]}
    assert recs["plain"]["exact"] and not recs["fewstep"]["exact"] and not recs["flashdrive-fewstep"]["exact"]
    study = {r["variant"]: r for r in data["step_cache_study"]}
    assert study["few-step expert 2"]["head_calls"] == 2 and study["few-step expert 2"]["drift_m"] > 0.0

    from mmspec.drivers.train_vla import export_vla

    shipped = export_vla(saved, str(tmp_path / "shipped"), student=out)  # drive-sim finds the student it ships
    rc = main(["drive-sim", "--model", shipped, "--systems", "flashdrive,flashdrive-stepcache", "--clips", "1",
               "--ticks", "1", "--warmup", "0", "--closed-loop", "0", "--samples", "1", "--threads", "1",
               "--clips-dir", str(tmp_path / "clips"), "--json", str(sim_json), "--no-progress"])
    assert rc == 0
    recs = {r["system"]: r for r in json.loads(sim_json.read_text())["results"]}
    assert "few-step expert" in recs["flashdrive"]["note"] and "few-step" not in recs["flashdrive-stepcache"]["note"]


def test_the_fewstep_mechanism_settings():
    from mmspec.drivers.flashdrive import FlashDriveConfig

    assert FlashDriveConfig().expert == "auto" and FlashDriveConfig().step_cache == "adaptive"
    assert FlashDriveConfig.parse("stream,fewstep").expert == "bundled"  # the student the VLA ships
    assert FlashDriveConfig.parse("stream,step_cache").expert is None  # a mechanism list: only what it names
    cfg = FlashDriveConfig.parse({"expert": "/some/student"})  # the student replaces the step cache
    assert "fewstep" in cfg.names() and cfg.step_cache is None and not cfg.exact
    assert FlashDriveConfig.parse({"stream": False, "step_cache": None}).exact  # "auto" only replaces the step cache
    for bad in ("", "<--expert>", True):
        with pytest.raises(InvalidInputError, match="distilled expert's folder"):
            FlashDriveConfig(expert=bad)


def test_a_shipped_student_is_flashdrives_default(saved, tmp_path):
    import shutil

    from safetensors.torch import load_file

    from mmspec.drivers import DrivingPipeline
    from mmspec.drivers.distill import DistillConfig, backbone_hash, bundled_student, distill_expert
    from mmspec.drivers.train_vla import DrivingVLA, export_vla

    student = str(tmp_path / "fewstep")
    distill_expert(DistillConfig(vla=saved, out=student, student_steps=2, steps=0), progress=False)
    other = str(tmp_path / "other")
    _tiny(seed=1).save_pretrained(other)
    with pytest.raises(InvalidInputError, match="not distilled on|another backbone"):  # refused before writing
        export_vla(other, str(tmp_path / "never"), student=student)
    assert not (tmp_path / "never").exists()

    shipped = export_vla(saved, str(tmp_path / "shipped"), student=student)
    path = bundled_student(shipped)
    assert path == f"{shipped}/fewstep"
    info = json.load(open(f"{path}/distill.json"))
    assert info["distilled_on"] == backbone_hash(saved) != info["backbone_sha256_16"] == backbone_hash(shipped)
    assert {v.dtype for v in load_file(f"{path}/action_expert.safetensors").values()} == {torch.bfloat16}

    def engine(vla_dir, flashdrive=True):
        vla = DrivingVLA.from_pretrained(vla_dir, dtype=torch.float32)
        return DrivingPipeline(vla, max_reasoning_tokens=3, flashdrive=flashdrive).engine

    e = engine(shipped)  # the default: the shipped student, in place of the step cache
    assert e.student_path == path and e.step_cache is None and e.expert.num_steps == 2
    assert "fewstep" in e.describe() and "few-step expert: 2 steps, lossy" in e.describe()
    assert "step_cache" not in e.describe()
    e = engine(shipped, {"expert": None})  # the VLA's own expert with the step cache
    assert e.student_path is None and e.step_cache is not None and e.expert.num_steps == 3
    e = engine(shipped, {"stream": False, "step_cache": None, "spec": False})  # exact settings stay exact
    assert e.student_path is None and e.exact
    e = engine(saved)  # no student shipped: the VLA's own expert, said so
    assert e.student_path is None and e.step_cache is not None and "ships no few-step expert" in e.describe()
    with pytest.raises(InvalidInputError, match="ships no few-step expert"):
        engine(saved, "fewstep")
    shutil.copytree(path, f"{other}/fewstep")  # a student bound to other weights: never used by default
    e = engine(other)
    assert e.student_path is None and "distilled on other weights" in e.describe()
    with pytest.raises(InvalidInputError, match="another backbone"):
        engine(other, "fewstep")
    from mmspec.drivers.distill import export_student

    with pytest.raises(InvalidInputError, match="not .* exported"):  # never bound to an unrelated backbone
        export_student(student, saved, other)
    with pytest.raises(InvalidInputError, match="another folder"):
        export_vla(saved, saved, student=student)
    inside = tmp_path / "shipped2" / "fewstep"
    shutil.copytree(student, inside)  # a student of saved, sitting where the export would put it
    with pytest.raises(InvalidInputError, match="replaces"):
        export_vla(saved, str(tmp_path / "shipped2"), student=str(inside))
    assert (inside / "distill.json").exists()
    with open(f"{shipped}/train_config.json", "w") as f:
        json.dump({"stream_mask": 0.5}, f)  # an older model's record
    export_vla(saved, shipped)  # re-exported without a student: the old one (bound to the old weights) goes
    assert bundled_student(shipped) is None
    assert not (tmp_path / "shipped" / "train_config.json").exists()  # saved has none: the old one does not stay
    # a student distilled on the shipped VLA itself (warm-started from another of its students) ships in place
    two = export_student(student, saved, shipped)  # the 2-step student, shipped again
    one = str(tmp_path / "one")
    distill_expert(DistillConfig(vla=shipped, out=one, student_steps=1, steps=1, batch_size=1, init=two),
                   progress=False)
    warm = str(tmp_path / "warm")  # steps=0 saves the starting point: the 2-step student's weights, at 1 step
    distill_expert(DistillConfig(vla=shipped, out=warm, student_steps=1, steps=0, init=two), progress=False)
    a, b = load_file(f"{warm}/action_expert.safetensors"), load_file(f"{two}/action_expert.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k].float()) for k in a)
    assert export_student(one, shipped, shipped) == f"{shipped}/fewstep"
    info = json.load(open(f"{shipped}/fewstep/distill.json"))
    assert info["student_steps"] == 1 and info["distilled_on"] == info["backbone_sha256_16"] == backbone_hash(shipped)
    assert engine(shipped).expert.num_steps == 1 and info["init_record"]["student_steps"] == 2
    with pytest.raises(InvalidInputError, match="folder of its own"):  # never trained over the student it starts from
        distill_expert(DistillConfig(vla=shipped, out=f"{shipped}/fewstep", student_steps=1, steps=1,
                                     init=f"{shipped}/fewstep"), progress=False)
    with pytest.raises(InvalidInputError, match="resume with the same --init"):
        distill_expert(DistillConfig(vla=shipped, out=one, student_steps=1, steps=1, batch_size=1), progress=False)
    with pytest.raises(InvalidInputError, match="another backbone|not distilled on"):  # a warm start must fit
        distill_expert(DistillConfig(vla=other, out=str(tmp_path / "bad"), student_steps=1, steps=1, init=one),
                       progress=False)
