"""mmspec.image_ar: the image world for autoregressive image generation (spatial 2-D drafting and relaxed
acceptance come with the image issues).

Importing this package registers the ``images`` workload (:mod:`mmspec.image_ar.workload`) and
:class:`ImageARPipeline` for the ``images`` task (so ``MMSpecPipeline.from_pretrained`` returns one for a folder
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

from mmspec.registry import register_pipeline
from mmspec.workloads import register_workload

from .generator import ImageARPipeline
from .workload import ImagesWorkload

register_workload(ImagesWorkload)
register_pipeline(ImageARPipeline.task, ImageARPipeline, model_types=ImageARPipeline.model_types)

__all__ = ["ImagesWorkload", "ImageARPipeline"]
