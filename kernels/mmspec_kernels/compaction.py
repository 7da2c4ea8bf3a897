"""KV compaction: gather each row's kept cache slots (committed prefix + accepted path) into place.

After a verify pass every layer's cache holds ``[B, H, L + Q, D]``: the old slots and the pass's ``Q``
new ones. ``mmspec.TargetAdapter.commit`` keeps, per row, its committed slots, the root and the accepted
path, right-aligned (rows are left-padded) to the longest row's length ``T``, and may drop finished rows.
:func:`gather_slots` does that move for one layer's keys and values in one launch: ``out[i, h, t] =
cache[rows[i], h, index[i, t]]`` for both tensors (row selection fused, no intermediate copy).

Example:
    >>> import torch
    >>> k = torch.arange(8.).reshape(1, 1, 4, 2); index = torch.tensor([[0, 2, 3]])
    >>> gather_slots(k, k, index)[0][0, 0].tolist()
    [[0.0, 1.0], [4.0, 5.0], [6.0, 7.0]]
"""

from __future__ import annotations

import torch

from .dispatch import backend as _backend
from .dispatch import interpreting

__all__ = ["gather_slots", "gather_slots_reference"]


def gather_slots_reference(keys, values, index, rows=None):
    """Plain torch: ``index_select`` the rows, then ``take_along_dim`` the slots (what commit did before).

    Example:
        >>> k = torch.arange(4.).reshape(2, 1, 2, 1)
        >>> gather_slots_reference(k, k, torch.tensor([[1]]), rows=torch.tensor([1]))[0].flatten().tolist()
        [3.0]
    """
    gather = index[:, None, :, None]
    out = []
    for t in (keys, values):
        if rows is not None:
            t = t.index_select(0, rows)
        out.append(torch.take_along_dim(t, gather, dim=2))
    return out[0], out[1]


def gather_slots(keys, values, index, rows=None, backend: str | None = None):
    """``(keys, values)`` re-laid to ``[B', H, T, D]``: slot ``index[i, t]`` of batch row ``rows[i]``.

    ``keys`` and ``values`` are one layer's ``[B, H, S, D]`` tensors (the kernel takes them when they share
    shape and dtype; otherwise the reference runs); ``index`` is
    ``int[B', T]`` with entries in ``[0, S)``; ``rows`` (``int[B']``) selects batch rows, ``None`` keeps all.

    Example:
        >>> k = torch.randn(2, 3, 5, 4); idx = torch.tensor([[4, 0], [1, 1]])
        >>> out, _ = gather_slots(k, k, idx, backend="reference")
        >>> torch.equal(out[0, :, 0], k[0, :, 4]), tuple(out.shape)
        (True, (2, 3, 2, 4))
    """
    b_out, t_out = index.shape
    if (rows is None and b_out != keys.shape[0]) or (rows is not None and rows.shape != (b_out,)):
        raise ValueError(f"gather_slots: index {tuple(index.shape)} does not fit {keys.shape[0]} rows / rows")
    name = backend or _backend(keys.device)
    if name != "triton" or keys.shape != values.shape or keys.dtype != values.dtype or keys.dim() != 4 or (
            keys.dtype == torch.bfloat16 and (keys.device.type == "cpu" or interpreting())):
        return gather_slots_reference(keys, values, index, rows)  # e.g. keys and values of different widths
    from ._compaction_kernel import gather_kernel

    _, h, _, d = keys.shape
    if rows is None:
        rows = torch.arange(b_out, device=keys.device)
    index = index.to(device=keys.device, dtype=torch.int64).contiguous()
    rows = rows.to(device=keys.device, dtype=torch.int64).contiguous()
    new_k = torch.empty(b_out, h, t_out, d, dtype=keys.dtype, device=keys.device)
    new_v = torch.empty_like(new_k)
    if new_k.numel() == 0:
        return new_k, new_v
    block_d = 1 << max(0, (d - 1).bit_length())
    block_t = max(1, min(64, 4096 // block_d))
    grid = (-(-t_out // block_t), h, b_out)
    gather_kernel[grid](keys, values, new_k, new_v, index, rows,
                        keys.stride(0), keys.stride(1), keys.stride(2), keys.stride(3),
                        values.stride(0), values.stride(1), values.stride(2), values.stride(3),
                        new_k.stride(0), new_k.stride(1), new_k.stride(2), index.stride(0), t_out, d,
                        BLOCK_T=block_t, BLOCK_D=block_d)
    return new_k, new_v
