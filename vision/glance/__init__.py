"""GLANCE for mmspec: a block draft head that reads the target's states over the whole prompt, page included.

Importing this package registers the ``glance`` drafter kind (``make_drafter("glance:DIR", target)``,
``mmspec bench --systems glance:DIR``) and its trainer (``mmspec train --kind glance``) side by side.

Example:
    >>> from mmspec.registry import drafter_kinds
    >>> from mmspec.train import trainer_kinds
    >>> "glance" in drafter_kinds() and "glance" in trainer_kinds()
    True
"""

from mmspec.registry import register_drafter
from mmspec.train import register_trainer

from .drafter import GlanceDrafter, glance_factory
from .head import ShuffledImageFeatures, image_token_mask
from .train import GlanceTrainer, glance_record

register_drafter("glance", glance_factory)
register_trainer("glance", GlanceTrainer)

__all__ = ["GlanceDrafter", "GlanceTrainer", "ShuffledImageFeatures", "glance_factory", "glance_record",
           "image_token_mask"]
