"""Where the shipped reader lives and how a shipped folder becomes a loadable checkpoint.

Why a module of its own: the reader's workloads name the bundled model, and the package's ``__init__`` imports
the drafter, whose training helpers import the workloads; path lookups here import nothing of the package, so
the arrows stay one way.

Example:
    >>> os.path.basename(bundled_reader())
    'reader'
"""

from __future__ import annotations

import os

__all__ = ["bundled_reader", "is_reader_assets", "reader_checkpoint"]


def bundled_reader() -> str:
    """The shipped reader folder (``vision/assets/reader``); ``from_pretrained`` assembles it on first use.

    Example:
        >>> os.path.basename(bundled_reader())
        'reader'
    """
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "assets", "reader")


def is_reader_assets(path) -> bool:
    """Whether ``path`` is a shipped reader folder (a manifest, no LM weights of its own).

    Example:
        >>> is_reader_assets("/no/such/dir")
        False
    """
    from .model import READER_MANIFEST

    path = os.fspath(path)
    return (os.path.isfile(os.path.join(path, READER_MANIFEST))
            and not os.path.isfile(os.path.join(path, "model.safetensors")))


def reader_checkpoint(path, print_fn=None) -> str:
    """``path`` itself, or, for a shipped reader folder, the full checkpoint assembled from it (cached).

    Example:
        >>> reader_checkpoint("/some/hf/folder")
        '/some/hf/folder'
    """
    if not is_reader_assets(path):
        return os.fspath(path)
    from .model import assemble_reader

    return assemble_reader(os.fspath(path), print_fn=print_fn)
