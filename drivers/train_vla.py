"""The driving VLA as one object (backbone + action expert), its training on the driving workload, and its
evaluation (reasoning accuracy, minADE against a constant-velocity baseline).

Training, per step, on a batch of driving items (four front frames, the ego history in the prompt):
``loss = lm + aux_weight * aux + action_weight * flow + road_weight * road``. ``lm`` is the backbone's
cross-entropy on the reasoning sentence; ``aux`` is a dense loss on the *backbone's vision tower* (a linear
reader says which world classes, :data:`~mmspec.drivers.world.LABELS`, lie under each patch: the renderer
knows; from-scratch tiny VLMs otherwise learn the text prior and ignore the pixels, DESIGN.md); ``flow`` is the
action expert's rectified-flow loss on the expert driver's 64 (accel, curvature) steps, read from the
backbone's KV cache of prompt + reasoning (the final end-of-turn excluded, as at run time); ``road`` (optional)
makes the vision tokens say where the road runs ahead (:class:`RoadReader`).

Example:
    >>> vla = train_vla(VLATrainConfig(out="/tmp/vla", size="tiny", steps=2))          # doctest: +SKIP
    >>> evaluate_vla(vla, n=8)                                                         # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch

from mmspec.drafters.eagle import warmup_cosine
from mmspec.errors import InvalidInputError
from mmspec.train import add_config_arguments, trim_log
from mmspec.vision.testbed import PatchReader
from mmspec.workloads import get_workload

from .clips import FRAMES_PER_CAMERA
from .vla import (ACTION_MEAN, ACTION_SCALE, LEGACY_NORMALIZATION, TrajectoryExpert, attention_mask_for,
                  next_text_positions)
from .world import DT, LABELS, LOOKAHEAD_M

__all__ = ["DrivingVLA", "RoadReader", "VLATrainConfig", "VLA_SIZES", "build_vla", "train_vla", "evaluate_vla",
           "vla_losses", "constant_velocity", "closed_loop", "model_policy", "collect_rollouts", "score_step",
           "summarize_scores", "bundled_vla", "export_vla", "streaming_attention_mask", "save_expert", "load_expert",
           "expert_context"]

PATCH, MERGE = 14, 2
VLA_SIZES = {
    "tiny": dict(text=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2),
                 vision=dict(depth=1, embed_dim=64, num_heads=2, mlp_ratio=2)),
    "small": dict(text=dict(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
                            num_key_value_heads=2),
                  vision=dict(depth=2, embed_dim=128, num_heads=2, mlp_ratio=2)),
}
PIXELS = dict(min_pixels=28 * 28, max_pixels=224 * 112)  # the workload's frames pass unresized
EXPERT_NAME, EXPERT_CONFIG = "action_expert.safetensors", "action_expert.json"


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

        from .pipeline import TRAINED_CAMERAS, TRAINED_FRAMES

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


def build_vla(size: str = "small", tokenizer_texts: int = 2000, vocab_size: int = 512, seed: int = 0) -> DrivingVLA:
    """A fresh VLA: a Qwen2-VL with a tokenizer trained on the driving prompts and sentences, and an expert."""
    from mmspec.demo import build_qwen2vl, train_tokenizer
    from mmspec.vision.testbed import _rope
    from mmspec.vision.workloads import all_text

    texts = list(all_text(get_workload("driving"), "train", tokenizer_texts, include_prompts=True))
    spec = VLA_SIZES[size]
    text = dict(spec["text"], max_position_embeddings=1024, initializer_range=0.02,
                rope_parameters=_rope(spec["text"]["hidden_size"] // spec["text"]["num_attention_heads"]))
    backbone, processor = build_qwen2vl(train_tokenizer(texts, vocab_size), text=text, vision=dict(spec["vision"]),
                                        pixels=PIXELS, seed=seed)
    torch.manual_seed(seed + 1)
    return DrivingVLA(backbone, processor, TrajectoryExpert(backbone.config.text_config))


def _label_targets(example, grid_hw_per_image) -> torch.Tensor:
    """Multi-hot ``[n_merged, 4, len(LABELS)]`` over every image: the classes in each patch of each token."""
    out = []
    for lab, (h, w) in zip(example.meta["labels"], grid_hw_per_image):
        cells = torch.from_numpy(np.asarray(lab, dtype=np.int64)[: h * PATCH, : w * PATCH])
        onehot = torch.nn.functional.one_hot(cells, len(LABELS)).view(h, PATCH, w, PATCH, -1).amax(dim=(1, 3))
        merged = onehot.view(h // MERGE, MERGE, w // MERGE, MERGE, -1).permute(0, 2, 1, 3, 4)
        out.append(merged.reshape(-1, MERGE * MERGE, len(LABELS)).float())
    return torch.cat(out)


ROAD_SCALE_M = (0.45, 0.57, 1.23, 2.6)  # std of road_ahead on training items (perturb 0.3): unit-scale targets


class RoadReader(torch.nn.Module):
    """Where the road runs ahead (:func:`~mmspec.drivers.world.road_ahead`), read from one item's vision tokens:
    one learned query per look-ahead distance attends over the tokens, a linear map per query gives the position
    in units of :data:`ROAD_SCALE_M` (an auxiliary loss in training only, never saved with the VLA).

    Example:
        >>> RoadReader(8)([torch.zeros(5, 8), torch.zeros(3, 8)]).shape
        torch.Size([2, 4])
    """

    def __init__(self, hidden: int, n_out: int = len(LOOKAHEAD_M)):
        super().__init__()
        assert n_out == len(ROAD_SCALE_M), "one target scale per look-ahead distance"
        self.query = torch.nn.Parameter(torch.randn(n_out, hidden) * hidden ** -0.5)
        self.key = torch.nn.Linear(hidden, hidden)
        self.value = torch.nn.Linear(hidden, hidden)
        self.out = torch.nn.Parameter(torch.zeros(n_out, hidden))
        self.bias = torch.nn.Parameter(torch.zeros(n_out))

    def forward(self, tokens_per_item) -> torch.Tensor:
        rows = []
        for h in tokens_per_item:
            attn = torch.softmax(self.query @ self.key(h).T * h.shape[-1] ** -0.5, dim=-1)
            rows.append(((attn @ self.value(h)) * self.out).sum(-1) + self.bias)
        return torch.stack(rows)


def streaming_attention_mask(input_ids: torch.Tensor, attention_mask: torch.Tensor, vision_start_id: int,
                             vision_end_id: int) -> torch.Tensor:
    """``bool[B, 1, L, L]``: causal attention over real tokens, except that a frame's tokens (``<vision_start>`` to
    ``<vision_end>``) see no other frame, only the tokens before the first frame and their own frame.

    Why: FlashDrive's streaming reuse keeps a frame's KV for the ticks after it entered the window, while the frames
    before it leave one by one; a frame computed attending only to the prompt head and itself carries nothing of
    frames that have left (the authors fine-tune with such a mask). The text after the frames sees everything.

    Example:
        >>> ids = torch.tensor([[9, 3, 5, 4, 3, 5, 4, 8]])                # head, two frames, text
        >>> m = streaming_attention_mask(ids, torch.ones_like(ids), 3, 4)[0, 0]
        >>> m[5].int().tolist(), m[7].int().tolist()                      # second frame; text
        ([1, 0, 0, 0, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1, 1, 1])
    """
    B, L = input_ids.shape
    starts = (input_ids == vision_start_id).long().cumsum(1)
    ends = (input_ids == vision_end_id).long().cumsum(1)
    inside = starts > ends
    frame = torch.where(inside | (input_ids == vision_end_id), starts, torch.zeros_like(starts))  # 0: not a frame
    causal = torch.ones(L, L, dtype=torch.bool, device=input_ids.device).tril()
    valid = attention_mask.bool()
    allowed = causal[None] & valid[:, None, :] & valid[:, :, None]
    other_frame = (frame[:, :, None] > 0) & (frame[:, None, :] > 0) & (frame[:, :, None] != frame[:, None, :])
    allowed &= ~other_frame
    idx = torch.arange(L, device=input_ids.device)
    allowed[:, idx, idx] |= True  # padded rows keep one key: no all-masked softmax row
    return allowed[:, None]


def _backbone_inputs(vla: DrivingVLA, batch: dict, stream_mask: bool = False) -> dict:
    """The backbone's keyword inputs for a training ``batch``: as made, or under :func:`streaming_attention_mask`
    (the positions stay the prompt's own)."""
    kw = dict(batch)
    if stream_mask:
        cfg = vla.backbone.config
        pos, _ = vla.backbone.model.get_rope_index(batch["input_ids"], batch["mm_token_type_ids"],
                                                   image_grid_thw=batch["image_grid_thw"],
                                                   attention_mask=batch["attention_mask"])
        kw["position_ids"] = pos
        allowed = streaming_attention_mask(batch["input_ids"], batch["attention_mask"], cfg.vision_start_token_id,
                                           cfg.vision_end_token_id)
        kw["attention_mask"] = {"full_attention": attention_mask_for(
            allowed, cfg.get_text_config()._attn_implementation, vla.backbone.dtype)}
    return kw


def _expert_prefix(vla: DrivingVLA, batch: dict) -> tuple:
    """``(start, valid)``: the expert's context in a training batch is prompt + reasoning, without the final
    end-of-turn (generate never feeds it); ``start`` is the text position after it."""
    labels = batch["labels"]
    last = (labels != -100).long().cumsum(1).argmax(1)
    prefix = batch["attention_mask"].clone()
    prefix[torch.arange(len(labels)), last] = 0
    return next_text_positions(vla.backbone, {**batch, "attention_mask": prefix}), prefix.bool()


def expert_context(vla: DrivingVLA, batch: dict, stream_mask: bool = False) -> tuple:
    """``(cache, start, valid)``: what the action expert reads for a training ``batch`` (:func:`make_batch` of
    driving items with their reasoning): the backbone's cache of prompt + reasoning, the text position after it and
    which cached positions it may read. Used by :mod:`mmspec.drivers.distill`.

    Example:
        >>> cache, start, valid = expert_context(vla, make_batch(vla.processor, examples))   # doctest: +SKIP
    """
    kw = _backbone_inputs(vla, batch, stream_mask)
    kw.pop("labels", None)
    out = vla.backbone(**kw, use_cache=True)
    start, valid = _expert_prefix(vla, batch)
    return (out.cache if getattr(out, "cache", None) is not None else out.past_key_values), start, valid


def vla_losses(vla: DrivingVLA, examples, reader, generator=None, road_reader=None, stream_mask: bool = False) -> dict:
    """The training losses on ``examples`` (driving items with ``meta["labels"]``): ``lm``, ``aux``, ``flow``,
    and ``road`` (mean squared error in units of :data:`ROAD_SCALE_M`) when a :class:`RoadReader` is given.
    ``stream_mask``: the backbone attends under :func:`streaming_attention_mask` (the positions stay the
    prompt's own)."""
    from mmspec.vision.testbed import make_batch

    batch = make_batch(vla.processor, examples)
    captured = {}
    hook = vla.backbone.model.visual.register_forward_hook(
        lambda m, a, out: captured.__setitem__("h", out.pooler_output))
    try:
        out = vla.backbone(**_backbone_inputs(vla, batch, stream_mask), use_cache=True)
    finally:
        hook.remove()
    grids = batch["image_grid_thw"][:, 1:].tolist()
    per_ex = len(examples[0].images)
    aux_y = torch.cat([_label_targets(ex, grids[i * per_ex:(i + 1) * per_ex]) for i, ex in enumerate(examples)])
    aux = torch.nn.functional.binary_cross_entropy_with_logits(reader(captured["h"]), aux_y)
    start, valid = _expert_prefix(vla, batch)
    actions = torch.from_numpy(np.stack([ex.meta["actions"] for ex in examples])).float()
    flow = vla.expert.loss(actions, out.cache if getattr(out, "cache", None) is not None else out.past_key_values, start, valid, generator=generator)
    losses = {"lm": out.loss, "aux": aux, "flow": flow}
    if road_reader is not None:
        counts = (batch["image_grid_thw"].prod(-1) // (MERGE * MERGE)).view(len(examples), per_ex).sum(1)
        pred = road_reader(captured["h"].split(counts.tolist()))
        want = torch.from_numpy(np.stack([ex.meta["road_ahead"] for ex in examples])).float()
        losses["road"] = torch.nn.functional.mse_loss(pred, want / torch.tensor(ROAD_SCALE_M))
    return losses


@dataclass
class VLATrainConfig:
    """Hyper-parameters of :func:`train_vla` (saved beside the checkpoint); ``stop_after`` ends this run early
    while the schedule still spans ``steps``; ``init`` starts from another checkpoint's weights (fresh
    optimizer and schedule; the action expert takes the current action normalisation); ``perturb`` is the
    share of training items with a perturbed lead-in and the expert's recovery (see ``DrivingWorkload``);
    ``road_weight`` weighs the :class:`RoadReader` loss (0: none), which makes the vision tower say where the
    road runs ahead: without it the VLA steered from its history and drifted off the road in closed loop;
    ``rollouts`` (a :func:`collect_rollouts` file) makes a ``rollout_fraction`` of the items DAgger items;
    ``stream_mask`` is the share of steps trained under :func:`streaming_attention_mask` (FlashDrive's streaming
    fine-tuning; the rest keep the causal mask that plain inference uses)."""

    out: str = "driving-vla"
    size: str = "small"
    steps: int = 1500
    batch_size: int = 8
    lr: float = 1e-3
    warmup: int = 50
    aux_weight: float = 1.0
    action_weight: float = 1.0
    save_every: int = 100
    seed: int = 0
    threads: int = 0
    stop_after: int = 0
    tokenizer_texts: int = 2000
    vocab_size: int = 512
    init: str = ""
    perturb: float = 0.0
    road_weight: float = 0.0
    rollouts: str = ""
    rollout_fraction: float = 0.5
    stream_mask: float = 0.0


def train_vla(cfg: VLATrainConfig, progress: bool = True) -> DrivingVLA:
    """Train (or resume from ``cfg.out/state.pt``) the driving VLA; checkpoints with ``save_pretrained``."""
    from tqdm import tqdm

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    os.makedirs(cfg.out, exist_ok=True)
    state_path = os.path.join(cfg.out, "state.pt")
    resume = os.path.isfile(state_path)
    if resume:
        vla = DrivingVLA.from_pretrained(cfg.out, dtype=torch.float32)
    elif cfg.init:
        vla = DrivingVLA.from_pretrained(cfg.init, dtype=torch.float32)
        vla.expert.action_mean.copy_(torch.tensor(ACTION_MEAN))
        vla.expert.action_scale.copy_(torch.tensor(ACTION_SCALE))
    else:
        vla = build_vla(cfg.size, cfg.tokenizer_texts, cfg.vocab_size, cfg.seed)
    reader = PatchReader(vla.backbone.config.text_config.hidden_size, len(LABELS))
    road_reader = RoadReader(vla.backbone.config.text_config.hidden_size) if cfg.road_weight else None
    params = list(vla.backbone.parameters()) + list(vla.expert.parameters()) + list(reader.parameters())
    if road_reader is not None:
        params += list(road_reader.parameters())
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.01)
    start = 0
    if resume:
        saved = torch.load(state_path, weights_only=True)
        if (road_reader is not None) != ("road_reader" in saved):
            raise InvalidInputError(f"{cfg.out} was trained with{'out' if road_reader is not None else ''} the road "
                                    "loss: resume it with the road_weight it started with")
        opt.load_state_dict(saved["optimizer"])
        reader.load_state_dict(saved["reader"])
        if road_reader is not None:
            road_reader.load_state_dict(saved["road_reader"])
        start = int(saved["step"])
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(cfg.warmup, cfg.steps))
    for _ in range(start):
        sched.step()
    log_path = os.path.join(cfg.out, "train_log.jsonl")
    trim_log(log_path, start)  # steps logged past the last checkpoint by a killed job
    wl = get_workload("driving", labels=True, perturb=cfg.perturb, rollouts=cfg.rollouts or None,
                      rollout_fraction=cfg.rollout_fraction)
    gen = torch.Generator().manual_seed(cfg.seed)
    end = min(cfg.steps, cfg.stop_after) if cfg.stop_after else cfg.steps
    vla.train()
    bar = tqdm(range(start, end), initial=start, total=cfg.steps, disable=not progress, desc="driving vla")
    for step in bar:
        t0 = time.perf_counter()
        gen.manual_seed(cfg.seed * 1_000_003 + step)  # resumable: the noise of step s does not depend on history
        masked = cfg.stream_mask > 0 and (step * 0.6180339887) % 1.0 < cfg.stream_mask  # spread evenly, resumable
        losses = vla_losses(vla, wl.examples("train", cfg.batch_size, start=step * cfg.batch_size), reader, gen,
                            road_reader, stream_mask=masked)
        loss = losses["lm"] + cfg.aux_weight * losses["aux"] + cfg.action_weight * losses["flow"]
        if road_reader is not None:
            loss = loss + cfg.road_weight * losses["road"]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        rec = {"step": step + 1, **{k: round(v.item(), 4) for k, v in losses.items()},
               "lr": sched.get_last_lr()[0], "sec": round(time.perf_counter() - t0, 3)}
        bar.set_postfix({k: rec[k] for k in losses})
        with open(log_path, "a") as f:
            f.write(json.dumps(rec) + "\n")
        if (step + 1) % cfg.save_every == 0 or step + 1 == end:
            vla.eval().save_pretrained(cfg.out)
            vla.train()
            tmp = state_path + ".tmp"
            saved = {"optimizer": opt.state_dict(), "reader": reader.state_dict(), "step": step + 1}
            if road_reader is not None:
                saved["road_reader"] = road_reader.state_dict()
            torch.save(saved, tmp)
            os.replace(tmp, state_path)
            with open(os.path.join(cfg.out, "train_config.json"), "w") as f:
                json.dump(asdict(cfg), f, indent=2)
    return vla.eval()


VLA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "assets", "driving-vla")


def bundled_vla() -> str | None:
    """The bundled trained driving VLA's folder (``None`` if this install has none); what ``mmspec bench
    --workload driving`` runs when no model is named.

    Example:
        >>> bundled_vla() is None or os.path.isfile(os.path.join(bundled_vla(), "action_expert.json"))
        True
    """
    return VLA_DIR if os.path.isfile(os.path.join(VLA_DIR, EXPERT_NAME)) else None


def export_vla(src: str, out: str = VLA_DIR, dtype=torch.bfloat16, student: str | None = None) -> str:
    """The shippable copy of a trained VLA: weights in ``dtype`` (loaded as float32), training log and config
    beside them. What ships is this rounded model; measurements use it, not ``src``. ``student``: a few-step
    action expert distilled on ``src`` (:mod:`mmspec.drivers.distill`), shipped as ``out/fewstep`` and re-bound
    to the exported backbone (FlashDrive's default expert for this VLA); a student that ``out`` held before is
    removed, since it was bound to the weights this export replaces.

    Example:
        >>> export_vla("/work/vla-fp32", "/work/vla", student="/work/fewstep")         # doctest: +SKIP
        '/work/vla'
    """
    import shutil

    from mmspec.checkpoints import copy_training_files

    from .distill import STUDENT_DIR, export_student, student_info

    if os.path.realpath(out) == os.path.realpath(src):
        raise InvalidInputError(f"export {src} into another folder: it would overwrite the weights it reads")
    if student:
        student_info(student, src)  # refuse before anything under ``out`` is replaced
        if os.path.realpath(student) == os.path.realpath(os.path.join(out, STUDENT_DIR)):
            raise InvalidInputError(f"{student} is the folder this export replaces: export the student from its own")
    DrivingVLA.from_pretrained(src, dtype=torch.float32).save_pretrained(out, dtype=dtype)
    for name in ("train_log.jsonl", "train_config.json"):  # an older model's records must not describe this one
        if not os.path.isfile(os.path.join(src, name)) and os.path.isfile(os.path.join(out, name)):
            os.remove(os.path.join(out, name))
    copy_training_files(src, out)
    if os.path.isdir(os.path.join(out, STUDENT_DIR)):
        shutil.rmtree(os.path.join(out, STUDENT_DIR))
    if student:
        export_student(student, src, out, dtype)
    return out


def constant_velocity(speed: float, n: int = 64) -> np.ndarray:
    """The constant-velocity baseline: straight ahead at the current speed, ``[n, 2]``."""
    return np.stack([speed * DT * np.arange(1, n + 1), np.zeros(n)], 1)


DISTANCE_TOLERANCE_M = 2  # metres: what "right" allows on a hazard distance (exact match is reported too)


@torch.no_grad()
def evaluate_vla(vla: DrivingVLA, n: int = 24, samples: int = 6, split: str = "test", seed: int = 0) -> dict:
    """Reasoning accuracy and minADE on ``n`` held-out items (batch 1, as the pipeline drives).

    Reports ``reasoning_exact`` (the sentence, token for token), ``reasoning_right`` (phrase and action right
    and the distance within :data:`DISTANCE_TOLERANCE_M`), ``hazard_accuracy`` (the hazard phrase and
    the action right), ``distance_mae_m`` (where both name a distance), ``min_ade_1`` / ``min_ade_k`` (mean
    over 64 waypoints of the L2 error; the minimum over ``samples`` noise draws for ``k``) and the
    constant-velocity baseline's ADE on the same items.
    """
    from .pipeline import DrivingPipeline

    pipe = DrivingPipeline(vla)
    wl = get_workload("driving")
    scores = []
    for i in range(n):
        ex = wl.example(split, i)
        res = pipe.step(ex.images, ex.meta["history"], ex.meta["speed"], num_samples=samples, seed=seed + i)
        scores.append(score_step(res, ex))
    return summarize_scores(scores, samples)


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


@torch.no_grad()
def closed_loop(vla: DrivingVLA, n: int = 12, seconds: float = 8.0, handover_tick: int = 20, replan_every: int = 5,
                split: str = "test", seed: int = 0) -> dict:
    """Let the VLA drive: the expert drives the first ``handover_tick`` ticks (history for the model), then
    every ``replan_every`` ticks the pipeline plans from the current frames and ego history and the ego
    executes the planned (accel, curvature) steps. Rates of collision, off-road and red-light running over
    ``n`` scenarios (all kinds in turn), the same for the expert, mean progress, and the model's incident
    counts per scenario kind (``model_by_kind``).

    Example:
        >>> closed_loop(DrivingVLA.from_pretrained("drivers/assets/driving-vla"), n=6)            # doctest: +SKIP
    """
    from .pipeline import DrivingPipeline
    from .world import SCENARIO_KINDS, safety_events, scenario_for, simulate

    pipe = DrivingPipeline(vla)
    totals = {"model": {"collision": 0, "offroad": 0, "red_light": 0, "progress_m": 0.0},
              "expert": {"collision": 0, "offroad": 0, "red_light": 0, "progress_m": 0.0}}
    by_kind: dict = {}  # the model's incident counts per scenario kind: where it fails, not only how often
    for i in range(n):
        scn = scenario_for(split, 10_000 + i, seed, SCENARIO_KINDS[i % len(SCENARIO_KINDS)])
        policy = model_policy(pipe, handover_tick, replan_every, seed)
        kind = by_kind.setdefault(scn.kind, {"n": 0, "collision": 0, "offroad": 0, "red_light": 0})
        kind["n"] += 1
        for who, pol in (("model", policy), ("expert", None)):
            ev = safety_events(simulate(scn, seconds, pol), handover_tick)
            for key in ("collision", "offroad", "red_light"):
                totals[who][key] += int(ev[key])
                if who == "model":
                    kind[key] += int(ev[key])
            totals[who]["progress_m"] += ev["progress_m"]
    return {who: {**{f"{k}_rate": v / n for k, v in t.items() if k != "progress_m"},
                  "progress_m": t["progress_m"] / n} for who, t in totals.items()} | {"n": n, "model_by_kind": by_kind}


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
    from .clips import ego_history
    from .world import render_frame

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


@torch.no_grad()
def collect_rollouts(vla: DrivingVLA, path: str, n: int = 120, seconds: float = 8.0, handover_tick: int = 20,
                     replan_every: int = 5, split: str = "train", first_index: int = 20_000, seed: int = 0,
                     progress: bool = True) -> list:
    """DAgger's data: let ``vla`` drive ``n`` scenarios of ``split`` (all kinds in turn, indices from
    ``first_index``) and append each drive to the JSONL file ``path`` (``split``, world ``seed``, ``index``,
    ``kind``, ``handover``, the executed ``controls`` from the hand-over on, and the drive's safety events).
    Drives already in the file are kept and not driven again (a killed job resumes); returns this range's rows.
    Train on them with ``VLATrainConfig.rollouts``: the workload replays a drive to a tick inside it and labels
    the state with the expert's recovery.

    Example:
        >>> vla = DrivingVLA.from_pretrained("drivers/assets/driving-vla")               # doctest: +SKIP
        >>> rows = collect_rollouts(vla, "rollouts.jsonl", n=6)                         # doctest: +SKIP
    """
    from tqdm import tqdm

    from .pipeline import DrivingPipeline
    from .workload import load_rollouts
    from .world import INCIDENTS, SCENARIO_KINDS, safety_events, scenario_for, simulate

    if seconds <= handover_tick * DT:
        raise InvalidInputError(f"a drive of {seconds} s ends before the hand-over at tick {handover_tick}")
    key = lambda r: (r["split"], r.get("seed", 0), r["index"], r["handover"])  # noqa: E731
    done = {}
    if os.path.isfile(path):
        done = {key(r): r for r in load_rollouts(path)}
        with open(path, "rb+") as f:  # drop a row cut short by a killed job, so appended rows start on a line
            data = f.read()
            if data and not data.endswith(b"\n"):
                f.truncate(data.rfind(b"\n") + 1)
    pipe = DrivingPipeline(vla)
    rows = []
    for i in tqdm(range(n), disable=not progress, desc="rollouts"):
        index = first_index + i
        want = (split, seed, index, handover_tick)
        if want in done:
            rows.append(done[want])
            continue
        kind = SCENARIO_KINDS[i % len(SCENARIO_KINDS)]
        sim = simulate(scenario_for(split, index, seed, kind), seconds,
                       model_policy(pipe, handover_tick, replan_every, seed))
        ev = safety_events(sim, handover_tick)
        row = {"split": split, "seed": seed, "index": index, "kind": kind, "handover": handover_tick,
               "controls": [[round(a, 5), round(c, 6)] for a, c in sim.controls[handover_tick:]],
               "events": {k: bool(ev[k]) for k in INCIDENTS}}
        rows.append(row)
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")
    return rows


def _parse(sentence: str):
    """``(hazard phrase, distance or None, action)`` of a reasoning sentence."""
    import re

    s = sentence.strip().rstrip(".")
    head, _, action = s.partition("; ")
    m = re.match(r"(.*?) (\d+) m ahead$", head)
    if m:
        return m.group(1).lower(), int(m.group(2)), action
    return head.lower(), None, action


def main(argv=None) -> int:
    """``python -m mmspec.drivers.train_vla train|export|rollouts|eval ...``: train, export, record DAgger drives
    of, or evaluate the driving VLA."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m mmspec.drivers.train_vla")
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train")
    add_config_arguments(t, VLATrainConfig)
    x = sub.add_parser("export", help="write the shippable (bfloat16) copy of a trained VLA")
    x.add_argument("--model", required=True)
    x.add_argument("--out", default=VLA_DIR)
    x.add_argument("--student", default=None, help="a few-step action expert distilled on --model, shipped as "
                   "OUT/fewstep (FlashDrive's default expert for this VLA)")
    r = sub.add_parser("rollouts", help="let a VLA drive training scenarios and record it (DAgger's data)")
    r.add_argument("--model", required=True)
    r.add_argument("--out", required=True, help="JSONL file (appended to; a killed run resumes)")
    r.add_argument("--n", type=int, default=120)
    r.add_argument("--first-index", type=int, default=20_000)
    r.add_argument("--threads", type=int, default=0)
    e = sub.add_parser("eval")
    e.add_argument("--model", default=None, help="default: the bundled VLA")
    e.add_argument("--n", type=int, default=24)
    e.add_argument("--samples", type=int, default=6)
    e.add_argument("--closed-loop", type=int, default=0, help="also drive this many scenarios in closed loop")
    args = p.parse_args(argv)
    if args.cmd == "train":
        train_vla(VLATrainConfig(**{k: v for k, v in vars(args).items() if k != "cmd"}))
        return 0
    if args.cmd == "rollouts":
        if args.threads:
            torch.set_num_threads(args.threads)
        rows = collect_rollouts(DrivingVLA.from_pretrained(args.model), args.out, n=args.n,
                                first_index=args.first_index)
        from .world import INCIDENTS

        bad = {k: sum(r["events"][k] for r in rows) for k in INCIDENTS}
        print(json.dumps({"rows": len(rows), **bad}))
        return 0
    if args.cmd == "export":
        print(export_vla(args.model, args.out, student=args.student))
        return 0
    model = args.model or bundled_vla()
    if not model:
        raise InvalidInputError("no VLA bundled: pass --model PATH")
    vla = DrivingVLA.from_pretrained(model)
    print(json.dumps(evaluate_vla(vla, n=args.n, samples=args.samples)))
    if args.closed_loop:
        print(json.dumps(closed_loop(vla, n=args.closed_loop)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
