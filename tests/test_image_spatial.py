"""Spatial drafting's grid bookkeeping (image_ar/spatial.py): raster index maps with newline tokens and the grid
scheduler, on a built 3x4 grid whose rows end in a newline (the bundled generator's grid has none), against maps
and plans written out by hand and a reference scheduler written here with plain row/column arithmetic."""

from __future__ import annotations

import pytest
import torch

from mmspec.errors import InvalidInputError
from mmspec.image_ar.spatial import GridScheduler, RasterMap

NL = 99  # the newline token of the built grid


def test_raster_map_with_newlines_written_out():
    m = RasterMap(3, 4, newline=True)
    # row 0: 0 1 2 3 <nl 4>; row 1: 5 6 7 8 <nl 9>; row 2: 10 11 12 13 <nl 14>
    assert len(m) == 15
    assert m.index_map().tolist() == [[0, 1, 2, 3], [5, 6, 7, 8], [10, 11, 12, 13]]
    assert m.newline_indices() == [4, 9, 14]
    assert [m.cell(i) for i in (0, 3, 4, 5, 9, 13, 14)] == [(0, 0), (0, 3), None, (1, 0), None, (2, 3), None]
    for r in range(3):
        for c in range(4):
            assert m.cell(m.seq(r, c)) == (r, c)
    seq = [10 * r + c for r in range(3) for c in range(4)]
    for nl in m.newline_indices():  # the sequence a Lumina-style model writes
        seq.insert(nl, NL)
    assert seq[4] == NL and seq[9] == NL and seq[14] == NL
    assert m.to_grid(seq).tolist() == [[0, 1, 2, 3], [10, 11, 12, 13], [20, 21, 22, 23]]
    assert m.to_grid(torch.tensor([seq, seq])).shape == (2, 3, 4)


def test_raster_map_without_newlines_is_plain_raster():
    m = RasterMap(16, 16)
    assert len(m) == 256 and m.newline_indices() == []
    assert torch.equal(m.index_map(), torch.arange(256).view(16, 16))
    assert m.cell(17) == (1, 1)


def test_raster_map_refuses_bad_input():
    m = RasterMap(3, 4, newline=True)
    for call, match in ((lambda: m.seq(3, 0), "outside"), (lambda: m.cell(15), "outside"),
                        (lambda: m.to_grid(list(range(12))), "15 tokens"), (lambda: RasterMap(0, 4), "height"),
                        (lambda: GridScheduler(m, k_h=0), "k_h"), (lambda: GridScheduler(m, k_v=-1), "k_v"),
                        (lambda: GridScheduler(m).plan(16), "n_done")):
        with pytest.raises(InvalidInputError, match=match):
            call()


def _plan(s, n):
    return [(x.seq, x.kind, x.offset, x.source) for x in s.plan(n)]


def test_plans_written_out_on_the_newline_grid():
    m = RasterMap(3, 4, newline=True)
    s = GridScheduler(m, k_h=2, k_v=1)
    # Nothing committed: no source for anything.
    assert _plan(s, 0) == []
    # (0, 0) committed: (0, 1) and (0, 2) from it; (0, 3) is 3 away (> k_h) and nothing is above it.
    assert _plan(s, 1) == [(1, "h", 1, 0), (2, "h", 2, 0)]
    # Row 0 done, newline pending: the newline is forced, then row 1 from row 0 straight above, all of it.
    assert _plan(s, 4) == [(4, "newline", 0, -1), (5, "v", 1, 0), (6, "v", 1, 1), (7, "v", 1, 2), (8, "v", 1, 3),
                           (9, "newline", 0, -1)]
    # After the newline (row 1 not started): row 1 from above; row 2 has nothing committed above it.
    assert _plan(s, 5) == [(5, "v", 1, 0), (6, "v", 1, 1), (7, "v", 1, 2), (8, "v", 1, 3), (9, "newline", 0, -1)]
    # Mid row 1 at (1, 1): two horizontal, (1, 3) from above, newline, (2, 0) and (2, 1) from row 1; (2, 2) would
    # need (1, 2), a draft of this very round: the chain stops (a slot not yet generated is never read).
    assert _plan(s, 7) == [(7, "h", 1, 6), (8, "h", 2, 6), (9, "newline", 0, -1), (10, "v", 1, 5), (11, "v", 1, 6)]
    # Two rows of vertical heads: (2, 2), (2, 3) from row 0, then the last newline: the whole rest of the image.
    s2 = GridScheduler(m, k_h=2, k_v=2)
    assert _plan(s2, 7) == _plan(s, 7) + [(12, "v", 2, 2), (13, "v", 2, 3), (14, "newline", 0, -1)]
    assert _plan(GridScheduler(m, k_h=2, k_v=1, max_slots=3), 7) == _plan(s, 7)[:3]
    assert _plan(s, 15) == []


def _reference(H, W, newline, k_h, k_v, n_done, max_slots=None):
    """The scheduler written with row/column arithmetic, no RasterMap."""
    stride = W + (1 if newline else 0)
    out = []
    last_row, last_col = divmod(n_done - 1, stride) if n_done else (None, None)
    last_is_code = n_done > 0 and last_col < W
    for i in range(n_done, H * stride):
        if max_slots is not None and len(out) == max_slots:
            break
        row, col = divmod(i, stride)
        if col == W:
            out.append((i, "newline", 0, -1))
            continue
        if last_is_code and row == last_row and 0 < col - last_col <= k_h:
            out.append((i, "h", col - last_col, n_done - 1))
            continue
        above = [d for d in range(1, k_v + 1) if row - d >= 0 and (row - d) * stride + col < n_done]
        if not above:
            break
        out.append((i, "v", above[0], (row - above[0]) * stride + col))
    return out


@pytest.mark.parametrize("newline", [True, False])
@pytest.mark.parametrize("k_h,k_v,max_slots", [(1, 0, None), (2, 1, None), (5, 2, None), (3, 1, 4)])
def test_scheduler_against_reference_at_every_step(newline, k_h, k_v, max_slots):
    m = RasterMap(3, 4, newline=newline)
    s = GridScheduler(m, k_h=k_h, k_v=k_v, max_slots=max_slots)
    for n in range(len(m) + 1):
        assert _plan(s, n) == _reference(3, 4, newline, k_h, k_v, n, max_slots), n


def test_visible_mask_is_the_committed_slots_only():
    s = GridScheduler(RasterMap(3, 4, newline=True), k_h=2, k_v=1)
    mask = s.visible(7)
    assert mask.shape == (5, 15)
    want = [[1] * 7 + [0] * 8] * 5  # every drafted slot reads committed slots 0..6, never a slot of this round
    assert mask.int().tolist() == want
