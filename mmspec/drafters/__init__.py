"""Drafters: the proposers that share one verify loop.

Example:
    >>> from mmspec.drafters import PromptLookupDrafter
    >>> PromptLookupDrafter().kind
    'lookup'
"""

from .base import DraftContext, Drafter, RoundResult
from .draft_model import DraftModelDrafter
from .lookup import PromptLookupDrafter
from .oracle import NoisyOracleDrafter
from .saving import TrainableDrafter, target_fingerprint

__all__ = ["Drafter", "DraftContext", "RoundResult", "PromptLookupDrafter", "DraftModelDrafter", "NoisyOracleDrafter",
           "TrainableDrafter", "target_fingerprint"]
