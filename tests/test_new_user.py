"""What a new user hit on main (issue 13, section 4): the core API and the ``mmspec`` command line.

Each case is a clear :class:`mmspec.MMSpecError` (one line and exit status 2 on the command line) or the
behaviour a user expects. The driving and image worlds' cases are in ``test_worlds_api.py``.
"""

from __future__ import annotations

import os
import stat
import time

import numpy as np
import pytest
import torch

import mmspec
from mmspec import InvalidInputError, MMSpecPipeline
from mmspec.cli import main


def _one_line_error(capsys, rc, *fragments):
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.startswith("mmspec: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    for f in fragments:
        assert f in err, err
    return err


# ---------------------------------------------------------------------------- mmspec.generate
def test_generate_accepts_drafter_spec_strings(vlm_pipe):
    inputs = vlm_pipe.prepare(prompt="a b c a b c a b")
    ref = mmspec.generate(vlm_pipe.model, inputs, drafter=None, max_new_tokens=6)
    out = mmspec.generate(vlm_pipe.model, inputs, drafter="lookup;num_draft_tokens=3", max_new_tokens=6)
    assert torch.equal(out.sequences, ref.sequences) and out.stats.drafter == "lookup"
    with pytest.raises(InvalidInputError, match="unknown drafter kind"):
        mmspec.generate(vlm_pipe.model, inputs, drafter="nope", max_new_tokens=6)


def test_generate_bare_tensor_inputs_is_a_clear_error(vlm_pipe):
    ids = vlm_pipe.prepare(prompt="hello")["input_ids"]
    with pytest.raises(InvalidInputError, match="bare tensor.*input_ids"):
        mmspec.generate(vlm_pipe.model, ids, max_new_tokens=4)
    with pytest.raises(InvalidInputError, match="mapping"):
        mmspec.generate(vlm_pipe.model, [1, 2, 3], max_new_tokens=4)


def test_drafter_returning_none_is_a_clear_error(vlm_pipe):
    from mmspec.drafters import Drafter

    class Silent(Drafter):
        kind = "silent"

        def propose(self, ctx):
            return None  # a user's drafter that forgot its return

    inputs = vlm_pipe.prepare(prompt="hello")
    with pytest.raises(InvalidInputError, match="'silent' returned None.*list of DraftTree"):
        mmspec.generate(vlm_pipe.model, inputs, drafter=Silent(), max_new_tokens=4)


@pytest.mark.parametrize("kwargs, message", [
    ({"do_sample": True, "temperature": 0.0}, "temperature must be > 0"),
    ({"do_sample": True, "temperature": -1.0}, "temperature must be > 0"),
    ({"do_sample": True, "temperature": float("nan")}, "temperature must be > 0"),
    ({"do_sample": True, "top_k": -3}, "top_k must be >= 0"),
    ({"do_sample": True, "top_p": 1.5}, "top_p must be in"),
])
def test_sampling_parameters_are_mmspec_errors(vlm_pipe, kwargs, message):
    inputs = vlm_pipe.prepare(prompt="hello")
    with pytest.raises(InvalidInputError, match=message):
        mmspec.generate(vlm_pipe.model, inputs, max_new_tokens=4, **kwargs)
    with pytest.raises(InvalidInputError, match=message):
        vlm_pipe(prompt="hello", max_new_tokens=4, **kwargs)


@pytest.mark.parametrize("value", [np.int64(3), np.int32(3), torch.tensor(3)])
def test_numpy_and_0d_tensor_max_new_tokens(vlm_pipe, value):
    ref = vlm_pipe(prompt="hello", max_new_tokens=3)
    out = vlm_pipe(prompt="hello", max_new_tokens=value)
    assert out.text == ref.text
    inputs = vlm_pipe.prepare(prompt="hello")
    assert torch.equal(mmspec.generate(vlm_pipe.model, inputs, max_new_tokens=value).sequences, ref.sequences)
    with pytest.raises(InvalidInputError, match="max_new_tokens"):
        vlm_pipe(prompt="hello", max_new_tokens=torch.tensor([3, 4]))  # not a 0-d integer
    with pytest.raises(InvalidInputError, match="max_new_tokens"):
        vlm_pipe(prompt="hello", max_new_tokens=np.float64(3.0))


@pytest.mark.parametrize("prompt", ["", "   ", ["hi", ""]])
def test_empty_prompt_without_images(vlm_pipe, prompt):
    with pytest.raises(InvalidInputError, match="empty"):
        vlm_pipe(prompt=prompt, max_new_tokens=4)


def test_empty_prompt_with_an_image_still_runs(vlm_pipe, shapes_image):
    # The image is the request (a captioner's use); only a request with nothing in it is refused.
    assert isinstance(vlm_pipe(images=[shapes_image], prompt="", max_new_tokens=3).text, str)


# ---------------------------------------------------------------------------- missing local folders
def _fast(fn):
    t0 = time.perf_counter()
    with pytest.raises(InvalidInputError, match="not found") as e:
        fn()
    assert time.perf_counter() - t0 < 5, "tried as a hub id"
    return str(e.value)


def test_missing_local_folder_said_at_once_for_every_entry_point(tmp_path, monkeypatch, tiny_vlm):
    """``models/vlm`` has one slash, like a hub id; its first part is a local folder, so it is a local path."""
    from mmspec.registry import make_drafter
    from mmspec.train import TrainConfig

    monkeypatch.chdir(tmp_path)
    os.makedirs("models")
    target = MMSpecPipeline.from_pretrained(tiny_vlm).model
    for fn in [lambda: MMSpecPipeline.from_pretrained("models/vlm"),
               lambda: make_drafter("draft-model:models/small", None),
               lambda: make_drafter("eagle:models/head", target),
               lambda: MMSpecPipeline.from_pretrained("/nope/driving-vla", task="driving"),
               lambda: MMSpecPipeline.from_pretrained("/nope/image-gen", task="images"),
               lambda: TrainConfig(target="models/vlm", out=str(tmp_path / "o")).validate()]:
        assert "models" in _fast(fn) or "nope" in _fast(fn)


def test_missing_local_folder_on_the_command_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    os.makedirs("models")
    t0 = time.perf_counter()
    rc = main(["generate", "--model", "models/vlm", "--prompt", "hi"])
    assert time.perf_counter() - t0 < 5
    _one_line_error(capsys, rc, "not found", "models/vlm")


# ---------------------------------------------------------------------------- eagle without a path
def test_bare_eagle_means_the_bundled_head_of_that_target():
    from mmspec.registry import make_drafter
    from mmspec.vision.testbed import bundled_eagle, bundled_target

    if bundled_target() is None or bundled_eagle() is None:
        pytest.skip("no bundled testbed target and head in this checkout")
    pipe = MMSpecPipeline.from_pretrained(bundled_target(), drafter="eagle")
    shipped = make_drafter(f"eagle:{bundled_eagle()}", pipe.model)
    assert pipe.drafter.kind == "eagle"
    for (k, a), b in zip(pipe.drafter.state_dict().items(), shipped.state_dict().values()):
        assert torch.equal(a, b), k  # the trained head, not a random one
    assert make_drafter("eagle;topk=3", pipe.model).topk == 3


def test_bare_eagle_on_another_target_names_what_to_pass(tiny_vlm, capsys):
    from mmspec.registry import make_drafter

    with pytest.raises(InvalidInputError, match=r"eagle:DIR"):
        MMSpecPipeline.from_pretrained(tiny_vlm, drafter="eagle")
    capsys.readouterr()  # the loading bars of the call above
    _one_line_error(capsys, main(["generate", "--model", tiny_vlm, "--prompt", "hi", "--drafter", "eagle"]),
                    "eagle:DIR")
    model = MMSpecPipeline.from_pretrained(tiny_vlm).model
    # An untrained head is still there for tests and ablations, asked for by name.
    assert make_drafter("eagle;untrained=true", model).kind == "eagle"


# ---------------------------------------------------------------------------- command line
def test_cli_sampling_errors_exit_2(tiny_vlm, capsys):
    base = ["generate", "--model", tiny_vlm, "--prompt", "hi", "--max-new-tokens", "4"]
    _one_line_error(capsys, main(base + ["--do-sample", "--temperature", "0"]), "temperature must be > 0")
    _one_line_error(capsys, main(base + ["--do-sample", "--top-k", "-3"]), "top_k must be >= 0")


def test_cli_sampling_options_without_do_sample_warn(tiny_vlm, capsys):
    rc = main(["generate", "--model", tiny_vlm, "--prompt", "hi", "--max-new-tokens", "3", "--temperature", "0.7",
               "--top-k", "5"])
    err = capsys.readouterr().err
    assert rc == 0
    assert "--temperature, --top-k" in err and "ignored" in err and "--do-sample" in err


def test_cli_device_map_cuda_without_a_gpu(tiny_vlm, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    rc = main(["generate", "--model", tiny_vlm, "--prompt", "hi", "--device-map", "cuda"])
    _one_line_error(capsys, rc, "no CUDA GPU")
    with pytest.raises(InvalidInputError, match="no CUDA GPU"):
        MMSpecPipeline.from_pretrained(tiny_vlm, device_map="cuda:0")


def test_cli_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"mmspec {mmspec.__version__}"


@pytest.mark.parametrize("value", ["-1", "0"])
def test_demo_max_new_tokens_validated(capsys, value):
    _one_line_error(capsys, main(["demo", "--max-new-tokens", value]), "max_new_tokens must be a positive integer")


# ---------------------------------------------------------------------------- mmspec train
def test_train_rejects_too_many_val_shards_before_the_data_stage(tmp_path, capsys, monkeypatch):
    from mmspec import train as train_mod
    from mmspec.demo import tiny_vlm_path

    def no_data(*a, **k):
        raise AssertionError("the data stage ran before the check")

    monkeypatch.setattr(train_mod, "collect_data", no_data)
    rc = main(["train", "--target", tiny_vlm_path(), "--out", str(tmp_path / "o"), "--n-train", "4",
               "--shard-size", "2", "--val-shards", "2", "--no-progress"])
    _one_line_error(capsys, rc, "val_shards", "2 data shards")


def test_saved_weights_are_readable_by_others(tmp_path, vlm_pipe):
    from mmspec.drafters import EagleDrafter

    head = EagleDrafter.from_target(vlm_pipe.model, seed=0)
    head.save_pretrained(tmp_path / "head")
    mode = stat.S_IMODE(os.stat(tmp_path / "head" / "model.safetensors").st_mode)
    umask = os.umask(0)
    os.umask(umask)
    assert mode == 0o666 & ~umask  # as any file the user writes (safetensors alone leaves 0600)


# ---------------------------------------------------------------------------- mmspec bench
@pytest.mark.parametrize("args, fragments", [
    (["--workload", "driving", "--model", "driving=/nope/vla"], ["not found", "/nope/vla"]),
    (["--workload", "driving", "--model", "images=/nope/gen"], ["images", "does not measure"]),
    (["--workload", "docs", "--model", "docs=/nope/vlm,driving=/nope/vla"], ["driving", "does not measure"]),
])
def test_bench_model_paths_checked_before_any_work(capsys, args, fragments):
    _one_line_error(capsys, main(["bench", "--n", "1", "--no-progress", *args]), *fragments)


def test_bench_model_of_the_wrong_kind(tiny_vlm, capsys):
    from mmspec.drivers.train_vla import bundled_vla

    _one_line_error(capsys, main(["bench", "--workload", "driving", "--model", f"driving={tiny_vlm}", "--n", "1"]),
                    "not a driving model")
    if bundled_vla():
        _one_line_error(capsys, main(["bench", "--workload", "docs", "--model", bundled_vla(), "--n", "1"]),
                        "a driving model", "docs")


def test_bench_bare_eagle_on_the_bundled_target_named_by_path(monkeypatch):
    """`--systems eagle --model vision/assets/testbed-vlm` is the same run as without --model: the shipped head."""
    import mmspec.bench as bench
    from mmspec.vision.testbed import bundled_eagle, bundled_target

    if bundled_target() is None or bundled_eagle() is None:
        pytest.skip("no bundled testbed target and head in this checkout")

    class Stop(Exception):
        pass

    def capture(names, *a, **k):
        raise Stop(names)

    monkeypatch.setattr(bench, "build_systems", capture)
    with pytest.raises(Stop) as e:
        bench.run_bench(bench.BenchConfig(model=bundled_target(), workloads=["testbed-docs"], systems=["eagle"], n=1),
                        progress=False)
    assert e.value.args[0] == ["ar", f"eagle:{bundled_eagle()}"]


def test_bench_table_prints_latency_and_quality_of_plain_pipelines():
    from mmspec.bench import BenchReport, plain_record

    rec = plain_record("driving", 1, 2, [0.5, 0.7], 24, {"encode": [10.0, 12.0], "total": [500.0, 700.0]},
                       {"reasoning_exact": 0.5, "min_ade_1": 4.25, "note": "x"})
    img = plain_record("images", 4, 8, [1.0], 1024, {"generate": [900.0], "total": [1000.0]},
                       {"prompt_accuracy": 0.875, "fid": 24.7, "fid_n": 8, "field_accuracy": {"shape": 1.0}})
    text = dict(rec, workload="inputs:req.jsonl", system="lookup", latency_ms=None, quality={"cer": 0.1})
    table = BenchReport([rec, img, text], {"dtype": "torch.float32"}).table()
    assert not any(line.startswith("inputs:req.jsonl  lookup  bs") for line in table.splitlines())
    lines = table.splitlines()
    driving = next(line for line in lines if line.startswith("driving") and "ms" in line)
    assert "total 600.0 ms" in driving and "p90 680.0" in driving and "encode 11.0" in driving
    assert "reasoning_exact 0.5" in driving and "min_ade_1 4.25" in driving
    images = next(line for line in lines if line.startswith("images") and "ms" in line)
    assert "prompt_accuracy 0.875" in images and "fid 24.7 (n 8)" in images and "shape 1" in images


def test_generate_on_a_world_folder_says_what_it_is(capsys):
    from mmspec.drivers.train_vla import bundled_vla

    if not bundled_vla():
        pytest.skip("no bundled driving VLA in this checkout")
    _one_line_error(capsys, main(["generate", "--model", bundled_vla(), "--prompt", "hi"]),
                    "is a driving model", "DrivingPipeline")
    pipe = MMSpecPipeline.from_pretrained(bundled_vla())
    with pytest.raises(InvalidInputError, match="frames"):
        pipe(images=["a.png"], prompt="hi")  # a VLM-style call on the driving pipeline: what it takes instead
