"""Quality measures of the image world: FID behaves like a distance, prompt accuracy checks prompts."""

import numpy as np
import pytest
import torch

from mmspec.image_ar.quality import WorldClassifier, fid, frechet_distance, prompt_accuracy, train_classifier
from mmspec.image_ar.world import draw, parse_prompt
from mmspec.workloads import get_workload


def test_frechet_distance_properties():
    rng = np.random.default_rng(0)
    a = rng.normal(size=(500, 6))
    b = rng.normal(size=(500, 6)) * 2.0 + 1.0
    ca, cb = np.cov(a, rowvar=False), np.cov(b, rowvar=False)
    assert abs(frechet_distance(a.mean(0), ca, a.mean(0), ca)) < 1e-6
    d = frechet_distance(a.mean(0), ca, b.mean(0), cb)
    assert abs(d - frechet_distance(b.mean(0), cb, a.mean(0), ca)) < 1e-6 and d > 5.0


@pytest.mark.slow
def test_classifier_learns_and_metrics_separate_right_from_wrong(tmp_path):
    torch.set_num_threads(1)
    clf = train_classifier(str(tmp_path), steps=60, batch_size=32, progress=False)
    loaded = WorldClassifier.from_pretrained(str(tmp_path))
    exs = get_workload("images").examples("test", 48)
    real = [ex.meta["image"] for ex in exs]
    with torch.no_grad():
        assert torch.equal(clf(torch.zeros(1, 3, 64, 64))["pattern"], loaded(torch.zeros(1, 3, 64, 64))["pattern"])
    right = prompt_accuracy(loaded, real, [ex.prompt for ex in exs])
    shuffled = prompt_accuracy(loaded, real, [ex.prompt for ex in exs[1:] + exs[:1]])
    mean = lambda r: np.mean([v for k, v in r.items() if k != "all"])  # noqa: E731
    assert mean(right) > mean(shuffled) + 0.1, (right, shuffled)
    other = [draw(parse_prompt("a large red square on the left on a white background"), 64)] * 48
    more = [ex.meta["image"] for ex in get_workload("images").examples("test", 48, start=48)]
    assert fid(loaded, real, more) < fid(loaded, real, other)


def test_bundled_classifier_reads_every_field_of_real_pictures():
    from mmspec.image_ar.quality import bundled_classifier

    if bundled_classifier() is None:  # an install without the repository's assets; this checkout ships it
        pytest.skip("no world classifier bundled in this install")
    clf = WorldClassifier.from_pretrained(bundled_classifier())
    exs = get_workload("images").examples("test", 64)
    assert prompt_accuracy(clf, [ex.meta["image"] for ex in exs], [ex.prompt for ex in exs])["all"] >= 0.95


def test_kid_is_the_unbiased_mmd_written_out():
    """KID against the definition: mean of k over distinct pairs within each set, minus twice the cross mean,
    k(x, y) = (x . y / d + 1) ** 3; near 0 for one distribution, large for shifted features."""
    import numpy as np

    from mmspec.image_ar.quality import kernel_mmd2

    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(7, 5)), rng.normal(size=(9, 5)) + 0.3
    k = lambda x, y: (x @ y / 5 + 1) ** 3  # noqa: E731
    aa = sum(k(a[i], a[j]) for i in range(7) for j in range(7) if i != j) / (7 * 6)
    bb = sum(k(b[i], b[j]) for i in range(9) for j in range(9) if i != j) / (9 * 8)
    ab = sum(k(x, y) for x in a for y in b) / (7 * 9)
    assert abs(kernel_mmd2(a, b) - (aa + bb - 2 * ab)) < 1e-9
    same = rng.normal(size=(400, 5))
    assert abs(kernel_mmd2(same[:200], same[200:])) < 0.05 < kernel_mmd2(same[:200], same[200:] + 0.5)
