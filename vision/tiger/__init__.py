"""TIGER for mmspec: GLANCE's block drafter with text-gated visual routing, trained by distillation and then by
acceptance-aligned group policy training.

Importing this package registers the ``tiger`` drafter kind (``make_drafter("tiger:DIR;visual_top_k=32",
target)``) and its trainer (``mmspec train --kind tiger``).

Example:
    >>> from mmspec.registry import drafter_kinds
    >>> from mmspec.train import trainer_kinds
    >>> "tiger" in drafter_kinds() and "tiger" in trainer_kinds()
    True
"""

from mmspec.registry import register_drafter
from mmspec.train import register_trainer

from .drafter import TigerDrafter, tiger_factory
from .router import VisualRouter, parse_top_k
from .train import TigerTrainer, tiger_record

register_drafter("tiger", tiger_factory)
register_trainer("tiger", TigerTrainer)

__all__ = ["TigerDrafter", "TigerTrainer", "VisualRouter", "parse_top_k", "tiger_factory", "tiger_record"]
