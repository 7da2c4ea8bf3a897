"""Where the driving models ship: the bundled VLA's folder and the few-step student inside a VLA folder.

Path lookups only (no model code, no torch): the ``driving`` workload names its bundled model from here, and the
loaders (:mod:`mmspec.drivers.vla`), trainers and benches find the same files by the same names.

Example:
    >>> bundled_vla() is None or os.path.isfile(os.path.join(bundled_vla(), EXPERT_CONFIG))
    True
    >>> bundled_student("/nonexistent") is None
    True
"""

from __future__ import annotations

import os

__all__ = ["VLA_DIR", "EXPERT_NAME", "EXPERT_CONFIG", "STUDENT_DIR", "STUDENT_INFO", "bundled_vla", "bundled_student"]

EXPERT_NAME, EXPERT_CONFIG = "action_expert.safetensors", "action_expert.json"
STUDENT_INFO = "distill.json"
STUDENT_DIR = "fewstep"  # a VLA folder's own student (``train_vla export --student``): FlashDrive's default expert
VLA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "assets", "driving-vla")


def bundled_vla() -> str | None:
    """The bundled trained driving VLA's folder (``None`` if this install has none); what ``mmspec bench
    --workload driving`` runs when no model is named.

    Example:
        >>> bundled_vla() is None or os.path.isfile(os.path.join(bundled_vla(), "action_expert.json"))
        True
    """
    return VLA_DIR if os.path.isfile(os.path.join(VLA_DIR, EXPERT_NAME)) else None


def bundled_student(vla_path: str | None) -> str | None:
    """The few-step student shipped inside the VLA folder ``vla_path`` (``vla_path/fewstep``, written by
    ``python -m mmspec.drivers.train_vla export --student DIR``), or ``None`` when it ships none.

    Example:
        >>> bundled_student("/nonexistent") is None
        True
    """
    if not vla_path:
        return None
    path = os.path.join(vla_path, STUDENT_DIR)
    return path if os.path.isfile(os.path.join(path, STUDENT_INFO)) else None
