"""The ``driving`` workload: one tick of a simulated clip as a VLA request.

Each item simulates scenario ``index`` of ``split`` with the expert driver and cuts a sample at a tick
between 2 s and 4 s into the clip: the last four front-camera frames (oldest first) as images, the ego
speed and the 1.6 s ego history in the prompt, the rule-derived chain-of-causation sentence as the target,
and the ground-truth 6.4 s future (64 waypoints) with the hazard fields in ``meta`` (so reasoning is
checkable field by field and trajectories are scored by ADE).

Example:
    >>> from mmspec.workloads import get_workload
    >>> ex = get_workload("driving").example("test", 0)
    >>> len(ex.images), ex.meta["future"].shape
    (4, (64, 2))
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from mmspec.errors import InvalidInputError
from mmspec.workloads import Example, SeededWorkload

from .bundled import EXPERT_CONFIG, bundled_vla
from .clips import FUTURE_TICKS, sample_at
from .world import (CAMERAS, DT, SCENARIO_KINDS, any_incident, perturbed_expert, render_frame, road_ahead,
                    safety_events, scenario_for, simulate)

__all__ = ["DrivingWorkload", "history_text", "driving_prompt", "load_rollouts", "check_rollouts"]

ROLLOUT_KEYS = ("split", "index", "kind", "handover", "controls")


def history_text(history: np.ndarray, speed: float) -> str:
    """The ego state as the prompt states it: speed now and four past positions (every 0.4 s).

    Example:
        >>> history_text(np.array([[-1.6 * k, 0.0, 0.0] for k in range(16, 0, -1)]), 10.0)
        'Ego speed 10.0 m/s. Past positions (x forward, y left, m): (-25.6, 0.0) (-19.2, 0.0) (-12.8, 0.0) (-6.4, 0.0).'
    """
    pts = " ".join(f"({x:.1f}, {y:.1f})" for x, y in history[::4, :2])
    return f"Ego speed {speed:.1f} m/s. Past positions (x forward, y left, m): {pts}."


def driving_prompt(cameras, frames_per_camera: int, history: np.ndarray, speed: float) -> str:
    """The request text of one tick (what :class:`DrivingWorkload` items and the pipeline send)."""
    return (f"Cameras: {', '.join(cameras)}; {frames_per_camera} frames each, oldest first, 0.1 s apart. "
            f"{history_text(history, speed)} What matters now, and what should the ego car do?")


class DrivingWorkload(SeededWorkload):
    """Driving VLA requests from the seeded road world (see :mod:`mmspec.drivers.world`).

    Args:
        cameras: cameras whose last four frames form the images (``"front"``, ``"left"``, ``"right"``).
        size: frame size in pixels (multiples of 28 suit Qwen2-VL's merged 14-px patches).
        kinds: scenario kinds drawn from (uniformly); default all of :data:`SCENARIO_KINDS`.
        labels: also return each frame's class-id image (``meta["labels"]``, see ``render_frame(labels=True)``)
            for dense supervision of a vision tower, and where the road runs ahead (``meta["road_ahead"]``,
            see :func:`~mmspec.drivers.world.road_ahead`).
        perturb: share of items whose last 1-2.5 s before the sample tick were driven by the expert with a
            constant acceleration and curvature offset (:func:`~mmspec.drivers.world.perturbed_expert`): the
            history shows the ego drifting off the lane centre, too fast or too slow, the future the expert's
            recovery (training data against closed-loop drift). Items whose recovery would still end in a collision,
            off the road or through a red light keep the expert's own lead-in. Drawn only when > 0, so the
            default items are unchanged.
        rollouts: DAgger data: the model's own closed-loop drives (rows of :func:`~mmspec.drivers.train_vla.
            collect_rollouts`, or the path of their JSONL file, read by :func:`load_rollouts`). A share
            ``rollout_fraction`` of the items of a split replays one of that split's drives up to a tick drawn
            inside it and cuts the sample there: the frames and history are the states the model drove itself
            into, the future is the expert's recovery from them. A drive is replayed in the scenario it was
            driven in (split, index, kind and world seed of the row); a tick whose recovery still crashes,
            leaves the road or runs a red light is moved halfway back towards the hand-over (at most twice),
            and if that fails too the item is an ordinary one (the expert drives its own scenario).
        rollout_fraction: share of items drawn from ``rollouts`` (when given).
        seed: mixed into every item's seed.
    """

    name = "driving"
    model_task = "driving"
    model_marker = EXPERT_CONFIG
    # mmspec bench measures this world through its own pipeline: the hooks (plain_pipeline, bench_plain, ...) are
    # DrivingBenchWorkload's (drivers/bench.py), the class registered as "driving"; a workload imports no bench.

    def bundled_model(self):
        return bundled_vla()

    def __init__(self, cameras=("front",), size=(224, 112), kinds=None, labels: bool = False, perturb: float = 0.0,
                 rollouts=None, rollout_fraction: float = 0.5, seed: int = 0):
        bad = [c for c in cameras if c not in CAMERAS]
        if bad or not cameras:
            raise InvalidInputError(f"unknown cameras {bad}; use some of {sorted(CAMERAS)}")
        self.cameras, self.size, self.seed, self.labels = tuple(cameras), tuple(size), seed, labels
        self.kinds = tuple(kinds or SCENARIO_KINDS)
        if not 0.0 <= perturb <= 1.0:
            raise InvalidInputError(f"perturb must be in [0, 1], got {perturb}")
        self.perturb = float(perturb)
        rows = load_rollouts(rollouts) if isinstance(rollouts, str) else check_rollouts(list(rollouts or []))
        self.rollouts = {}
        for row in rows:
            self.rollouts.setdefault(row["split"], []).append(row)
        if not 0.0 <= rollout_fraction <= 1.0:
            raise InvalidInputError(f"rollout_fraction must be in [0, 1], got {rollout_fraction}")
        self.rollout_fraction = float(rollout_fraction)

    def generate(self, rng, nrng, split, index, draw=True):
        kind = self.kinds[rng.randrange(len(self.kinds))]
        tick = 20 + rng.randrange(21)  # 2-4 s in: most scripted events are under way
        scn = scenario_for(split, index, self.seed, kind)
        seconds = (tick + FUTURE_TICKS + 1) * DT
        sim, replayed = None, False
        rows = self.rollouts.get(split)
        if rows and rng.random() < self.rollout_fraction:
            row = rows[rng.randrange(len(rows))]
            handover, controls = int(row["handover"]), row["controls"]
            replay_scn = scenario_for(row["split"], row["index"], row.get("seed", self.seed), row["kind"])
            replay_tick = handover + 1 + rng.randrange(max(1, len(controls) - 1))
            for _ in range(3):
                sim = simulate(replay_scn, (replay_tick + FUTURE_TICKS + 1) * DT,
                               _replay(handover, replay_tick, controls))
                if not any_incident(safety_events(sim)) and sim.ticks > replay_tick + FUTURE_TICKS:
                    break
                sim, replay_tick = None, handover + (replay_tick - handover) // 2
                if replay_tick <= handover:
                    break
            if sim is not None:
                scn, tick, replayed = replay_scn, replay_tick, True
                seconds = (tick + FUTURE_TICKS + 1) * DT
        if sim is None and self.perturb and rng.random() < self.perturb:
            lead_in = rng.randint(10, 25)
            policy = perturbed_expert(tick - lead_in, tick, rng.uniform(-1.5, 1.5),
                                      rng.choice((-1, 1)) * rng.uniform(0.005, 0.02))
            sim = simulate(scn, seconds, policy)
            if any_incident(safety_events(sim)) or sim.ticks <= tick + FUTURE_TICKS:
                sim = None  # an unrecoverable perturbation would teach the crash
        perturbed = sim is not None and not replayed
        sim = sim or simulate(scn, seconds)
        sample = sample_at(sim, tick, cameras=self.cameras if draw else (), size=self.size)
        images = [Image.fromarray(f) for cam in self.cameras for f in sample["frames"].get(cam, [])]
        prompt = driving_prompt(self.cameras, 4, sample["history"], sample["speed"])
        h = sample["hazard"]
        if self.labels and draw:
            ticks = range(tick - len(images) // len(self.cameras) + 1, tick + 1)
            label_maps = [np.asarray(render_frame(sim, k, cam, self.size, labels=True)) for cam in self.cameras
                          for k in ticks]
        meta = {"kind": scn.kind, "tick": tick, "perturbed": perturbed, "replayed": replayed,
                "history": sample["history"], "speed": sample["speed"], "future": sample["future"],
                "actions": sample["actions"],
                "hazard_kind": h.kind, "hazard_distance": h.distance, "hazard_action": h.action}
        if self.labels and draw:
            meta["labels"] = label_maps
            meta["road_ahead"] = road_ahead(sim, tick)
        return Example(id="", prompt=prompt, target=sample["reasoning"], images=images, meta=meta)


def _replay(start: int, stop: int, controls):
    """A ``simulate`` policy: the recorded ``controls`` (from tick ``start``) on ticks ``start <= k < stop``, the
    expert elsewhere."""
    def policy(sim, k):
        return tuple(controls[k - start]) if start <= k < stop else None

    return policy


def check_rollouts(rows: list) -> list:
    """Validate DAgger rows (see :func:`~mmspec.drivers.train_vla.collect_rollouts`) and sort them by split, world
    seed and index, so the items drawn from them do not depend on the order the drives were recorded in.

    Example:
        >>> row = {"split": "train", "kind": "cruise", "handover": 20, "controls": [[0, 0]]}
        >>> check_rollouts([{**row, "index": 3}, {**row, "index": 1}])[0]["index"]
        1
    """
    bad = [i for i, r in enumerate(rows) if not set(ROLLOUT_KEYS) <= set(r) or not r["controls"]]
    if bad:
        raise InvalidInputError(f"rollout rows {bad[:5]} lack one of {list(ROLLOUT_KEYS)} or have no controls")
    return sorted(rows, key=lambda r: (r["split"], r.get("seed", 0), r["index"]))


def load_rollouts(path: str) -> list:
    """The rows of a rollouts JSONL file, checked and sorted (:func:`check_rollouts`). A last line cut short by
    a killed writer is dropped; any other unreadable line is an error.

    Example:
        >>> load_rollouts("rollouts.jsonl")                                    # doctest: +SKIP
    """
    import json
    import os

    if not os.path.isfile(path):
        raise InvalidInputError(f"no rollouts file at {path!r} (write one with `python -m "
                                "mmspec.drivers.train_vla rollouts --model M --out FILE`)")
    with open(path) as f:
        lines = [line for line in f if line.strip()]
    rows = []
    for i, line in enumerate(lines):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines) - 1 and not line.endswith("\n"):
                break  # the row being written when the job died
            raise InvalidInputError(f"{path}: line {i + 1} is not JSON") from None
    return check_rollouts(rows)
