"""mmspec.image_ar: the image world for autoregressive image generation, with Speculative Jacobi Decoding
(the ``sjd`` drafter, :mod:`mmspec.image_ar.sjd`), relaxed acceptance rules (``lantern++``, ``csd``, ``gsd``,
:mod:`mmspec.image_ar.relaxed`) and spatial 2-D drafting (the ``spatial`` drafter, :mod:`mmspec.image_ar.ssd`, its head
:mod:`mmspec.image_ar.ssd_head` and trainer :mod:`mmspec.image_ar.ssd_train`, over the raster maps with newline tokens
and the draft scheduler of :mod:`mmspec.image_ar.spatial`).

Importing this package registers the ``images`` workload (:mod:`mmspec.image_ar.workload`), the ``sjd`` and ``spatial`` drafters (and
``mmspec train --kind spatial``), the relaxed rules and SSD's lossy ``ssd_correct`` and :class:`ImageARPipeline` for the ``images`` task (so ``MMSpecPipeline.from_pretrained`` returns one for a folder
whose config says ``"mmspec_task": "images"``); the core imports it only lazily, through
:mod:`mmspec.registry`.

Example:
    >>> from mmspec.image_ar.world import parse_prompt
    >>> parse_prompt("the letter A in red on a white background")["glyph"]
    'A'
    >>> from mmspec.image_ar import ImageARPipeline
    >>> ImageARPipeline.task
    'images'
"""

from mmspec.acceptance import register_rule
from mmspec.registry import register_drafter, register_pipeline
from mmspec.train import register_trainer
from mmspec.workloads import register_workload

from . import relaxed  # noqa: F401  (registers the relaxed acceptance rules: lantern++, csd, gsd)
from .generator import ImageARPipeline
from .sjd import _sjd_factory
from .ssd import SpatialCorrectRule, _spatial_factory
from .ssd_train import SpatialTrainer
from .workload import ImagesWorkload

register_workload(ImagesWorkload)
register_pipeline(ImageARPipeline.task, ImageARPipeline, model_types=ImageARPipeline.model_types)
register_drafter("sjd", _sjd_factory)
register_drafter("spatial", _spatial_factory)
register_rule("ssd_correct", SpatialCorrectRule)
register_trainer("spatial", SpatialTrainer)

__all__ = ["ImagesWorkload", "ImageARPipeline"]
