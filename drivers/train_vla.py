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
from mmspec.vision.testbed_train import PatchReader
from mmspec.workloads import get_workload

from .bundled import VLA_DIR, bundled_vla
from .export import export_vla
from .pipeline import model_policy
from .scoring import constant_velocity, score_step, summarize_scores
from .vla import ACTION_MEAN, ACTION_SCALE, DrivingVLA, TrajectoryExpert, attention_mask_for, next_text_positions
from .world import DT, LABELS, LOOKAHEAD_M

__all__ = ["RoadReader", "VLATrainConfig", "VLA_SIZES", "build_vla", "train_vla", "evaluate_vla", "vla_losses",
           "closed_loop", "collect_rollouts", "streaming_attention_mask", "expert_context",
           # defined in the runtime modules (vla, bundled, export, scoring, pipeline), still importable from here
           "DrivingVLA", "bundled_vla", "export_vla", "model_policy", "constant_velocity"]

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
    x.add_argument("--student-only", action="store_true", help="ship --student (distilled on --model itself, "
                   "e.g. the bundled VLA) as MODEL/fewstep in bfloat16, replacing the student shipped there")
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
        if args.student_only:
            if not args.student:
                raise InvalidInputError("--student-only ships --student: name it")
            if os.path.realpath(args.out) != os.path.realpath(VLA_DIR):
                raise InvalidInputError("--student-only ships the student into --model itself; --out does not apply")
            from .export import export_student

            print(export_student(args.student, args.model, args.model))
            return 0
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
