"""The error family of mmspec.

Every error a user can cause (bad inputs, a drafter for another target, a prompt past the context
window, an unsupported model) derives from :class:`MMSpecError`, and is raised before any model work
starts, so a batch job can record the failing item and go on.

Example:
    >>> from mmspec.errors import MMSpecError, InvalidInputError
    >>> issubclass(InvalidInputError, MMSpecError)
    True
"""

from __future__ import annotations

__all__ = [
    "MMSpecError",
    "InvalidInputError",
    "InvalidImageError",
    "ContextLengthError",
    "DrafterMismatchError",
    "UnsupportedModelError",
]


class MMSpecError(Exception):
    """Base class of every error mmspec raises on purpose."""


class InvalidInputError(MMSpecError, ValueError):
    """An argument or input the call cannot work with (e.g. ``max_new_tokens <= 0``)."""


class InvalidImageError(InvalidInputError):
    """An image that cannot be read, is empty, or has a zero-size side."""


class ContextLengthError(InvalidInputError):
    """The prompt (plus what would be generated) does not fit the model's context window."""


class DrafterMismatchError(MMSpecError):
    """A drafter was built or trained for a different target than the one it is paired with."""


class UnsupportedModelError(MMSpecError):
    """The model is of a kind mmspec cannot drive; the message names the kinds it can."""
