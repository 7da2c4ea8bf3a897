"""Training the spatial head: ``mmspec train --kind spatial --workload images --target GENERATOR``.

Stage 1 (the core's :func:`mmspec.train.collect_data`): for each ``images`` prompt the target *samples* its own
image (temperature 1, its default guidance, a seed per item), then one teacher-forced pass gives its last-layer
hidden state before every code. A record holds ``tokens`` (the code indices, ``[N]``) and ``feats`` (``[N, H]``,
float16: ``feats[j]`` is the state whose logits gave code ``j``, the ``<boi>`` position for ``j = 0``).

Stage 2 (:func:`mmspec.train.fit`): :class:`SpatialLoss` draws, per record, committed lengths ``n`` at random, asks
the drafter's own :class:`~mmspec.image_ar.spatial.GridScheduler` for the round it would draft after ``n`` codes,
builds the head's inputs with the same :func:`~mmspec.image_ar.ssd_head.slot_inputs` the drafter uses, and fits the
head to the target's distribution at every drafted slot (soft cross-entropy against the target's code logits there,
kept in the record as ``logits``, ``[N, codes]`` float16). Losses
and top-1 agreement are logged for three groups: the next slot, the rest of the current row, the rows below.

Example:
    >>> from mmspec.train import get_trainer
    >>> get_trainer("spatial").kind
    'spatial'
"""

from __future__ import annotations

import random

import torch
import torch.nn.functional as F

from mmspec.errors import InvalidInputError
from mmspec.train import Trainer

__all__ = ["SpatialTrainer", "SpatialLoss", "spatial_record", "collate_spatial"]

_OPTIONS = {"k_h": int, "k_v": int, "draft_len": int, "num_layers": int, "intermediate_size": int,
            "rounds_per_record": int}


def spatial_record(model, inputs: dict, n_codes: int, seed: int) -> dict:
    """One record from one request (``input_ids`` / ``attention_mask`` of one prompt): the target's own sample of
    ``n_codes`` codes (temperature 1, no guidance) and its last-layer states and code logits before each (module
    docstring).

    Example:
        >>> rec = spatial_record(model, {"input_ids": ids, "attention_mask": mask}, 256, seed=0)  # doctest: +SKIP
        >>> rec["tokens"].shape, rec["feats"].shape, rec["logits"].shape                         # doctest: +SKIP
        (torch.Size([256]), torch.Size([256, 192]), torch.Size([256, 256]))
    """
    return spatial_records(model, inputs["input_ids"], inputs["attention_mask"], n_codes, seed)[0]


def _ids(tok, prompts):
    from .generator import _request_ids

    return _request_ids(tok, prompts)


@torch.no_grad()
def spatial_records(model, ids, mask, n_codes: int, seed: int) -> list:
    """:func:`spatial_record` for a left-padded batch of requests in one AR loop (one generator for the batch)."""
    from .generator import _with_codes, generate_codes

    offset = int(model.generation_config.image_code_offset)
    g = torch.Generator(device=ids.device).manual_seed(seed)
    codes = generate_codes(model, ids, mask, None, n_codes, cfg_scale=1.0, generator=g, do_sample=True)
    seq, full, pos = _with_codes(ids, mask, codes[:, :-1] + offset)
    out = model(input_ids=seq, attention_mask=full, position_ids=pos, output_hidden_states=True)
    p = ids.shape[1] - 1  # left padding: every prompt ends here
    feats, logits = out.hidden_states[-1][:, p:], out.logits[:, p:, offset:]
    return [{"tokens": codes[i].cpu(), "feats": feats[i].to(torch.float16).cpu(),
             "logits": logits[i].to(torch.float16).cpu()} for i in range(ids.shape[0])]


def collate_spatial(records: list) -> dict:
    """Records (all of one grid) -> ``{"tokens": [B, N], "feats": [B, N, H], "logits": [B, N, K]}`` (float32)."""
    return {"tokens": torch.stack([r["tokens"] for r in records]),
            "feats": torch.stack([r["feats"] for r in records]).float(),
            "logits": torch.stack([r["logits"] for r in records]).float()}


class SpatialLoss(torch.nn.Module):
    """Stage 2's loss (module docstring): ``forward(batch) -> (losses[3], accuracies[3])``."""

    def __init__(self, drafter, rounds_per_record: int = 8, seed: int = 0):
        super().__init__()
        self.drafter = drafter
        self.rounds_per_record = int(rounds_per_record)
        self.rng = random.Random(seed)

    def forward(self, batch: dict):
        from .ssd_head import slot_inputs

        d = self.drafter
        tokens, feats = batch["tokens"], batch["feats"]
        n_slots = tokens.shape[1]
        # feats[b, j] is the state before code j; the teacher at slot j is the target's logits from it.
        feats_pad = torch.cat([feats, feats[:, -1:]], dim=1)  # the head indexes N + 1 slots (as the drafter's buffer)
        codes = torch.cat([tokens, torch.full_like(tokens[:, :1], d.n_codes)], dim=1)
        sched = d.scheduler
        cols = {k: [] for k in ("slot_row", "seq", "last", "above", "delta", "dv", "row", "col")}
        for b in range(tokens.shape[0]):
            for _ in range(self.rounds_per_record):
                n = self.rng.randint(1, n_slots - 1)
                ins = slot_inputs(sched.plan(n), n, d.raster, d.k_v)
                cols["slot_row"] += [b] * len(ins["seq"])
                for k, v in ins.items():
                    cols[k] += v
        t = {k: torch.tensor(v, dtype=torch.long, device=feats.device) for k, v in cols.items()}
        # Inputs: only committed slots (< n) are read; the feats of slot s sit at index s (the state before it).
        logits = d.head(feats_pad, codes, t["slot_row"], t["last"], t["above"], t["delta"], t["dv"], t["row"],
                        t["col"])
        teacher = torch.softmax(batch["logits"][t["slot_row"], t["seq"]], dim=-1)
        logq = torch.log_softmax(logits, dim=-1)
        loss = -(teacher * logq).sum(-1)
        hit = (logits.argmax(-1) == teacher.argmax(-1)).float()
        same_row = t["row"] == torch.div(t["last"], d.raster.stride, rounding_mode="floor")
        groups = [t["delta"] == 1, same_row & (t["delta"] > 1), ~same_row]
        losses = torch.stack([loss[m].mean() if bool(m.any()) else loss.sum() * 0 for m in groups])
        accs = torch.stack([hit[m].mean() if bool(m.any()) else hit.sum() * 0 for m in groups])
        return losses, accs


class SpatialTrainer(Trainer):
    """``mmspec train --kind spatial``: the spatial head on the ``images`` workload (see the module docstring).
    ``--options`` (JSON): ``k_h``, ``k_v``, ``draft_len`` (the scheduler it trains for, saved with the head),
    ``num_layers``, ``intermediate_size`` (the head's shape), ``rounds_per_record`` (rounds sampled per record per
    step, default 8). The samples it learns from are the target's at temperature 1 without guidance."""

    kind = "spatial"
    default_num_draft_tokens = 16

    @property
    def drafter_cls(self):
        from .ssd import SpatialDrafter

        return SpatialDrafter

    def check_config(self, cfg) -> None:
        if tuple(cfg.workloads) != ("images",):
            raise InvalidInputError(f"the spatial head trains on the images workload (--workload images); got "
                                    f"{list(cfg.workloads)}")
        bad = {k: v for k, v in (cfg.options or {}).items()
               if k not in _OPTIONS or isinstance(v, bool) or not isinstance(v, (int, float))}
        if bad:
            raise InvalidInputError(f"bad spatial options {bad}; known: {sorted(_OPTIONS)} (numbers)")

    def layer_ids(self, cfg, model_config) -> tuple:
        return (int(model_config.get_text_config(decoder=True).num_hidden_layers),)

    def build_drafter(self, cfg, model, tokenizer):
        from .ssd import SpatialDrafter

        o = cfg.options or {}
        shape = {k: int(o[k]) for k in ("k_h", "k_v", "num_layers", "intermediate_size") if k in o}
        return SpatialDrafter.from_target(model, tokenizer, seed=cfg.seed,
                                          draft_len=int(o.get("draft_len", cfg.num_draft_tokens)), **shape)

    def record(self, cfg, model, inputs, layer_ids, reference=None) -> dict:
        """One record per request (image prompts carry no reference answer, so ``reference`` is unused), sampled
        in batches: the data stage asks for the workload's items in order, so
        the first request of a batch samples the next ``shard_size`` prompts together (one AR loop at batch
        ``shard_size`` instead of that many at batch 1) and later requests are served from that batch."""
        grid = getattr(model.generation_config, "image_grid", None)
        if not grid:
            raise InvalidInputError("the target names no image grid (generation_config.image_grid)")
        key = tuple(inputs["input_ids"][0].tolist())
        cache = self.__dict__.setdefault("_batch", {})
        if not cache.get(key):
            cache.clear()
            cache.update(self._sample_batch(cfg, model, key, int(grid) ** 2))
        return cache[key].pop(0)

    def _sample_batch(self, cfg, model, key: tuple, n_codes: int) -> dict:
        from mmspec.workloads import get_workload

        if not hasattr(self, "_prompts"):
            wl = get_workload("images")
            self._prompts = [wl.example(cfg.split, k).prompt for k in range(cfg.n_train)]
            self._next = 0
        tok = self._tokenizer(cfg)
        start = self._next
        for k in range(self._next, len(self._prompts)):  # the request's item: the first unserved match
            if tuple(_ids(tok, [self._prompts[k]])[0][0].tolist()) == key:
                start = k
                break
        prompts = self._prompts[start: start + cfg.shard_size]
        self._next = start + len(prompts)
        ids, mask = _ids(tok, prompts)
        recs = spatial_records(model, ids.to(model.device), mask.to(model.device), n_codes,
                               seed=cfg.seed * 1_000_003 + start)
        out: dict = {}
        for i, r in enumerate(recs):
            out.setdefault(tuple(ids[i][mask[i].bool()].tolist()), []).append(r)
        return out

    def _tokenizer(self, cfg):
        if not hasattr(self, "_tok"):
            from transformers import AutoTokenizer

            self._tok = AutoTokenizer.from_pretrained(cfg.target)
        return self._tok

    def collate(self, records):
        return collate_spatial(records)

    def loss_module(self, drafter, cfg):
        return SpatialLoss(drafter, int((cfg.options or {}).get("rounds_per_record", 8)), cfg.seed)
