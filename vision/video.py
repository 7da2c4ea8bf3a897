"""Video loading: a clip file read with decord into sampled frames and the metadata Qwen-VL processors want.

Why: a video answer is only as good as the frames the model sees, and processors fail late and obscurely on a
missing, corrupt or empty clip (often after the model has loaded). :func:`load_video` reads the file once with
decord, samples frames by rate (``fps``) or by count (``num_frames``) the way Qwen's own helpers do
(evenly spaced, both ends included), and returns a :class:`Video`: the frames as one ``uint8`` array
``[T, H, W, 3]`` and a ``transformers`` ``VideoMetadata`` carrying the source rate and the sampled frame
indices. The VLM pipeline hands both to the processor with ``do_sample_frames=False`` (mmspec has sampled
already), so Qwen2.5-VL's ``second_per_grid_ts`` (temporal patch size / sampled rate) comes out right.
Everything that can be wrong raises :class:`mmspec.InvalidInputError` before any model work.

Example:
    >>> video = load_video("clip.mp4", fps=2)                                    # doctest: +SKIP
    >>> video.frames.shape, video.metadata.frames_indices                         # doctest: +SKIP
    ((8, 240, 320, 3), [0, 7, 14, 21, 29, 36, 43, 50])
    >>> sample_indices(20, 10.0, fps=2.5)
    [0, 5, 10, 14, 19]
    >>> sample_indices(20, 10.0, num_frames=4)
    [0, 6, 13, 19]
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np

from mmspec.errors import InvalidInputError

from .images import local_file

__all__ = ["Video", "load_video", "sample_indices", "DEFAULT_FPS"]

DEFAULT_FPS = 2.0
"""Frames per second sampled when neither ``fps`` nor ``num_frames`` is given (Qwen2-VL's own default)."""


@dataclass
class Video:
    """Sampled frames of a clip and where they came from.

    Attributes:
        frames: ``uint8`` array ``[T, H, W, 3]`` (RGB), the sampled frames in time order.
        metadata: a ``transformers.video_utils.VideoMetadata`` (``total_num_frames``, source ``fps``,
            ``duration``, ``width``, ``height``, ``frames_indices`` of the sampled frames).
        path: the file read (``None`` for frames built in memory).
    """

    frames: np.ndarray
    metadata: object
    path: str | None = None

    @property
    def num_frames(self) -> int:
        """Number of sampled frames."""
        return int(self.frames.shape[0])


def sample_indices(total: int, video_fps: float, fps: float | None = None, num_frames: int | None = None,
                   frame_multiple: int = 1, max_frames: int | None = None) -> list[int]:
    """The frame indices to read from a clip of ``total`` frames at ``video_fps``: evenly spaced, first and last
    frame included (``numpy.linspace`` rounded, as Qwen's ``qwen_vl_utils`` samples).

    Why: the sampling rule is the one thing that decides which moments the model sees, so it is a pure function,
    tested apart from any decoder.

    Args:
        total: frames in the clip (> 0).
        video_fps: the clip's frame rate (used with ``fps``).
        fps: frames per second to sample: ``floor(duration * fps)`` frames, at least one, at most ``total``.
        num_frames: exactly this many frames (at most ``total``). Exclusive with ``fps``; neither: ``fps``
            :data:`DEFAULT_FPS`.
        frame_multiple: with ``fps``, round the count down to a multiple of this (a Qwen-VL temporal patch
            holds 2 frames; the processor would otherwise repeat the last frame to fill one), keeping at least
            ``min(frame_multiple, total)``.
        max_frames: with ``fps``, sample at most this many frames (long clips at a high rate).

    Raises:
        InvalidInputError: an empty clip, both or invalid ``fps`` / ``num_frames``, more frames asked than the
            clip holds.

    Example:
        >>> sample_indices(100, 25.0, fps=1.0)
        [0, 33, 66, 99]
        >>> sample_indices(100, 25.0, fps=0.75), sample_indices(100, 25.0, fps=0.75, frame_multiple=2)
        ([0, 50, 99], [0, 99])
        >>> sample_indices(3, 25.0, num_frames=4)
        Traceback (most recent call last):
        ...
        mmspec.errors.InvalidInputError: num_frames 4 asks for more frames than the clip holds (3)
    """
    if total <= 0:
        raise InvalidInputError("the video has no frames")
    if fps is not None and num_frames is not None:
        raise InvalidInputError("pass fps or num_frames, not both (fps samples by rate, num_frames by count)")
    if num_frames is not None:
        if isinstance(num_frames, bool) or not isinstance(num_frames, (int, np.integer)) or num_frames < 1:
            raise InvalidInputError(f"num_frames must be a positive integer (got {num_frames!r})")
        if num_frames > total:
            raise InvalidInputError(f"num_frames {num_frames} asks for more frames than the clip holds ({total})")
        n = int(num_frames)
    else:
        fps = DEFAULT_FPS if fps is None else fps
        if isinstance(fps, bool) or not isinstance(fps, (int, float)) or not math.isfinite(fps) or fps <= 0:
            raise InvalidInputError(f"fps must be a positive number (got {fps!r})")
        if not video_fps or video_fps <= 0 or not math.isfinite(video_fps):
            raise InvalidInputError("the video does not say its frame rate; sample it with num_frames=N instead")
        n = min(total, max(1, math.floor(total / video_fps * fps)))
        if max_frames is not None:
            n = max(1, min(n, int(max_frames)))
        if frame_multiple > 1 and n >= frame_multiple:
            n -= n % frame_multiple
        elif frame_multiple > 1:
            n = min(frame_multiple, total)
    return [int(i) for i in np.rint(np.linspace(0, total - 1, n))]


def load_video(x, fps: float | None = None, num_frames: int | None = None, frame_multiple: int = 1,
               max_frames: int | None = None) -> Video:
    """Read a clip file with decord and sample its frames; a :class:`Video` is returned as it is.

    Why: the VLM pipeline's one entry for videos (``pipe(video="clip.mp4", fps=2)``); a missing, empty or
    corrupt file, or a clip with no frames, raises :class:`mmspec.InvalidInputError` naming the file before any
    model work.

    Args:
        x: a path (``str`` / ``os.PathLike``, ``~`` expanded) to a file decord reads (mp4, avi, mkv, webm, ...),
            or a :class:`Video` (passed through: it was sampled already).
        fps, num_frames, frame_multiple, max_frames: the sampling (:func:`sample_indices`).

    Raises:
        InvalidInputError: no such file, a folder, an empty or unreadable file, no frames, bad sampling.

    Example:
        >>> load_video("/no/such/clip.mp4")
        Traceback (most recent call last):
        ...
        mmspec.errors.InvalidInputError: video file not found: /no/such/clip.mp4
    """
    if isinstance(x, Video):
        return x
    if not isinstance(x, (str, os.PathLike)):
        raise InvalidInputError(f"cannot use a {type(x).__name__} as a video; pass the path of a video file")
    path = local_file(x, "video", InvalidInputError)
    if path.stat().st_size == 0:
        raise InvalidInputError(f"video file is empty (0 bytes): {path}")
    try:
        import decord
    except ImportError as e:  # an optional dependency: the vision extra
        raise InvalidInputError("reading videos needs decord: pip install 'mmspec[vision]'") from e
    try:
        reader = decord.VideoReader(str(path), ctx=decord.cpu(0))
        total = len(reader)
        video_fps = float(reader.get_avg_fps()) if total else 0.0
    except (RuntimeError, decord.DECORDError) as e:  # decord says "ERROR opening ...": its last line is enough
        if "cannot find video stream" in str(e):
            raise InvalidInputError(f"video file {path} has no frames (no video stream)") from e
        raise InvalidInputError(f"video file {path} is unreadable (corrupt, or not a video): "
                                f"{str(e).strip().splitlines()[-1][:200]}") from e
    if total == 0:
        raise InvalidInputError(f"video file {path} has no frames")
    indices = sample_indices(total, video_fps, fps=fps, num_frames=num_frames, frame_multiple=frame_multiple,
                             max_frames=max_frames)
    try:
        frames = reader.get_batch(indices).asnumpy()
    except (RuntimeError, decord.DECORDError) as e:
        raise InvalidInputError(f"video file {path}: cannot decode frames {indices[:8]}...: "
                                f"{str(e).strip().splitlines()[-1][:200]}") from e
    if frames.ndim != 4 or frames.shape[0] == 0 or frames.shape[1] == 0 or frames.shape[2] == 0:
        raise InvalidInputError(f"video file {path} decoded to no usable frames (shape {tuple(frames.shape)})")
    from transformers.video_utils import VideoMetadata

    height, width = int(frames.shape[1]), int(frames.shape[2])
    meta = VideoMetadata(total_num_frames=total, fps=video_fps, width=width, height=height,
                         duration=total / video_fps if video_fps else None, video_backend="decord",
                         frames_indices=indices)
    return Video(frames=np.ascontiguousarray(frames[..., :3]), metadata=meta, path=str(path))
