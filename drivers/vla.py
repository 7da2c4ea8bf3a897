"""A small driving VLA shaped like Alpamayo: a Qwen2-VL backbone that writes the chain-of-causation, then a
flow-matching action expert that reads the backbone's KV cache and integrates a 6.4 s trajectory.

Layout (NVlabs/alpamayo, at small scale):

* **backbone**: ``Qwen2VLForConditionalGeneration`` over the camera frames and a prompt carrying the ego
  history; it generates the reasoning sentence greedily;
* **action expert** (:class:`TrajectoryExpert`): a second text decoder built from the backbone's *text
  config* (same layers and KV heads, so layer ``i`` attends to the backbone's layer-``i`` cache), without
  token embeddings; 64 action tokens enter through ``in_proj([x_t, time embedding])``, attend to the whole
  cache (prompt, images, reasoning) and to each other, and ``out_proj`` gives the flow velocity; the cache is
  cropped back after every call, so the N Euler steps all read the same context;
* **action space**: per step (accel, curvature) of the unicycle, scaled to unit range; integrating it from
  the current speed gives the 64 waypoints (kinematically feasible by construction).

Flow matching (rectified flow): ``x_t = (1 - t) x_0 + t x_1`` with ``x_0 ~ N(0, I)`` and ``x_1`` the scaled
expert actions; the expert regresses ``x_1 - x_0``; sampling integrates ``dx/dt = v`` from ``t = 0`` to ``1``
in ``num_steps`` Euler steps (10 by default, as Alpamayo).

Example:
    >>> expert = TrajectoryExpert(backbone.config.text_config)                      # doctest: +SKIP
    >>> traj = integrate_actions(expert.sample(cache, start, mask), speed)          # doctest: +SKIP
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from mmspec.errors import InvalidInputError
from mmspec.lean import rms_norm, run_layers, why_not as lean_why_not

from .bundled import EXPERT_CONFIG, EXPERT_NAME, STUDENT_INFO
from .clips import FRAMES_PER_CAMERA
from .world import DT

__all__ = ["TrajectoryExpert", "ACTION_MEAN", "ACTION_SCALE", "LEGACY_NORMALIZATION", "integrate_actions",
           "time_embedding", "expert_attention_mask", "attention_mask_for", "next_text_positions", "StepCache",
           "LeanExpert", "DrivingVLA", "save_expert", "load_expert", "TRAINED_CAMERAS", "TRAINED_FRAMES", "backbone_hash",
           "student_info", "load_student"]

# Per-dimension normalisation of (accel m/s^2, curvature 1/m): the expert driver's mean and standard deviation
# over 60 train clips (-0.50 +- 1.02; 0.000 +- 0.0066). Flow matching starts from unit noise, so each action
# dimension must span about unit range: with a fixed (4, 0.1) scale the curvature spread was 0.07 of the
# noise's and the lateral error dominated minADE (road curvature 0.01 for 6.4 s at 10 m/s is 20 m).
ACTION_MEAN = (-0.5, 0.0)
ACTION_SCALE = (1.0, 0.0066)
LEGACY_NORMALIZATION = {"action_mean": (0.0, 0.0), "action_scale": (4.0, 0.1)}  # checkpoints saved before


def time_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal embedding ``[B, dim]`` of flow times ``t[B]`` in ``[0, 1]``.

    Example:
        >>> time_embedding(torch.tensor([0.0, 1.0]), 8).shape
        torch.Size([2, 8])
    """
    half = dim // 2
    freqs = torch.exp(-math.log(1000.0) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
    ang = t.float()[:, None] * 1000.0 * freqs[None]
    emb = torch.cat([ang.sin(), ang.cos()], -1)
    return F.pad(emb, (0, dim - emb.shape[-1]))


def integrate_actions(actions, speed, dt: float = DT) -> np.ndarray:
    """Waypoints ``[B, N, 2]`` (x forward, y left, ego frame) from ``actions[B, N, 2]`` (accel, curvature)
    and the current ``speed[B]``, with the world's unicycle (position first, then yaw and speed).

    Example:
        >>> integrate_actions(np.zeros((1, 3, 2)), np.array([10.0]))[0, :, 0].round(3).tolist()
        [1.0, 2.0, 3.0]
    """
    a = np.asarray(actions, dtype=np.float64)
    B, N, _ = a.shape
    x = np.zeros(B)
    y = np.zeros(B)
    yaw = np.zeros(B)
    v = np.asarray(speed, dtype=np.float64).reshape(B).copy()
    out = np.zeros((B, N, 2))
    for k in range(N):
        x, y = x + v * np.cos(yaw) * dt, y + v * np.sin(yaw) * dt
        yaw, v = yaw + v * a[:, k, 1] * dt, np.maximum(0.0, v + a[:, k, 0] * dt)
        out[:, k, 0], out[:, k, 1] = x, y
    return out


def expert_attention_mask(prefix_valid: torch.Tensor, n_actions: int, implementation: str, dtype):
    """``[B, 1, N, L + N]`` mask for the action tokens: every valid cached position, and all action tokens
    (bidirectional); bool for sdpa, additive for eager."""
    B, L = prefix_valid.shape
    allowed = torch.cat([prefix_valid[:, None, :].expand(B, n_actions, L),
                         torch.ones(B, n_actions, n_actions, dtype=torch.bool, device=prefix_valid.device)], dim=2)
    return attention_mask_for(allowed[:, None], implementation, dtype)


def attention_mask_for(allowed: torch.Tensor, implementation: str | None, dtype) -> torch.Tensor:
    """A ``bool`` 4-D mask (true: may attend) in the form ``implementation`` takes: as is for sdpa, additive
    (``0`` / the dtype's minimum) otherwise. Why: eager attention adds the mask to the scores, and a bool mask
    added is ``0``/``1``: nothing would be masked.

    Example:
        >>> attention_mask_for(torch.tensor([[[[True, False]]]]), "eager", torch.float32)[0, 0, 0, 1].item() < -1e30
        True
    """
    if (implementation or "sdpa") == "sdpa":
        return allowed
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(~allowed, torch.finfo(dtype).min)


def next_text_positions(model, inputs: dict) -> torch.Tensor:
    """``[B]``: the M-RoPE text position right after each row's last real token of ``inputs`` (processor
    outputs with ``attention_mask``), from the model's own ``get_rope_index`` (padding-aware), where the
    action tokens continue the sequence. (transformers' ``generate`` continues a *left-padded* row at
    ``cache length + rope_deltas`` instead, which counts the padding; at batch 1 the two agree.)"""
    ids = inputs["input_ids"]
    mask = inputs.get("attention_mask")
    mask = torch.ones_like(ids) if mask is None else mask
    pos, _ = model.model.get_rope_index(ids, inputs["mm_token_type_ids"], image_grid_thw=inputs.get("image_grid_thw"),
                                        video_grid_thw=inputs.get("video_grid_thw"), attention_mask=mask)
    pos = pos[-3:] if pos.shape[0] == 4 else pos
    return pos.masked_fill(~mask.bool()[None], -1).amax(dim=(0, 2)) + 1


class TrajectoryExpert(nn.Module):
    """The flow-matching action expert over a Qwen2-VL backbone's KV cache (see the module docstring).

    Args:
        text_config: the backbone's text config (copied; the expert has the same layers and KV heads).
        horizon: action tokens (64: 6.4 s at 10 Hz).
        num_steps: Euler steps at sampling time.
    """

    def __init__(self, text_config, horizon: int = 64, num_steps: int = 10, action_mean=ACTION_MEAN,
                 action_scale=ACTION_SCALE):
        super().__init__()
        from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLTextModel

        cfg = copy.deepcopy(text_config)
        self.decoder = Qwen2VLTextModel(cfg)
        self.decoder.embed_tokens = None  # actions come in as embeddings (Alpamayo deletes them too)
        H = cfg.hidden_size
        self.hidden_size, self.horizon, self.num_steps = H, int(horizon), int(num_steps)
        self.in_proj = nn.Sequential(nn.Linear(2 + H, H), nn.SiLU(), nn.Linear(H, H))
        self.out_proj = nn.Linear(H, 2)
        self.register_buffer("action_mean", torch.tensor(action_mean, dtype=torch.float32), persistent=False)
        self.register_buffer("action_scale", torch.tensor(action_scale, dtype=torch.float32), persistent=False)

    def velocity(self, x_t, t, cache, position_start, prefix_valid, mask=None, positions=None, t_emb=None):
        """Flow velocity ``[B, N, 2]`` at ``x_t[B, N, 2]``, times ``t[B]``; ``cache`` (the backbone's
        ``DynamicCache``, left as it was on return), ``position_start[B]`` (the text position after the cached sequence, M-RoPE deltas
        included), ``prefix_valid[B, L]`` (which cached positions are real tokens). ``mask``, ``positions``
        (``[3, B, N]``) and ``t_emb`` (``[B, hidden]``) may be passed precomputed (they are fixed for a given
        cache length, horizon and step: FlashDrive's system level builds them once per tick, not per call)."""
        B, N, _ = x_t.shape
        if t_emb is None:
            t_emb = time_embedding(t, self.hidden_size)
        # The flow state stays float32 (the same noise and Euler sums in any dtype); the expert runs in its own.
        w = self.out_proj.weight.dtype
        emb = self.in_proj(torch.cat([x_t.to(w), t_emb[:, None].expand(B, N, -1).to(w)], dim=-1))
        if positions is None:
            pos = (position_start[:, None] + torch.arange(N, device=x_t.device)[None]).long()
            positions = pos[None].expand(3, B, N)
        if mask is None:
            mask = expert_attention_mask(prefix_valid, N, self.decoder.config._attn_implementation or "sdpa", emb.dtype)
        # Every call reads the same context: the layers' tensors are put back afterwards (not cropped, so no
        # autograd history of this call stays attached to the cache across training steps).
        saved = [(layer.keys, layer.values) for layer in cache.layers]
        try:
            out = self.decoder(inputs_embeds=emb, attention_mask={"full_attention": mask},
                               position_ids=positions, cache=cache, use_cache=True)
        finally:
            for layer, (k, v) in zip(cache.layers, saved):
                layer.keys, layer.values = k, v
        return self.out_proj(out.last_hidden_state)

    def loss(self, actions, cache, position_start, prefix_valid, generator=None):
        """Rectified-flow loss for expert ``actions[B, N, 2]`` (accel, curvature), one random time per row."""
        x1 = (actions - self.action_mean) / self.action_scale
        x0 = torch.randn(x1.shape, generator=generator, device=x1.device, dtype=x1.dtype)
        t = torch.rand(x1.shape[0], generator=generator, device=x1.device, dtype=x1.dtype)
        xt = (1 - t)[:, None, None] * x0 + t[:, None, None] * x1
        return F.mse_loss(self.velocity(xt, t, cache, position_start, prefix_valid), x1 - x0)

    @torch.no_grad()
    def sample(self, cache, position_start, prefix_valid, num_steps: int | None = None, generator=None,
               batch_size: int | None = None, step_cache: "StepCache | None" = None, precompute: bool = False,
               stats: dict | None = None, lean: bool = False):
        """Actions ``[B, N, 2]`` (accel, curvature) by Euler integration of the flow from noise.

        ``step_cache`` (a :class:`StepCache`) reuses the last velocity on some steps instead of calling the
        expert (FlashDrive's step caching); ``precompute`` builds the mask, positions and time embeddings once
        for all steps; ``lean`` runs the head calls through :class:`LeanExpert` (the same numbers, built once for
        all steps; where it cannot run this decoder, the usual path runs); ``stats`` (a dict) gets ``head_calls``
        and ``steps``."""
        steps = int(num_steps or self.num_steps)
        B = batch_size or position_start.shape[0]
        dev = self.out_proj.weight.device
        x = torch.randn(B, self.horizon, 2, generator=generator, device=dev)
        ts = [torch.full((B,), i / steps, device=dev) for i in range(steps)]
        runner = None
        if lean and not self.training and B == position_start.shape[0] and not LeanExpert.why_not(self):
            runner = LeanExpert(self, cache, position_start, prefix_valid)
        fixed = {}
        if precompute and runner is None:
            N = self.horizon
            pos = (position_start[:, None] + torch.arange(N, device=dev)[None]).long()
            fixed["positions"] = pos[None].expand(3, B, N)
            fixed["mask"] = expert_attention_mask(prefix_valid, N, self.decoder.config._attn_implementation or "sdpa",
                                                  self.out_proj.weight.dtype)
        plan = step_cache.planner(steps) if step_cache is not None else None
        v, calls = None, 0
        for i in range(steps):
            if plan is None or plan.compute(i):
                if runner is not None:
                    v = runner.velocity(x, time_embedding(ts[i], self.hidden_size))
                else:
                    t_emb = time_embedding(ts[i], self.hidden_size) if precompute else None
                    v = self.velocity(x, ts[i], cache, position_start, prefix_valid, t_emb=t_emb, **fixed)
                calls += 1
                if plan is not None:
                    plan.observe(i, v)
            x = x + v / steps
        if stats is not None:
            stats["head_calls"] = stats.get("head_calls", 0) + calls
            stats["steps"] = stats.get("steps", 0) + steps
        return x * self.action_scale + self.action_mean


class LeanExpert:
    """The action expert's head calls of one tick over a fixed context, without the transformers call stack.

    Every head call of a tick reads the same cache, at the same positions, under the same mask, with 64 action
    tokens: fixed shapes. Built once per tick (:meth:`TrajectoryExpert.sample` with ``lean=True``): the M-RoPE
    cos/sin of the action positions (the decoder recomputes them every call), the mask (none when every cached
    position is valid: the action tokens then see everything), and per layer one K/V buffer holding the cached
    context with room for the action tokens (the decoder concatenates the cache with them every call). A call
    runs the layers' own weights through the ops of ``Qwen2VLTextModel`` (RMSNorm, projections, rotation, SiLU MLP)
    and SDPA over the key/value heads (``enable_gqa``; the decoder repeats K/V to the query heads), writing the action
    K/V into the buffers' tails: the same numbers (tested bit for bit in fp32 and bf16), without the modules'
    ``__call__``, the decorators, the concatenation, ``repeat_kv`` and the set-up of every call. :meth:`why_not` says
    when a decoder is not one it can run (then the expert's own path runs).

    Example:
        >>> lean = LeanExpert(expert, cache, start, valid)                              # doctest: +SKIP
        >>> torch.equal(lean.velocity(x, t_emb), expert.velocity(x, t, cache, start, valid, t_emb=t_emb))  # doctest: +SKIP
        True
    """

    def __init__(self, expert: "TrajectoryExpert", cache, position_start, prefix_valid):
        dec = expert.decoder
        self.expert, self.dec = expert, dec
        w = expert.out_proj.weight
        B, N = position_start.shape[0], expert.horizon
        pos = (position_start[:, None] + torch.arange(N, device=w.device)[None]).long()
        positions = pos[None].expand(3, B, N)
        self.mask = None if bool(prefix_valid.all()) else expert_attention_mask(prefix_valid, N, "sdpa", w.dtype)
        cos, sin = dec.rotary_emb(torch.empty(0, device=w.device, dtype=w.dtype), positions)
        self.cos, self.sin = cos.unsqueeze(1), sin.unsqueeze(1)
        self.B, self.N = B, N
        self.kv = []
        for c in cache.layers:
            L = c.keys.shape[2]
            buf = []
            for t in (c.keys, c.values):  # [B, Hkv, L + N, D], the context written once
                b = t.new_empty(t.shape[0], t.shape[1], L + N, t.shape[3])
                b[:, :, :L] = t
                buf.append(b)
            self.kv.append((buf[0], buf[1], L))

    @staticmethod
    def why_not(expert: "TrajectoryExpert") -> str:
        """``""`` when :class:`LeanExpert` runs this expert's decoder, else why not (then its own path runs)."""
        return lean_why_not(expert.decoder)

    def velocity(self, x_t: torch.Tensor, t_emb: torch.Tensor) -> torch.Tensor:
        """:meth:`TrajectoryExpert.velocity` at ``x_t[B, N, 2]`` with the time embedding ``t_emb[B, hidden]``."""
        e, B, N = self.expert, self.B, self.N
        w = e.out_proj.weight.dtype
        h = e.in_proj(torch.cat([x_t.to(w), t_emb[:, None].expand(B, N, -1).to(w)], dim=-1))

        def kv(i, k, v):  # the action tokens' K/V into the buffer's tail, after the context written once
            bk, bv, L = self.kv[i]
            bk[:, :, L:] = k
            bv[:, :, L:] = v
            return bk, bv

        h = run_layers(self.dec.layers, h, self.cos, self.sin, self.mask, kv)
        return e.out_proj(rms_norm(h, self.dec.norm))


class StepCache:
    """Which Euler steps of the flow-matching head reuse the last velocity instead of calling the expert.

    ``mode="adaptive"``: after each computed velocity the relative change per step since the previous computed
    one, ``||v_i - v_j|| / ||v_j|| / (i - j)``, is added up over the following steps; a step reuses the last
    velocity while that running estimate stays under ``threshold`` (at most ``max_skip`` steps in a row), and
    computes (resetting the estimate) otherwise. The first ``warmup`` steps always compute. ``threshold=0``
    never skips: exactly the uncached integration. ``mode="fixed"``: the steps in ``cache_steps`` reuse
    (FlashDrive's released schedule, ``(3, 4, 5, 6)`` of 10).

    Example:
        >>> plan = StepCache("fixed", cache_steps=(1, 2)).planner(4)
        >>> [plan.compute(i) for i in range(4)]
        [True, False, False, True]
    """

    def __init__(self, mode: str = "adaptive", threshold: float = 0.05, cache_steps=(3, 4, 5, 6), warmup: int = 2,
                 max_skip: int = 3):
        if mode not in ("adaptive", "fixed"):
            raise InvalidInputError(f"step cache mode must be 'adaptive' or 'fixed', not {mode!r}")
        if not threshold >= 0:
            raise InvalidInputError(f"step cache threshold must be >= 0 (got {threshold!r})")
        self.mode, self.threshold, self.cache_steps = mode, float(threshold), tuple(int(s) for s in cache_steps)
        self.warmup, self.max_skip = int(warmup), int(max_skip)
        if mode == "fixed" and 0 in self.cache_steps:
            raise InvalidInputError("step 0 has no velocity to reuse: cache_steps must not contain 0")

    def planner(self, steps: int) -> "_StepPlan":
        """A fresh per-integration decision object for ``steps`` Euler steps."""
        return _StepPlan(self, steps)

    def __repr__(self):
        if self.mode == "fixed":
            return f"StepCache('fixed', cache_steps={self.cache_steps})"
        return f"StepCache('adaptive', threshold={self.threshold:g})"


class _StepPlan:
    def __init__(self, cfg: StepCache, steps: int):
        self.cfg, self.steps = cfg, steps
        self.last = None  # (step, velocity) of the last computed velocity
        self.rate, self.acc, self.skipped = None, 0.0, 0

    def compute(self, i: int) -> bool:
        cfg = self.cfg
        if cfg.mode == "fixed":
            return i not in cfg.cache_steps
        if i < cfg.warmup or self.rate is None or self.skipped >= cfg.max_skip:
            return True
        self.acc += self.rate
        if self.acc < cfg.threshold:
            self.skipped += 1
            return False
        return True

    def observe(self, i: int, v) -> None:
        if self.last is not None:
            j, prev = self.last
            self.rate = float((v - prev).norm() / prev.norm().clamp_min(1e-12)) / (i - j)
        self.last, self.acc, self.skipped = (i, v), 0.0, 0


# ---------------------------------------------------------------------------- the VLA as one object
TRAINED_CAMERAS, TRAINED_FRAMES = "mmspec_cameras", "mmspec_frames_per_camera"
"""``config.json`` keys of a driving VLA: the cameras and frames per camera it was trained on (absent in
folders saved before them: the workload's defaults, ``["front"]`` and 4)."""


class DrivingVLA(torch.nn.Module):
    """Backbone (``Qwen2VLForConditionalGeneration``) + :class:`~mmspec.drivers.vla.TrajectoryExpert`, saved
    together: the backbone with ``save_pretrained`` (with its processor), the expert beside it."""

    def __init__(self, backbone, processor, expert: TrajectoryExpert):
        super().__init__()
        self.backbone, self.expert = backbone, expert
        self.processor = processor

    def save_pretrained(self, path: str, dtype=None) -> None:
        """Backbone, processor and expert under ``path``; ``dtype`` (e.g. ``torch.bfloat16``) stores the
        weights compactly (loading upcasts to float32)."""
        from mmspec.checkpoints import save_hf_compact
        from mmspec.pipelines import TASK_KEY

        os.makedirs(path, exist_ok=True)
        # The folder says what it is, so MMSpecPipeline.from_pretrained returns a DrivingPipeline for it (the
        # backbone alone is a plain qwen2_vl), and what it was trained on, so requests are checked against it.
        config = self.backbone.config
        setattr(config, TASK_KEY, "driving")
        if getattr(config, TRAINED_CAMERAS, None) is None:
            setattr(config, TRAINED_CAMERAS, ["front"])  # DrivingWorkload's default cameras and frame count
        if getattr(config, TRAINED_FRAMES, None) is None:
            setattr(config, TRAINED_FRAMES, FRAMES_PER_CAMERA)
        if dtype is None:
            self.backbone.save_pretrained(path)
        else:
            save_hf_compact(self.backbone, path, dtype)
        self.processor.save_pretrained(path)
        save_expert(self.expert, path, dtype)

    @classmethod
    def from_pretrained(cls, path: str, dtype="auto") -> "DrivingVLA":
        """Load a VLA saved by :meth:`save_pretrained`; ``dtype="auto"`` runs it in the dtype its weights are
        stored in (bf16 for the bundled one), ``"float32"`` (what training resumes in) or another name.

        Example:
            >>> DrivingVLA.from_pretrained(VLA_DIR).backbone.dtype                  # doctest: +SKIP
            torch.bfloat16
        """
        from transformers import AutoProcessor, Qwen2VLForConditionalGeneration

        from mmspec.checkpoints import resolve_dtype
        from mmspec.checks import check_local_folder

        path = check_local_folder(path, "driving VLA folder")  # said at once, not tried as a hub id
        if not os.path.isfile(os.path.join(path, EXPERT_CONFIG)):
            raise InvalidInputError(f"{path} is not a driving VLA folder (no {EXPERT_CONFIG}: "
                                    "DrivingVLA.save_pretrained writes the backbone and the action expert together)")
        dtype = resolve_dtype(dtype, path)
        backbone = Qwen2VLForConditionalGeneration.from_pretrained(path, dtype=dtype).eval()
        expert = load_expert(path, backbone.config.text_config)
        vla = cls(backbone, AutoProcessor.from_pretrained(path), expert.to(backbone.dtype).eval())
        vla.name_or_path = os.path.abspath(path)  # a distilled expert checks it was distilled on this backbone
        return vla


def save_expert(expert: TrajectoryExpert, path: str, dtype=None) -> None:
    """The action expert's weights and settings (horizon, Euler steps, normalisation) under ``path``.

    Example:
        >>> save_expert(vla.expert, "/tmp/vla")                                       # doctest: +SKIP
    """
    from mmspec.checkpoints import save_state_compact

    os.makedirs(path, exist_ok=True)
    save_state_compact(expert.state_dict(), os.path.join(path, EXPERT_NAME), dtype)
    with open(os.path.join(path, EXPERT_CONFIG), "w") as f:
        json.dump({"horizon": expert.horizon, "num_steps": expert.num_steps,
                   "action_mean": expert.action_mean.tolist(), "action_scale": expert.action_scale.tolist()}, f)


def load_expert(path: str, text_config) -> TrajectoryExpert:
    """The action expert saved by :func:`save_expert` under ``path`` (float32 weights as stored, upcast), for a
    backbone with ``text_config``.

    Example:
        >>> load_expert("drivers/assets/driving-vla", vla.backbone.config.text_config).num_steps   # doctest: +SKIP
        10
    """
    from safetensors.torch import load_file

    with open(os.path.join(path, EXPERT_CONFIG)) as f:
        expert = TrajectoryExpert(text_config, **{**LEGACY_NORMALIZATION, **json.load(f)})
    expert.load_state_dict(load_file(os.path.join(path, EXPERT_NAME)))  # copied into float32 parameters
    return expert.eval()


# ---------------------------------------------------------------------------- a distilled few-step expert (a student)
def backbone_hash(path: str) -> str:
    """The first 16 hex digits of the SHA-256 over a VLA folder's backbone weights (``model*.safetensors``, sorted):
    what a student was distilled on. A folder without them raises :class:`~mmspec.errors.InvalidInputError`.

    Example:
        >>> import tempfile
        >>> d = tempfile.mkdtemp()
        >>> _ = open(os.path.join(d, "model.safetensors"), "wb").write(b"weights")
        >>> backbone_hash(d)
        '39c2875015b458ee'
    """
    names = sorted(n for n in os.listdir(path) if n.startswith("model") and n.endswith(".safetensors")) \
        if os.path.isdir(path) else []
    if not names:
        raise InvalidInputError(f"{path} holds no backbone weights (model*.safetensors): not a saved VLA folder")
    from mmspec.checkpoints import file_sha256

    h = hashlib.sha256()
    for name in names:
        h.update(file_sha256(os.path.join(path, name)).encode())
    return h.hexdigest()[:16]


def student_info(path: str, vla_path: str) -> dict:
    """The record (``distill.json``) of the distilled expert in ``path``, checked against the VLA folder ``vla_path``:
    raises :class:`~mmspec.errors.InvalidInputError` unless ``path`` holds a student distilled on (or exported with)
    that backbone.

    Example:
        >>> student_info("vla/fewstep", "vla")["student_steps"]                  # doctest: +SKIP
        2
    """
    info_path = os.path.join(path, STUDENT_INFO)
    if not os.path.isfile(info_path) or not os.path.isfile(os.path.join(path, EXPERT_NAME)):
        raise InvalidInputError(f"{path} is not a distilled action expert (no {STUDENT_INFO} or {EXPERT_NAME}: "
                                "python -m mmspec.drivers.distill writes one)")
    with open(info_path) as f:
        info = json.load(f)
    have = backbone_hash(vla_path)
    if have != info["backbone_sha256_16"]:
        raise InvalidInputError(f"{path} was distilled on another backbone ({info['backbone_sha256_16']}, "
                                f"{vla_path}'s is {have}): distil it again on this VLA")
    return info


def load_student(path: str, vla: DrivingVLA, vla_path: str | None = None):
    """A distilled expert from ``path`` for ``vla`` (moved to its dtype and device). A student reads the backbone's
    cache, so one distilled on another backbone (a fine-tune, say) is refused: ``vla_path`` (default: the folder
    ``vla`` was loaded from, ``vla.name_or_path``) must hold the backbone it was distilled on; a VLA with no folder
    cannot be checked and is refused too.

    Example:
        >>> student = load_student("/tmp/fewstep", vla, "drivers/assets/driving-vla")   # doctest: +SKIP
    """
    vla_path = vla_path or getattr(vla, "name_or_path", None)
    if vla_path is None:
        raise InvalidInputError("cannot check which backbone this VLA is (it was not loaded from a folder): save it and "
                                "load it with DrivingVLA.from_pretrained before using a distilled expert")
    student_info(path, vla_path)
    p = next(vla.expert.parameters())
    return load_expert(path, vla.backbone.config.text_config).to(device=p.device, dtype=p.dtype).eval()
