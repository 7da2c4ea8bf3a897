"""The spatial drafting head (SSD seed): predicts an image slot's code from the committed context to its left and above.

SSD's heads map a committed state ``z = [h; e]`` (the target's hidden state that produced a code, and the code's
embedding) to the state ``δ`` slots ahead, through ``W0 z + SwiGLU(RMSNorm(W0 z))``, then the output head. Here one
head body serves every slot a round drafts (:class:`~mmspec.image_ar.spatial.GridScheduler`'s plan), fed two
committed states at once:

* the *last* committed slot ``n - 1`` (the current row's context; ``Δ`` = raster distance to the drafted slot),
* the nearest committed cell *straight above* the drafted one (``d`` rows up, ``d <= k_v``), which is the vertical
  head's source; a slot with no committed cell above (the first row) reads a zero there behind an explicit
  "missing" flag (``d = 0``), never a slot not yet generated,

plus learned embeddings of ``Δ``, ``d`` and the drafted cell's row and column. Every input is a committed state,
so all slots of a round are predicted in one batched call (rows of the image in parallel, not one code after the
other). The state of slot ``s`` is ``[feat[s]; embed(code[s])]`` where ``feat[s]`` is the target's last-layer hidden
state at the position *before* ``s`` (the one whose logits gave code ``s``; for ``s = 0`` the ``<boi>`` position).

:func:`slot_inputs` builds the index arrays for one row and one ``n_done`` from a plan; the drafter (run time) and
the trainer (:mod:`mmspec.image_ar.ssd_train`) both call it, so the head sees the same inputs in training and use.

Example:
    >>> import torch
    >>> from mmspec.image_ar.spatial import GridScheduler, RasterMap
    >>> s = GridScheduler(RasterMap(3, 4), k_h=2, k_v=1)
    >>> ins = slot_inputs(s.plan(5), 5, s.raster, k_v=1)
    >>> ins["delta"], ins["above"], ins["dv"]
    ([1, 2, 3, 4], [1, 2, 3, 4], [1, 1, 1, 1])
    >>> head = SpatialHead(hidden_size=8, n_codes=5, max_rows=3, max_cols=4)
    >>> feats, codes = torch.randn(1, 12, 8), torch.randint(5, (1, 12))
    >>> head(feats, codes, torch.zeros(4, dtype=torch.long), torch.tensor(ins["last"]), torch.tensor(ins["above"]),
    ...      torch.tensor(ins["delta"]), torch.tensor(ins["dv"]), torch.tensor(ins["row"]),
    ...      torch.tensor(ins["col"])).shape
    torch.Size([4, 5])
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["SpatialHead", "slot_inputs"]


def slot_inputs(plan: list, n_done: int, raster, k_v: int) -> dict:
    """Index arrays of the code slots of ``plan`` (newline slots are skipped: they are forced) after ``n_done``
    committed image-sequence slots: ``seq`` (the slot), ``last`` (``n_done - 1``), ``above`` (the nearest committed
    cell straight above within ``k_v`` rows, ``-1`` when none), ``delta`` (raster distance from ``last``), ``dv``
    (rows up to ``above``, 0 when none), ``row``, ``col``.

    Example:
        >>> from mmspec.image_ar.spatial import GridScheduler, RasterMap
        >>> s = GridScheduler(RasterMap(2, 2, newline=True), k_h=1, k_v=1)
        >>> [x.kind for x in s.plan(1)], slot_inputs(s.plan(1), 1, s.raster, 1)["seq"]
        (['h', 'newline', 'v'], [1, 3])
    """
    out = {k: [] for k in ("seq", "last", "above", "delta", "dv", "row", "col")}
    for slot in plan:
        if slot.cell is None:
            continue
        row, col = slot.cell
        above, dv = -1, 0
        for d in range(1, k_v + 1):
            if row - d >= 0 and raster.seq(row - d, col) < n_done:
                above, dv = raster.seq(row - d, col), d
                break
        out["seq"].append(slot.seq)
        out["last"].append(n_done - 1)
        out["above"].append(above)
        out["delta"].append(slot.seq - (n_done - 1))
        out["dv"].append(dv)
        out["row"].append(row)
        out["col"].append(col)
    return out


class _SwiGLU(nn.Module):
    def __init__(self, hidden: int, intermediate: int, eps: float):
        super().__init__()
        self.eps = eps
        self.norm = nn.Parameter(torch.ones(hidden))
        self.gate_up = nn.Linear(hidden, 2 * intermediate, bias=False)
        self.down = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x):
        g, u = self.gate_up(F.rms_norm(x, (x.shape[-1],), self.norm, self.eps)).chunk(2, dim=-1)
        return self.down(F.silu(g) * u)


class SpatialHead(nn.Module):
    """The head body (module docstring): ``forward(feats, codes, slot_row, last, above, delta, dv, row, col)`` ->
    code logits ``[S, n_codes]``.

    Args:
        hidden_size: the target's hidden size (its last-layer states are the input).
        n_codes: image codes (the output classes; code ``c`` is target token ``offset + c``).
        max_rows, max_cols: the grid (row / column embeddings).
        max_delta: raster distances embedded separately (longer ones share the last entry).
        k_v: vertical reach (``d`` embeddings ``0..k_v``, 0 = nothing committed above).
        num_layers, intermediate_size, rms_eps: the residual SwiGLU stack.

    ``feats[R, N, H]`` / ``codes[R, N]`` hold per row (``slot_row`` picks it) each image slot's ``feat`` and code
    (``n_codes`` at a newline slot); ``last``, ``above`` index them (``above = -1``: masked).
    """

    def __init__(self, hidden_size: int, n_codes: int, max_rows: int, max_cols: int, max_delta: int = 64,
                 k_v: int = 2, num_layers: int = 2, intermediate_size: int | None = None, rms_eps: float = 1e-6):
        super().__init__()
        H = int(hidden_size)
        self.hidden_size, self.n_codes, self.eps = H, int(n_codes), float(rms_eps)
        self.max_delta = int(max_delta)
        self.code_embed = nn.Embedding(self.n_codes + 1, H)  # the last entry: a newline slot (not a code)
        self.w_last = nn.Linear(2 * H, H, bias=False)
        self.w_above = nn.Linear(2 * H, H, bias=False)
        self.delta_embed = nn.Embedding(self.max_delta + 1, H)
        self.dv_embed = nn.Embedding(int(k_v) + 1, H)
        self.row_embed = nn.Embedding(int(max_rows), H)
        self.col_embed = nn.Embedding(int(max_cols), H)
        for e in (self.delta_embed, self.dv_embed, self.row_embed, self.col_embed):
            nn.init.normal_(e.weight, std=0.02)
        self.blocks = nn.ModuleList(_SwiGLU(H, int(intermediate_size or 2 * H), self.eps) for _ in range(num_layers))
        self.norm = nn.Parameter(torch.ones(H))
        self.out = nn.Linear(H, self.n_codes, bias=False)

    def state(self, feats, codes, slot_row, idx):
        """``[S, 2H]``: ``[feat; embed(code)]`` of slot ``idx`` of row ``slot_row`` (zeros where ``idx < 0``)."""
        safe = idx.clamp(min=0)
        x = torch.cat([feats[slot_row, safe].to(self.w_last.weight.dtype), self.code_embed(codes[slot_row, safe])],
                      dim=-1)
        return x * (idx >= 0)[:, None].to(x.dtype)

    def forward(self, feats, codes, slot_row, last, above, delta, dv, row, col):
        return self.from_states(self.state(feats, codes, slot_row, last), self.state(feats, codes, slot_row, above),
                                delta, dv, row, col)

    def from_states(self, x_last, x_above, delta, dv, row, col):
        """:meth:`forward` from the two committed states of every slot (``[S, 2H]`` each, as :meth:`state` gives
        them: zeros where nothing is committed). The drafter keeps each committed slot's state in a table, written
        once, and indexes it: two gathers instead of rebuilding both states every round."""
        z = self.w_last(x_last) + self.w_above(x_above)
        z = z + self.delta_embed(delta.clamp(max=self.max_delta)) + self.dv_embed(dv) + self.row_embed(row) \
            + self.col_embed(col)
        for block in self.blocks:
            z = z + block(z)
        return self.out(F.rms_norm(z, (z.shape[-1],), self.norm, self.eps)).float()
