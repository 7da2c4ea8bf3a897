"""FlashDrive for the driving VLA: streaming reuse across ticks, step caching of the flow head, system level.

One tick of :class:`~mmspec.drivers.pipeline.DrivingPipeline` with ``flashdrive=`` runs through
:class:`FlashDriveEngine` instead of ``generate``. What each mechanism does, and whether it is exact:

* **vision cache** (``vision_cache``, exact): each frame's vision-tower output is kept under a hash of its
  pixels, so a tick encodes only the frame(s) that entered the window (the tower attends within one image).
* **streaming KV reuse** (``stream``, approximate): consecutive 10 Hz windows share 3 of 4 frames per camera.
  The language model's keys and values of the frames that stay are moved to their new slots; their keys are
  re-rotated to the new M-RoPE positions (``rerotate=True``, per token and per axis, with the model's own
  rotary embedding: exact for the rotation) or left at their old rotation (``rerotate=False``, FlashDrive's
  shift). Only the new frame(s), the ego history and the text are prefilled. Not exact even re-rotated:
  a kept frame's states above layer 0 were computed while it attended to the frame that has left the window
  (a fresh prefill's would not); a model trained with the streaming mask (as the authors fine-tune) closes
  that gap. A 1-layer model has only context-free layer-0 states, so there re-rotated streaming is exact
  (the tests use that).
* **step cache** (``step_cache``, approximate): :class:`~mmspec.drivers.vla.StepCache` reuses the last
  velocity of the flow-matching head on some Euler steps (adaptive threshold or fixed schedule).
* **few-step expert** (``fewstep``, approximate): the flow head integrates with a student of the action
  expert distilled into a few Euler steps (:mod:`mmspec.drivers.distill`; the bundled VLA ships a 1-step one) instead
  of the VLA's own 10-step expert: fewer head calls than the step cache at less drift from the 10-step trajectory
  (``results/drivers/drive-sim``).
  A VLA folder may ship its student (``fewstep/``); FlashDrive then uses it by default (``expert="auto"``) in
  place of the step cache; ``expert=None`` keeps the VLA's own expert, ``expert=DIR`` takes another student.
* **speculative reasoning** (``spec``, exact): a block drafter (a GLANCE head, ``mmspec train --kind glance
  --workload driving`` on the VLA's own greedy reasoning) drafts the reasoning a block at a time from the
  language model's states over the whole prompt (frames included); the core verifies it
  (:class:`~mmspec.target.TargetAdapter` scores a block in one pass from the tick's cache, the core's greedy rule
  accepts, the adapter commits), so the reasoning is token for token the VLA's own greedy reasoning. The VLA decodes
  greedily (Alpamayo samples; this one does not), and it has no trajectory tokens in its vocabulary (the action
  expert reads the cache), so there is no range to mask. With streaming, the kept frames' states the drafter reads
  are carried between ticks like their KV.
* **system** (``system``, exact): the prompt's M-RoPE positions are built once per prompt layout (not by
  ``get_rope_index`` every tick), the expert's mask and positions once per tick and the flow-time embeddings
  once per step (not per head call). The engine itself, with any mechanism, runs its own reasoning loop (the
  language model and the last position's head, no ``generate`` machinery per token); ``mmspec drive-sim``'s
  ``engine`` system (every mechanism off) measures that loop alone. Measured and left out: ``torch.compile`` of
  the expert (200 s to compile on this CPU for ~15% per call) and a preallocated KV buffer (the cache's
  concatenations are ~8% of a decode step's operator time here).
* **lean expert** (``lean_expert``, exact): the action expert's head calls run through
  :class:`~mmspec.drivers.vla.LeanExpert`: the layers' own weights through the decoder's ops, with the context's
  K/V buffers (room for the action tokens; SDPA over the key/value heads), mask and M-RoPE rotation set up once per
  tick instead of per call, and without the transformers call stack per call (``results/drivers/drive-sim``: the
  profile and the measured ratio). Bit for bit the decoder's output; where it cannot run a decoder (not sdpa,
  sliding windows, another activation) the expert's own path runs and :meth:`FlashDriveEngine.describe` says so.
* **lean language model** (``lean_lm``, exact): the language model's passes of a tick (the prefill, streamed or
  full, the reasoning decode's steps and the speculative verify passes) run through :class:`mmspec.lean.LeanForward`:
  the layers' own weights through the same ops without the transformers call stack (bit for bit the model's
  numbers, tested), which on this 4-layer model is as much time as the arithmetic.
* **lean vision tower** (``lean_vision``, exact): the frames that miss the vision cache are encoded through
  :class:`mmspec.lean_vision.LeanVision`: the tower's own weights through the same ops without the transformers call
  stack, the rotary angles and attention lengths built once per frame grid instead of every tick (bit for bit
  ``get_image_features``, tested). Where it cannot run the tower (not sdpa, another tower class) the model's own
  ``get_image_features`` runs and :meth:`FlashDriveEngine.describe` says so.
* **patch matmul** (``patch_matmul``, approximate; off by default, implies ``lean_vision``): the lean tower's Conv3d
  patch embedding as one matmul over the flattened patches: the same sum in another order, so the features differ
  from the conv's in the last bits.

Streaming state lives between ticks of one clip. ``tick`` makes breaks detectable: the next tick of a stream
must be the last one plus one, from the same cameras, with a window whose first frames are the last window's
later frames (checked by pixel hash). Anything else (a gap, an out-of-order or repeated tick, a frame that does
not continue the window, changed cameras, a changed prompt layout) is a reset to a full prefill
(``on_break="reset"``, reported in the result's ``stream`` field) or a :class:`StreamBreakError`
(``on_break="error"``); never a silent reuse.

Example:
    >>> FlashDriveConfig.parse("stream,step_cache").names()
    ['vision_cache', 'stream', 'step_cache']
    >>> FlashDriveConfig.parse(True).exact, FlashDriveConfig.parse("vision_cache,system").exact
    (False, True)
"""

from __future__ import annotations

import hashlib
import os
from collections import OrderedDict
from dataclasses import dataclass, fields

import numpy as np
import torch

from mmspec.drafters.base import DraftContext, Drafter
from mmspec.errors import InvalidInputError, MMSpecError
from mmspec.lean import LeanForward, why_not as lean_why_not
from mmspec.lean_vision import LeanVision, why_not as lean_vision_why_not
from mmspec.tree import DraftTree

from .stages import StageClock
from .vla import LeanExpert, StepCache, attention_mask_for

__all__ = ["FlashDriveConfig", "FlashDriveEngine", "StreamBreakError", "rerotate_keys", "MECHANISMS", "DRAFTER_DIR",
           "bundled_drafter", "ReasoningReuseDrafter"]

MECHANISMS = ("vision_cache", "stream", "step_cache", "fewstep", "system", "spec", "lean_expert", "lean_lm",
              "lean_vision", "patch_matmul")
"""The mechanism names :meth:`FlashDriveConfig.parse` accepts (``stream`` implies ``vision_cache``, ``patch_matmul``
``lean_vision``)."""

DRAFTER_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "assets", "driving-drafter")
"""The bundled reasoning drafter (a GLANCE block head trained with ``mmspec train`` on the bundled VLA's own greedy
reasoning over the driving world; ``results/drivers/reproduce.sh``)."""


class StreamBreakError(InvalidInputError):
    """A tick does not continue the stream (gap, out of order, other frames or cameras) under ``on_break='error'``."""


@dataclass(frozen=True)
class FlashDriveConfig:
    """Which FlashDrive mechanisms run (see the module docstring) and their settings.

    Args:
        vision_cache: reuse per-frame vision-tower outputs (exact).
        stream: reuse the kept frames' language-model KV across ticks.
        rerotate: re-rotate moved keys to their new positions (exact rotation); ``False`` is FlashDrive's shift.
        step_cache: ``None`` (off), ``"adaptive"`` or ``"fixed"``.
        threshold: the adaptive step cache's threshold on the running relative velocity change.
        cache_steps: the fixed schedule's reused steps.
        system: build fixed positions and masks once, lean decode loop.
        on_break: ``"reset"`` (full prefill, reported) or ``"error"`` when a tick does not continue the stream.
        frame_mask: prefill each frame seeing only the prompt head and itself, never another frame (the streaming
            mask a VLA fine-tuned with ``train_vla train --stream-mask`` learned; the text after the frames sees
            everything). With streaming a kept frame's states then carry nothing of frames that have left: the
            streamed cache is the one a full prefill under that mask gives, but for the kept frames' shifted
            distance to the prompt head. Lossy against plain, which prefills with the full causal mask. ``"auto"``
            (default): on with streaming when the VLA was fine-tuned with that mask (its folder's
            ``train_config.json`` has ``stream_mask > 0``), off otherwise.
        refresh_every: a full prefill every this many ticks of a stream (``0``: never). Why: a kept frame's states
            were computed attending to the frames before it, which were computed the same way, so information from
            frames long gone reaches the window through the chain; a periodic refresh bounds it (at the cost of a
            full prefill on those ticks).
        spec: speculative reasoning (exact: greedy verification by the core): ``True`` (a drafter must be found),
            ``"auto"`` (on when a drafter fits this VLA: ``drafter``, else the bundled one if its fingerprint is the
            VLA's; off otherwise, said by :meth:`FlashDriveEngine.describe`), ``False``.
        drafter: the reasoning drafter, a ``make_drafter`` spec (``"glance:DIR"``, ``"glance:DIR;branch_k=2"``) or a
            folder (read as ``glance:DIR``); ``None``: the bundled :data:`DRAFTER_DIR`.
        reuse_reasoning: with speculative reasoning, the first round drafts the rest of the last tick's reasoning
            (:class:`ReasoningReuseDrafter`; the drafter takes over from the first mismatch). Exact like ``spec``.
        lean_expert: the action expert's head calls through :class:`~mmspec.drivers.vla.LeanExpert` (exact: the same
            numbers without the transformers call stack; the context's K/V, mask and rotation set up once per tick).
        lean_lm: the language model's prefill, decode and verify passes through :class:`mmspec.lean.LeanForward`
            (exact: the same numbers without the transformers call stack).
        lean_vision: the vision tower's encodes through :class:`mmspec.lean_vision.LeanVision` (exact: the same
            features without the transformers call stack; the rotary angles and attention lengths cached per grid).
        patch_matmul: in the lean vision tower, the Conv3d patch embedding as one matmul (approximate: another
            summation order, not the conv's bits; turns ``lean_vision`` on).
        expert: the action expert that integrates the flow. ``"auto"`` (default): where the step cache is on, the
            few-step student the VLA folder ships (``fewstep/``, :func:`mmspec.drivers.bundled.bundled_student`)
            replaces it when there is one distilled on this backbone; otherwise the VLA's own expert (which one ran
            is said by :meth:`FlashDriveEngine.describe`; with ``step_cache=None`` "auto" never picks a student, so
            an exact configuration stays exact); ``"bundled"``: that student, refused when the VLA ships none; a
            distilled expert's folder (:func:`mmspec.drivers.vla.load_student`; distilled on this VLA's
            backbone); ``None``: the VLA's own expert. A student is lossy and replaces the step cache (its
            thresholds are for the 10-step expert).

    Example:
        >>> FlashDriveConfig.parse({"step_cache": "fixed", "stream": False}).step_cache
        'fixed'
    """

    vision_cache: bool = True
    stream: bool = True
    rerotate: bool = True
    step_cache: str | None = "adaptive"
    threshold: float = 0.1
    cache_steps: tuple = (3, 4, 5, 6)
    system: bool = True
    on_break: str = "reset"
    refresh_every: int = 0
    frame_mask: object = "auto"
    spec: object = "auto"
    drafter: object = None
    reuse_reasoning: bool = True
    expert: object = "auto"
    lean_expert: bool = True
    lean_lm: bool = True
    lean_vision: bool = True
    patch_matmul: bool = False

    def __post_init__(self):
        if self.step_cache not in (None, "adaptive", "fixed"):
            raise InvalidInputError(f"step_cache must be None, 'adaptive' or 'fixed' (got {self.step_cache!r})")
        if self.on_break not in ("reset", "error"):
            raise InvalidInputError(f"on_break must be 'reset' or 'error' (got {self.on_break!r})")
        if isinstance(self.refresh_every, bool) or not isinstance(self.refresh_every, int) or self.refresh_every < 0:
            raise InvalidInputError(f"refresh_every must be an integer >= 0 (got {self.refresh_every!r})")
        if not (isinstance(self.frame_mask, bool) or self.frame_mask == "auto"):
            raise InvalidInputError(f"frame_mask must be True, False or 'auto' (got {self.frame_mask!r})")
        if self.spec not in (True, False, "auto"):
            raise InvalidInputError(f"spec must be True, False or 'auto' (got {self.spec!r})")
        if self.stream and not self.vision_cache:
            object.__setattr__(self, "vision_cache", True)  # a kept frame's features are what streaming keeps
        if self.patch_matmul and not self.lean_vision:
            object.__setattr__(self, "lean_vision", True)  # the matmul replaces the conv inside the lean tower
        StepCache(self.step_cache or "adaptive", self.threshold, self.cache_steps)  # validates the settings
        if self.expert == "bundled":
            object.__setattr__(self, "step_cache", None)  # the student integrates in its own few steps
        elif self.expert not in (None, "auto"):
            name = str(self.expert) if isinstance(self.expert, (str, os.PathLike)) else ""
            if not name or name.startswith("<"):  # "<--expert>": drive-sim's placeholder, never a folder
                raise InvalidInputError(f"expert must be None, 'auto', 'bundled' or a distilled expert's folder "
                                        f"(got {self.expert!r})")
            object.__setattr__(self, "step_cache", None)  # the student integrates in its own few steps

    @classmethod
    def parse(cls, spec) -> "FlashDriveConfig | None":
        """``True`` (all; speculative reasoning where a drafter fits, ``spec="auto"``), ``False`` / ``None`` (off:
        plain), a comma list of :data:`MECHANISMS` (each alone or together; ``stream-shift`` is
        streaming without re-rotation; ``spec`` requires a drafter; ``fewstep`` the student the VLA ships, refused
        when it ships none; another student's folder takes a dict or config; ``frame_mask`` the streaming mask, off
        in a list that does not name it), a dict of fields (fields it leaves out keep their defaults,
        ``spec="auto"`` among them: a dict config speculates where a drafter fits unless it says ``"spec": False``),
        or a config.

        Example:
            >>> FlashDriveConfig.parse("stream-shift").rerotate
            False
        """
        if spec is None or spec is False:
            return None
        if isinstance(spec, cls):
            return spec
        if spec is True:
            return cls()
        if isinstance(spec, dict):
            known = {f.name for f in fields(cls)}
            bad = sorted(set(spec) - known)
            if bad:
                raise InvalidInputError(f"unknown FlashDrive settings {bad}; known: {sorted(known)}")
            return cls(**spec)
        if isinstance(spec, str):
            names = [n.strip() for n in spec.split(",") if n.strip()]
            if names == ["flashdrive"] or names == ["all"]:
                return cls()
            kw = dict(vision_cache=False, stream=False, step_cache=None, system=False, spec=False, expert=None,
                      frame_mask=False, lean_expert=False, lean_lm=False, lean_vision=False)
            for n in names:
                if n == "stream-shift":
                    kw.update(stream=True, rerotate=False)
                elif n == "step_cache" or n == "step-cache":
                    kw["step_cache"] = "adaptive"
                elif n == "step_cache_fixed" or n == "step-cache-fixed":
                    kw["step_cache"] = "fixed"
                elif n == "fewstep":
                    kw["expert"] = "bundled"
                elif n in ("frame_mask", "frame-mask"):
                    kw["frame_mask"] = True
                elif n.replace("-", "_") in MECHANISMS:
                    kw[n.replace("-", "_")] = True
                else:
                    raise InvalidInputError(f"unknown FlashDrive mechanism {n!r}; use some of {list(MECHANISMS)}, frame_mask, "
                                            "stream-shift, step_cache_fixed, or 'flashdrive' for all")
            return cls(**kw)
        raise InvalidInputError(f"flashdrive must be True, a mechanism list or a FlashDriveConfig (got {spec!r})")

    def names(self) -> list:
        """The mechanisms switched on, in :data:`MECHANISMS` order."""
        on = {"vision_cache": self.vision_cache, "stream": self.stream, "step_cache": self.step_cache is not None,
              "fewstep": self.expert not in (None, "auto"), "system": self.system, "spec": bool(self.spec),
              "lean_expert": self.lean_expert, "lean_lm": self.lean_lm, "lean_vision": self.lean_vision,
              "patch_matmul": self.patch_matmul}
        return [m for m in MECHANISMS if on[m]]

    @property
    def exact(self) -> bool:
        """Whether every mechanism on is exact (the vision cache, the system level, the lean passes and greedy-verified
        speculative reasoning are; streaming, step caching, the few-step expert and the patch matmul approximate;
        ``expert="auto"`` picks a student only in place of the step cache). Speculative reasoning is exact in fp32
        only: :attr:`FlashDriveEngine.exact` also reads the model's dtype."""
        return not self.stream and self.step_cache is None and self.expert in (None, "auto") \
            and self.frame_mask is not True and not self.patch_matmul

    def step_cache_policy(self) -> StepCache | None:
        return None if self.step_cache is None else StepCache(self.step_cache, self.threshold, self.cache_steps)


def rerotate_keys(keys: torch.Tensor, delta: torch.Tensor, rotary_emb) -> torch.Tensor:
    """Keys ``[B, H, n, D]`` rotated by their RoPE at positions ``p`` -> the same keys at ``p + delta``.

    ``delta[3, n]`` (M-RoPE: temporal, height, width; equal rows for 1-D RoPE): RoPE is a rotation per frequency
    pair, so rotating by the angle of ``delta`` moves a key to its new position exactly (up to rounding). The
    model's own ``rotary_emb`` supplies the angles (its M-RoPE sections and scaling included).

    Example:
        >>> from transformers import Qwen2VLTextConfig                                       # doctest: +SKIP
        >>> k2 = rerotate_keys(k, torch.full((3, n), -10), model.model.language_model.rotary_emb)  # doctest: +SKIP
    """
    from transformers.models.qwen2_vl.modeling_qwen2_vl import rotate_half

    delta = delta.to(keys.device).long()
    if bool((delta == 0).all()):
        return keys
    cos, sin = rotary_emb(keys.float(), delta[:, None, :].expand(3, keys.shape[0], -1))
    cos, sin = cos[:, None].float(), sin[:, None].float()  # [B, 1, n, D]: every head turns alike
    k = keys.float()
    return (k * cos + rotate_half(k) * sin).to(keys.dtype)


def stream_mask_trained(vla_path: str | None) -> bool:
    """Whether the VLA folder ``vla_path`` was fine-tuned with the streaming mask (``train_vla train --stream-mask``:
    its ``train_config.json`` says ``stream_mask > 0``): where ``frame_mask="auto"`` turns the mask on.

    Example:
        >>> stream_mask_trained("/nonexistent")
        False
    """
    import json

    path = os.path.join(vla_path or "", "train_config.json")
    if not vla_path or not os.path.isfile(path):
        return False
    with open(path) as f:
        return float(json.load(f).get("stream_mask") or 0) > 0


def bundled_drafter() -> str | None:
    """The bundled reasoning drafter's folder (``None`` if this install has none).

    Example:
        >>> bundled_drafter() is None or os.path.isfile(os.path.join(bundled_drafter(), "config.json"))
        True
    """
    return DRAFTER_DIR if os.path.isfile(os.path.join(DRAFTER_DIR, "config.json")) else None


class ReasoningReuseDrafter(Drafter):
    """Speculative reasoning at 10 Hz: the first round drafts the rest of the last tick's reasoning, then ``fallback``.

    Ticks 100 ms apart mostly reason alike. When the tick's first token is the last reasoning's first token, the
    first round proposes the rest of the last reasoning as one chain: accepted whole, the reasoning takes one verify
    pass and the block drafter never runs (its ``begin``, a projection of the whole prompt, is deferred). From the
    first mismatch on, or when the reasoning goes on past the last one, ``fallback`` takes over, begun then with the
    tick's prompt states and told the reuse round's result, so it reads the same states it would have read had it
    run from the start. Greedy verification keeps the reasoning the VLA's own; only the number of passes changes.
    Batch 1 (the engine's); a batch goes to ``fallback`` whole.

    Example:
        >>> from mmspec.drafters import PromptLookupDrafter
        >>> d = ReasoningReuseDrafter(PromptLookupDrafter())
        >>> d.previous = [5, 6, 7, 8]
        >>> ctx = DraftContext(sequences=[np.array([1, 2, 5])], rows=[0], remaining=[8], prompt_lengths=[2])
        >>> d.begin(ctx); d.propose(ctx)[0].tokens.tolist()
        [6, 7, 8]
    """

    kind = "reuse"

    def __init__(self, fallback):
        if not isinstance(fallback, Drafter):
            raise InvalidInputError(f"the reuse drafter falls back on a Drafter (got {type(fallback).__name__})")
        self.fallback = fallback
        self.previous: list = []  # the last finished reasoning (generated tokens)
        self._counts: dict = {}
        self._begin_ctx = self._pending = None
        self._delegating = True

    @property
    def hidden_layers(self) -> tuple:
        return tuple(self.fallback.hidden_layers)

    @property
    def num_draft_tokens(self):
        return getattr(self.fallback, "num_draft_tokens", "?")

    def bind(self, model) -> None:
        self.fallback.bind(model)

    def begin(self, ctx: DraftContext) -> None:
        self._counts = {"reuse_rounds": 0, "reuse_tokens": 0, "fallback_starts": 0}
        self._begin_ctx, self._pending, self._delegating = ctx, None, False
        if len(ctx.rows) != 1 or not self.previous:
            self._start_fallback()

    def _start_fallback(self) -> None:
        self._delegating = True
        self._counts["fallback_starts"] += 1
        self.fallback.begin(self._begin_ctx)
        if self._pending is not None:  # the reuse round's states and result, as the fallback would have seen them
            self.fallback.observe(*self._pending)
        self._begin_ctx = self._pending = None

    def propose(self, ctx: DraftContext) -> list:
        if not self._delegating:
            done = [int(t) for t in ctx.sequences[0][ctx.prompt_lengths[0]:]]
            prev = self.previous
            if self._pending is None and len(done) < len(prev) and done == prev[: len(done)]:
                self._counts["reuse_rounds"] += 1
                return [DraftTree.from_chain(prev[len(done):])]
            self._start_fallback()
        return self.fallback.propose(ctx)

    def observe(self, ctx, result) -> None:
        if result.finished and result.finished[0] and len(ctx.rows) == 1:
            self.previous = [int(t) for t in ctx.sequences[0][ctx.prompt_lengths[0]:]] + list(result.committed[0])
        if self._delegating:
            self.fallback.observe(ctx, result)
        else:
            self._counts["reuse_tokens"] += len(result.paths[0])
            self._pending = (ctx, result)

    def counters(self) -> dict:
        fallback = self.fallback.counters()
        if not self._counts.get("fallback_starts"):  # not begun this call: its counters are an earlier call's
            fallback = {k: 0 for k in fallback}
        return {**self._counts, **fallback}

    def forget(self) -> None:
        self.previous = []
        self.fallback.forget()


def _frame_key(img) -> str:
    """A frame's content key: blake2b over its pixels' bytes (C order) and its shape. hashlib reads the array's
    buffer itself, so no ``tobytes()`` copy (the same bytes, the same key; a strided array is made contiguous)."""
    a = np.ascontiguousarray(np.asarray(img))
    return hashlib.blake2b(a, digest_size=16).hexdigest() + f"{a.shape}"


@dataclass
class _Stream:
    """What a clip's stream keeps between ticks."""

    tick: int | None
    cameras: tuple
    frame_keys: list  # per camera, per frame slot: pixel hash
    prefix_ids: torch.Tensor  # the tokens before the first frame
    frame_tokens: int  # tokens per frame block (<vision_start> ... <vision_end>)
    cache: object  # DynamicCache holding prefix + frames (text and reasoning cropped off)
    slot_index: list  # per camera, per frame slot: LongTensor of cache indices
    prefix_len: int
    positions: torch.Tensor  # [3, L_cache]: the position of every cache entry
    age: int = 0  # ticks since the last full prefill
    hidden: dict | None = None  # speculative reasoning: {layer: [L_cache, H]} the drafter reads, moved like the KV


@dataclass
class _Template:
    """The token layout of one tick's prompt."""

    ids: torch.Tensor  # [L]
    positions: torch.Tensor  # [3, L]
    next_position: int  # the text position after the prompt
    prefix_len: int
    frame_spans: list  # per image (camera-major): (start, end) token range of <vision_start> .. <vision_end>
    image_token_index: torch.Tensor  # token indices of the image placeholders


class FlashDriveEngine:
    """Runs one tick of a :class:`~mmspec.drivers.vla.DrivingVLA` with the mechanisms of ``config``.

    Used by :class:`~mmspec.drivers.pipeline.DrivingPipeline` (``flashdrive=``); :meth:`reset` ends a clip.

    Example:
        >>> engine = FlashDriveEngine(vla, FlashDriveConfig())                             # doctest: +SKIP
        >>> out = engine.step(images, prompt, ("front",), speed, tick=20)                  # doctest: +SKIP
    """

    VISION_CACHE_FRAMES = 64

    def __init__(self, vla, config: FlashDriveConfig, max_reasoning_tokens: int = 40):
        self.vla, self.config, self.max_reasoning_tokens = vla, config, max_reasoning_tokens
        bb = vla.backbone
        self.backbone, self.lm = bb, bb.model.language_model
        self.processor = vla.processor
        cfg = bb.config
        self.image_token_id = cfg.image_token_id
        self.vision_start_id, self.vision_end_id = cfg.vision_start_token_id, cfg.vision_end_token_id
        eos = bb.generation_config.eos_token_id
        self.eos = set(eos if isinstance(eos, (list, tuple)) else [eos]) - {None}
        self.student_path, self.expert_note = self._student(vla, config.expert, config.step_cache is not None)
        self.frame_mask = config.frame_mask is True or (config.frame_mask == "auto" and config.stream
                                                        and stream_mask_trained(getattr(vla, "name_or_path", None)))
        self.expert = vla.expert
        self.step_cache = config.step_cache_policy()
        if self.student_path is not None:
            from .vla import load_student

            self.expert = load_student(self.student_path, vla)
            self.step_cache = None  # the student integrates in its own few steps
        self._features: OrderedDict = OrderedDict()  # frame hash -> (features [n, H], grid [3])
        self._templates: dict = {}
        self._stream: _Stream | None = None
        self.stats = {"vision_hits": 0, "vision_misses": 0, "stream_ticks": 0, "resets": {}, "spec_rounds": 0,
                      "spec_tokens": 0}
        self.last_context = None
        self.drafter, self.spec_note = self._load_drafter(config)
        self.hidden_layers = tuple(self.drafter.hidden_layers) if self.drafter is not None else ()
        self._adapter = None
        self.lean_lm_off = lean_why_not(self.backbone) if config.lean_lm else ""
        self._lean = LeanForward(self.backbone) if config.lean_lm and not self.lean_lm_off else None
        self.lean_vision_off = lean_vision_why_not(self.backbone) if config.lean_vision else ""
        self._lean_vision = LeanVision(self.backbone, patch_matmul=config.patch_matmul) \
            if config.lean_vision and not self.lean_vision_off else None

    # ------------------------------------------------------------------ state
    def reset(self) -> None:
        """Forget the stream (a new clip) and the drafter's memory of earlier ticks (a new drive must not be drafted
        from the last drive's reasoning: exact either way, but it would flatter the first tick's latency); the vision
        cache is content-addressed and stays."""
        self._stream = None
        if self.drafter is not None:
            self.drafter.forget()

    def _load_drafter(self, config: FlashDriveConfig):
        """``(drafter or None, note)``: the reasoning drafter ``config`` asks for, bound to the backbone."""
        from mmspec.errors import DrafterMismatchError
        from mmspec.registry import make_drafter

        if not config.spec:
            return None, "off"
        spec = config.drafter
        if spec is None:
            spec = bundled_drafter()
            if spec is None:
                if config.spec is True:
                    raise InvalidInputError("speculative reasoning needs a drafter: none is bundled with this install; "
                                            "pass drafter='glance:DIR' (trained with mmspec train --kind glance)")
                return None, "off (no drafter bundled)"
        if isinstance(spec, str) and os.path.isdir(os.path.expanduser(spec)):
            spec = f"glance:{spec}"
        try:
            drafter = make_drafter(spec, self.backbone)
        except DrafterMismatchError:
            if config.spec is True or config.drafter is not None:
                raise
            return None, "off (the bundled drafter was trained for another VLA)"
        drafter.bind(self.backbone)
        note = f"{drafter.kind}, block of {getattr(drafter, 'num_draft_tokens', '?')} drafts"
        if config.reuse_reasoning:
            drafter, note = ReasoningReuseDrafter(drafter), note + ", last tick's reasoning first"
        return drafter, note

    # ------------------------------------------------------------------ helpers
    def _sync(self):
        if self.backbone.device.type == "cuda":
            torch.cuda.synchronize(self.backbone.device)

    def _encode(self, images, keys) -> list:
        """Vision features of every frame: cached ones looked up (vision_cache), the rest encoded together."""
        use_cache = self.config.vision_cache
        missing = [i for i, k in enumerate(keys) if not (use_cache and k in self._features)]
        out = [None] * len(images)
        if missing:
            ip = self.processor.image_processor
            px = ip(images=[images[i] for i in missing], return_tensors="pt")
            pv = px["pixel_values"].to(self.backbone.device, self.backbone.model.visual.dtype)
            grid = px["image_grid_thw"].to(self.backbone.device)
            if self._lean_vision is not None:  # the host grid: the lean set-up's cache key without a device sync
                feats = self._lean_vision(pv, px["image_grid_thw"])
            else:
                feats = self.backbone.model.get_image_features(pv, grid).pooler_output
            for j, i in enumerate(missing):
                out[i] = (feats[j], grid[j])
                if use_cache:
                    self._features[keys[i]] = out[i]
        self.stats["vision_misses"] += len(missing)
        for i, k in enumerate(keys):
            if out[i] is None:
                out[i] = self._features[k]
                self._features.move_to_end(k)
                self.stats["vision_hits"] += 1
        while len(self._features) > self.VISION_CACHE_FRAMES:
            self._features.popitem(last=False)
        return out

    def _template(self, prompt_text: str, grids) -> _Template:
        """Token ids and M-RoPE positions of the prompt (cached per prompt layout when ``system``)."""
        tok = self.processor.tokenizer
        pad = self.processor.image_token
        merge = self.backbone.model.visual.spatial_merge_size ** 2
        text = prompt_text
        for g in grids:  # expand each placeholder as the processor does
            text = text.replace(pad, "\0" * int(g.prod() // merge), 1)
        ids = torch.tensor(tok(text.replace("\0", pad), add_special_tokens=False)["input_ids"])
        L = int(ids.shape[0])
        key = (tuple(tuple(int(x) for x in g) for g in grids), L)  # the text tail only shifts positions along
        if self.config.system and key in self._templates:
            t = self._templates[key]
            if torch.equal(t.ids[: t.frame_spans[-1][1]], ids[: t.frame_spans[-1][1]]):
                return _Template(ids, t.positions, t.next_position, t.prefix_len, t.frame_spans,
                                 t.image_token_index)
        starts = (ids == self.vision_start_id).nonzero().flatten().tolist()
        ends = (ids == self.vision_end_id).nonzero().flatten().tolist()
        if len(starts) != len(grids) or len(ends) != len(grids):
            raise InvalidInputError(f"the prompt holds {len(starts)} image blocks for {len(grids)} frames")
        mm = (ids == self.image_token_id).long()[None]
        grid_t = torch.stack([g.cpu() for g in grids])
        pos, _ = self.backbone.model.get_rope_index(ids[None], mm_token_type_ids=mm, image_grid_thw=grid_t,
                                                    attention_mask=torch.ones(1, L, dtype=torch.long))
        pos = pos[-3:, 0].to(self.backbone.device)
        t = _Template(ids, pos, int(pos.max()) + 1, starts[0], [(s, e + 1) for s, e in zip(starts, ends)],
                      mm[0].nonzero().flatten())
        if self.config.system:
            self._templates[key] = t
        return t

    def _forward(self, embeds, positions, cache, mask=None, hidden_layers=()):
        """The language model over ``embeds[1, n, H]`` at ``positions[3, n]``; last hidden state ``[1, n, H]`` and
        ``{layer: [n, H]}`` of ``hidden_layers`` (``hidden_states`` indices: what the drafter reads)."""
        if self._lean is not None:
            out = self._lean(inputs_embeds=embeds, position_ids=positions[:, None, :], attention_mask=mask,
                             cache=cache, output_hidden_states=bool(hidden_layers), logits=False)
            return out.last_hidden_state, {i: out.hidden_states[i][0] for i in hidden_layers}
        am = None if mask is None else {"full_attention": mask}
        out = self.lm(inputs_embeds=embeds, position_ids=positions[:, None, :], cache=cache, attention_mask=am,
                      use_cache=True, output_hidden_states=bool(hidden_layers))
        hs = {i: out.hidden_states[i][0] for i in hidden_layers}
        return out.last_hidden_state, hs

    def _embed(self, ids, feats_by_token=None):
        emb = self.lm.embed_tokens(ids.to(self.backbone.device))[None]
        if feats_by_token is not None:
            idx, feats = feats_by_token
            emb[0, idx] = feats.to(emb.dtype)
        return emb

    # ------------------------------------------------------------------ streaming
    def _continues(self, tick, cameras, keys, tpl: _Template, fpc: int):
        """``None`` if this tick continues the stream, else ``(category, why)``."""
        st = self._stream
        if not self.config.stream:
            return ("off", "streaming off")
        if st is None:
            return ("start", "first tick of a stream")
        if tick is None or st.tick is None:
            return ("no tick", "no tick index")
        if tick == st.tick:
            return ("repeated", f"tick {tick} repeated")
        if tick < st.tick:
            return ("out of order", f"tick {tick} out of order (after {st.tick})")
        if tick != st.tick + 1:
            return ("gap", f"gap: tick {tick} after {st.tick}")
        if tuple(cameras) != st.cameras:
            return ("cameras", f"cameras changed ({list(st.cameras)} -> {list(cameras)})")
        n_tok = {e - s for s, e in tpl.frame_spans}
        if tpl.prefix_len != st.prefix_len or not torch.equal(tpl.ids[: tpl.prefix_len], st.prefix_ids) \
                or n_tok != {st.frame_tokens}:
            return ("layout", "prompt layout changed")
        for c in range(len(cameras)):
            if keys[c * fpc: c * fpc + fpc - 1] != st.frame_keys[c][1:]:
                return ("frames", f"frames of camera {cameras[c]!r} do not continue the last window")
        if self.config.refresh_every and st.age + 1 >= self.config.refresh_every:
            return ("refresh", f"periodic refresh (every {self.config.refresh_every} ticks)")
        return None

    def _stream_prefill(self, st: _Stream, tpl: _Template, feats, fpc: int, ncam: int):
        """Move the kept frames' KV (re-rotated or shifted), prefill the new frames and the text."""
        dev = self.backbone.device
        keep_idx, moved, new_pos_moved = [torch.arange(st.prefix_len, device=dev)], [], []
        for c in range(ncam):
            for j in range(fpc - 1):
                old = st.slot_index[c][j + 1]
                s, e = tpl.frame_spans[c * fpc + j]
                keep_idx.append(old)
                moved.append((st.positions[:, old], tpl.positions[:, s:e]))
        keep = torch.cat(keep_idx)
        P = st.prefix_len
        delta = None
        if self.config.rerotate and moved:
            delta = torch.cat([new - old for old, new in moved], dim=1)  # [3, n_moved]
        cache = st.cache
        rot = self.lm.rotary_emb
        for layer in cache.layers:
            k = layer.keys.index_select(2, keep)
            v = layer.values.index_select(2, keep)
            if delta is not None:
                k = torch.cat([k[:, :, :P], rerotate_keys(k[:, :, P:], delta, rot)], dim=2)
            layer.keys, layer.values = k, v
        # Cache entries now: prefix, then per camera frames 0..fpc-2 (at the new window's slots).
        kept_pos = [tpl.positions[:, :P]] + [new for _, new in moved]
        order_cached = [torch.arange(P, device=dev)] + [
            torch.arange(*tpl.frame_spans[c * fpc + j], device=dev) for c in range(ncam) for j in range(fpc - 1)]
        new_tok = [torch.arange(*tpl.frame_spans[c * fpc + fpc - 1], device=dev) for c in range(ncam)]
        tail = torch.arange(tpl.frame_spans[-1][1], tpl.ids.shape[0], device=dev)
        q_idx = torch.cat(new_tok + [tail])
        new_feats = torch.cat([feats[c * fpc + fpc - 1][0] for c in range(ncam)])
        ids_q = tpl.ids.to(dev)[q_idx]
        emb = self._embed(ids_q, ((ids_q == self.image_token_id).nonzero().flatten(), new_feats))
        mask = None
        k_order = torch.cat(order_cached + [q_idx])  # the prompt index of every cache entry
        if self.frame_mask:
            mask = self._frame_mask(tpl, q_idx, k_order, emb.dtype)
        elif ncam > 1:  # the new frames sit between kept frames in sequence order: attend by original index
            mask = attention_mask_for((k_order[None, :] <= q_idx[:, None])[None, None],
                                      self.backbone.config.get_text_config()._attn_implementation, emb.dtype)
        hidden, hs = self._forward(emb, tpl.positions[:, q_idx], cache, mask, self.hidden_layers)
        if self.hidden_layers:  # the drafter's states of the kept entries were computed on earlier ticks, as the KV
            if st.hidden is None:
                raise RuntimeError("a streamed tick without the kept entries' drafter states")
            hs = {i: torch.cat([st.hidden[i].index_select(0, keep), h]) for i, h in hs.items()}
        # Slot map for the next tick: kept frames, then the new frames at the end of the kept part.
        slots, at = [], P
        L_kept = keep.shape[0]
        nt = st.frame_tokens
        for c in range(ncam):
            row = []
            for j in range(fpc - 1):
                row.append(torch.arange(at, at + nt, device=dev))
                at += nt
            slots.append(row)
        for c in range(ncam):
            slots[c].append(torch.arange(L_kept + c * nt, L_kept + (c + 1) * nt, device=dev))
        positions = torch.cat(kept_pos + [tpl.positions[:, q_idx]], dim=1)
        return hidden, slots, L_kept + ncam * nt, positions, hs, k_order

    def _frame_mask(self, tpl: _Template, q_idx: torch.Tensor, k_idx: torch.Tensor, dtype) -> torch.Tensor:
        """The 4-D mask of ``frame_mask`` for queries at prompt indices ``q_idx`` over cache entries at ``k_idx``:
        causal by prompt index, and no frame token sees another frame's (``streaming_attention_mask``'s rule)."""
        frame = torch.zeros(tpl.ids.shape[0], dtype=torch.long, device=q_idx.device)
        for j, (s, e) in enumerate(tpl.frame_spans):
            frame[s:e] = j + 1
        fq, fk = frame[q_idx][:, None], frame[k_idx][None, :]
        allowed = (k_idx[None, :] <= q_idx[:, None]) & ~((fq > 0) & (fk > 0) & (fq != fk))
        return attention_mask_for(allowed[None, None], self.backbone.config.get_text_config()._attn_implementation,
                                  dtype)

    def _full_prefill(self, tpl: _Template, feats, fpc: int, ncam: int):
        from transformers import DynamicCache

        dev = self.backbone.device
        emb = self._embed(tpl.ids, (tpl.image_token_index.to(dev), torch.cat([f for f, _ in feats])))
        cache = DynamicCache(config=self.backbone.config.get_text_config())
        mask = None
        if self.frame_mask:
            idx = torch.arange(tpl.ids.shape[0], device=dev)
            mask = self._frame_mask(tpl, idx, idx, emb.dtype)
        hidden, hs = self._forward(emb, tpl.positions, cache, mask, hidden_layers=self.hidden_layers)
        slots = [[torch.arange(*tpl.frame_spans[c * fpc + j], device=dev) for j in range(fpc)] for c in range(ncam)]
        return hidden, cache, slots, tpl.frame_spans[-1][1], tpl.positions, hs

    # ------------------------------------------------------------------ one tick
    @torch.no_grad()
    def step(self, images, prompt_text: str, cameras, speed: float, tick=None, num_samples: int = 1, seed: int = 0,
             clock=None) -> dict:
        """One tick: ``images`` (PIL, camera-major, oldest first), the chat ``prompt_text`` with one image
        placeholder per frame; returns what :meth:`DrivingPipeline.step` returns, plus ``stream`` (``"reuse"``
        or why a full prefill ran) and ``head_calls``. ``clock``: the pipeline's
        :class:`~mmspec.drivers.stages.StageClock`, running ``preprocess`` (default: one started here)."""
        clock = StageClock(self._sync, start="preprocess") if clock is None else clock
        ncam = len(cameras)
        fpc = len(images) // ncam
        keys = [_frame_key(im) for im in images]
        clock.to("encode")
        feats = self._encode(images, keys)
        clock.to("preprocess")
        tpl = self._template(prompt_text, [g for _, g in feats])
        brk = self._continues(tick, cameras, keys, tpl, fpc)
        if brk is not None and brk[0] not in ("off", "start", "no tick", "refresh") and self.config.on_break == "error":
            raise StreamBreakError(f"tick {tick} does not continue the stream: {brk[1]} (reset() starts a new clip)")
        clock.to("prefill")
        st, self._stream = self._stream, None  # taken: a failure below leaves no half-moved cache behind
        if brk is None:
            hidden, slots, kept_len, positions, hs, order = self._stream_prefill(st, tpl, feats, fpc, ncam)
            cache = st.cache
            self.stats["stream_ticks"] += 1
        else:
            if brk[0] != "off":
                self.stats["resets"][brk[0]] = self.stats["resets"].get(brk[0], 0) + 1
            hidden, cache, slots, kept_len, positions, hs = self._full_prefill(tpl, feats, fpc, ncam)
            order = None
        logits = self.backbone.lm_head(hidden[:, -1])
        clock.to("decode")
        # Reasoning, greedy: the cache ends up holding the prompt and every generated token but the last (as
        # generate leaves it), which the action expert reads.
        first_logits = logits[0].float().clone()
        dev = self.backbone.device
        rounds = None
        if self.drafter is not None:
            new, rounds = self._decode_spec(logits, cache, tpl, hs, order, [g for _, g in feats])
        else:
            new = self._decode(logits, cache, tpl)
        pos = tpl.next_position + len(new) - 1
        clock.to("action")
        L = cache.get_seq_length()
        start = torch.tensor([pos], device=dev)
        valid = torch.ones(1, L, dtype=torch.bool, device=dev)
        gen = torch.Generator(device=dev).manual_seed(int(seed))
        expert = self.expert
        stats: dict = {}
        self.last_context = (cache, start, valid)  # what the expert read (step-cache studies; cropped if streaming)
        acts = [expert.sample(cache, start, valid, generator=gen, step_cache=self.step_cache,
                              precompute=self.config.system, stats=stats, lean=self.config.lean_expert)]
        clock.to(None)
        calls_timed = stats.get("head_calls", 0)
        # Further samples (minADE over K) are drawn after the clock stops: a car executes one trajectory.
        for _ in range(num_samples - 1):
            acts.append(expert.sample(cache, start, valid, generator=gen, step_cache=self.step_cache,
                                      precompute=self.config.system, lean=self.config.lean_expert))
        if self.config.stream and tick is not None:  # without a tick index a stream cannot be checked: no reuse
            cache.crop(kept_len - cache.get_seq_length())  # transformers 5: a negative count removes
            self._stream = _Stream(int(tick), tuple(cameras),
                                   [keys[c * fpc:(c + 1) * fpc] for c in range(ncam)], tpl.ids[: tpl.prefix_len],
                                   tpl.frame_spans[0][1] - tpl.frame_spans[0][0], cache, slots, tpl.prefix_len,
                                   positions[:, :kept_len], age=(st.age + 1) if brk is None else 0,
                                   hidden={i: h[:kept_len] for i, h in hs.items()} if hs else None)
        text = self.processor.tokenizer.decode(new, skip_special_tokens=True)
        out = {"reasoning": text, "actions": torch.cat(acts).float().cpu().numpy(), "num_decode_tokens": len(new),
               "timings_ms": clock.timings_ms(), "stream": "reuse" if brk is None else brk[1],
               "head_calls": calls_timed, "first_logits": first_logits.cpu(), "tokens": list(new)}
        if rounds is not None:
            out["spec_rounds"] = rounds  # target passes after the prefill (plain greedy: num_decode_tokens - 1)
        return out

    # ------------------------------------------------------------------ reasoning
    def _done(self, new: list) -> bool:
        return new[-1] in self.eos or len(new) >= self.max_reasoning_tokens

    def _decode(self, logits, cache, tpl: _Template) -> list:
        """Greedy reasoning, one token per pass: the cache ends up holding the prompt and every generated token but
        the last (as ``generate`` leaves it), which the action expert reads."""
        dev = self.backbone.device
        new, pos = [], tpl.next_position
        while True:
            new.append(int(logits[0].argmax()))
            if self._done(new):
                return new
            emb = self.lm.embed_tokens(torch.tensor([[new[-1]]], device=dev))
            hidden, _ = self._forward(emb, torch.full((3, 1), pos, device=dev, dtype=torch.long), cache)
            logits = self.backbone.lm_head(hidden[:, -1])
            pos += 1

    def _decode_spec(self, logits, cache, tpl: _Template, hs: dict, order, grids) -> tuple:
        """Speculative greedy reasoning through the core's rounds (:func:`mmspec.decode.decode_from_state`) from this
        tick's cache: the drafter proposes a block (a tree) per round from the tick's states, the core's
        :class:`~mmspec.target.TargetAdapter` scores it in one pass, the greedy rule accepts, the adapter commits.
        Returns ``(tokens, rounds)``; the cache ends as :meth:`_decode` leaves it (prompt + every token but the
        last), so the action expert reads the same context.

        ``hs``: the drafter's layers over the prompt in cache order, ``order`` the prompt index of each cache entry
        (``None``: cache order is prompt order)."""
        from mmspec.decode import decode_from_state
        from mmspec.positions import StreamPositions
        from mmspec.target import TargetAdapter, TargetState

        dev = self.backbone.device
        if self._adapter is None:
            self._adapter = TargetAdapter(self.backbone, hidden_layers=self.hidden_layers, lean=self._lean is not None)
        ids = tpl.ids
        plen = int(ids.shape[0])
        if order is not None:  # the drafter reads the prompt in its own order (its positions are the prompt's)
            hs = {i: torch.empty_like(h).index_copy_(0, order, h) for i, h in hs.items()}
        mm = (ids == self.image_token_id).long()[None].to(dev)
        model_inputs = {"input_ids": ids[None].to(dev), "attention_mask": torch.ones(1, plen, dtype=torch.long,
                                                                                         device=dev),
                        "mm_token_type_ids": mm, "image_grid_thw": torch.stack([g.to(dev) for g in grids])}
        # positions: the last prompt token's (the adapter places the pending token one past it)
        state = TargetState(cache=cache, valid=torch.ones(1, cache.get_seq_length(), dtype=torch.bool, device=dev),
                            positions=StreamPositions(torch.full((3, 1, 1), tpl.next_position - 1, device=dev)),
                            pending=torch.zeros(1, dtype=torch.long, device=dev),
                            new_type_ids={"mm_token_type_ids": torch.zeros(1, 1, dtype=torch.long, device=dev)})
        res = decode_from_state(
            self._adapter, state, logits.float(), self.drafter, prompts=[ids.tolist()],
            max_new=self.max_reasoning_tokens, eos_ids=self.eos, hidden={i: h[None] for i, h in hs.items()},
            model_inputs=model_inputs, keep_state=True)
        (new,), stats = res
        # The action expert reads batch row 0 of ``cache``: the tick's one row must be the one the state kept.
        if res.state_rows != [0]:  # not an assert: python -O must not let a wrong row reach the action expert
            raise MMSpecError(f"speculative reasoning kept rows {res.state_rows} of a one-row tick, expected [0]")
        self.stats["spec_rounds"] += stats.rounds
        self.stats["spec_tokens"] += len(new) - 1
        if stats.rounds:  # the drafter began (a run that stops at its first token makes no round)
            for k, v in self.drafter.counters().items():
                self.stats[k] = self.stats.get(k, 0) + v
        return new, stats.rounds

    SPEC_EXACT_NOTE = ("speculative reasoning is exact in fp32 (token for token the VLA's greedy reasoning); in "
                       "bf16 a block pass rounds differently from one-token passes, so near-ties may decode differently")

    @property
    def exact(self) -> bool:
        """Whether this engine's output is the plain pipeline's: every mechanism exact, and speculative reasoning (when
        a drafter runs) only in fp32 (a verify pass over a block rounds differently from one-token passes in bf16).

        Example:
            >>> FlashDriveEngine(vla, FlashDriveConfig.parse("spec")).exact   # doctest: +SKIP
            True
        """
        c = self.config
        return (not c.stream and self.step_cache is None and self.student_path is None and not self.frame_mask
                and not self.patch_matmul and (self.drafter is None or self.backbone.dtype == torch.float32))

    @property
    def patch_matmul(self) -> bool:
        """Whether the (approximate) patch matmul runs: asked for, and the lean vision tower runs this VLA's tower."""
        return self._lean_vision is not None and self._lean_vision.patch_matmul

    @staticmethod
    def _student(vla, expert, step_cache: bool) -> tuple:
        """``(folder of the few-step student to load or None, why the VLA's own expert runs)`` for ``expert``."""
        from .bundled import bundled_student
        from .vla import student_info

        if expert is None or (expert == "auto" and not step_cache):
            return None, ""
        if expert not in ("auto", "bundled"):
            return os.path.expanduser(str(expert)), ""
        where = getattr(vla, "name_or_path", None)
        path = bundled_student(where)
        if expert == "bundled":
            if path is None:
                raise InvalidInputError(f"the VLA ({where or 'not loaded from a folder'}) ships no few-step expert "
                                        "(fewstep/): name a distilled expert's folder (expert=DIR, drive-sim --expert)")
            return path, ""
        if path is None:
            return None, "the VLA ships no few-step expert"
        try:
            student_info(path, where)
        except InvalidInputError:  # a VLA saved over its old weights: its own expert is still right
            return None, "the shipped few-step expert was distilled on other weights"
        return path, ""

    def describe(self) -> str:
        c = self.config
        on = dict.fromkeys(self.config.names(), True)
        lean_off = LeanExpert.why_not(self.expert) if c.lean_expert else ""
        on.update(spec=self.drafter is not None, fewstep=self.student_path is not None,
                  step_cache=self.step_cache is not None, lean_expert=c.lean_expert and not lean_off,
                  lean_lm=self._lean is not None, lean_vision=self._lean_vision is not None,
                  patch_matmul=self.patch_matmul)
        parts = [m for m in MECHANISMS if on.get(m)]
        extra = []
        if c.stream:
            extra.append("re-rotated" if c.rerotate else "shifted (no re-rotation)")
        if self.frame_mask:
            extra.append("frames see only the prompt head and themselves (streaming mask), lossy")
        if self.step_cache is not None:
            extra.append(repr(self.step_cache))
        if self.patch_matmul:
            extra.append("patch embedding as one matmul, approximate (not the conv's summation order)")
        if self.student_path is not None:
            extra.append(f"few-step expert: {self.expert.num_steps} steps, lossy")
        elif self.expert_note and c.expert is not None:
            extra.append(f"the VLA's own expert: {self.expert_note}")
        if c.spec:
            extra.append(f"spec: {self.spec_note}")
        if lean_off:
            extra.append(f"lean expert off: {lean_off}")
        if self.lean_lm_off:
            extra.append(f"lean language model off: {self.lean_lm_off}")
        if self.lean_vision_off:
            extra.append(f"lean vision tower off: {self.lean_vision_off}")
        return "+".join(parts) + (f" ({', '.join(extra)})" if extra else "")
