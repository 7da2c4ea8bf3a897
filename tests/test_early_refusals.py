"""What a new user hit (issue 31): bad requests refused early and clearly, one default drafter everywhere.

Each case is the behaviour a user expects or a one-line ``MMSpecError`` (exit 2 on the command line), said
before any model work where the request alone shows it is wrong.
"""

from __future__ import annotations

import pytest
from PIL import Image

from mmspec import MMSpecPipeline
from mmspec.cli import main
from mmspec.errors import InvalidImageError, InvalidInputError


def _no_model_load(monkeypatch):
    """Make any model load fail loudly: what must be refused before it is refused before it."""
    import mmspec.pipelines

    def boom(*a, **k):
        raise AssertionError("a model was loaded before the request was checked")

    monkeypatch.setattr(mmspec.pipelines, "load_target_config", boom)


def test_a_one_pixel_image_is_refused(vlm_pipe):
    with pytest.raises(InvalidImageError, match="at least 8 pixels"):
        vlm_pipe(images=[Image.new("RGB", (1, 1))], prompt="Describe.", max_new_tokens=4)


def test_an_image_over_the_pixel_limit_is_refused_from_its_header(tmp_path, monkeypatch):
    from mmspec.vision import load_image

    path = tmp_path / "big.png"
    Image.new("RGB", (40, 30), "white").save(path)
    monkeypatch.setenv("MMSPEC_MAX_IMAGE_PIXELS", "1000")
    decoded = []
    monkeypatch.setattr(Image.Image, "load", lambda self, *a: decoded.append(1))
    with pytest.raises(InvalidImageError, match="1,200 pixels, over mmspec's limit of 1,000"):
        load_image(str(path))
    assert not decoded  # refused from the size in the header, before any pixel was decoded
    monkeypatch.setenv("MMSPEC_MAX_IMAGE_PIXELS", "zero")
    with pytest.raises(InvalidImageError, match="MMSPEC_MAX_IMAGE_PIXELS must be a positive integer"):
        load_image(Image.new("RGB", (2, 2)))


def test_an_unknown_drafter_is_refused_before_the_model_loads(monkeypatch, capsys, tiny_vlm):
    _no_model_load(monkeypatch)
    with pytest.raises(InvalidInputError, match="unknown drafter kind 'foo'"):
        MMSpecPipeline.from_pretrained(tiny_vlm, drafter="foo")
    assert main(["generate", "--model", tiny_vlm, "--prompt", "hi", "--drafter", "foo"]) == 2
    assert "unknown drafter kind 'foo'" in capsys.readouterr().err


@pytest.mark.parametrize("args, what", [(["--budget-ms", "-5"], "--budget-ms and --seconds must be positive"),
                                        (["--seconds", "0"], "--budget-ms and --seconds must be positive"),
                                        (["--dtype", "fp8"], "unknown dtype")])
def test_drive_sim_refuses_impossible_settings_before_loading(capsys, args, what):
    assert main(["drive-sim", "--model", "/no/such/vla", *args]) == 2
    assert what in capsys.readouterr().err


def test_drive_sim_loads_in_the_dtype_auto_picks():
    import argparse

    from mmspec.drivers.bench import _sim_arguments

    p = argparse.ArgumentParser()
    _sim_arguments(p)
    assert p.parse_args([]).dtype == "auto"


def test_one_default_drafter_auto_everywhere(tiny_vlm, shapes_image):
    """from_pretrained without a drafter drafts with 'auto' (here its fallback, prompt lookup) and says so in
    the stats; drafter=None still means plain decoding; the CLI's default is the same."""
    from mmspec.cli import build_parser

    pipe = MMSpecPipeline.from_pretrained(tiny_vlm)
    assert pipe.drafter is not None and pipe.notes and "auto" in pipe.notes[0]
    out = pipe(images=[shapes_image], prompt="Describe.", max_new_tokens=8)
    assert out.stats.drafter == pipe.drafter.kind != ""
    assert MMSpecPipeline.from_pretrained(tiny_vlm, drafter=None).drafter is None
    assert build_parser().parse_args(["generate", "--prompt", "hi"]).drafter == "auto"


def test_generate_without_model_uses_the_bundled_document_model(monkeypatch, capsys):
    """`mmspec generate` without --model runs the bundled document model (what the demo ran), not argparse's
    usage dump."""
    from mmspec.workloads import get_workload

    seen = {}
    import mmspec.cli

    def fake_check(model, task):
        seen["model"] = model
        raise InvalidInputError("stop here")

    monkeypatch.setattr(mmspec.cli, "_check_text_task", fake_check)
    assert main(["generate", "--prompt", "hi"]) == 2
    want = get_workload("docs").bundled_model() or get_workload("testbed-docs").bundled_model()
    assert seen["model"] == want


def test_bench_footer_names_the_dtype_of_plain_pipelines():
    from mmspec.bench import BenchReport, plain_record

    rec = plain_record("driving", 1, 2, [0.5, 0.7], 24, {"total": [500.0, 700.0]}, {}, "x", dtype="bfloat16")
    assert "(dtype bfloat16)" in BenchReport([rec], {"dtype": None}).table()
