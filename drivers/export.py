"""The shippable copies: a trained driving VLA exported in bfloat16, with the few-step student distilled on it.

What ships is the rounded model (:data:`~mmspec.drivers.bundled.VLA_DIR`); measurements use it, not the float32
run it came from. Training (:mod:`mmspec.drivers.train_vla`, :mod:`mmspec.drivers.distill`) writes the runs; this
module only copies and re-binds them.

Example:
    >>> export_vla("/work/vla-fp32", "/work/vla", student="/work/fewstep")         # doctest: +SKIP
    '/work/vla'
"""

from __future__ import annotations

import json
import os

import torch

from mmspec.errors import InvalidInputError

from .bundled import EXPERT_CONFIG, EXPERT_NAME, STUDENT_DIR, STUDENT_INFO, VLA_DIR
from .vla import DrivingVLA, backbone_hash, student_info

__all__ = ["export_vla", "export_student"]


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


def export_student(student: str, src_vla: str, out_vla: str, dtype=torch.bfloat16) -> str:
    """Ship ``student`` (distilled on the VLA folder ``src_vla``) inside ``out_vla``, the exported copy of
    ``src_vla`` (:func:`~mmspec.drivers.export.export_vla`), as ``out_vla/fewstep`` with weights in ``dtype``.
    The export rounds the backbone, so its weights hash changes: the student is re-bound to the exported backbone
    (``distilled_on`` keeps the hash it was distilled on). Refused unless the student was distilled on ``src_vla``
    and ``out_vla``'s backbone is ``src_vla``'s rounded to ``dtype``, tensor for tensor, or ``out_vla`` is
    ``src_vla`` (a student distilled on the shipped VLA itself: it replaces the one shipped there).

    Example:
        >>> export_student("/work/fewstep", "/work/vla-fp32", "/work/vla-bf16")   # doctest: +SKIP
        '/work/vla-bf16/fewstep'
    """
    import shutil

    from safetensors.torch import load_file

    from mmspec.checkpoints import save_state_compact

    info = student_info(student, src_vla)
    out = os.path.join(out_vla, STUDENT_DIR)
    if os.path.realpath(student) == os.path.realpath(out):
        raise InvalidInputError(f"export the student from its own folder (got student {student}, out {out_vla})")
    same = os.path.realpath(src_vla) == os.path.realpath(out_vla)  # distilled on the shipped VLA itself
    if not same and not _is_export_of(out_vla, src_vla, dtype):
        raise InvalidInputError(f"{out_vla} is not {src_vla} exported in {dtype}: the student would be bound to "
                                "another backbone (export both with train_vla export --student)")
    # written beside, then swapped in: a failure midway leaves the shipped student as it was. No training log: the
    # package ships models, not results (the record names the run it came from)
    tmp = out + ".tmp"
    if os.path.isdir(tmp):
        shutil.rmtree(tmp)
    os.makedirs(tmp)
    save_state_compact(load_file(os.path.join(student, EXPERT_NAME)), os.path.join(tmp, EXPERT_NAME), dtype)
    shutil.copy(os.path.join(student, EXPERT_CONFIG), os.path.join(tmp, EXPERT_CONFIG))
    info = {**info, "backbone_sha256_16": backbone_hash(out_vla),
            "distilled_on": info.get("distilled_on", info["backbone_sha256_16"]),
            "exported_from": os.path.abspath(student), "dtype": str(dtype).replace("torch.", "")}
    with open(os.path.join(tmp, STUDENT_INFO), "w") as f:
        json.dump(info, f, indent=2)
    if os.path.isdir(out):
        shutil.rmtree(out)  # nothing of an earlier student may stay beside this one
    os.replace(tmp, out)
    return out


def _backbone_tensors(path: str) -> dict:
    from safetensors.torch import load_file

    out = {}
    for name in sorted(n for n in os.listdir(path) if n.startswith("model") and n.endswith(".safetensors")):
        out.update(load_file(os.path.join(path, name)))
    return out


def _is_export_of(out_vla: str, src_vla: str, dtype) -> bool:
    """Whether ``out_vla``'s backbone weights are ``src_vla``'s cast to ``dtype`` (floating tensors), exactly."""
    a, b = _backbone_tensors(out_vla), _backbone_tensors(src_vla)
    if a.keys() != b.keys():
        return False
    return all(torch.equal(a[k], b[k].to(dtype) if b[k].is_floating_point() else b[k]) for k in a)
