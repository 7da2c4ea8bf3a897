"""Few-step distillation of the driving VLA's flow-matching action expert: the action stage with fewer head calls.

The expert integrates its flow with ``num_steps`` (10) Euler steps, one expert call each, and that is most of a
FlashDrive tick (``results/drivers/drive-sim/README.md``). Reusing velocities (the step cache) or integrating with
fewer uniform steps from the same expert both drift from the 10-step trajectory. Here a *student* copy of the
expert learns to land, in ``student_steps`` Euler steps, where the teacher's 10 steps land from the same noise
(direct trajectory distillation, as in Luhman & Luhman 2021 and progressive distillation, Salimans & Ho 2022, in
one stage since the gap is only 10 to 2-3 steps): per training item the backbone reads the prompt and the
reasoning (no gradient), the teacher integrates from noise ``x0`` (no gradient), and the student integrates from
the same ``x0``; the loss is the mean squared error between the two, in the expert's normalised action space, at
the end and at every student step whose time the teacher's grid also has. The backbone and the teacher stay
frozen, so a student serves only the VLA it was distilled from (its folder records the backbone's weights hash and
:func:`~mmspec.drivers.vla.load_student` checks it).

It is lossy (the student's trajectories are not the teacher's), like the step cache: FlashDrive takes it with
``FlashDriveConfig(expert=DIR)`` and says so. Runs resume from ``OUT/state.pt``.

Example:
    >>> cfg = DistillConfig(vla="drivers/assets/driving-vla", out="/tmp/fewstep", steps=2)    # doctest: +SKIP
    >>> student = distill_expert(cfg)                                                        # doctest: +SKIP
    >>> student.num_steps                                                                    # doctest: +SKIP
    2
"""

from __future__ import annotations

import copy
import json
import os
import time
from dataclasses import asdict, dataclass

import torch

from mmspec.drafters.eagle import warmup_cosine
from mmspec.errors import InvalidInputError
from mmspec.train import trim_log
from mmspec.workloads import get_workload

from .bundled import STUDENT_INFO, bundled_student
from .export import export_student
from .train_vla import expert_context
from .vla import DrivingVLA, backbone_hash, load_student, save_expert

STATE = "distill_state.pt"

__all__ = ["DistillConfig", "distill_expert", "euler_path",
           # defined in vla, bundled and export (the runtime and the shipping side), still importable from here
           "load_student", "backbone_hash", "bundled_student", "export_student"]

def euler_path(expert, x0, cache, start, valid, steps: int) -> list:
    """The states ``[x_1/steps, ..., x_1]`` of ``steps`` uniform Euler steps of ``expert``'s flow from ``x0``
    (normalised action space), with gradients if enabled: what :meth:`TrajectoryExpert.sample` computes, kept step by
    step.

    Example:
        >>> xs = euler_path(vla.expert, torch.randn(1, 64, 2), cache, start, valid, 2)    # doctest: +SKIP
        >>> len(xs)                                                                      # doctest: +SKIP
        2
    """
    from .vla import expert_attention_mask, time_embedding

    B, N, _ = x0.shape
    pos = (start[:, None] + torch.arange(N, device=x0.device)[None]).long()[None].expand(3, B, N)
    mask = expert_attention_mask(valid, N, expert.decoder.config._attn_implementation or "sdpa",
                                 expert.out_proj.weight.dtype)
    x, out = x0, []
    for i in range(steps):
        t = torch.full((B,), i / steps, device=x0.device)
        v = expert.velocity(x, t, cache, start, valid, mask=mask, positions=pos,
                            t_emb=time_embedding(t, expert.hidden_size))
        x = x + v / steps
        out.append(x)
    return out


@dataclass
class DistillConfig:
    """Settings of :func:`distill_expert`: the teacher ``vla`` folder, ``out`` (the student's folder),
    ``student_steps`` Euler steps to distil into, ``steps`` optimiser steps of ``batch_size`` driving items (``0``
    saves the untrained copy: the teacher at ``student_steps`` uniform steps, the baseline)
    (``perturb``: the share with a perturbed lead-in, as the VLA trained), ``lr`` with ``warmup`` then cosine.
    ``stream_mask``: the share of steps whose backbone context is computed under the streaming mask (FlashDrive's
    kept frames see only themselves), so the student also learns the contexts a streaming tick gives it.
    ``stop_after`` ends this run early while the schedule still spans ``steps`` (resume to go on).
    ``init``: a student folder (``distill.json`` beside an expert, distilled on the same backbone) whose weights the
    new student starts from instead of the teacher's: the shipped 1-step student was warm-started from a 2-step one.

    Example:
        >>> DistillConfig(vla="drivers/assets/driving-vla", out="/tmp/fewstep").student_steps
        2
    """

    vla: str = ""
    out: str = "driving-fewstep"
    student_steps: int = 2
    steps: int = 300
    batch_size: int = 8
    lr: float = 1e-4
    warmup: int = 20
    perturb: float = 0.2
    stream_mask: float = 0.5
    seed: int = 0
    threads: int = 0
    save_every: int = 50
    stop_after: int = 0
    init: str = ""


def _save_student(student, cfg: DistillConfig, teacher_hash: str, steps_done: int, init_record=None) -> None:
    save_expert(student, cfg.out)
    rec = {"kind": "fewstep_expert", "teacher": os.path.abspath(cfg.vla), "backbone_sha256_16": teacher_hash,
           "student_steps": cfg.student_steps, "steps_done": steps_done, "config": asdict(cfg)}
    if init_record is not None:  # what the warm start was (its folder may later hold another student)
        rec["init_record"] = init_record
    with open(os.path.join(cfg.out, STUDENT_INFO), "w") as f:
        json.dump(rec, f, indent=2)


def _check_config(cfg: DistillConfig) -> None:
    if not cfg.vla:
        raise InvalidInputError("name the teacher VLA folder (--vla)")
    checks = [(cfg.student_steps >= 1, "student_steps must be >= 1"), (cfg.steps >= 0, "steps must be >= 0"),
              (cfg.batch_size >= 1, "batch_size must be >= 1"), (cfg.save_every >= 1, "save_every must be >= 1"),
              (cfg.lr > 0, "lr must be > 0"), (0 <= cfg.stream_mask <= 1, "stream_mask must be in [0, 1]"),
              (0 <= cfg.perturb <= 1, "perturb must be in [0, 1]"), (cfg.stop_after >= 0, "stop_after must be >= 0")]
    for ok, msg in checks:
        if not ok:
            raise InvalidInputError(f"{msg} (got {asdict(cfg)})")
    if cfg.init and os.path.realpath(cfg.init) == os.path.realpath(cfg.out):
        raise InvalidInputError(f"--out {cfg.out} is the --init student: train the new student in a folder of its own")
    if os.path.realpath(cfg.out) == os.path.realpath(cfg.vla) or os.path.isfile(os.path.join(cfg.out, "model.safetensors")) \
            or os.path.isfile(os.path.join(os.path.dirname(os.path.abspath(cfg.out)), "model.safetensors")):
        raise InvalidInputError(f"--out {cfg.out} is (inside) a VLA folder: the student would overwrite its expert "
                                "or the student it ships; give the student a folder of its own (ship it with "
                                "train_vla export)")


def distill_expert(cfg: DistillConfig, progress: bool = True):
    """Distil ``cfg.vla``'s action expert into a ``cfg.student_steps``-step student (see the module docstring);
    returns the student, saved under ``cfg.out`` every ``save_every`` steps. A killed run resumes from
    ``cfg.out/distill_state.pt`` (weights, optimiser and step in one file, replaced atomically) exactly where it saved;
    resuming with another teacher or step count is refused.

    Example:
        >>> s = distill_expert(DistillConfig(vla="drivers/assets/driving-vla", out="/tmp/u2", steps=0))  # doctest: +SKIP
        >>> s.num_steps                                    # the expert itself at 2 uniform steps: the baseline  # doctest: +SKIP
        2
    """
    from tqdm import tqdm

    from mmspec.vision.testbed import make_batch

    _check_config(cfg)
    teacher_hash = backbone_hash(cfg.vla)  # also: is it a VLA folder, before anything loads
    state_path = os.path.join(cfg.out, STATE)
    resume = os.path.isfile(state_path)
    if resume:
        with open(os.path.join(cfg.out, STUDENT_INFO)) as f:
            info = json.load(f)
        if cfg.steps == 0:
            raise InvalidInputError(f"{cfg.out} holds a distillation run: the untrained baseline (--steps 0) needs a "
                                    "folder of its own")
        if (info["backbone_sha256_16"], info["student_steps"]) != (teacher_hash, cfg.student_steps):
            raise InvalidInputError(f"{cfg.out} was distilled from another VLA or into another step count "
                                    f"({info['teacher']}, {info['student_steps']} steps): use another --out")
        if cfg.init != info["config"].get("init", ""):  # a resumed run goes on from its own warm start
            raise InvalidInputError(f"{cfg.out} was started with --init {info['config'].get('init', '')!r}, not "
                                    f"{cfg.init!r}: resume with the same --init, or use another --out")
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    vla = DrivingVLA.from_pretrained(cfg.vla, dtype=torch.float32)
    for p in vla.parameters():
        p.requires_grad_(False)
    teacher = vla.expert
    os.makedirs(cfg.out, exist_ok=True)
    student = copy.deepcopy(teacher)
    init_record = info.get("init_record") if resume else None
    if cfg.init and not resume:
        # the warm start must serve this backbone: a student of another VLA reads another cache
        student.load_state_dict(load_student(cfg.init, vla, cfg.vla).state_dict())
        with open(os.path.join(cfg.init, STUDENT_INFO)) as f:
            init_record = {k: v for k, v in json.load(f).items() if k != "config"}
    student.num_steps = cfg.student_steps
    opt = torch.optim.AdamW(student.parameters(), lr=cfg.lr, weight_decay=0.0)
    start_step = 0
    if resume:
        saved = torch.load(state_path, weights_only=True)
        student.load_state_dict(saved["student"])
        opt.load_state_dict(saved["optimizer"])
        start_step = int(saved["step"])
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(cfg.warmup, cfg.steps))
    for _ in range(start_step):
        sched.step()
    log_path = os.path.join(cfg.out, "train_log.jsonl")
    trim_log(log_path, start_step)
    if cfg.steps == 0:  # the teacher itself at student_steps uniform steps: the baseline a student must beat
        _save_student(student.eval(), cfg, teacher_hash, 0, init_record)
        return student
    student.train()
    for p in student.parameters():
        p.requires_grad_(True)
    T, S = teacher.num_steps, cfg.student_steps
    # Student step j ends at time (j+1)/S; the teacher's grid has it when T (j+1) / S is a whole step.
    aligned = [(j, T * (j + 1) // S - 1) for j in range(S) if (T * (j + 1)) % S == 0]
    wl = get_workload("driving", labels=True, perturb=cfg.perturb)
    gen = torch.Generator()
    end = min(cfg.steps, cfg.stop_after) if cfg.stop_after else cfg.steps
    bar = tqdm(range(start_step, end), initial=start_step, total=cfg.steps, disable=not progress,
               desc="distil expert")
    for step in bar:
        t0 = time.perf_counter()
        gen.manual_seed(cfg.seed * 1_000_003 + step)  # resumable: step s's noise does not depend on history
        # golden-ratio spacing: every run of steps gets about stream_mask of masked ones, and it depends on the step only
        masked = cfg.stream_mask > 0 and (step * 0.6180339887) % 1.0 < cfg.stream_mask
        examples = wl.examples("train", cfg.batch_size, start=step * cfg.batch_size)
        with torch.no_grad():
            batch = make_batch(vla.processor, examples)
            cache, start, valid = expert_context(vla, batch, stream_mask=masked)
            x0 = torch.randn(len(examples), teacher.horizon, 2, generator=gen)
            ref = euler_path(teacher, x0, cache, start, valid, T)
        path = euler_path(student, x0, cache, start, valid, S)
        # every aligned point, the end among them (aligned always holds the last student step)
        loss = torch.stack([torch.nn.functional.mse_loss(path[j], ref[i]) for j, i in aligned]).mean()
        final = torch.nn.functional.mse_loss(path[-1].detach(), ref[-1])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(student.parameters(), 1.0)
        opt.step()
        sched.step()
        rec = {"step": step + 1, "loss": round(loss.item(), 5), "final_mse": round(final.item(), 5),
               "stream_mask": masked, "lr": sched.get_last_lr()[0], "sec": round(time.perf_counter() - t0, 3)}
        bar.set_postfix(loss=rec["loss"], final=rec["final_mse"])
        with open(log_path, "a") as f:
            f.write(json.dumps(rec) + "\n")
        if (step + 1) % cfg.save_every == 0 or step + 1 == end:
            # The resume point first, in one atomic replace; the exported student after it (rewritten on resume).
            tmp = state_path + ".tmp"
            torch.save({"student": student.state_dict(), "optimizer": opt.state_dict(), "step": step + 1}, tmp)
            os.replace(tmp, state_path)
            _save_student(student.eval(), cfg, teacher_hash, step + 1, init_record)
            student.train()
    return student.eval()


def main(argv=None) -> int:
    """``python -m mmspec.drivers.distill --vla DIR --out DIR [--student-steps 2 ...]``: distil the VLA's action
    expert into a few-step student (resumes)."""
    import argparse

    from mmspec.train import add_config_arguments

    p = argparse.ArgumentParser(prog="python -m mmspec.drivers.distill", description=main.__doc__)
    add_config_arguments(p, DistillConfig)
    args = p.parse_args(argv)
    distill_expert(DistillConfig(**vars(args)))
    print(os.path.abspath(args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
