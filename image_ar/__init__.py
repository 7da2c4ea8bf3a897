"""mmspec.image_ar: the image world for autoregressive image generation (spatial 2-D drafting and relaxed
acceptance come with the image issues).

Importing this package registers the ``images`` workload (:mod:`mmspec.image_ar.workload`); the core
imports it only lazily, through :mod:`mmspec.registry`.

Example:
    >>> from mmspec.image_ar.world import parse_prompt
    >>> parse_prompt("the letter A in red on a white background")["glyph"]
    'A'
"""

from mmspec.workloads import register_workload

from .workload import ImagesWorkload

register_workload(ImagesWorkload)

__all__ = ["ImagesWorkload"]
