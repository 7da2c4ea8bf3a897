"""Drafters: the proposers that share one verify loop.

Example:
    >>> from mmspec.drafters import PromptLookupDrafter
    >>> PromptLookupDrafter().kind
    'lookup'
"""

from .base import DraftContext, Drafter, RoundResult
from .draft_model import DraftModelDrafter
from .eagle import EagleDrafter, train_eagle
from .lookup import PromptLookupDrafter
from .oracle import NoisyOracleDrafter
from .saving import TrainableDrafter, target_fingerprint
from .union import UnionDrafter

from ..registry import register_drafter as _register_drafter  # noqa: E402
from .eagle import _eagle_spec_factory  # noqa: E402

_register_drafter("eagle", _eagle_spec_factory)
from .auto import auto_factory as _auto_factory  # noqa: E402

_register_drafter("auto", _auto_factory)  # the saved drafter with the best validation tau (mmspec.drafters.auto)
from . import fastmtp as _fastmtp  # noqa: E402,F401  registers the fastmtp drafter and trainer

__all__ = ["Drafter", "DraftContext", "RoundResult", "PromptLookupDrafter", "DraftModelDrafter", "NoisyOracleDrafter",
           "TrainableDrafter", "target_fingerprint", "EagleDrafter", "train_eagle", "UnionDrafter"]
