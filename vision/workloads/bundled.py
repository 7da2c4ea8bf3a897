"""Where the testbed's trained models ship: the 12M target VLM and its EAGLE head under ``vision/assets``.

Path lookups only (no model code): the ``testbed-docs`` and ``testbed-charts`` workloads name their bundled model
and drafter from here, and :mod:`mmspec.vision.testbed_train` (which trains and exports them) writes to the same
folders.

Example:
    >>> bundled_target() is None or os.path.isfile(os.path.join(bundled_target(), "config.json"))
    True
"""

from __future__ import annotations

import os

__all__ = ["BUNDLED", "TARGET_DIR", "EAGLE_DIR", "bundled_target", "bundled_eagle"]

BUNDLED = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "assets")
TARGET_DIR = os.path.join(BUNDLED, "testbed-vlm")
EAGLE_DIR = os.path.join(BUNDLED, "testbed-vlm-eagle")


def bundled_target() -> str | None:
    """The bundled trained testbed target's folder (``None`` if this install has none).

    Example:
        >>> bundled_target() is None or os.path.isfile(os.path.join(bundled_target(), "config.json"))
        True
    """
    return TARGET_DIR if os.path.isfile(os.path.join(TARGET_DIR, "model.safetensors")) else None


def bundled_eagle() -> str | None:
    """The bundled EAGLE head trained for :func:`bundled_target` (``None`` if this install has none)."""
    return EAGLE_DIR if os.path.isfile(os.path.join(EAGLE_DIR, "model.safetensors")) else None
