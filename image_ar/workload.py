"""The ``images`` workload: text-to-image requests from the image world, with the reference picture.

Each item is a prompt (:func:`~mmspec.image_ar.world.prompt_for` of a seeded scene spec); the reference
image drawn from the same spec and the spec's classifier labels are in ``meta`` (``image``, ``spec``,
``labels``): an AR generator is asked for ``prompt`` and judged against them. ``images`` (the model's
*inputs*) is empty: nothing is shown to a text-to-image model.

Example:
    >>> from mmspec.workloads import get_workload
    >>> ex = get_workload("images").example("test", 0)
    >>> ex.images, ex.meta["image"].size
    ([], (64, 64))
"""

from __future__ import annotations

from mmspec.workloads import Example, SeededWorkload

from .world import draw as render
from .world import prompt_for, sample_spec, spec_labels

__all__ = ["ImagesWorkload"]


class ImagesWorkload(SeededWorkload):
    """Prompt-composed synthetic images (see :mod:`mmspec.image_ar.world`).

    Args:
        size: image side in pixels (64 by default; 128 for finer grids).
        seed: mixed into every item's seed.
    """

    name = "images"
    plain_pipeline = True
    plain_systems = True  # ar, sjd, spatial and the relaxed rules: image_ar/bench.py
    resumable = True  # --resume: a checkpoint per batch (image_ar/bench.py)
    quality_full = True  # --quality full: >= 1000 images per system (image_ar/bench.py)
    model_task = "images"
    model_marker = "image_generation.json"

    def bundled_model(self):
        from .generator import bundled_generator

        return bundled_generator()

    def check_plain_systems(self, systems) -> None:
        from .bench import _systems

        _systems(systems)

    def bench_plain(self, model, examples, cfg, progress=True):
        from .bench import bench_images

        return bench_images(model or self.bundled_model(), examples, cfg, progress)

    def __init__(self, size: int = 64, seed: int = 0):
        self.size, self.seed = int(size), seed

    def generate(self, rng, nrng, split, index, draw=True):
        spec = sample_spec(nrng)
        meta = {"spec": spec, "labels": spec_labels(spec)}
        if draw:
            meta["image"] = render(spec, self.size)
        return Example(id="", prompt=prompt_for(spec), target="", images=[], meta=meta)
