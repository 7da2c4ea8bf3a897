"""Driving clips on disk, like real logs: camera videos (PyAV writes, decord reads) beside the ego motion.

A clip folder holds, per clip id, ``<id>.<camera>.mp4`` (10 Hz, H.264) for each camera and ``<id>.npz``
with ``ego[T, 4]`` (x, y, yaw, speed in the world frame), ``ego_s[T]`` (arc length along the road),
``hazard_kind[T]`` / ``hazard_distance[T]`` (the rule-derived ground truth per tick; distance -1 when
none) and ``meta`` (a JSON string: scenario kind, seed, cameras, frame size). :func:`sample_at` cuts one
training/evaluation sample out of a clip at a tick: the last frames of every camera, the ego history and
the ground-truth future (6.4 s, 64 waypoints, in the ego frame at that tick), and the reasoning sentence.

Example:
    >>> path = write_clip("/tmp/clips", "test", 0, seconds=2.0)                    # doctest: +SKIP
    >>> clip = load_clip(path)                                                     # doctest: +SKIP
    >>> clip.frames["front"].shape                                                 # doctest: +SKIP
    (21, 112, 224, 3)
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy as np

from .world import (DT, Hazard, SimResult, hazard_at, reasoning_text, render_frame, scenario_for, simulate,
                    to_ego_frame)

__all__ = ["Clip", "write_clip", "load_clip", "sample_at", "ego_history", "write_video", "read_video", "HISTORY_TICKS",
           "FUTURE_TICKS", "FRAMES_PER_CAMERA"]

HISTORY_TICKS = 16  # 1.6 s of ego history (Alpamayo: 16 history trajectory tokens)
FUTURE_TICKS = 64  # 6.4 s at 10 Hz, the 64-waypoint future
FRAMES_PER_CAMERA = 4  # the last 0.4 s of every camera


def write_video(path: str, frames, fps: int = 10, crf: int = 18) -> None:
    """Encode RGB ``frames`` (PIL images or ``uint8[H, W, 3]``) as an H.264 mp4 (written atomically)."""
    import av

    tmp = path + ".tmp.mp4"
    with av.open(tmp, "w") as out:
        first = np.asarray(frames[0])
        stream = out.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = first.shape[1], first.shape[0], "yuv420p"
        stream.options = {"crf": str(crf)}
        for fr in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(np.asarray(fr, dtype=np.uint8), format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    os.replace(tmp, path)


def read_video(path: str, indices=None) -> np.ndarray:
    """Decode frames with decord: ``uint8[T, H, W, 3]`` (all, or the given ``indices``)."""
    from decord import VideoReader, cpu

    vr = VideoReader(path, ctx=cpu(0))
    idx = list(range(len(vr))) if indices is None else list(indices)
    return vr.get_batch(idx).asnumpy()


@dataclass
class Clip:
    """A clip read back from disk: ``frames[camera] = uint8[T, H, W, 3]``, ``ego[T, 4]``, ``ego_s[T]``,
    ``controls[T - 1, 2]`` (accel, curvature), per-tick hazards and the metadata."""

    clip_id: str
    frames: dict
    ego: np.ndarray
    ego_s: np.ndarray
    controls: np.ndarray
    hazards: list
    meta: dict

    @property
    def ticks(self) -> int:
        return int(self.ego.shape[0])


def write_clip(out_dir: str, split: str, index: int, seconds: float = 8.0, cameras=("front",), size=(224, 112),
               seed: int = 0, kind: str | None = None) -> str:
    """Simulate scenario ``index`` of ``split`` for ``seconds`` with the expert, render every tick for each
    camera, and write the videos and the ego log; returns the path prefix ``out_dir/<id>``.

    A clip already on disk (its ``.npz`` is written last) is left as it is, so a killed job resumes; unless it was
    written with another seed, kind, cameras or size, or is shorter than ``seconds`` (a shorter run's clip): then it is
    written again.
    """
    os.makedirs(out_dir, exist_ok=True)
    clip_id = f"{split}-{index:06d}"
    prefix = os.path.join(out_dir, clip_id)
    scn = scenario_for(split, index, seed, kind)
    if os.path.isfile(prefix + ".npz"):
        with np.load(prefix + ".npz") as z:
            old, ticks = json.loads(str(z["meta"])), int(z["ego"].shape[0])
        same = (old.get("seed"), old.get("kind"), old.get("cameras"), old.get("size")) == (
            seed, scn.kind, list(cameras), list(size))
        if same and ticks >= int(round(seconds / DT)) + 1:
            return prefix
    sim = simulate(scn, seconds)
    for cam in cameras:
        write_video(f"{prefix}.{cam}.mp4", [render_frame(sim, k, cam, size) for k in range(sim.ticks)])
    hz = [hazard_at(sim, k) for k in range(sim.ticks)]
    meta = {"clip_id": clip_id, "split": split, "index": index, "seed": seed, "kind": scn.kind,
            "cameras": list(cameras), "size": list(size), "dt": DT}
    tmp = prefix + ".tmp.npz"
    np.savez(tmp, ego=np.stack(sim.ego), ego_s=np.asarray(sim.ego_s), meta=json.dumps(meta),
             controls=np.asarray(sim.controls, dtype=np.float64).reshape(-1, 2),
             hazard_kind=np.array([h.kind for h in hz]), hazard_action=np.array([h.action for h in hz]),
             hazard_distance=np.array([-1 if h.distance is None else h.distance for h in hz]))
    os.replace(tmp, prefix + ".npz")
    return prefix


def load_clip(prefix: str) -> Clip:
    """Read a clip written by :func:`write_clip` (videos through decord)."""
    with np.load(prefix + ".npz") as z:
        meta = json.loads(str(z["meta"]))
        hazards = [Hazard(str(k), None if d < 0 else int(d), str(a))
                   for k, d, a in zip(z["hazard_kind"], z["hazard_distance"], z["hazard_action"])]
        ego, ego_s, controls = z["ego"], z["ego_s"], z["controls"]
    frames = {cam: read_video(f"{prefix}.{cam}.mp4") for cam in meta["cameras"]}
    return Clip(meta["clip_id"], frames, ego, ego_s, controls, hazards, meta)


def ego_history(ego, tick: int) -> np.ndarray:
    """``[HISTORY_TICKS, 3]``: the ego's past x, y and yaw in its own frame at ``tick`` (oldest first, ending one
    tick before); ``ego`` is the world-frame ``(x, y, yaw, speed)`` per tick. What samples and a driving model in
    closed loop both see, from one function.

    Example:
        >>> ego = np.array([[k * 1.0, 0.0, 0.0, 10.0] for k in range(20)])
        >>> ego_history(ego, 17)[-1].tolist()
        [-1.0, 0.0, 0.0]
    """
    ego = np.asarray(ego)
    pose, hist = ego[tick], ego[tick - HISTORY_TICKS: tick]
    return np.c_[to_ego_frame(hist[:, :2], pose), (hist[:, 2] - pose[2] + np.pi) % (2 * np.pi) - np.pi]


def sample_at(source, tick: int, cameras=("front",), size=(224, 112)) -> dict:
    """One sample at ``tick`` from a :class:`Clip` (decoded frames) or a :class:`SimResult` (rendered now).

    Returns ``frames`` (per camera, the last :data:`FRAMES_PER_CAMERA` ticks, oldest first, as
    ``uint8[H, W, 3]``), ``history[16, 3]`` (past x, y, yaw in the ego frame at ``tick``, oldest first,
    ending one tick before), ``speed`` (m/s now), ``future[64, 2]`` (x, y of the next 6.4 s in the same
    frame), ``actions[64, 2]`` (the expert's accel and curvature that drove it: the unicycle action space a
    trajectory head predicts), ``hazard`` and ``reasoning`` (the sentence).
    """
    ego = np.stack(source.ego) if isinstance(source, SimResult) else source.ego
    controls = np.asarray(source.controls, dtype=np.float64).reshape(-1, 2)
    if tick < max(HISTORY_TICKS, FRAMES_PER_CAMERA - 1) or tick + FUTURE_TICKS >= len(ego):
        raise ValueError(f"tick {tick} needs {HISTORY_TICKS} ticks of history and {FUTURE_TICKS} of future "
                         f"in a clip of {len(ego)} ticks")
    pose = ego[tick]
    history = ego_history(ego, tick)
    future = to_ego_frame(ego[tick + 1: tick + 1 + FUTURE_TICKS, :2], pose)
    ticks = range(tick - FRAMES_PER_CAMERA + 1, tick + 1)
    if isinstance(source, SimResult):
        frames = {cam: [np.asarray(render_frame(source, k, cam, size)) for k in ticks] for cam in cameras}
        hazard = hazard_at(source, tick)
    else:
        frames = {cam: [source.frames[cam][k] for k in ticks] for cam in cameras}
        hazard = source.hazards[tick]
    return {"frames": frames, "history": history.astype(np.float32), "speed": float(pose[3]),
            "future": future.astype(np.float32), "actions": controls[tick: tick + FUTURE_TICKS].astype(np.float32),
            "hazard": hazard, "reasoning": reasoning_text(hazard)}
