"""How a driving step did: the reasoning sentence field by field and the trajectory's ADE, against the
constant-velocity baseline; used by evaluation (:func:`~mmspec.drivers.train_vla.evaluate_vla`) and the bench
(:mod:`mmspec.drivers.bench`) alike.

Example:
    >>> constant_velocity(10.0, 2).tolist()
    [[1.0, 0.0], [2.0, 0.0]]
"""

from __future__ import annotations

import numpy as np

from .world import DT

__all__ = ["constant_velocity", "score_step", "summarize_scores", "DISTANCE_TOLERANCE_M"]


def constant_velocity(speed: float, n: int = 64) -> np.ndarray:
    """The constant-velocity baseline: straight ahead at the current speed, ``[n, 2]``."""
    return np.stack([speed * DT * np.arange(1, n + 1), np.zeros(n)], 1)


DISTANCE_TOLERANCE_M = 2  # metres: what "right" allows on a hazard distance (exact match is reported too)


def score_step(result: dict, example) -> dict:
    """How one :meth:`DrivingPipeline.step` result did on a ``driving`` item: reasoning exact, hazard phrase
    and action right, distance error (or ``None``), ADE of the first sample and the best sample, and the
    constant-velocity ADE on the same item.

    Example:
        >>> from mmspec.workloads import get_workload
        >>> ex = get_workload("driving").text_example("test", 0)
        >>> fake = {"reasoning": ex.target, "trajectories": ex.meta["future"][None]}
        >>> s = score_step(fake, ex); s["exact"], s["hazard"], s["right"], s["ade_1"]
        (True, True, True, 0.0)
    """
    got, want = _parse(result["reasoning"]), _parse(example.target)
    err = np.linalg.norm(result["trajectories"] - example.meta["future"][None], axis=-1).mean(-1)
    cv = np.linalg.norm(constant_velocity(example.meta["speed"]) - example.meta["future"], axis=-1).mean()
    hazard = got[0] == want[0] and got[2] == want[2]
    d_err = abs(got[1] - want[1]) if got[1] is not None and want[1] is not None else None
    # Right within tolerance: phrase and action right, and the distance (where the reference names one)
    # within DISTANCE_TOLERANCE_M; whole-metre exactness is what reasoning_exact measures.
    right = hazard and (want[1] is None or (d_err is not None and d_err <= DISTANCE_TOLERANCE_M))
    return {"exact": result["reasoning"].strip() == example.target, "hazard": hazard, "right": right,
            "distance_error": d_err, "ade_1": float(err[0]), "ade_min": float(err.min()), "cv_ade": float(cv)}


def summarize_scores(scores: list, samples: int = 1) -> dict:
    """The evaluation figures over :func:`score_step` results (see :func:`evaluate_vla`)."""
    n = len(scores)
    dist = [s["distance_error"] for s in scores if s["distance_error"] is not None]
    out = {"n": n, "reasoning_exact": sum(s["exact"] for s in scores) / n,
           "reasoning_right": sum(s["right"] for s in scores) / n,
           "hazard_accuracy": sum(s["hazard"] for s in scores) / n,
           "distance_mae_m": float(np.mean(dist)) if dist else None,
           "min_ade_1": float(np.mean([s["ade_1"] for s in scores]))}
    if samples > 1:
        out[f"min_ade_{samples}"] = float(np.mean([s["ade_min"] for s in scores]))
    out["constant_velocity_ade"] = float(np.mean([s["cv_ade"] for s in scores]))
    return out


def _parse(sentence: str):
    """``(hazard phrase, distance or None, action)`` of a reasoning sentence."""
    import re

    s = sentence.strip().rstrip(".")
    head, _, action = s.partition("; ")
    m = re.match(r"(.*?) (\d+) m ahead$", head)
    if m:
        return m.group(1).lower(), int(m.group(2)), action
    return head.lower(), None, action
