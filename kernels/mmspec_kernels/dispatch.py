"""Which implementation a kernel call runs: ``"triton"`` or ``"reference"`` (plain torch).

Chosen once per device type, on first use: Triton on CUDA devices when Triton is installed, the reference
everywhere else. The environment variable ``MMSPEC_KERNELS`` forces either (``triton``, ``reference``;
``auto``, the default, chooses as above). Forcing ``triton`` for CPU tensors runs the kernels in Triton's
interpreter, which is slow and meant for tests: it needs ``TRITON_INTERPRET=1`` as well, so a forgotten
variable cannot make a CPU run crawl. :func:`using` overrides the choice inside a ``with`` block (tests,
the bench).

A kernel may still run its reference for inputs its Triton version does not cover (say a head dim of 32);
:func:`supports` is where each kernel says so, and the bench reports it.

Example:
    >>> import torch
    >>> with using("reference"):
    ...     backend(torch.device("cpu"))
    'reference'
"""

from __future__ import annotations

import contextlib
import importlib.util
import os

__all__ = ["backend", "using", "triton_available", "interpreting", "ENV"]

ENV = "MMSPEC_KERNELS"
_CHOICES = ("auto", "triton", "reference")
_chosen: dict = {}  # device type -> backend, filled once
_override: list = []  # stack of forced backends (innermost last)


def triton_available() -> bool:
    """Whether Triton is importable (the ``kernels`` extra: ``pip install 'mmspec[kernels]'``)."""
    return importlib.util.find_spec("triton") is not None


def interpreting() -> bool:
    """Whether ``TRITON_INTERPRET=1`` asks for Triton's CPU interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _choose(device_type: str, forced: str) -> str:
    if forced not in _CHOICES:
        raise ValueError(f"{ENV}={forced!r}: expected one of {', '.join(_CHOICES)}")
    if forced == "reference":
        return "reference"
    if forced == "triton":
        if not triton_available():
            raise ValueError(f"{ENV}=triton but Triton is not installed: pip install 'mmspec[kernels]'")
        if device_type != "cuda" and not interpreting():
            raise ValueError(f"{ENV}=triton on {device_type} tensors needs TRITON_INTERPRET=1 (Triton's interpreter)")
        return "triton"
    return "triton" if device_type == "cuda" and triton_available() else "reference"


def backend(device) -> str:
    """The backend kernel calls on ``device`` (a ``torch.device`` or a string) use.

    Example:
        >>> with using("reference"):
        ...     backend("cpu")
        'reference'
    """
    device_type = device if isinstance(device, str) else device.type
    device_type = device_type.split(":")[0]
    if _override:
        return _choose(device_type, _override[-1])
    if device_type not in _chosen:
        _chosen[device_type] = _choose(device_type, os.environ.get(ENV, "auto").strip().lower() or "auto")
    return _chosen[device_type]


@contextlib.contextmanager
def using(name: str):
    """Force ``name`` (``"triton"``, ``"reference"`` or ``"auto"``) for every kernel call inside the block.

    Example:
        >>> with using("reference"):
        ...     backend("cuda")
        'reference'
    """
    _choose("cpu" if name != "triton" else "cuda", name)  # validate the name now, not at the first call
    _override.append(name)
    try:
        yield
    finally:
        _override.pop()
