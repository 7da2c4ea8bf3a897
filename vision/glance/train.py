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
head never attends to image positions; which ids are images is read from the target's config).
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

__all__ = ["GlanceTrainer", "glance_record", "text_context", "OPTION_DEFAULTS"]

OPTION_DEFAULTS = {"num_anchors": 16, "loss_decay": None, "num_layers": 2, "num_kept_layers": 3, "anchor_feature": True,
                   "refine": 0, "rope": "target", "context": "all"}
"""GLANCE's training options and their defaults (``loss_decay=None``: ``block_size / 2``)."""


@torch.no_grad()
def glance_record(model, inputs, layer_ids, max_new_tokens: int, feature_dtype=torch.bfloat16, keep_top: int = 0,
                  reference=None) -> dict:
    """One record: :func:`~mmspec.drafters.eagle.target_record` plus ``positions[n, A]`` (the target's own
    positions of prompt + response: one axis for 1-D RoPE, three for M-RoPE), features stored in
    ``feature_dtype`` (bfloat16 by default: half the disk of float32, and a page's record is mostly its ~300
    image positions times the kept layers; the head trains in float32 on them). ``keep_top``: also the
    target's top next-token log-probabilities (see :func:`~mmspec.drafters.eagle.target_record`)."""
    from mmspec.drafters.block import context_positions, rope_settings
    from mmspec.drafters.eagle import _extend_inputs, _text_model_inputs, target_record

    rec = target_record(model, inputs, layer_ids, max_new_tokens, keep_top=keep_top, reference=reference)
    full = rec["tokens"]
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
                                         rope=opts["rope"], context=opts["context"])

    #: kind options that shape the drafter, and the drafter config key each one sets
    SHAPE_OPTIONS = {"num_layers": "num_layers", "anchor_feature": "anchor_feature", "refine": "refine",
                     "rope": "rope", "context": "context"}

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
