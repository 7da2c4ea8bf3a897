"""``mmspec bench --workload driving,images``: the plain pipelines measured into the same records as the VLM
systems, with latency per stage and quality fields (tiny untrained models: the fields, not the values)."""

import json

import pytest
import torch

from mmspec.bench import BenchConfig, run_bench
from mmspec.errors import InvalidInputError

COMMON = {"workload", "system", "batch_size", "tau", "speedup_vs_ar", "forwards_per_token", "tokens_per_s",
          "identical_to_ar", "latency_ms", "quality"}


@pytest.fixture(scope="module")
def tiny_vla(tmp_path_factory):
    from mmspec.drivers.train_vla import build_vla

    path = tmp_path_factory.mktemp("vla")
    torch.manual_seed(0)
    vla = build_vla("tiny", tokenizer_texts=40, vocab_size=300).eval()
    vla.expert.num_steps = 2
    vla.save_pretrained(str(path))
    return str(path)


@pytest.fixture(scope="module")
def tiny_generator(tmp_path_factory):
    from mmspec.image_ar.generator import train_generator
    from mmspec.image_ar.vq import train_vq

    root = tmp_path_factory.mktemp("gen")
    torch.set_num_threads(1)
    train_vq(str(root / "vq"), steps=1, batch_size=2, progress=False, codebook_size=16, code_dim=8, hidden=16)
    train_generator(str(root / "gen"), str(root / "vq"), steps=1, batch_size=2, size="tiny", progress=False)
    return str(root / "gen")


def test_driving_records_latency_per_stage_and_quality(tiny_vla):
    report = run_bench(BenchConfig(model=f"driving={tiny_vla}", workloads=["driving"], n=2, batch_sizes=[1, 4]),
                       progress=False)
    rec, fd = report.results  # a car plans one tick at a time: batch 1 only; ar and FlashDrive by default
    assert COMMON <= set(rec) and rec["system"] == "ar" and rec["batch_size"] == 1 and rec["status"] == "ok"
    assert fd["system"] == "flashdrive" and fd["batch_size"] == 1 and fd["speedup_vs_ar"] > 0
    assert fd["lossless"] is False and 0 <= fd["identical_rate"] <= 1 and fd["quality"]["n"] == 2
    assert fd["speedup_median"] > 0 and fd["tau"] == 1.0  # no drafter fits this tiny VLA: one token per pass
    lat = rec["latency_ms"]
    assert set(lat) == {"preprocess", "encode", "prefill", "decode", "action", "total", "p50", "p90"}
    assert 0 < lat["encode"] < lat["total"] and lat["action"] > 0 and lat["p50"] <= lat["p90"]
    q = rec["quality"]
    assert q["n"] == 2 and 0 <= q["reasoning_exact"] <= q["hazard_accuracy"] + 1 and q["min_ade_1"] > 0
    assert q["constant_velocity_ade"] > 0
    assert report.meta["models"] == {"driving": tiny_vla}
    json.loads(report.to_json())
    assert "driving" in report.table()


def test_images_records_per_batch_size_with_fid_and_prompt_accuracy(tiny_generator, tmp_path, monkeypatch):
    from mmspec.image_ar import quality

    quality.train_classifier(str(tmp_path / "clf"), steps=1, batch_size=4, progress=False)
    monkeypatch.setattr(quality, "bundled_classifier", lambda: str(tmp_path / "clf"))
    report = run_bench(BenchConfig(model=f"images={tiny_generator}", workloads=["images"], n=3,
                                   batch_sizes=[1, 2]), progress=False)
    # by default AR and the lossless speculative systems (no spatial head ships for this tiny generator: left out)
    assert [(r["system"], r["batch_size"]) for r in report.results] == [("ar", 1), ("sjd", 1), ("ar", 2), ("sjd", 2)]
    for rec in report.results:
        assert COMMON <= set(rec) and rec["new_tokens"] == 3 * 256
        assert set(rec["latency_ms"]) == {"generate", "decode", "total", "p50", "p90"}
        q = rec["quality"]
        assert 0 <= q["prompt_accuracy"] <= 1 and q["fid"] >= 0 and q["fid_n"] == 3
        assert set(q["field_accuracy"]) and 0 <= q["real_prompt_accuracy"] <= 1
        assert q["cfg_scale"] == 1.0 and "batch doubled" not in rec["note"]
    json.loads(report.to_json())


def test_images_without_a_classifier_says_so(tiny_generator, monkeypatch):
    from mmspec.image_ar import quality

    monkeypatch.setattr(quality, "bundled_classifier", lambda: None)
    (rec,) = run_bench(BenchConfig(model=tiny_generator, workloads=["images"], systems=["ar"], n=1,
                                   batch_sizes=[1]), progress=False).results
    assert "prompt_accuracy" not in rec["quality"] and "no world classifier" in rec["quality"]["note"]


def test_plain_workloads_fail_early_on_what_they_cannot_do(monkeypatch):
    from mmspec.drivers.workload import DrivingWorkload

    monkeypatch.setattr(DrivingWorkload, "bundled_model", lambda self: None)
    with pytest.raises(InvalidInputError, match="no model for workload 'driving'"):
        run_bench(BenchConfig(workloads=["driving"], n=1), progress=False)
    with pytest.raises(InvalidInputError, match="unknown driving system"):
        run_bench(BenchConfig(model="driving=/x", workloads=["driving"], systems=["lookup"], n=1), progress=False)


def test_image_cli_evaluates_the_tokenizer_and_the_generator(tiny_generator, tmp_path, capsys):
    import os

    from mmspec.image_ar.evaluate import main
    from mmspec.image_ar.quality import train_classifier

    train_classifier(str(tmp_path / "clf"), steps=1, batch_size=4, progress=False)
    assert main(["eval", "--vq", os.path.join(tiny_generator, "vq"), "--generator", tiny_generator,
                 "--classifier", str(tmp_path / "clf"), "--n", "3", "--threads", "1"]) == 0
    vq, gen = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert vq["vq"]["n"] == 256 and vq["vq"]["psnr_db"] > 0 and 1 <= vq["vq"]["codes_used"] <= 16
    g = gen["generator"]
    assert g["n"] == 3 and g["fid"] >= 0 and g["fid_real_vs_real"] >= 0 and g["fid_vq_reconstruction"] >= 0
    assert 0 <= g["prompt_accuracy"] <= 1 and 0 <= g["vq_prompt_accuracy"] <= 1
    assert g["cfg_scale"] == 1.0  # the generator's own (it names none: no guidance)
    assert 0 <= g["unconditional_teacher_forced_accuracy"] <= 1 and 0 <= g["teacher_forced_accuracy"] <= 1


def test_model_option_parsing():
    from mmspec.bench import model_for

    assert model_for("driving", "/runs/lr=1e-3/vla") == "/runs/lr=1e-3/vla"  # a path with "=" in it
    assert model_for("docs", "docs=/a,images=/b") == "/a" and model_for("charts", "docs=/a") is None
    with pytest.raises(InvalidInputError, match="unknown workloads"):
        model_for("driving", "drving=/x")
    with pytest.raises(InvalidInputError, match="NAME=PATH"):
        model_for("driving", "driving=/x,/y")
    with pytest.raises(InvalidInputError, match="one run measures one target"):
        run_bench(BenchConfig(model="docs=/a,charts=/b", workloads=["docs", "charts"], n=1), progress=False)
