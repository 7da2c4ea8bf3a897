"""Training TIGER with ``mmspec train --kind tiger``: a distillation warm start, then acceptance-aligned group
policy training. Both stages run through the shared data stage and fit loop, so both resume (``--resume``).

**Records** are GLANCE's (:func:`~mmspec.vision.glance.train.glance_record`: tokens, the target's next-token
labels, the kept layers' states over prompt and response, the target's positions) plus ``routable`` (the image
and video positions the router picks among) and the target's top-``teacher_top_k`` next-token log-probabilities
at every position (``top_ids`` / ``top_logp``, :func:`~mmspec.drafters.eagle.target_record` with ``keep_top``).

**Stage ``distill``** (default): GLANCE's block loss (cross-entropy on the target's greedy token at each block
offset, DFlash's position decay) plus ``kl_weight`` times the KL divergence from the target's distribution
(renormalised over its top ``teacher_top_k``) to the head's, at every block offset: the KL anchor that keeps
the head's whole distribution near the target's, not only its argmax.

**Stage ``policy``** (``--init-drafter`` a distilled TIGER head, ``--data`` its data): for every block, the head
samples ``group`` drafts from its own per-position distributions; each draft's reward is the prefix the
verifier would accept (greedy verification: the leading positions equal to the target's tokens); rewards are
normalised within the group (group-relative advantages, GRPO); the loss is ``-A * log q(draft)`` over the
accepted positions and the first rejected one (later positions cannot change the reward), plus ``kl_ref``
times the KL divergence from the warm-start head (frozen, loaded from ``--init-drafter``) to the head. Held-out
scores (``--val-shards``) stay the per-offset top-1 of the block loss in both stages, so the two read alike.

Differences from the TIGER paper: its drafter architecture is not stated (here GLANCE's block head); its reward
is the accepted prefix length from the verifier, here computed against the target's recorded greedy tokens,
which is exactly what greedy verification accepts along the target's own path.

Kind options (``--options JSON``), GLANCE's plus: ``visual_top_k`` (default 64, or ``"all"``), ``router_dim``
(64), ``stage`` (``distill`` / ``policy``), ``teacher_top_k`` (32), ``kl_weight`` (1.0), ``group`` (4),
``kl_ref`` (0.1).

Example:
    >>> from mmspec.train import get_trainer
    >>> t = get_trainer("tiger")
    >>> t.kind, t.options(type("C", (), {"options": {"visual_top_k": "all"}})())["visual_top_k"]
    ('tiger', 'all')
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mmspec.errors import InvalidInputError

from ..glance.train import OPTION_DEFAULTS as GLANCE_DEFAULTS
from ..glance.train import GlanceTrainer, glance_record
from .router import VisualRouter, parse_top_k

__all__ = ["TigerTrainer", "tiger_record", "OPTION_DEFAULTS", "TigerDistillLoss", "TigerPolicyLoss",
           "routing_mask"]

OPTION_DEFAULTS = {**GLANCE_DEFAULTS, "visual_top_k": 64, "router_dim": 64, "stage": "distill", "teacher_top_k": 32,
                   "kl_weight": 1.0, "group": 4, "kl_ref": 0.1}
"""TIGER's training options and their defaults."""

STAGES = ("distill", "policy")


@torch.no_grad()
def tiger_record(model, inputs, layer_ids, max_new_tokens: int, teacher_top_k: int = 32,
                 feature_dtype=torch.bfloat16, reference=None) -> dict:
    """GLANCE's record plus ``routable[n]`` (image / video positions) and the target's top-``teacher_top_k``
    next-token log-probabilities ``top_ids`` / ``top_logp[n, K]``.

    Example:
        >>> rec = tiger_record(model, inputs, (2, 3, 4), 64)                          # doctest: +SKIP
        >>> rec["routable"].sum(), rec["top_logp"].shape                             # doctest: +SKIP
        (tensor(324), torch.Size([402, 32]))
    """
    from ..glance.head import image_token_mask

    rec = glance_record(model, inputs, layer_ids, max_new_tokens, feature_dtype, keep_top=teacher_top_k,
                        reference=reference)
    n = len(rec["tokens"])
    routable = torch.zeros(n, dtype=torch.bool)
    if not torch.is_tensor(inputs):
        P = int(rec["prompt_len"])
        one = {"input_ids": rec["tokens"][None, :P]}
        routable[:P] = image_token_mask(model, one, 0).cpu()
    rec["routable"] = routable
    rec["top_logp"] = rec["top_logp"].to(feature_dtype)
    return rec


def routing_mask(router: VisualRouter | None, k: int | None):
    """The training side of :meth:`TigerDrafter.context_mask`: a ``context_mask`` for
    :func:`~mmspec.drafters.block.block_forward` that routes each block (its text state: the projected context
    just before its anchor) to the top ``k`` visual positions it may see; ``None`` (no router) keeps the mask.
    Counts are added to the returned function's ``read`` / ``available`` attributes."""
    if router is None:
        return None

    def mask(allowed, c, anchors, batch):
        B, NQ, TK = allowed.shape
        T = c.shape[1]
        N = anchors.shape[1]
        Bs = NQ // N
        a = anchors.clamp(min=0)
        text_state = c.gather(1, (a - 1).clamp(min=0)[:, :, None].expand(-1, -1, c.shape[-1]))  # [B, N, H]
        visible = allowed[:, ::Bs, :T]  # a block's queries all see the same context
        routable = batch["routable"].to(c.device)
        bias, read = router.bias(router.scores(text_state, c), routable, visible, k)
        mask.read += int(read)
        mask.available += int((visible & routable[:, None, :]).sum())
        ctx_part = bias.repeat_interleave(Bs, dim=1)
        blk = torch.zeros(allowed[:, :, T:].shape, dtype=c.dtype, device=c.device).masked_fill(
            ~allowed[:, :, T:], float("-inf"))
        return torch.cat([ctx_part, blk], dim=2)

    mask.read = 0
    mask.available = 0
    return mask


def _teacher_kl(logits: torch.Tensor, top_ids: torch.Tensor, top_logp: torch.Tensor, keep: torch.Tensor):
    """Mean KL(p || q) over kept positions, ``p`` the target's top-K renormalised, ``q`` the head's softmax."""
    keep = keep.bool() & torch.isfinite(top_logp[..., 0])  # padding carries -inf everywhere
    lp = torch.where(keep[..., None], top_logp.float(), torch.zeros_like(top_logp, dtype=torch.float32))
    p = torch.softmax(lp, dim=-1)  # renormalised over the K kept tokens
    logq = torch.log_softmax(logits.float(), dim=-1).gather(-1, top_ids)
    kl = (p * (torch.log(p.clamp_min(1e-12)) - logq)).sum(-1)
    return torch.where(keep, kl, torch.zeros_like(kl)).sum() / keep.sum().clamp(min=1)


def _block_teacher(batch, anchors, Bs, T):
    """The target's top-K at each block offset's scored position ``a + j - 1`` -> ``ids, logp[B, N, Bs-1, K]``."""
    a = anchors.clamp(min=0)
    offs = torch.arange(1, Bs, device=a.device)
    idx = (a[:, :, None] + offs[None, None] - 1).clamp(max=T - 1)  # [B, N, Bs-1]
    B, N = a.shape
    K = batch["top_ids"].shape[-1]
    flat = idx.view(B, -1)[:, :, None].expand(-1, -1, K)
    ids = batch["top_ids"].to(a.device).gather(1, flat).view(B, N, Bs - 1, K)
    logp = batch["top_logp"].to(a.device).gather(1, flat).view(B, N, Bs - 1, K)
    return ids, logp


class TigerDistillLoss(nn.Module):
    """Stage ``distill``: the block loss plus the KL anchor to the target (see the module docstring). Returns
    per-offset ``(losses, accuracies)`` like :class:`~mmspec.drafters.block.BlockLoss`."""

    def __init__(self, drafter, decay: float | None, kl_weight: float):
        super().__init__()
        self.drafter, self.decay, self.kl_weight = drafter, decay, float(kl_weight)

    def forward(self, batch: dict):
        from mmspec.drafters.block import block_forward, position_weights

        d = self.drafter
        route = routing_mask(d.router, d.visual_top_k)
        if not self.training:  # held-out scores: the plain block loss, comparable across stages and kinds
            return _eval_loss(d, batch, route, self.decay)
        logits, target = block_forward(d.head, batch, route)
        Bs = d.block_size
        w = position_weights(Bs, self.decay).to(logits.device)
        ids, logp = _block_teacher(batch, batch["anchors"].to(logits.device), Bs, batch["tokens"].shape[1])
        losses, accs = [], []
        for j in range(Bs - 1):
            lg, tg = logits[:, :, j], target[:, :, j]
            keep = tg != -100
            ce = F.cross_entropy(lg.reshape(-1, lg.shape[-1]), tg.reshape(-1), ignore_index=-100) if bool(
                keep.any()) else lg.sum() * 0.0
            kl = _teacher_kl(lg, ids[:, :, j], logp[:, :, j], keep) if self.kl_weight else 0.0
            losses.append((ce + self.kl_weight * kl) * w[j])
            accs.append(((lg.argmax(-1) == tg) & keep).sum().float() / keep.sum().clamp(min=1))
        return torch.stack(losses), torch.stack(accs).detach()


class TigerPolicyLoss(nn.Module):
    """Stage ``policy``: group-relative policy training on the accepted prefix length, with a KL leash to the
    warm-start head (see the module docstring). In training mode returns ``(losses[2], stats[2])``: the policy
    and KL terms, and the mean accepted prefix (tokens) with the greedy draft's, both over ``Bs - 1``. In eval
    mode (held-out scores) it returns the block loss's per-offset cross-entropy and top-1, like the distillation
    stage, so validation logs of both stages compare."""

    def __init__(self, drafter, reference, decay: float | None, group: int, kl_ref: float):
        super().__init__()
        self.drafter, self.decay, self.group, self.kl_ref = drafter, decay, int(group), float(kl_ref)
        self._ref = [reference.eval().requires_grad_(False)]  # a list: not a submodule, never trained or saved

    def forward(self, batch: dict):
        from mmspec.drafters.block import block_forward

        d = self.drafter
        route = routing_mask(d.router, d.visual_top_k)
        if not self.training:
            return _eval_loss(d, batch, route, self.decay)
        logits, target = block_forward(d.head, batch, route)  # [B, N, J, V], [B, N, J]
        with torch.no_grad():
            ref = self._ref[0]
            if ref.head.fc.weight.device != logits.device:  # kept out of the module tree, so prepare() never moved it
                ref.to(logits.device)
            ref_logits, _ = block_forward(ref.head, batch, routing_mask(ref.router, ref.visual_top_k))
        logq = torch.log_softmax(logits.float(), dim=-1)
        G = self.group
        with torch.no_grad():
            draws = torch.multinomial(logq.exp().reshape(-1, logq.shape[-1]), G, replacement=True)
            draws = draws.view(*logq.shape[:-1], G).permute(3, 0, 1, 2)  # [G, B, N, J]
            ok = target != -100
            match = (draws == target[None]) & ok[None]
            accepted = match.long().cumprod(-1).sum(-1).float()  # [G, B, N]: the prefix greedy verify keeps
            valid = ok[:, :, 0].float()  # blocks with something to score
            adv = (accepted - accepted.mean(0, keepdim=True)) / (accepted.std(0, keepdim=True) + 1e-4)
            J = target.shape[-1]
            upto = (torch.arange(J, device=logits.device)[None, None, None] <= accepted[..., None]) & ok[None]
            greedy = ((logits.argmax(-1) == target) & ok).long().cumprod(-1).sum(-1).float()
        lp = logq[None].expand(G, *logq.shape).gather(-1, draws[..., None])[..., 0]  # [G, B, N, J]
        lp = (lp * upto).sum(-1)
        n_blocks = valid.sum().clamp(min=1)
        policy = -(adv * lp * valid[None]).sum() / (G * n_blocks)
        logr = torch.log_softmax(ref_logits.float(), dim=-1)
        kl = ((logq.exp() * (logq - logr)).sum(-1) * ok).sum() / ok.sum().clamp(min=1)
        stats = torch.stack([(accepted * valid[None]).sum() / (G * n_blocks), (greedy * valid).sum() / n_blocks])
        return torch.stack([policy, self.kl_ref * kl]), stats.detach() / J


def _eval_loss(drafter, batch, route, decay):
    """The block loss (per-offset cross-entropy with decay, top-1) of a routed head."""
    from mmspec.drafters.block import block_forward, position_weights

    logits, target = block_forward(drafter.head, batch, route)
    w = position_weights(drafter.block_size, decay).to(logits.device)
    losses, accs = [], []
    for j in range(drafter.block_size - 1):
        lg, tg = logits[:, :, j].reshape(-1, logits.shape[-1]), target[:, :, j].reshape(-1)
        keep = tg != -100
        losses.append((F.cross_entropy(lg, tg, ignore_index=-100) if bool(keep.any()) else lg.sum() * 0.0) * w[j])
        accs.append(((lg.argmax(-1) == tg) & keep).sum().float() / keep.sum().clamp(min=1))
    return torch.stack(losses), torch.stack(accs).detach()


class TigerTrainer(GlanceTrainer):
    """TIGER's plug into :mod:`mmspec.train` (see the module docstring)."""

    kind = "tiger"
    data_from = ()  # GLANCE's records lack the routable positions and the target's top tokens
    SHAPE_OPTIONS = {**GlanceTrainer.SHAPE_OPTIONS, "visual_top_k": "visual_top_k", "router_dim": "router_dim"}

    @property
    def drafter_cls(self):
        from .drafter import TigerDrafter

        return TigerDrafter

    OPTIONS = OPTION_DEFAULTS

    def check_options(self, opts: dict) -> None:
        super().check_options(opts)
        try:
            parse_top_k(opts["visual_top_k"])
        except ValueError as e:
            raise InvalidInputError(f"tiger option {e}") from e
        if opts["context"] != "all":  # the router picks among image positions: they must be in the context
            raise InvalidInputError("tiger routes over the image positions: context must be \"all\"")
        if opts["pointer"]:  # the router's additive mask decides what a block sees; the pointer's shifted read would
            # lose every value the router left out
            raise InvalidInputError("tiger does not train GLANCE's pointer (pointer must be false)")
        if opts["refine"]:  # its distillation and policy losses score one pass
            raise InvalidInputError("tiger does not train GLANCE's refinement pass (refine must be 0)")
        if opts["stage"] not in STAGES:
            raise InvalidInputError(f"tiger option stage must be one of {STAGES} (got {opts['stage']!r})")
        for k, lo in (("router_dim", 1), ("teacher_top_k", 1), ("group", 2)):
            v = opts[k]
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise InvalidInputError(f"tiger option {k} must be an integer >= {lo} (got {v!r})")
        for k in ("kl_weight", "kl_ref"):
            v = opts[k]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                raise InvalidInputError(f"tiger option {k} must be a number >= 0 (got {v!r})")

    def check_config(self, cfg):
        super().check_config(cfg)
        if self._opts["stage"] == "policy" and not getattr(cfg, "init_drafter", ""):
            raise InvalidInputError("the tiger policy stage starts from a distilled head: pass --init-drafter DIR "
                                    "(and --data DIR, that run's data)")

    def build_drafter(self, cfg, model, tokenizer):
        from .drafter import TigerDrafter

        opts = self.options(cfg)
        return TigerDrafter.from_target(model, tokenizer, layer_ids=self.layer_ids(cfg, model.config), seed=cfg.seed,
                                        block_size=cfg.num_draft_tokens + 1, num_layers=opts["num_layers"],
                                        anchor_feature=opts["anchor_feature"], visual_top_k=opts["visual_top_k"],
                                        router_dim=opts["router_dim"], rope=opts["rope"])

    def record(self, cfg, model, inputs, layer_ids, reference=None):
        return tiger_record(model, inputs, layer_ids, cfg.max_new_tokens, self.options(cfg)["teacher_top_k"],
                            reference=reference)

    def loss_module(self, drafter, cfg):
        opts, decay = self.loss_setup(drafter, cfg)
        if opts["stage"] == "distill":
            return TigerDistillLoss(drafter, decay, opts["kl_weight"])
        from .drafter import TigerDrafter

        reference = TigerDrafter.from_pretrained(cfg.init_drafter, shared=drafter.held_target_tensors())
        if reference.fingerprint != drafter.fingerprint:
            raise InvalidInputError(f"{cfg.init_drafter} was trained for another target than this run's data")
        return TigerPolicyLoss(drafter, reference, decay, opts["group"], opts["kl_ref"])
