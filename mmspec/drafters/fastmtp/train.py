"""Training FastMTP with ``mmspec train --kind fastmtp``: EAGLE's data stage, records, batches and unrolled
graph, with FastMTP's step-weighted loss.

Data (stage 1, :func:`mmspec.train.collect_data`): the EAGLE record (:func:`~mmspec.drafters.eagle.target_record`:
the target's own greedy response, its next-token labels, and the states of the layers read, here only the last
one, ``[n, H]``). Batches: :func:`~mmspec.drafters.eagle.collate_eagle` (loss on the answer only).

The graph is EAGLE's training-time-test unroll (:func:`~mmspec.drafters.eagle.eagle_unroll_loss`) over ``K``
steps (``--num-draft-tokens``, 3 by default; ``--ttt-steps`` can differ): step ``k`` at position ``t`` reads the
ground-truth token there (teacher forcing, as FastMTP) and the block's own output of step ``k - 1`` at ``t - 1``.
Where it differs from FastMTP's reference training, and why: the reference runs step ``k`` causally over the whole
sequence of step-``k`` states, so position ``t`` attends to step-``k`` states of earlier positions that decoding
never computes (at run time the block's cache holds step-1 keys of the committed prefix, and a draft sees only
those and its own chain); the EAGLE unroll mask gives every step exactly that view, so what is trained is what runs.

Loss (FastMTP, arXiv 2509.18362, Eq. 2; ``Tencent-BAC/FastMTP``; ``vllm-project/speculators``
``fast_mtp/core.py``, ``_MTP_STEP_DECAY_BETA``): ``L = sum_k alpha_k * CE_k`` with
``alpha_k = beta**k / sum_j beta**j`` over the ``K`` steps, ``beta = 0.6`` (0.51, 0.31, 0.18 at ``K = 3``): early
steps, which every accepted draft passes through, weigh most. EAGLE sums its steps unweighted. The per-step losses
in ``train_log.jsonl`` / ``val_log.jsonl`` are the weighted terms ``alpha_k * CE_k`` (their sum is the objective;
speculators logs the same); the top-1 accuracies are unweighted, so the validation tau estimate is comparable
with EAGLE's.

Kind options (``--options '{"beta": 0.6}'``): ``beta``, the step decay (> 0; 1 weighs the steps equally).

Example:
    >>> step_weights(3).tolist()  # doctest: +ELLIPSIS
    [0.5102..., 0.3061..., 0.1836...]
"""

from __future__ import annotations

import torch
from torch import nn

from mmspec.errors import InvalidInputError
from mmspec.train import EagleTrainer

__all__ = ["STEP_DECAY_BETA", "step_weights", "FastMTPLoss", "FastMTPTrainer"]

STEP_DECAY_BETA = 0.6
"""FastMTP's step decay ``beta`` (paper Eq. 2; the reference code's and speculators' default)."""


def step_weights(num_steps: int, beta: float = STEP_DECAY_BETA) -> torch.Tensor:
    """``alpha_k = beta**k / sum_j beta**j`` for ``k = 0 .. num_steps - 1`` (float32, sums to 1).

    Example:
        >>> [round(w, 2) for w in step_weights(3, 0.6).tolist()], step_weights(2, 1.0).tolist()
        ([0.51, 0.31, 0.18], [0.5, 0.5])
    """
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1 (got {num_steps})")
    w = torch.tensor([float(beta) ** k for k in range(int(num_steps))], dtype=torch.float64)
    return (w / w.sum()).float()


class FastMTPLoss(nn.Module):
    """The head plus FastMTP's objective as one module (what ``accelerate`` wraps): ``forward(batch)`` returns
    ``(alpha_k * CE_k [K], top-1 accuracy [K])``; ``fit`` minimises the sum of the first."""

    def __init__(self, drafter, unroll: int = 3, beta: float = STEP_DECAY_BETA):
        super().__init__()
        self.drafter, self.unroll = drafter, int(unroll)
        self.register_buffer("weights", step_weights(self.unroll, beta), persistent=False)

    def forward(self, batch: dict):
        from ..eagle import eagle_unroll_loss

        losses, accs = eagle_unroll_loss(self.drafter, batch, self.unroll)
        return losses * self.weights.to(losses), accs


class FastMTPTrainer(EagleTrainer):
    """FastMTP's plug into :mod:`mmspec.train`: EAGLE's record and collate, one layer (the last), FastMTP's loss."""

    kind = "fastmtp"
    data_from = ()  # it reads one (the last) layer; GLANCE's and TIGER's records concatenate several
    default_num_draft_tokens = 3
    OPTIONS = {"beta": STEP_DECAY_BETA}

    @property
    def drafter_cls(self):
        from .drafter import FastMTPDrafter

        return FastMTPDrafter

    def check_options(self, opts: dict) -> None:
        beta = opts["beta"]
        if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not beta > 0:
            raise InvalidInputError(f"fastmtp option beta must be a number > 0 (got {beta!r})")

    def check_config(self, cfg):
        self.options(cfg)
        if cfg.layer_ids is not None and len(cfg.layer_ids) != 1:
            raise InvalidInputError(f"the fastmtp head reads one target layer (default: the last); got layer_ids "
                                    f"{list(cfg.layer_ids)}")

    def layer_ids(self, cfg, model_config) -> tuple:
        n = int(model_config.get_text_config(decoder=True).num_hidden_layers)
        return tuple(cfg.layer_ids) if cfg.layer_ids is not None else (n,)

    def build_drafter(self, cfg, model, tokenizer):
        from .drafter import FastMTPDrafter

        return FastMTPDrafter.from_target(model, tokenizer, layer_ids=self.layer_ids(cfg, model.config), seed=cfg.seed,
                                          num_draft_tokens=cfg.num_draft_tokens)

    def loss_module(self, drafter, cfg):
        return FastMTPLoss(drafter, cfg.unroll, self.options(cfg)["beta"])
