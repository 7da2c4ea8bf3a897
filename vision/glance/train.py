"""Training GLANCE with ``mmspec train --kind glance``: the shared data stage and fit loop, GLANCE's record,
anchors and loss.

Stage 1 (:func:`mmspec.train.collect_data`) asks :meth:`GlanceTrainer.record` for one record per item: the
target's greedy response (the EAGLE record of :func:`mmspec.drafters.eagle.target_record`: tokens, the target's
next-token labels, the kept layers' states over prompt AND response, image positions included) plus the
positions the target itself used for every token (M-RoPE: time, height, width). Stage 2
(:func:`mmspec.train.fit`) batches them with :func:`~mmspec.drafters.block.collate_blocks` (random anchors
among the generated positions of each sequence) and optimises :class:`~mmspec.drafters.block.BlockLoss`
(the block mask: context strictly before the anchor, bidirectional inside a block, blocks blind to each
other; cross-entropy per offset with DFlash's position decay). ``--val-shards`` scores held-out records with
the same loss: the per-offset top-1 there is the acceptance to expect.

Kind options (``--options '{"num_anchors": 16}'``), validated before any model loads and saved with the run:
``num_anchors`` (blocks per sequence, default 16), ``loss_decay`` (DFlash's gamma, default block_size / 2;
0 for none), ``num_layers`` (head layers, default 2), ``num_kept_layers`` (target layers read, default 3),
``anchor_feature`` (default true: the block's committed token also reads the state just before it, EAGLE's
input, see :class:`~mmspec.drafters.block.BlockHead`), ``refine`` (0 or 1: a second head pass in which every drafted
position reads the first pass's drafts, trained on the head's own first-pass argmax; both passes' losses count),
``rope`` (``"target"``: the target's own M-RoPE positions; ``"flat"``: FlatRoPE, 1-D sequence indices; the records
keep the target's positions either way, so one data stage serves both), ``context`` (``"all"``, or ``"text"``: the
head never attends to image positions; which ids are images is read from the target's config), ``pointer`` (default
false: the copy path of :class:`~mmspec.drafters.block.BlockHead`, one content match per block and a read of the
values after it; needs ``anchor_feature``).
The block holds ``--num-draft-tokens`` + 1 tokens.

Example:
    >>> from mmspec.train import get_trainer
    >>> get_trainer("glance").kind
    'glance'
"""

from __future__ import annotations

import torch

from mmspec.drafters.block import ROPE_MODES
from mmspec.errors import InvalidInputError
from mmspec.train import Trainer

from .drafter import CONTEXTS

__all__ = ["GlanceTrainer", "glance_record", "text_context", "OPTION_DEFAULTS", "add_pointer_slots", "pointer_slots"]

OPTION_DEFAULTS = {"num_anchors": 16, "loss_decay": None, "num_layers": 2, "num_kept_layers": 3, "anchor_feature": True,
                   "refine": 0, "rope": "target", "context": "all", "pointer": False}
"""GLANCE's training options and their defaults (``loss_decay=None``: ``block_size / 2``)."""


@torch.no_grad()
def glance_record(model, inputs, layer_ids, max_new_tokens: int, feature_dtype=torch.bfloat16, keep_top: int = 0,
                  reference=None) -> dict:
    """One record: :func:`~mmspec.drafters.eagle.target_record` plus the pointer's slots (:func:`pointer_slots`) and
    ``positions[n, A]`` (the target's own
    positions of prompt + response: one axis for 1-D RoPE, three for M-RoPE), features stored in
    ``feature_dtype`` (bfloat16 by default: half the disk of float32, and a page's record is mostly its ~300
    image positions times the kept layers; the head trains in float32 on them). ``keep_top``: also the
    target's top next-token log-probabilities (see :func:`~mmspec.drafters.eagle.target_record`)."""
    from mmspec.drafters.block import context_positions, rope_settings
    from mmspec.drafters.eagle import _extend_inputs, _text_model_inputs, target_record


    # hidden_states[0] too: the vectors the LM receives at the image positions, read as tokens (``context_tokens``)
    rec = target_record(model, inputs, (0, *layer_ids), max_new_tokens, keep_top=keep_top, reference=reference)
    H = rec["features"].shape[-1] // (len(layer_ids) + 1)
    embeds, rec["features"] = rec["features"][:, :H], rec["features"][:, H:]
    full = rec["tokens"]
    P = int(rec["prompt_len"])
    rec["pointer_tokens"], rec["pointer_pos"] = pointer_slots(model, full, P, embeds[:P])
    if torch.is_tensor(inputs):
        ext = _text_model_inputs(model, full)
    else:
        cpu = {k: (v.cpu() if torch.is_tensor(v) else v) for k, v in dict(inputs).items()}
        ext = _extend_inputs(cpu, full, model.device)
    n_axes = 1 if rope_settings(model)["mrope_section"] is None else 3
    rec["positions"] = context_positions(model, ext, n_axes)[0].cpu()
    rec["features"] = rec["features"].to(feature_dtype)
    eos = model.generation_config.eos_token_id
    eos = set() if eos is None else {int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])}
    if int(full[-1]) in eos:
        # The target's guess after its own end of answer: decoding stops at the eos, so no block ever drafts
        # past it, and training on it would teach noise.
        rec["labels"][-1] = -100
    return rec


def pointer_slots(model, full: torch.Tensor, P: int, prompt_embeds: torch.Tensor) -> tuple:
    """A record's pointer slots ``pointer_tokens[S]`` / ``pointer_pos[S]``: the prompt's context tokens
    (:func:`~mmspec.vision.glance.head.context_tokens`, image positions read from the LM's input vectors
    ``prompt_embeds[P, H]``), then the response's own tokens, one slot a position; what
    :func:`~mmspec.drafters.block.collate_blocks` hands a pointer head.

    Example:
        >>> tokens, pos = pointer_slots(model, rec["tokens"], int(rec["prompt_len"]), embeds)   # doctest: +SKIP
    """
    from .head import context_tokens, token_pairs

    tok, at = context_tokens(model, full[:P], prompt_embeds, token_pairs(model))
    n = len(full)
    return torch.cat([tok, full[P:].cpu()]), torch.cat([at, torch.arange(P, n)])


def text_context(batch: dict, hidden_ids) -> dict:
    """``context="text"``: mark the positions of a :func:`~mmspec.drafters.block.collate_blocks` batch whose token
    is one of ``hidden_ids`` (image placeholders) as invisible to every block (``context_visible``), as
    :meth:`~mmspec.vision.glance.drafter.GlanceDrafter.prompt_visible` keeps them out of the cache at run time.

    Example:
        >>> b = text_context({"tokens": torch.tensor([[1, 9, 9, 2]]), "valid": torch.ones(1, 4, dtype=torch.bool)}, [9])
        >>> b["context_visible"].int().tolist()
        [[1, 0, 0, 1]]
    """
    ids = torch.as_tensor(list(hidden_ids), dtype=batch["tokens"].dtype)
    return {**batch, "context_visible": batch["valid"] & ~torch.isin(batch["tokens"], ids)}


class GlanceTrainer(Trainer):
    """GLANCE's plug into :mod:`mmspec.train` (see the module docstring)."""

    kind = "glance"
    data_from = ("tiger",)  # TIGER's records are GLANCE's plus routing and teacher fields

    def __init__(self):
        self._gen = torch.Generator().manual_seed(0)
        self._opts = dict(self.OPTIONS)
        self._block = None
        self._rope = self._opts.get("rope", "target")  # the head being fitted's, which collate must lay out
        self._hidden_ids = None  # token ids whose positions the head being fitted never attends to (context="text")

    @property
    def drafter_cls(self):
        from .drafter import GlanceDrafter

        return GlanceDrafter

    #: the kind's options and their defaults (a subclass names its own)
    OPTIONS = OPTION_DEFAULTS

    def check_options(self, opts: dict) -> None:
        """Raise :class:`~mmspec.errors.InvalidInputError` on a bad value (subclasses add their own checks)."""
        for k in ("num_anchors", "num_layers", "num_kept_layers"):
            v = opts[k]
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InvalidInputError(f"{self.kind} option {k} must be a positive integer (got {v!r})")
        if opts["refine"] not in (0, 1) or isinstance(opts["refine"], bool):
            raise InvalidInputError(f"{self.kind} option refine must be 0 or 1 (got {opts['refine']!r})")
        if not (isinstance(opts["anchor_feature"], bool) or opts["anchor_feature"] == "all"):
            raise InvalidInputError(f"{self.kind} option anchor_feature must be true, false or \"all\" "
                                    f"(got {opts['anchor_feature']!r})")
        if not isinstance(opts["pointer"], bool):
            raise InvalidInputError(f"{self.kind} option pointer must be true or false (got {opts['pointer']!r})")
        if opts["pointer"] and not opts["anchor_feature"]:
            raise InvalidInputError(f"{self.kind} option pointer needs anchor_feature (its query is the state before "
                                    "each block)")
        if opts["pointer"] and opts["context"] != "all":
            raise InvalidInputError(f"{self.kind} option pointer reads every context position: context must be "
                                    "\"all\"")
        if opts["rope"] not in ROPE_MODES:
            raise InvalidInputError(f"{self.kind} option rope must be one of {ROPE_MODES} (got {opts['rope']!r})")
        if opts["context"] not in CONTEXTS:
            raise InvalidInputError(f"{self.kind} option context must be one of {CONTEXTS} "
                                    f"(got {opts['context']!r})")
        d = opts["loss_decay"]
        if d is not None and (isinstance(d, bool) or not isinstance(d, (int, float)) or d < 0):
            raise InvalidInputError(f"{self.kind} option loss_decay must be a number >= 0 (got {d!r})")

    def check_config(self, cfg):
        opts = self.options(cfg)
        if cfg.num_draft_tokens < 1:
            raise InvalidInputError("glance drafts at least one token per block (--num-draft-tokens >= 1)")
        if cfg.layer_ids is not None and len(cfg.layer_ids) != opts["num_kept_layers"] and "num_kept_layers" in (
                getattr(cfg, "options", None) or {}):
            raise InvalidInputError(f"layer_ids {list(cfg.layer_ids)} and num_kept_layers "
                                    f"{opts['num_kept_layers']} disagree")
        self._opts = opts
        self._block = cfg.num_draft_tokens + 1
        self._rope = opts["rope"]

    def layer_ids(self, cfg, model_config) -> tuple:
        from mmspec.drafters.block import kept_layer_ids

        n = int(model_config.get_text_config(decoder=True).num_hidden_layers)
        if cfg.layer_ids is not None:
            return tuple(cfg.layer_ids)
        return kept_layer_ids(n, self.options(cfg)["num_kept_layers"])

    def build_drafter(self, cfg, model, tokenizer):
        from .drafter import GlanceDrafter

        opts = self.options(cfg)
        return GlanceDrafter.from_target(model, tokenizer, layer_ids=self.layer_ids(cfg, model.config), seed=cfg.seed,
                                         block_size=cfg.num_draft_tokens + 1, num_layers=opts["num_layers"],
                                         anchor_feature=opts["anchor_feature"], refine=opts["refine"],
                                         rope=opts["rope"], context=opts["context"], pointer=opts["pointer"])

    #: kind options that shape the drafter, and the drafter config key each one sets
    SHAPE_OPTIONS = {"num_layers": "num_layers", "anchor_feature": "anchor_feature", "refine": "refine",
                     "rope": "rope", "context": "context", "pointer": "pointer"}

    def initial_drafter(self, drafter, cfg):
        """Rebuild the saved initial head when this fit's options ask for another shape (e.g. a data stage run
        without ``anchor_feature``): same target tensors (embeddings, LM head) and fingerprint, fresh layers."""
        opts = self.options(cfg)
        config = drafter.config_dict()
        want = {key: opts[opt] for opt, key in self.SHAPE_OPTIONS.items()}
        if all(config.get(k) == v for k, v in want.items()):
            return drafter
        if cfg.seed is not None:
            torch.manual_seed(cfg.seed)
        fresh = type(drafter)(fingerprint=drafter.fingerprint, **{**config, **want})
        with torch.no_grad():
            fresh.head.embed_tokens.weight.copy_(drafter.head.embed_tokens.weight)
            fresh.head.lm_head.weight.copy_(drafter.head.lm_head.weight)
        return fresh.eval()

    def record(self, cfg, model, inputs, layer_ids, reference=None):
        return glance_record(model, inputs, layer_ids, cfg.max_new_tokens, reference=reference)

    def collate(self, records):
        from mmspec.drafters.block import collate_blocks

        if self._block is None:
            raise InvalidInputError("GlanceTrainer.collate before check_config: validate the TrainConfig first")
        first = records[0]
        n_axes = first["positions"].reshape(len(first["tokens"]), -1).shape[1] if "positions" in first else 1
        batch = collate_blocks(records, self._block, self._opts["num_anchors"], self._gen, n_axes, rope=self._rope)
        return batch if self._hidden_ids is None else text_context(batch, self._hidden_ids)

    def loss_setup(self, drafter, cfg) -> tuple:
        """Check the drafter against ``cfg`` and fix the collate settings; returns ``(options, loss decay)``."""
        opts = self.options(cfg)
        if drafter.block_size != cfg.num_draft_tokens + 1:
            raise InvalidInputError(f"the initial drafter drafts blocks of {drafter.block_size}; --num-draft-tokens "
                                    f"{cfg.num_draft_tokens} asks for {cfg.num_draft_tokens + 1}")
        decay = opts["loss_decay"]
        decay = drafter.block_size / 2 if decay is None else (float(decay) or None)
        # the head's own layout, not the options': an --init-drafter head keeps the rope it was saved with
        self._opts, self._block, self._rope = opts, drafter.block_size, drafter.rope
        self._hidden_ids = None
        if getattr(drafter, "context", "all") == "text":  # the image ids are the target's, as at run time
            from transformers import AutoConfig

            from .head import image_token_ids

            self._hidden_ids = image_token_ids(AutoConfig.from_pretrained(cfg.target))
        return opts, decay

    def loss_module(self, drafter, cfg):
        from mmspec.drafters.block import BlockLoss

        return BlockLoss(drafter, self.loss_setup(drafter, cfg)[1])


@torch.no_grad()
def add_pointer_slots(data_dir: str, target: str, dtype: str | None = None, progress: bool = True) -> int:
    """Add the pointer's slots (:func:`pointer_slots`) to the records of a data stage run before they existed,
    without re-running the target's rollouts: per record, the item is prepared again and the target runs its
    embedding step (one prompt forward: ``hidden_states[0]``). Shards that have them are skipped, each shard is
    rewritten atomically with its own metadata, so a stopped run resumes. ``dtype``: the target's (default: the
    one the data was collected in). Returns the number of shards rewritten.

    ``python -m mmspec.vision.glance.train add-pointer-slots DATA --target T``

    Example:
        >>> add_pointer_slots("runs/reader-drafters/data-run/data", "vision/assets/reader")   # doctest: +SKIP
        25
    """
    import glob
    import json
    import os

    from safetensors import safe_open
    from tqdm.auto import tqdm

    from mmspec.pipelines import MMSpecPipeline
    from mmspec.train import read_shard, write_shard
    from mmspec.workloads import get_workload


    paths = sorted(glob.glob(os.path.join(data_dir, "shard-*.safetensors")))
    if not paths:
        raise InvalidInputError(f"no shards in {data_dir}")
    todo = []
    for path in paths:
        with safe_open(path, framework="pt") as f:
            if "pointer_tokens" not in f.keys():
                todo.append((path, {k: json.loads(v) for k, v in (f.metadata() or {}).items()
                                    if k not in ("n_records", "scalar_keys")}))
    if not todo:
        return 0
    dtype = dtype or (todo[0][1].get("settings") or {}).get("dtype") or "auto"
    pipe = MMSpecPipeline.from_pretrained(target, dtype=dtype)
    model = pipe.model.eval()
    workloads = {}
    bar = tqdm(total=len(todo), desc="pointer slots", disable=not progress)
    for path, meta in todo:
        records = read_shard(path)
        items = meta.get("items") or []
        if len(items) != len(records):
            raise InvalidInputError(f"{path} does not name its items; collect its data again")
        for rec, item in zip(records, items):
            name, split, idx = item.rsplit("/", 2)
            ex = workloads.setdefault(name, get_workload(name)).example(split, int(idx))
            inputs = dict(pipe.prepare(images=ex.images or None, prompt=ex.prompt))
            P = int(rec["prompt_len"])
            if not torch.equal(inputs["input_ids"][0].cpu(), rec["tokens"][:P]):
                raise InvalidInputError(f"{path}: item {item} no longer prepares to the recorded prompt")
            inputs = {k: (v.to(model.device) if torch.is_tensor(v) else v) for k, v in inputs.items()}
            embeds = model(**inputs, output_hidden_states=True, return_dict=True).hidden_states[0][0]
            rec["pointer_tokens"], rec["pointer_pos"] = pointer_slots(model, rec["tokens"], P, embeds.cpu())
            rec.pop("context_tokens", None)  # a field of an earlier layout of this change
        write_shard(path, records, meta)
        bar.update(1)
    bar.close()
    return len(todo)


def main(argv=None) -> None:
    """``python -m mmspec.vision.glance.train add-pointer-slots DATA --target T [--dtype D] [--threads N]``."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m mmspec.vision.glance.train")
    sub = ap.add_subparsers(dest="cmd", required=True)
    add = sub.add_parser("add-pointer-slots", help="add a pointer head's slots to older GLANCE/TIGER data")
    add.add_argument("data")
    add.add_argument("--target", required=True)
    add.add_argument("--dtype", default=None, help="the target's dtype (default: the data's)")
    add.add_argument("--threads", type=int, default=0)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    n = add_pointer_slots(args.data, args.target, args.dtype)
    print(f"pointer slots added to {n} shard(s) of {args.data}")


if __name__ == "__main__":
    main()
