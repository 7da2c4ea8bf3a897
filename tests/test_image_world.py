"""The image world: prompts round-trip to specs, drawing is deterministic, splits differ, labels index heads."""

import numpy as np

from mmspec.image_ar.world import LABEL_HEADS, draw, parse_prompt, prompt_for, sample_spec, spec_labels
from mmspec.workloads import get_workload


def test_prompts_round_trip_and_cover_every_field():
    rng = np.random.default_rng(0)
    seen = {k: set() for k in LABEL_HEADS}
    for _ in range(3000):
        spec = sample_spec(rng)
        assert parse_prompt(prompt_for(spec)) == spec
        for k, v in spec_labels(spec).items():
            assert 0 <= v < len(LABEL_HEADS[k])
            seen[k].add(v)
    assert all(len(seen[k]) == len(LABEL_HEADS[k]) for k in LABEL_HEADS), {k: len(v) for k, v in seen.items()}


def test_items_are_deterministic_and_splits_differ():
    wl = get_workload("images")
    a, b = wl.example("test", 5), get_workload("images").example("test", 5)
    assert a.prompt == b.prompt and np.array_equal(np.asarray(a.meta["image"]), np.asarray(b.meta["image"]))
    assert a.images == [] and wl.text_example("test", 5).prompt == a.prompt
    prompts_test = {wl.example("test", i).prompt for i in range(20)}
    prompts_train = {wl.example("train", i).prompt for i in range(20)}
    assert prompts_test != prompts_train
    assert get_workload("images", size=128).example("test", 5).meta["image"].size == (128, 128)


def test_drawing_shows_the_prompt():
    spec = parse_prompt("a large red square on the left on a white background")
    img = np.asarray(draw(spec, 64)).astype(int)
    left, right = img[:, :32], img[:, 32:]
    red = lambda x: ((x[..., 0] > 180) & (x[..., 1] < 80)).sum()  # noqa: E731
    assert red(left) > 200 and red(right) < 20
    top = np.asarray(draw(parse_prompt("a small blue circle above a large green square on a black background"), 64))
    assert (top[:32, :, 2] > 180).sum() > 50 and (top[32:, :, 1] > 140).sum() > 200
