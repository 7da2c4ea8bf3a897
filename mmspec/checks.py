"""Argument and model checks shared by the decode loop and the pipelines (one place, one message)."""

from __future__ import annotations

from .errors import InvalidInputError

__all__ = ["context_window", "check_max_new_tokens"]


def context_window(model_or_config) -> int | None:
    """The model's context window (``max_position_embeddings`` of the text model), or ``None`` if unknown.

    Example:
        >>> from transformers import LlamaConfig
        >>> context_window(LlamaConfig(max_position_embeddings=128))
        128
    """
    cfg = getattr(model_or_config, "config", model_or_config)
    for c in (getattr(cfg, "text_config", None), cfg):
        if c is not None and getattr(c, "max_position_embeddings", None):
            return int(c.max_position_embeddings)
    return None


def check_max_new_tokens(max_new_tokens) -> int:
    """Validate ``max_new_tokens`` (a positive int) before any work; returns it.

    Example:
        >>> check_max_new_tokens(0)
        Traceback (most recent call last):
        ...
        mmspec.errors.InvalidInputError: max_new_tokens must be a positive integer (got 0)
    """
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens <= 0:
        raise InvalidInputError(f"max_new_tokens must be a positive integer (got {max_new_tokens!r})")
    return max_new_tokens
