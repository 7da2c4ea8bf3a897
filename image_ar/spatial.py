"""Spatial 2-D drafting: the grid bookkeeping a spatial drafter (SSD, ZipAR-style) schedules its drafts with.

An image of ``height x width`` codes is generated in raster order; some models end every row with a newline token
(Lumina-mGPT, Emu3), so a sequence index is not ``row * width + col``. :class:`RasterMap` is the one place that maps
grid cells to sequence indices and back, newline slots included.

:class:`GridScheduler` decides, for a row that has committed ``n_done`` image-sequence tokens, which of the next
slots a round drafts and from what. SSD's heads predict a cell from a committed state: a *horizontal* head of offset
``h`` (``1 <= h <= k_h``) the cell ``h`` places after the last committed one in the same row, a *vertical* head of
offset ``d`` (``1 <= d <= k_v``) the cell ``d`` rows below a committed cell in the same column ("column-wise
independence"). A newline slot is forced (no head). Verification is the core's, on a chain in raster order, so
the drafted slots are the raster continuation from ``n_done``, each given a committed source (horizontal in the
row of the last committed code, within ``k_h``; otherwise vertical from the smallest offset whose cell above is
committed), up to the first slot no head can reach:
a slot whose sources are all not yet generated ends the chain (the explicit mask a raster-indexed cache needs,
ZipAR's pitfall: such slots must not be read as zeros). :meth:`GridScheduler.visible` is that mask.

Example:
    >>> m = RasterMap(2, 3, newline=True)          # two rows of three codes, each followed by a newline
    >>> m.index_map().tolist(), m.newline_indices()
    ([[0, 1, 2], [4, 5, 6]], [3, 7])
    >>> [(s.seq, s.kind, s.offset) for s in GridScheduler(m, k_h=2, k_v=1).plan(2)]
    [(2, 'h', 1), (3, 'newline', 0), (4, 'v', 1), (5, 'v', 1)]
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mmspec.errors import InvalidInputError

__all__ = ["RasterMap", "GridScheduler", "Slot"]


def _positive(name: str, v, zero_ok: bool = False) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < (0 if zero_ok else 1):
        raise InvalidInputError(f"{name} must be an integer >= {0 if zero_ok else 1} (got {v!r})")
    return v


class RasterMap:
    """Grid cells <-> raster sequence indices of one image, with an optional newline slot after every row.

    Args:
        height, width: the code grid.
        newline: whether every row (the last included) ends in a newline token, as Lumina-mGPT's rows do.

    Example:
        >>> RasterMap(2, 2, newline=True).cell(4), RasterMap(2, 2, newline=True).cell(2)
        ((1, 1), None)
    """

    def __init__(self, height: int, width: int, newline: bool = False):
        self.height, self.width = _positive("height", height), _positive("width", width)
        self.newline = bool(newline)
        self.stride = width + (1 if newline else 0)

    def __len__(self) -> int:
        """Sequence slots of the whole image (codes and newlines)."""
        return self.height * self.stride

    def seq(self, row: int, col: int) -> int:
        """Sequence index of cell ``(row, col)``."""
        if not (0 <= row < self.height and 0 <= col < self.width):
            raise InvalidInputError(f"cell ({row}, {col}) is outside the {self.height}x{self.width} grid")
        return row * self.stride + col

    def cell(self, index: int) -> tuple | None:
        """``(row, col)`` of sequence slot ``index``; ``None`` for a newline slot."""
        if not 0 <= index < len(self):
            raise InvalidInputError(f"sequence index {index} is outside the image's {len(self)} slots")
        row, col = divmod(index, self.stride)
        return None if col == self.width else (row, col)

    def is_newline(self, index: int) -> bool:
        return self.cell(index) is None

    def index_map(self) -> torch.Tensor:
        """``int64[height, width]``: the sequence index of every cell."""
        rows = torch.arange(self.height)[:, None] * self.stride
        return rows + torch.arange(self.width)[None]

    def newline_indices(self) -> list:
        """Sequence indices of the newline slots (empty without newlines)."""
        return [r * self.stride + self.width for r in range(self.height)] if self.newline else []

    def to_grid(self, tokens) -> torch.Tensor:
        """A whole image's sequence (newlines included) -> its ``[height, width]`` code grid."""
        tokens = torch.as_tensor(tokens)
        if tokens.shape[-1] != len(self):
            raise InvalidInputError(f"an image here is {len(self)} tokens, got {tokens.shape[-1]}")
        return tokens[..., self.index_map().flatten()].reshape(*tokens.shape[:-1], self.height, self.width)


@dataclass(frozen=True)
class Slot:
    """One drafted slot: sequence index ``seq``, cell (``None`` for a newline), ``kind`` (``"h"`` horizontal,
    ``"v"`` vertical, ``"newline"`` forced), the head ``offset`` (0 for a newline) and the committed ``source``
    slot the head reads (``-1`` for a newline)."""

    seq: int
    cell: tuple | None
    kind: str
    offset: int
    source: int


class GridScheduler:
    """Which slots a spatial drafter drafts next (see the module docstring).

    Args:
        raster: the image's :class:`RasterMap`.
        k_h: horizontal heads (offsets ``1..k_h`` along the current row).
        k_v: vertical heads (offsets ``1..k_v`` rows down); 0 for none.
        max_slots: at most this many slots a round (``None``: up to the first unreachable slot).

    Example:
        >>> s = GridScheduler(RasterMap(3, 4), k_h=2, k_v=1)
        >>> [(x.cell, x.kind, x.offset, x.source) for x in s.plan(5)]
        [((1, 1), 'h', 1, 4), ((1, 2), 'h', 2, 4), ((1, 3), 'v', 1, 3), ((2, 0), 'v', 1, 4)]
    """

    def __init__(self, raster: RasterMap, k_h: int = 5, k_v: int = 1, max_slots: int | None = None):
        self.raster = raster
        self.k_h, self.k_v = _positive("k_h", k_h), _positive("k_v", k_v, zero_ok=True)
        self.max_slots = None if max_slots is None else _positive("max_slots", max_slots)

    def _source(self, index: int, n_done: int) -> Slot | None:
        r = self.raster
        cell = r.cell(index)
        if cell is None:
            return Slot(index, None, "newline", 0, -1)
        row, col = cell
        # The current row from the last committed state (it has read the whole prefix) ...
        last = r.cell(n_done - 1) if n_done > 0 else None
        if last is not None and last[0] == row and 1 <= col - last[1] <= self.k_h:
            return Slot(index, cell, "h", col - last[1], n_done - 1)
        for d in range(1, self.k_v + 1):  # ... the rows below from the nearest committed cell straight above
            if row - d >= 0 and r.seq(row - d, col) < n_done:
                return Slot(index, cell, "v", d, r.seq(row - d, col))
        return None

    def plan(self, n_done: int) -> list:
        """The slots to draft after ``n_done`` committed image-sequence tokens, in raster order, up to the first
        slot no head reaches (or ``max_slots``)."""
        if not 0 <= n_done <= len(self.raster):
            raise InvalidInputError(f"n_done must be in 0..{len(self.raster)} (got {n_done})")
        out = []
        for index in range(n_done, len(self.raster)):
            if self.max_slots is not None and len(out) >= self.max_slots:
                break
            slot = self._source(index, n_done)
            if slot is None:
                break
            out.append(slot)
        return out

    def visible(self, n_done: int, plan: list | None = None) -> torch.Tensor:
        """``bool[len(plan), len(raster)]``: what each drafted slot's head may read, the committed slots only
        (drafts of the same round and slots not yet generated are masked, never read as zeros).

        Example:
            >>> GridScheduler(RasterMap(2, 2), k_h=1).visible(1).int().tolist()
            [[1, 0, 0, 0], [1, 0, 0, 0]]
        """
        plan = self.plan(n_done) if plan is None else plan
        mask = torch.zeros(len(plan), len(self.raster), dtype=torch.bool)
        mask[:, :n_done] = True
        return mask
