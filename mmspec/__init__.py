"""mmspec: lossless speculative decoding for multimodal and domain-specific models.

Example:
    >>> import mmspec
    >>> from mmspec.drafters import PromptLookupDrafter
    >>> out = mmspec.generate(model, inputs, drafter=PromptLookupDrafter(), max_new_tokens=64)  # doctest: +SKIP
    >>> out.stats.tau                                                                          # doctest: +SKIP
"""

from .acceptance import AcceptanceRule, GreedyRule, SpeculativeSamplingRule
from .decode import GenerateOutput, generate
from .errors import (ContextLengthError, DrafterMismatchError, InvalidImageError, InvalidInputError, MMSpecError,
                     UnsupportedModelError)
from .stats import SpecStats
from .tree import DraftTree

__version__ = "0.1.0"

__all__ = [
    "generate", "GenerateOutput", "SpecStats", "DraftTree", "AcceptanceRule", "GreedyRule", "SpeculativeSamplingRule",
    "MMSpecError", "InvalidInputError", "InvalidImageError", "ContextLengthError", "DrafterMismatchError",
    "UnsupportedModelError", "MMSpecPipeline",
]


def __getattr__(name):
    # The pipeline pulls in the registry and processors; import it only when asked for.
    if name == "MMSpecPipeline":
        from .pipelines import MMSpecPipeline

        return MMSpecPipeline
    raise AttributeError(name)
