"""What a new user hit in the driving and image worlds (issue 13, section 4): one entry point that returns
their pipelines for the bundled folders, exports from their packages, README snippets that run as written,
and clear :class:`mmspec.MMSpecError` s for bad requests (validated before any model work)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from mmspec import InvalidImageError, InvalidInputError, MMSpecPipeline

ROOT = Path(__file__).resolve().parent.parent
VLA = ROOT / "drivers" / "assets" / "driving-vla"
GEN = ROOT / "image_ar" / "assets" / "image-gen"


def _need(path):
    if not (path / "model.safetensors").is_file():
        pytest.skip(f"no bundled {path.name} in this checkout")


@pytest.fixture(scope="module")
def driving():
    _need(VLA)
    return MMSpecPipeline.from_pretrained(VLA)


@pytest.fixture(scope="module")
def images():
    _need(GEN)
    return MMSpecPipeline.from_pretrained(GEN)


@pytest.fixture(scope="module")
def tick():
    from mmspec.workloads import get_workload

    ex = get_workload("driving").example("test", 0)
    return ex.images, ex.meta["history"], ex.meta["speed"]


# ---------------------------------------------------------------------------- one entry point, exports
def test_from_pretrained_returns_the_world_pipelines(driving, images, tiny_vlm):
    from mmspec.drivers import DrivingPipeline
    from mmspec.image_ar import ImageARPipeline
    from mmspec.vision import VLMPipeline

    assert type(driving) is DrivingPipeline and type(images) is ImageARPipeline
    assert isinstance(driving, MMSpecPipeline) and isinstance(images, MMSpecPipeline)
    assert type(MMSpecPipeline.from_pretrained(VLA, task="vlm")) is VLMPipeline  # task= still forces one
    assert type(MMSpecPipeline.from_pretrained(tiny_vlm)) is VLMPipeline
    # The package classes load the bundled folders themselves, as the README shows.
    assert type(DrivingPipeline.from_pretrained(VLA)) is DrivingPipeline
    assert type(ImageARPipeline.from_pretrained(GEN)) is ImageARPipeline


def test_each_bundled_folder_says_its_task(tmp_path, driving):
    import json

    from mmspec.pipelines import TASK_KEY

    assert json.loads((VLA / "config.json").read_text())[TASK_KEY] == "driving"
    assert json.loads((GEN / "config.json").read_text())[TASK_KEY] == "images"
    driving.vla.save_pretrained(tmp_path / "vla")  # a folder saved again still says it
    assert json.loads((tmp_path / "vla" / "config.json").read_text())[TASK_KEY] == "driving"


def test_world_pipelines_take_drafters_and_refuse_wrong_folders(tiny_vlm):
    _need(VLA)
    # the driving pipeline drafts its reasoning with any core drafter (FlashDrive's speculative reasoning)
    pipe = MMSpecPipeline.from_pretrained(VLA, drafter="lookup")
    assert "spec: lookup" in pipe.engine.describe()
    with pytest.raises(InvalidInputError):
        MMSpecPipeline.from_pretrained(VLA, drafter="no-such-drafter")
    from mmspec.drivers import DrivingPipeline
    from mmspec.image_ar import ImageARPipeline

    with pytest.raises(InvalidInputError, match="not a driving VLA"):
        DrivingPipeline.from_pretrained(tiny_vlm)
    with pytest.raises(InvalidInputError, match="not an image generator"):
        ImageARPipeline.from_pretrained(tiny_vlm)


def test_world_folders_missing_are_said_at_once():
    from mmspec.drivers import DrivingPipeline
    from mmspec.drivers.train_vla import DrivingVLA
    from mmspec.image_ar import ImageARPipeline

    for fn in (lambda: DrivingVLA.from_pretrained("/nope/vla"), lambda: DrivingPipeline.from_pretrained("/nope/vla"),
               lambda: ImageARPipeline.from_pretrained("/nope/gen")):
        with pytest.raises(InvalidInputError, match="not found: /nope"):
            fn()


def _readme_snippet(marker: str) -> str:
    text = (ROOT / "README.md").read_text()
    at = text.index(marker)
    return re.search(r"```python\n(.*?)```", text[at:], re.S).group(1)


@pytest.mark.slow
@pytest.mark.parametrize("marker", ["<!-- snippet: driving -->", "<!-- snippet: images -->"])
def test_readme_world_snippets_run_as_written(marker, monkeypatch, capsys):
    _need(VLA)
    _need(GEN)
    monkeypatch.chdir(ROOT)  # the README's paths are relative to the repository root
    exec(compile(_readme_snippet(marker), f"README {marker}", "exec"), {})
    assert capsys.readouterr().out.strip()


# ---------------------------------------------------------------------------- driving requests
@pytest.mark.parametrize("speed, message", [(float("nan"), "speed"), (1e6, "speed"), (-3.0, "speed"),
                                            ("fast", "speed")])
def test_driving_speed_validated(driving, tick, speed, message):
    frames, history, _ = tick
    with pytest.raises(InvalidInputError, match=message):
        driving.step(frames, history, speed)


@pytest.mark.parametrize("history", [np.zeros((8, 3)), np.zeros((16, 2)), np.zeros(48), None,
                                     np.full((16, 3), np.nan)])
def test_driving_ego_history_validated(driving, tick, history):
    frames, _, speed = tick
    with pytest.raises(InvalidInputError, match="ego history"):
        driving.step(frames, history, speed)


@pytest.mark.parametrize("count", [1, 3, 12])
def test_driving_frame_count_must_match_training(driving, tick, count):
    frames, history, speed = tick
    with pytest.raises(InvalidInputError, match="trained on 4 frames per camera"):
        driving.step((frames * 3)[:count], history, speed)


def test_driving_unknown_or_untrained_camera(driving):
    from mmspec.drivers import DrivingPipeline

    with pytest.raises(InvalidInputError, match="unknown camera.*'rear'"):
        DrivingPipeline(driving.vla, cameras=("rear",))
    with pytest.raises(InvalidInputError, match="trained on cameras \\['front'\\]"):
        DrivingPipeline(driving.vla, cameras=("front", "left"))


def test_driving_frames_go_through_the_shared_loader(driving, tick, tmp_path):
    frames, history, speed = tick
    paths = []
    for i, f in enumerate(frames):
        paths.append(str(tmp_path / f"f{i}.png"))
        f.save(paths[-1])
    floats = [np.asarray(f, dtype=np.float32) / 255.0 for f in frames]
    ref = driving.step(frames, history, speed)
    for same in (paths, floats):  # paths and float arrays in [0, 1] are the same pictures
        out = driving.step(same, history, speed)
        assert out["reasoning"] == ref["reasoning"] and np.allclose(out["trajectory"], ref["trajectory"])
    with pytest.raises(InvalidImageError, match="frame 2: image file not found"):
        driving.step(paths[:2] + ["/no/such.png"] + paths[3:], history, speed)
    with pytest.raises(InvalidInputError, match="list of frames"):
        driving.step(frames[0], history, speed)


# ---------------------------------------------------------------------------- image requests
@pytest.mark.parametrize("prompt, message", [([], "prompt list is empty"), (None, "prompt is required"),
                                             (["a red circle", 3], "prompt 1 must be a string"),
                                             ("", "prompt is empty")])
def test_image_prompts_validated(images, prompt, message):
    with pytest.raises(InvalidInputError, match=message):
        images(prompt)


@pytest.mark.parametrize("kwargs, message", [
    ({"top_k": -5}, "top_k"), ({"top_k": 2.5}, "top_k"),
    ({"temperature": -1}, "temperature"), ({"temperature": float("nan")}, "temperature"),
    ({"cfg_scale": -2}, "cfg_scale"), ({"cfg_scale": float("nan")}, "cfg_scale"), ({"cfg_scale": 0.5}, "cfg_scale"),
    ({"seed": "x"}, "seed"), ({"seed": 1.5}, "seed"),
])
def test_image_sampling_settings_validated(images, kwargs, message, monkeypatch):
    import mmspec.image_ar.generator as gen

    def no_model_work(*a, **k):
        raise AssertionError("generation started")

    monkeypatch.setattr(gen, "generate_codes", no_model_work)
    with pytest.raises(InvalidInputError, match=message):
        images("a small red circle in the center on a white background", **kwargs)


def test_image_seed_none_draws_a_fresh_seed(images, monkeypatch):
    import mmspec.image_ar.generator as gen

    seen = []

    def codes(model, ids, mask, tok, n, cfg_scale, temperature, top_k, generator, do_sample=True):
        seen.append(generator.initial_seed())
        return torch.zeros(ids.shape[0], n, dtype=torch.long)

    monkeypatch.setattr(gen, "generate_codes", codes)
    images("a small red circle in the center on a white background", seed=None)
    images("a small red circle in the center on a white background", seed=None)
    images("a small red circle in the center on a white background", seed=7)
    assert seen[0] != seen[1] and seen[2] == 7


# ---------------------------------------------------------------------------- python -m mmspec.image_ar eval
def test_image_ar_eval_without_anything_to_evaluate_is_an_error(capsys):
    from mmspec.image_ar.evaluate import main

    with pytest.raises(SystemExit) as e:
        main(["eval"])
    assert e.value.code == 2
    assert "--generator" in capsys.readouterr().err

