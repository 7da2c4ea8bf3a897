"""The driving and image-generation examples a user copies run offline on the bundled models and show what they say
they show (examples/drive_latency_loop.py, examples/image_generation.py). No timing assertions: the machine is noisy."""

from __future__ import annotations

import runpy
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def _need(path: Path):
    if not (path / "model.safetensors").is_file():
        pytest.skip(f"no bundled {path.name} in this checkout")


@pytest.mark.slow
def test_drive_latency_loop_example(capsys):
    """Plain and FlashDrive each drive the same scenario for the same ticks; every tick has the stage timings, a
    one-sample plan of 64 (accel, curvature) actions and a 64-waypoint trajectory; FlashDrive's stream starts with a
    full prefill and then reuses the kept frames' KV on every tick; the summary counts agree with the ticks."""
    from mmspec.drivers.pipeline import STAGES

    _need(ROOT / "drivers" / "assets" / "driving-vla")
    ex = runpy.run_path(str(EXAMPLES / "drive_latency_loop.py"), run_name="example")
    got = ex["main"](ticks=3, scenarios=1, budget_ms=100.0, every=1)
    printed = capsys.readouterr().out
    plain, fd = got["systems"]["plain"], got["systems"]["flashdrive"]
    assert [r["tick"] for r in plain["ticks"]] == [r["tick"] for r in fd["ticks"]] == [20, 21, 22]
    for system in (plain, fd):
        assert system["n_ticks"] == 3
        for r in system["ticks"]:
            assert set(r["timings_ms"]) == set(STAGES) and all(v >= 0 for v in r["timings_ms"].values())
            assert r["actions"].shape == (1, 64, 2) and np.isfinite(r["actions"]).all()
            assert r["trajectory"].shape == (64, 2) and r["reasoning"]
            assert r["within_budget"] == (r["timings_ms"]["total"] <= 100.0)
        assert system["over_budget"] == sum(not r["within_budget"] for r in system["ticks"])
        assert system["median_ms"] <= system["p90_ms"]
        assert set(system["events"]) == {"collision", "offroad", "red_light"}
    # plain runs generate (no stream); FlashDrive prefills the first tick of the drive in full, then streams
    assert all(r["stream"] is None for r in plain["ticks"])
    assert fd["ticks"][0]["stream"] != "reuse" and [r["stream"] for r in fd["ticks"][1:]] == ["reuse", "reuse"]
    assert printed.count("plain      cruise") == 3 and printed.count("flashdrive cruise") == 3
    assert "plain      3 ticks: median" in printed and "flashdrive 3 ticks: median" in printed


@pytest.mark.slow
def test_image_generation_example(tmp_path, capsys):
    """Spatial speculation (and SJD) give AR's codes token for token under greedy decoding in float32, in fewer
    target passes; the grid PNG opens with one row per prompt and one 128-px column per picture, and its AR and
    spatial cells are the same pixels."""
    from PIL import Image

    _need(ROOT / "image_ar" / "assets" / "image-gen")
    ex = runpy.run_path(str(EXAMPLES / "image_generation.py"), run_name="example")
    out = tmp_path / "grid.png"
    got = ex["main"](images=2, out=str(out), systems=("spatial", "sjd"), dtype="float32", scale=2)
    printed = capsys.readouterr().out
    ar, spatial, sjd = (got["systems"][s] for s in ("ar", "spatial", "sjd"))
    assert ar["codes"].shape == (2, 256)
    for r in (spatial, sjd):
        assert r["equal_to_ar"] and r["lossless"] and r["same_codes_rate"] == 1.0
        assert r["tau"] > 1.5 and r["target_forwards"] < ar["target_forwards"] == 2 * 256
    assert spatial["tau"] > 3  # the bundled head drafts many codes a pass (as tests/test_image_ssd.py checks)
    assert printed.count("equals AR token for token: True") == 3

    assert got["columns"] == ["reference", "ar", "spatial", "sjd"]
    with Image.open(out) as img:
        grid = img.convert("RGB")
    cell, top = 128, got["label_px"]
    assert grid.size == tuple(got["grid_size"]) == (4 * cell, top + 2 * cell)
    for i in range(2):
        box = lambda j: (j * cell, top + i * cell, (j + 1) * cell, top + (i + 1) * cell)  # noqa: E731
        ar_cell, spatial_cell = np.asarray(grid.crop(box(1))), np.asarray(grid.crop(box(2)))
        assert np.array_equal(ar_cell, spatial_cell)  # same codes -> same decoded pixels
        expected = np.asarray(ar["images"][i].convert("RGB").resize((cell, cell), Image.NEAREST))
        assert np.array_equal(ar_cell, expected)
