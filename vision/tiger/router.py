"""TIGER's text-gated visual routing: from the drafter's current text state, pick a sparse top-k of the visual
tokens and gate them; the block head attends to those and to the text, never to the rest of the page.

The scores are a bilinear form between the projected context vector of the last committed position (the
target's fused state where the text stands now, the same vector GLANCE's anchor feature reads) and the
projected context vector of every visual position: ``s_i = <W_q c_last, W_k c_i> / sqrt(d)``. The top
``visual_top_k`` visual keys stay visible with an additive attention bias ``log sigmoid(s_i)`` (the gate: it
lets the loss move the scores, which a hard top-k alone would not); the other visual keys are hidden
(``-inf``); text keys are untouched. With ``visual_top_k="all"`` there is no router at all and the drafter is
GLANCE's (the ablation the issue names).

Example:
    >>> import torch
    >>> r = VisualRouter(hidden_size=8, dim=4)
    >>> c = torch.randn(1, 6, 8)                                  # 6 context positions
    >>> routable = torch.tensor([[False, True, True, True, True, False]])
    >>> visible = torch.ones(1, 2, 6, dtype=torch.bool)           # 2 blocks, both see every position
    >>> bias, read = r.bias(r.scores(c[:, [4, 5]], c), routable, visible, k=2)
    >>> bias.shape, int(read), bool((bias[0, 0, [0, 5]] == 0).all())  # text keys untouched
    (torch.Size([1, 2, 6]), 4, True)
    >>> int(torch.isinf(bias[0, 0, 1:5]).sum())                   # 2 of the 4 visual keys hidden
    2
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["VisualRouter", "parse_top_k"]


def parse_top_k(value):
    """``visual_top_k`` as given by a user (an int >= 1, or ``"all"``) -> an int or ``None`` (all).

    Example:
        >>> parse_top_k(32), parse_top_k("all"), parse_top_k("16")
        (32, None, 16)
    """
    if value is None or (isinstance(value, str) and value.strip().lower() == "all"):
        return None
    if isinstance(value, bool):
        raise ValueError(f"visual_top_k must be a positive integer or 'all' (got {value!r})")
    try:
        k = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"visual_top_k must be a positive integer or 'all' (got {value!r})") from None
    if k < 1 or (isinstance(value, float) and value != k):
        raise ValueError(f"visual_top_k must be a positive integer or 'all' (got {value!r})")
    return k


class VisualRouter(nn.Module):
    """Scores visual context positions against the current text state (see the module docstring).

    Args:
        hidden_size: the projected context width (the block head's hidden size).
        dim: the routing space's width.
    """

    def __init__(self, hidden_size: int, dim: int = 64):
        super().__init__()
        self.dim = int(dim)
        self.query_proj = nn.Linear(int(hidden_size), self.dim, bias=False)
        self.key_proj = nn.Linear(int(hidden_size), self.dim, bias=False)

    def keys(self, c: torch.Tensor) -> torch.Tensor:
        """Routing keys ``[..., dim]`` of context vectors ``c[..., H]``."""
        return self.key_proj(c)

    def scores(self, text_state: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        """``text_state[B, N, H]`` (one per block) against context ``c[B, T, H]`` -> scores ``[B, N, T]``."""
        return self.score_keys(text_state, self.keys(c))

    def score_keys(self, text_state: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """As :meth:`scores` with the routing keys ``[B, T, dim]`` already computed (the drafter caches them)."""
        return self.query_proj(text_state) @ keys.transpose(-1, -2) / math.sqrt(self.dim)

    @staticmethod
    def bias(scores: torch.Tensor, routable: torch.Tensor, visible: torch.Tensor, k: int) -> tuple:
        """The additive attention bias ``[B, N, T]`` over the context and how many visual keys it keeps.

        ``routable[B, T]``: visual positions; ``visible[B, N, T]``: what each block may see at all. Visible text
        positions get 0, the top ``k`` visible visual positions of each block ``log sigmoid(score)``, every other
        position ``-inf``. Returns ``(bias, read)`` with ``read`` the number of visual keys kept, summed over
        blocks (a 0-d tensor)."""
        cand = visible & routable[:, None, :]
        masked = scores.masked_fill(~cand, float("-inf"))
        kk = max(1, min(int(k), scores.shape[-1]))
        top = masked.topk(kk, dim=-1).indices
        picked = torch.zeros_like(cand).scatter(-1, top, True) & cand
        gate = F.logsigmoid(scores.float()).to(scores.dtype)
        neg = torch.full_like(scores, float("-inf"))
        text = visible & ~routable[:, None, :]
        bias = torch.where(text, torch.zeros_like(scores), torch.where(picked, gate, neg))
        return bias, picked.sum()
