"""``DrivingPipeline.step``: one tick of the driving VLA without speculation, timed per stage.

The baseline FlashDrive-style methods are measured against: encode (the vision tower over the frames),
prefill (the rest of the first backbone pass), decode (the reasoning, greedy), action (the expert's Euler
steps over the cache) and total, in milliseconds (CUDA-synchronised on a GPU).

Every request is checked before the model runs (:class:`mmspec.InvalidInputError`): frames go through the
one image loader of the VLM pipeline (:func:`mmspec.vision.load_image`: paths, PIL images, uint8 or float
arrays), as many per camera as the model was trained on; the ego history is ``[16, 3]`` and finite; the
speed a finite number of m/s a car can drive.

Example:
    >>> from mmspec.drivers import DrivingPipeline                                   # doctest: +SKIP
    >>> pipe = DrivingPipeline.from_pretrained("drivers/assets/driving-vla")         # doctest: +SKIP
    >>> out = pipe.step(frames, history, speed)                                      # doctest: +SKIP
    >>> out["reasoning"], out["trajectory"].shape, sorted(out["timings_ms"])         # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch

from mmspec.errors import InvalidImageError, InvalidInputError
from mmspec.pipelines import MMSpecPipeline

from .clips import FRAMES_PER_CAMERA, HISTORY_TICKS
from .stages import STAGES, StageClock
from .vla import TRAINED_CAMERAS, TRAINED_FRAMES, DrivingVLA, integrate_actions
from .workload import driving_prompt
from .world import CAMERAS, render_frame

__all__ = ["DrivingPipeline", "STAGES", "MAX_SPEED_MPS", "model_policy", "StageClock"]

MAX_SPEED_MPS = 70.0
"""The fastest ego speed a request may state (252 km/h): above any road car's cruise, far above the world's
expert (~15 m/s), so only nonsense (1e6, a km/h figure times ten) is refused."""


class DrivingPipeline(MMSpecPipeline):
    """Plain (non-speculative) driving VLA inference: frames + ego history -> reasoning + 6.4 s trajectory.

    ``MMSpecPipeline.from_pretrained(folder)`` returns one for a folder whose config says ``"mmspec_task":
    "driving"`` (what :meth:`~mmspec.drivers.vla.DrivingVLA.save_pretrained` writes); so does
    ``DrivingPipeline.from_pretrained(folder)``.

    Args:
        vla: a :class:`~mmspec.drivers.vla.DrivingVLA`.
        cameras: camera names the frames come from (in order, each with the same number of frames); default
            the cameras the model was trained on.
        max_reasoning_tokens: cap on the reasoning length.
        flashdrive: FlashDrive's mechanisms (:mod:`mmspec.drivers.flashdrive`): ``True`` for all (speculative
            reasoning where a drafter fits the VLA), a comma list (``"stream"``, ``"vision_cache,system"``,
            ``"step_cache"``, ``"spec"``...), a dict of
            :class:`~mmspec.drivers.flashdrive.FlashDriveConfig` fields or a config; ``None`` (default) is the
            plain pipeline (``generate``). With streaming, pass ``tick=`` to :meth:`step` and call :meth:`reset`
            between clips (a tick that does not continue the stream resets it, or raises under
            ``on_break="error"``).

    ``from_pretrained(folder, drafter=...)`` (``"glance:DIR"``, a folder, or ``"auto"`` for the bundled one)
    turns on FlashDrive's speculative reasoning (with the exact mechanisms, or over ``flashdrive=``'s).

    Example:
        >>> pipe = DrivingPipeline.from_pretrained("drivers/assets/driving-vla")      # doctest: +SKIP
        >>> pipe.cameras, pipe.frames_per_camera                                      # doctest: +SKIP
        (('front',), 4)
        >>> pipe = DrivingPipeline.from_pretrained("drivers/assets/driving-vla", drafter="auto")  # doctest: +SKIP
    """

    task = "driving"
    model_types = ()  # a driving VLA's backbone is a qwen2_vl: it is recognised by its config's mmspec_task

    def __init__(self, vla, cameras=None, max_reasoning_tokens: int = 40, flashdrive=None):
        super().__init__(vla.backbone, vla.processor, drafter=None)
        config = vla.backbone.config
        trained = tuple(getattr(config, TRAINED_CAMERAS, None) or ("front",))
        self.frames_per_camera = int(getattr(config, TRAINED_FRAMES, None) or FRAMES_PER_CAMERA)
        cameras = trained if cameras is None else ((cameras,) if isinstance(cameras, str) else tuple(cameras))
        unknown = [c for c in cameras if c not in CAMERAS]
        if unknown or not cameras:
            raise InvalidInputError(f"unknown camera(s) {unknown}; the world has {sorted(CAMERAS)}")
        if any(c not in trained for c in cameras):
            raise InvalidInputError(f"cameras {list(cameras)}: this model was trained on cameras {list(trained)}")
        if isinstance(max_reasoning_tokens, bool) or not isinstance(max_reasoning_tokens, int) \
                or max_reasoning_tokens <= 0:
            raise InvalidInputError(f"max_reasoning_tokens must be a positive integer (got {max_reasoning_tokens!r})")
        self.vla, self.cameras, self.max_reasoning_tokens = vla, cameras, max_reasoning_tokens
        self.trained_cameras = trained
        from .flashdrive import FlashDriveConfig, FlashDriveEngine

        self.flashdrive = FlashDriveConfig.parse(flashdrive)
        self.engine = None if self.flashdrive is None else FlashDriveEngine(vla, self.flashdrive,
                                                                            max_reasoning_tokens)

    def reset(self) -> None:
        """Forget the streaming state (a new clip starts); a no-op for the plain pipeline.

        Example:
            >>> pipe.reset()                                                           # doctest: +SKIP
        """
        if self.engine is not None:
            self.engine.reset()

    def __call__(self, frames=None, ego_history=None, speed=None, **kwargs) -> dict:
        """``pipe(frames, ego_history, speed)`` is :meth:`step` (the one call of every pipeline).

        Example:
            >>> out = pipe(frames, history, speed)                                     # doctest: +SKIP
        """
        if "images" in kwargs or "prompt" in kwargs:
            raise InvalidInputError("the driving pipeline takes frames, an ego history and a speed, not images and a "
                                    "prompt: pipe(frames, ego_history, speed) or pipe.step(...)")
        return self.step(frames, ego_history, speed, **kwargs)

    @classmethod
    def _from_config(cls, target, config, drafter=None, dtype=None, device_map=None, trust_remote_code=False,
                     **kw):
        flashdrive = kw.pop("flashdrive", None)
        if drafter is not None:  # a reasoning drafter is FlashDrive's speculative reasoning (exact) on the engine
            from .flashdrive import FlashDriveConfig

            if drafter == "auto":
                drafter = None  # the bundled drafter
            base = FlashDriveConfig.parse(flashdrive) or FlashDriveConfig.parse("vision_cache,system")
            flashdrive = dataclasses.replace(base, spec=True, drafter=drafter)
        if kw:
            raise InvalidInputError(f"the driving pipeline takes no further loading arguments but flashdrive= "
                                    f"(got {sorted(kw)})")
        vla = DrivingVLA.from_pretrained(target, dtype="auto" if dtype is None else dtype)
        if device_map is not None:
            if not isinstance(device_map, (str, torch.device)) or str(device_map) == "auto":
                raise InvalidInputError(f"the driving VLA runs on one device: pass device_map='cpu', 'cuda', "
                                        f"'cuda:1'... (got {device_map!r})")
            vla.to(torch.device(device_map))
        return cls(vla, flashdrive=flashdrive)

    def _frames(self, frames, cameras=None) -> list:
        """The frames as RGB PIL images through the shared loader, as many as the model was trained on."""
        from mmspec.vision import load_image

        if not isinstance(frames, (list, tuple)):
            raise InvalidInputError(f"frames must be a list of frames (per camera, oldest first), not "
                                    f"{type(frames).__name__}")
        cameras = self.cameras if cameras is None else cameras
        need = self.frames_per_camera * len(cameras)
        if len(frames) != need:
            raise InvalidInputError(f"{len(frames)} frames for cameras {list(cameras)}: the model was trained on "
                                    f"{self.frames_per_camera} frames per camera ({need} in all, oldest first)")
        images = []
        for i, f in enumerate(frames):
            try:
                images.append(load_image(f))
            except InvalidImageError as e:
                raise InvalidImageError(f"frame {i}: {e}") from e
        return images

    @property
    def tokenizer(self):
        """The backbone's tokenizer (what ``mmspec train`` fingerprints a drafter with)."""
        return self.vla.processor.tokenizer

    def prepare(self, images=None, prompt=None) -> dict:
        """The backbone's processor inputs for one request (chat template, frames), exactly as a plain :meth:`step`
        sends them to ``generate``: what ``mmspec train`` (whose data stage calls ``pipe.prepare``) regenerates the
        VLA's own reasoning from, so a reasoning drafter (``--kind glance --workload driving``) learns from the
        states it meets at run time.

        Example:
            >>> ex = get_workload("driving").example("train", 0)                       # doctest: +SKIP
            >>> pipe.prepare(images=ex.images, prompt=ex.prompt)["input_ids"].shape    # doctest: +SKIP
            torch.Size([1, 279])
        """
        from mmspec.vision.testbed import make_batch
        from mmspec.workloads import Example

        if not isinstance(prompt, str) or not prompt:
            raise InvalidInputError("the driving pipeline prepares one request: a non-empty prompt string")
        images = self._frames(list(images or []))
        return make_batch(self.vla.processor, [Example(id="", prompt=prompt, target="", images=images)], train=False)

    @staticmethod
    def _history(ego_history) -> np.ndarray:
        try:
            hist = np.asarray(ego_history, dtype=np.float64)
        except (TypeError, ValueError) as e:
            raise InvalidInputError(f"the ego history must be a [{HISTORY_TICKS}, 3] array of numbers: {e}") from e
        if hist.shape != (HISTORY_TICKS, 3):
            raise InvalidInputError(f"the ego history must be [{HISTORY_TICKS}, 3] (x, y, yaw of the last "
                                    f"{HISTORY_TICKS} ticks in the ego frame, oldest first); got shape {hist.shape}")
        if not np.isfinite(hist).all():
            raise InvalidInputError("the ego history contains NaN or infinite values")
        return hist

    @staticmethod
    def _speed(speed) -> float:
        ok = isinstance(speed, (int, float, np.integer, np.floating)) and not isinstance(speed, bool)
        if not ok or not math.isfinite(float(speed)) or not 0.0 <= float(speed) <= MAX_SPEED_MPS:
            raise InvalidInputError(f"speed must be a finite number of m/s in [0, {MAX_SPEED_MPS:g}] (got {speed!r})")
        return float(speed)

    def _sync(self):
        dev = self.vla.backbone.device
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    def _cameras(self, cameras) -> tuple:
        if cameras is None:
            return self.cameras
        cameras = (cameras,) if isinstance(cameras, str) else tuple(cameras)
        bad = [c for c in cameras if c not in self.trained_cameras]
        if bad or not cameras:
            raise InvalidInputError(f"cameras {list(cameras)}: this model was trained on cameras "
                                    f"{list(self.trained_cameras)}")
        return cameras

    @torch.no_grad()
    def step(self, frames, ego_history, speed: float, num_samples: int = 1, seed: int = 0, tick=None,
             cameras=None) -> dict:
        """One tick. ``frames``: PIL images or arrays (per camera, oldest first); ``ego_history[16, 3]``
        (x, y, yaw in the current ego frame); ``speed`` in m/s; ``tick`` the tick index in the clip (what
        FlashDrive's streaming checks continuity by); ``cameras`` this tick's cameras (default the pipeline's).
        Returns ``reasoning`` (and its token ids, ``tokens``), ``trajectory[64, 2]`` (the first sample),
        ``trajectories[num_samples, 64, 2]``, ``actions``, ``num_decode_tokens`` and ``timings_ms`` (``preprocess``, ``encode``, ``prefill``,
        ``decode``, ``action``, ``total``: one trajectory, as a car executes; further samples for minADE are
        drawn after the clock stops); with ``flashdrive`` also ``stream`` (``"reuse"`` or why a full prefill ran)
        and ``head_calls``, and with speculative reasoning ``spec_rounds`` (target passes after the prefill).

        Frames may be paths, PIL images or arrays (uint8, or floats in ``[0, 1]``), read by the same loader as
        the VLM pipeline's images. Raises :class:`~mmspec.InvalidInputError` (before the model runs) on a
        frame count other than the trained one, an ego history that is not ``[16, 3]`` and finite, a speed
        that is not a finite number in ``[0, MAX_SPEED_MPS]``, a bad ``num_samples`` / ``seed`` / ``tick``, or
        (streaming with ``on_break="error"``) a tick that does not continue the stream."""
        from mmspec.vision.testbed import _chat_prompts
        from mmspec.workloads import Example

        cameras = self._cameras(cameras)
        images = self._frames(frames, cameras)
        hist, speed = self._history(ego_history), self._speed(speed)
        if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
            raise InvalidInputError(f"num_samples must be a positive integer (got {num_samples!r})")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise InvalidInputError(f"seed must be an integer (got {seed!r})")
        if tick is not None and (isinstance(tick, bool) or not isinstance(tick, (int, np.integer))):
            raise InvalidInputError(f"tick must be an integer tick index (got {tick!r})")
        prompt = driving_prompt(cameras, self.frames_per_camera, hist, speed)
        example = Example(id="", prompt=prompt, target="", images=images)
        clock = StageClock(self._sync, start="preprocess")
        try:
            if self.engine is not None:
                res = self.engine.step(images, _chat_prompts(self.vla.processor, [example])[0], cameras, speed,
                                       tick=tick, num_samples=num_samples, seed=seed, clock=clock)
            else:
                res = self._generate_and_act(example, num_samples, seed, clock)
        finally:
            clock.close()
        trajs = integrate_actions(res["actions"], np.full(num_samples, float(speed)))
        return {**res, "trajectory": trajs[0], "trajectories": trajs}

    def _generate_and_act(self, example, num_samples: int, seed: int, clock: StageClock) -> dict:
        """The plain tick after validation, on ``clock`` (running ``preprocess``): the processor, ``generate`` (its
        encode, prefill and decode forwards timed by hooks; its own work between them is the ``generate`` range,
        in ``total`` only) and the expert's sample (``action``); further samples after the clock stops."""
        from mmspec.vision.testbed import make_batch

        backbone, proc = self.vla.backbone, self.vla.processor
        inputs = make_batch(proc, [example], train=False)
        inputs = {k: v.to(backbone.device) if torch.is_tensor(v) else v for k, v in inputs.items()}
        # transformers 5 encodes the images before the first forward (generate's mm_encoder_outputs); older
        # versions inside it: the clock goes back to the stage a hook interrupted, so encode time nested in a
        # forward is not that forward's prefill.
        back, forwards = {}, []

        def pre_visual(*_):
            back["visual"] = clock.to("encode")

        def post_visual(*_):
            clock.to(back.pop("visual"))

        def pre_model(*_):
            back["model"] = clock.to("decode" if forwards else "prefill")

        def post_model(*_):
            forwards.append(1)
            clock.to(back.pop("model"))

        hooks = [backbone.model.visual.register_forward_pre_hook(pre_visual),
                 backbone.model.visual.register_forward_hook(post_visual),
                 backbone.register_forward_pre_hook(pre_model), backbone.register_forward_hook(post_model)]
        clock.to("generate")
        try:
            out = backbone.generate(**inputs, max_new_tokens=self.max_reasoning_tokens, do_sample=False,
                                    return_dict_in_generate=True, output_logits=True)
        finally:
            for h in hooks:
                h.remove()
        clock.to("action")
        # transformers >= 5.25 names it ``cache`` (``past_key_values`` still answers, with a deprecation warning)
        cache = out.cache if getattr(out, "cache", None) is not None else out.past_key_values
        L = cache.get_seq_length()
        # Batch 1: the continuation position is the cache length plus the model's M-RoPE delta.
        start = L + backbone.model.rope_deltas.view(-1)[:1].to(torch.long)
        valid = torch.ones(1, L, dtype=torch.bool, device=backbone.device)
        gen = torch.Generator(device=backbone.device).manual_seed(int(seed))
        acts = [self.vla.expert.sample(cache, start, valid, generator=gen)]
        clock.to(None)
        # Further samples (minADE over K) after the clock stops: a car executes one trajectory.
        acts += [self.vla.expert.sample(cache, start, valid, generator=gen) for _ in range(num_samples - 1)]
        new = out.sequences[0, inputs["input_ids"].shape[1]:]
        return {"reasoning": proc.tokenizer.decode(new, skip_special_tokens=True),
                "actions": torch.cat(acts).float().cpu().numpy(), "num_decode_tokens": int(len(new)),
                "tokens": new.tolist(), "timings_ms": clock.timings_ms(), "first_logits": out.logits[0][0].float().cpu()}


def model_policy(pipe, handover_tick: int = 20, replan_every: int = 5, seed: int = 0, on_plan=None):
    """A ``simulate`` policy in which ``pipe`` (a :class:`~mmspec.drivers.pipeline.DrivingPipeline`) drives: the
    expert before ``handover_tick`` (history for the model), then a plan from the current frames and ego history
    every ``replan_every`` ticks (``1``: every tick, 10 Hz, as a real stack), whose (accel, curvature) steps the ego
    executes. Each plan passes its tick index (a streaming pipeline checks continuity by it); ``on_plan(tick,
    result)`` sees every plan (timings).

    Example:
        >>> from mmspec.drivers.pipeline import DrivingPipeline                      # doctest: +SKIP
        >>> from mmspec.drivers.world import scenario_for, simulate, safety_events  # doctest: +SKIP
        >>> pipe = DrivingPipeline(DrivingVLA.from_pretrained(bundled_vla()))      # doctest: +SKIP
        >>> sim = simulate(scenario_for("test", 0, 0, "cruise"), 8.0, model_policy(pipe))  # doctest: +SKIP
        >>> safety_events(sim, 20)["offroad"]                                       # doctest: +SKIP
        False
    """
    from .clips import ego_history  # the name of step()'s argument in this module

    plan, frames = {}, {}
    if hasattr(pipe, "reset"):
        pipe.reset()  # a new drive: no streaming state from the last one

    def policy(sim, k):
        if k < handover_tick:
            return None
        if (k - handover_tick) % replan_every == 0:
            for t in range(k - 3, k + 1):  # each tick's frame is rendered once (the window slides over them)
                if t not in frames:
                    frames[t] = render_frame(sim, t)
            res = pipe.step([frames[t] for t in range(k - 3, k + 1)], ego_history(sim.ego, k), float(sim.ego[k][3]),
                            seed=seed + k, tick=k)
            plan["actions"], plan["start"] = res["actions"][0], k
            if on_plan is not None:
                on_plan(k, res)
        a = plan["actions"][k - plan["start"]]
        return float(a[0]), float(a[1])

    return policy
