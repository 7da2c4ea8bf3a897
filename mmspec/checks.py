"""Argument and model checks shared by the decode loop and the pipelines (one place, one message)."""

from __future__ import annotations

import math
import operator
import os

from .errors import InvalidInputError

__all__ = ["context_window", "check_max_new_tokens", "check_sampling", "looks_local", "check_local_folder",
           "check_device_map"]


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
    """Validate ``max_new_tokens`` (a positive integer) before any work; returns it as a Python ``int``.

    Why: counts computed with numpy or torch arrive as ``np.int64`` or 0-d tensors; they are integers, and
    a user should not have to cast them. Floats, bools, strings and tensors of several values are refused.

    Example:
        >>> import numpy as np
        >>> check_max_new_tokens(np.int64(8))
        8
        >>> check_max_new_tokens(0)
        Traceback (most recent call last):
        ...
        mmspec.errors.InvalidInputError: max_new_tokens must be a positive integer (got 0)
    """
    value = None
    x = max_new_tokens
    if type(x).__module__.startswith("torch") and hasattr(x, "dim") and x.dim() == 0:
        x = x.item()  # a 0-d tensor: its Python value (int, float or bool, checked below)
    if not isinstance(x, bool) and not (type(x).__module__ == "numpy" and x.dtype.kind == "b"):
        try:
            value = operator.index(x)  # ints and numpy integers; floats raise TypeError
        except TypeError:
            value = None
    if value is None or value <= 0:
        raise InvalidInputError(f"max_new_tokens must be a positive integer (got {max_new_tokens!r})")
    return value


def check_sampling(do_sample: bool, temperature=None, top_k=None, top_p=None) -> None:
    """Refuse sampling settings no sampler can use, as :class:`~mmspec.InvalidInputError` (transformers raises
    a plain ``ValueError`` deep inside ``generate``, or a NaN temperature silently breaks the scores).

    ``temperature``, ``top_p`` are checked only when sampling (greedy decoding ignores them, as ``generate``
    does); ``top_k`` must never be negative.

    Example:
        >>> check_sampling(True, temperature=0.0)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        mmspec.errors.InvalidInputError: temperature must be > 0 when sampling (got 0.0); ...
    """
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0):
        raise InvalidInputError(f"top_k must be >= 0 (0: no top-k filtering; got {top_k!r})")
    if not do_sample:
        return
    if temperature is not None and not (isinstance(temperature, (int, float)) and math.isfinite(temperature)
                                        and temperature > 0):
        raise InvalidInputError(f"temperature must be > 0 when sampling (got {temperature!r}); for greedy decoding "
                                "pass do_sample=False")
    if top_p is not None and not (isinstance(top_p, (int, float)) and 0 < top_p <= 1):
        raise InvalidInputError(f"top_p must be in (0, 1] (got {top_p!r})")


def looks_local(path) -> bool:
    """Whether ``path`` names a local folder rather than a hub id (``owner/name``).

    Why: a missing local folder handed to transformers is tried as a hub id, which offline takes half a
    minute to fail with a message about the network. A path is local when it is absolute, starts with
    ``.`` or ``~``, has no slash or more than one, or its first part is a folder here (``models/vlm``).

    Example:
        >>> looks_local("/data/vlm"), looks_local("Qwen/Qwen2-VL-2B-Instruct"), looks_local("vlm")
        (True, False, True)
    """
    s = os.fspath(path)
    if os.path.isabs(s) or s.startswith((".", "~")) or s.count("/") != 1 or "\\" in s:
        return True
    return os.path.isdir(s.split("/")[0])


def check_local_folder(path, what: str = "model folder") -> str:
    """``path`` with ``~`` expanded; raises :class:`~mmspec.InvalidInputError` at once if it looks local
    (:func:`looks_local`) and is not a folder. A hub id passes through.

    Example:
        >>> check_local_folder("/no/such/folder")
        Traceback (most recent call last):
        ...
        mmspec.errors.InvalidInputError: model folder not found: /no/such/folder
    """
    s = os.path.expanduser(os.fspath(path))
    if looks_local(s) and not os.path.isdir(s):
        if os.path.exists(s):
            raise InvalidInputError(f"{what} not found: {s} is a file, not a folder")
        raise InvalidInputError(f"{what} not found: {s}")
    return s


def check_device_map(device_map) -> None:
    """Refuse a ``device_map`` naming CUDA on a machine without a CUDA GPU (accelerate fails late on it).

    Example:
        >>> check_device_map("cpu")
    """
    if device_map is None:
        return
    values = device_map.values() if isinstance(device_map, dict) else [device_map]
    wants_cuda = any(isinstance(v, int) or (isinstance(v, str) and (v.startswith("cuda") or v.isdigit()))
                     for v in values)
    if wants_cuda:
        import torch

        if not torch.cuda.is_available():
            raise InvalidInputError(f"device_map={device_map!r} asks for CUDA, but there is no CUDA GPU here; use "
                                    "device_map='cpu' or leave it unset")
