"""mmspec.image_ar: the image world for autoregressive image generation, with Speculative Jacobi Decoding
(the ``sjd`` drafter, :mod:`mmspec.image_ar.sjd`), relaxed acceptance rules (``lantern++``, ``csd``, ``gsd``,
:mod:`mmspec.image_ar.relaxed`) and the grid bookkeeping of spatial 2-D drafting (raster maps with newline tokens and
the draft scheduler, :mod:`mmspec.image_ar.spatial`; its trained heads are still to come).

Importing this package registers the ``images`` workload (:mod:`mmspec.image_ar.workload`), the ``sjd`` drafter,
the relaxed rules and :class:`ImageARPipeline` for the ``images`` task (so ``MMSpecPipeline.from_pretrained`` returns one for a folder
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

from mmspec.registry import register_drafter, register_pipeline
from mmspec.workloads import register_workload

from . import relaxed  # noqa: F401  (registers the relaxed acceptance rules: lantern++, csd, gsd)
from .generator import ImageARPipeline
from .sjd import _sjd_factory
from .workload import ImagesWorkload

register_workload(ImagesWorkload)
register_pipeline(ImageARPipeline.task, ImageARPipeline, model_types=ImageARPipeline.model_types)
register_drafter("sjd", _sjd_factory)

__all__ = ["ImagesWorkload", "ImageARPipeline"]
