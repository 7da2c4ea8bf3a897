"""The TIGER drafter: GLANCE's block drafter with a text-gated visual router in front of its context.

Every round the router scores the cached visual positions of each row against the row's current text state
(the projected context vector of its last committed token) and the block pass sees only the top
``visual_top_k`` of them, gated (:mod:`~mmspec.vision.tiger.router`); text positions, the prompt's and the
generated ones, stay visible. ``visual_top_k="all"`` removes the router: the drafter is then GLANCE's, the
ablation trained separately with the same recipe and data. ``stats.drafter_counters`` reports
``visual_read`` and ``visual_available`` (visual keys kept and offered, summed over rows and rounds): their
ratio is the fraction of the page each drafting step reads.

The router changes what the drafter proposes, never what is accepted: verification is the core's, so
outputs stay exactly the target's (greedy) or distributed as its samples (sampling).

Example:
    >>> from mmspec.registry import make_drafter                                       # doctest: +SKIP
    >>> d = make_drafter("tiger:HEAD;visual_top_k=32;branch_k=4", target)             # doctest: +SKIP
    >>> out = mmspec.generate(target, inputs, drafter=d)                              # doctest: +SKIP
    >>> out.stats.drafter_counters["visual_read"] / out.stats.drafter_counters["visual_available"]  # doctest: +SKIP
    0.11
"""

from __future__ import annotations

import torch

from mmspec.errors import InvalidInputError

from ..glance.drafter import RUN_OPTIONS as GLANCE_RUN_OPTIONS
from ..glance.drafter import GlanceDrafter, glance_factory
from ..glance.head import image_token_mask
from .router import VisualRouter, parse_top_k

__all__ = ["TigerDrafter", "tiger_factory", "RUN_OPTIONS"]

RUN_OPTIONS = GLANCE_RUN_OPTIONS + ("visual_top_k",)
"""Options that change how a saved TIGER head drafts (``visual_top_k`` may be lowered or raised at run time
for a sweep; the head was trained with its saved value)."""


class TigerDrafter(GlanceDrafter):
    """GLANCE's drafter plus a :class:`~mmspec.vision.tiger.router.VisualRouter` (see the module docstring).

    Args:
        visual_top_k: visual keys each drafting step reads (an int, or ``"all"`` / ``None``: no router).
        router_dim: the routing space's width.
        Others: as :class:`~mmspec.vision.glance.drafter.GlanceDrafter`.

    Example:
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> t = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
        ...                      num_hidden_layers=2, num_attention_heads=2))
        >>> d = TigerDrafter.from_target(t, block_size=4, visual_top_k=8, router_dim=4)
        >>> d.kind, d.visual_top_k, d.config_dict()["router_dim"]
        ('tiger', 8, 4)
        >>> TigerDrafter.from_target(t, block_size=4, visual_top_k="all").router is None
        True
    """

    kind = "tiger"

    def __init__(self, *args, visual_top_k=64, router_dim: int = 64, **kw):
        super().__init__(*args, **kw)
        if self.context != "all":  # its router picks among the image positions, and its cache slots index them
            raise ValueError("a tiger head routes over the image positions: context must be 'all'")
        self.visual_top_k = parse_top_k(visual_top_k)
        self.router_dim = int(router_dim)
        # "all" trains and runs without a router (no parameters): the ablation is GLANCE, not a router left idle.
        self.router = None if self.visual_top_k is None else VisualRouter(self.head.hidden_size, self.router_dim)
        self._reset_routes()

    def _reset_routes(self) -> None:
        self._route_keys: dict = {}  # original row -> (cache slots of its visual positions, routing keys [m, d])
        self._read = 0
        self._available = 0

    def config_dict(self) -> dict:
        return {**super().config_dict(), "visual_top_k": "all" if self.visual_top_k is None else self.visual_top_k,
                "router_dim": self.router_dim}

    def counters(self) -> dict:
        return {"visual_read": int(self._read), "visual_available": int(self._available)}

    def begin(self, ctx) -> None:
        self._reset_routes()
        super().begin(ctx)

    def prompt_context(self, slot: int, row: int, context: torch.Tensor, ctx) -> None:
        if self.router is None:
            return
        model = self._target_ref[0]
        mask = image_token_mask(model, ctx.model_inputs, row).to(context.device)
        idx = mask.nonzero().flatten()  # prompt positions are the row's first cache slots
        self._route_keys[row] = (idx, self.router.keys(context[idx]))

    def context_mask(self, allowed, rows: list, slots: torch.Tensor, block_size: int):
        if self.router is None:
            return allowed
        dev = self.head.fc.weight.device
        dt = self.head.fc.weight.dtype
        C = int(self._cache.lengths.max())
        B = len(rows)
        if allowed is None:
            allowed = torch.ones(B, block_size, C + block_size, dtype=torch.bool, device=dev)
        bias = torch.zeros(allowed.shape, dtype=dt, device=dev).masked_fill(~allowed, float("-inf"))
        last = self._last_c[slots.to(self._last_c.device)].to(dev)  # [B, H]: the text state of each row
        for b, r in enumerate(rows):
            idx, keys = self._route_keys.get(r, (None, None))
            if idx is None or len(idx) == 0:
                continue
            s = self.router.score_keys(last[b][None, None], keys[None])[0, 0]  # [m]
            k = min(self.visual_top_k, len(idx))
            top = s.topk(k)
            col = bias[b, :, :C]
            col[:, idx] = float("-inf")
            col[:, idx[top.indices]] = torch.nn.functional.logsigmoid(top.values.float()).to(dt)[None]
            self._read += k
            self._available += len(idx)
        return bias


def tiger_factory(target_model, path=None, tokenizer=None, **options):
    """``"tiger:PATH"`` loads a saved TIGER head; ``"tiger"`` alone builds an untrained one (tests). Run options
    (:data:`RUN_OPTIONS`) override the saved ones; ``visual_top_k`` cannot turn a router on in a head trained
    without one (``all``), or off in one trained with it."""
    top = options.pop("visual_top_k", None) if "visual_top_k" in options else ...
    if top is not ...:
        try:
            top = parse_top_k(top)
        except ValueError as e:
            raise InvalidInputError(str(e)) from e
    if path is None and top is not ...:
        options["visual_top_k"] = "all" if top is None else top
    drafter = glance_factory(target_model, path, tokenizer, cls=TigerDrafter, **options)
    if path is not None and top is not ...:
        if (top is None) != (drafter.router is None):
            raise InvalidInputError(f"{path} was trained {'without' if drafter.router is None else 'with'} a router; "
                                    f"visual_top_k={'all' if top is None else top} cannot change that")
        drafter.visual_top_k = top
    return drafter
