"""``DrivingPipeline.step``: one tick of the driving VLA without speculation, timed per stage.

The baseline FlashDrive-style methods are measured against: encode (the vision tower over the frames),
prefill (the rest of the first backbone pass), decode (the reasoning, greedy), action (the expert's Euler
steps over the cache) and total, in milliseconds (CUDA-synchronised on a GPU).

Example:
    >>> pipe = DrivingPipeline(DrivingVLA.from_pretrained("driving-vla"))         # doctest: +SKIP
    >>> out = pipe.step(frames, history, speed)                                   # doctest: +SKIP
    >>> out["reasoning"], out["trajectory"].shape, sorted(out["timings_ms"])      # doctest: +SKIP
"""

from __future__ import annotations

import time

import numpy as np
import torch

from .vla import integrate_actions
from .workload import driving_prompt

__all__ = ["DrivingPipeline", "STAGES"]

STAGES = ("encode", "prefill", "decode", "action", "total")


class DrivingPipeline:
    """Plain (non-speculative) driving VLA inference: frames + ego history -> reasoning + 6.4 s trajectory.

    Args:
        vla: a :class:`~mmspec.drivers.train_vla.DrivingVLA`.
        cameras: camera names the frames come from (in order, each with the same number of frames).
        max_reasoning_tokens: cap on the reasoning length.
    """

    def __init__(self, vla, cameras=("front",), max_reasoning_tokens: int = 40):
        self.vla, self.cameras, self.max_reasoning_tokens = vla, tuple(cameras), int(max_reasoning_tokens)

    def _sync(self):
        dev = self.vla.backbone.device
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    @torch.no_grad()
    def step(self, frames, ego_history, speed: float, num_samples: int = 1, seed: int = 0) -> dict:
        """One tick. ``frames``: PIL images or arrays (per camera, oldest first); ``ego_history[16, 3]``
        (x, y, yaw in the current ego frame); ``speed`` in m/s. Returns ``reasoning``, ``trajectory[64, 2]``
        (the first sample), ``trajectories[num_samples, 64, 2]``, ``actions`` and ``timings_ms``."""
        from PIL import Image

        from mmspec.vision.testbed import make_batch
        from mmspec.workloads import Example

        images = [f if isinstance(f, Image.Image) else Image.fromarray(np.asarray(f)) for f in frames]
        if not images or len(images) % len(self.cameras):
            from mmspec.errors import InvalidInputError

            raise InvalidInputError(f"{len(images)} frames for cameras {self.cameras}: need the same number per camera")
        prompt = driving_prompt(self.cameras, len(images) // len(self.cameras), np.asarray(ego_history), speed)
        backbone, proc = self.vla.backbone, self.vla.processor
        inputs = make_batch(proc, [Example(id="", prompt=prompt, target="", images=images)], train=False)
        inputs = {k: v.to(backbone.device) if torch.is_tensor(v) else v for k, v in inputs.items()}
        # transformers 5 encodes the images before the first forward (generate's mm_encoder_outputs); older
        # versions inside it: encode time nested in a forward is taken out of that forward's prefill.
        times = {"encode": 0.0, "nested": 0.0, "model": [], "in_model": False}

        def pre_visual(*_):
            self._sync()
            times["v0"] = time.perf_counter()

        def post_visual(*_):
            self._sync()
            dt = time.perf_counter() - times["v0"]
            times["encode"] += dt
            if times["in_model"] and not times["model"]:
                times["nested"] += dt

        def pre_model(*_):
            self._sync()
            times["m0"], times["in_model"] = time.perf_counter(), True

        def post_model(*_):
            self._sync()
            times["model"].append(time.perf_counter() - times["m0"])
            times["in_model"] = False

        hooks = [backbone.model.visual.register_forward_pre_hook(pre_visual),
                 backbone.model.visual.register_forward_hook(post_visual),
                 backbone.register_forward_pre_hook(pre_model), backbone.register_forward_hook(post_model)]
        t0 = time.perf_counter()
        try:
            out = backbone.generate(**inputs, max_new_tokens=self.max_reasoning_tokens, do_sample=False,
                                    return_dict_in_generate=True)
        finally:
            for h in hooks:
                h.remove()
        t_gen = time.perf_counter()
        cache = out.past_key_values
        L = cache.get_seq_length()
        # Batch 1: the continuation position is the cache length plus the model's M-RoPE delta.
        start = L + backbone.model.rope_deltas.view(-1)[:1].to(torch.long)
        valid = torch.ones(1, L, dtype=torch.bool, device=backbone.device)
        gen = torch.Generator(device=backbone.device).manual_seed(seed)
        acts = torch.cat([self.vla.expert.sample(cache, start, valid, generator=gen) for _ in range(num_samples)])
        self._sync()
        t_end = time.perf_counter()
        new = out.sequences[0, inputs["input_ids"].shape[1]:]
        text = proc.tokenizer.decode(new, skip_special_tokens=True)
        trajs = integrate_actions(acts.cpu().numpy(), np.full(num_samples, float(speed)))
        prefill = times["model"][0] - times["nested"] if times["model"] else 0.0
        timings = {"encode": times["encode"], "prefill": prefill, "decode": sum(times["model"][1:]),
                   "action": t_end - t_gen, "total": t_end - t0}
        return {"reasoning": text, "trajectory": trajs[0], "trajectories": trajs, "actions": acts.cpu().numpy(),
                "num_decode_tokens": int(len(new)), "timings_ms": {k: v * 1e3 for k, v in timings.items()}}
