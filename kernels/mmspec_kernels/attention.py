"""Tree-masked attention for the verification pass: queries are a draft tree's nodes, keys the cache + tree.

Layout (what a transformers attention function receives after the cache update)::

    q        [B, Hq, Q, D]      Q = 1 + N: the root (the row's pending token) and N tree nodes
    k, v     [B, Hkv, L + Q, D] the L cached slots, then the Q new ones in the same order as q
    prefix_valid  bool[B, L]    which cached slots hold committed tokens (rows are left-padded)
    parents  int[B, Q]          parent of each query in query indexing: -1 for the root, 0 for the
                                root's children; padding nodes of shorter rows hang off the root

Query ``i`` of row ``b`` sees the cached slots with ``prefix_valid[b]`` and, among the new slots, itself
and its ancestors: visibility is read from ``parents`` (a walk of at most ``max_depth`` steps), never from
a dense ``[Q, L + Q]`` mask. Hq must be a multiple of Hkv (GQA). The Triton kernel covers head dims 64 and
128 in fp32, fp16 and bf16 (bf16 on a GPU only: the interpreter has none); other inputs run the reference.

Example:
    >>> import torch
    >>> q = torch.randn(1, 2, 3, 8); k = torch.randn(1, 1, 5, 8); v = torch.randn(1, 1, 5, 8)
    >>> valid = torch.tensor([[False, True]]); parents = torch.tensor([[-1, 0, 0]])
    >>> tree_attention(q, k, v, valid, parents).shape
    torch.Size([1, 2, 3, 8])
"""

from __future__ import annotations

import torch

from .dispatch import backend as _backend
from .dispatch import interpreting

__all__ = ["tree_attention", "tree_attention_reference", "tree_visibility", "tree_attention_supported"]

_HEAD_DIMS = (64, 128)


def tree_visibility(parents: torch.Tensor, max_depth: int | None = None) -> torch.Tensor:
    """``bool[B, Q, Q]``: ``vis[b, i, j]`` is true when query ``j`` is query ``i`` or one of its ancestors.

    ``max_depth`` bounds the walk (the deepest node's depth; the root has depth 0); ``None`` walks until
    every chain has reached the root.

    Example:
        >>> tree_visibility(torch.tensor([[-1, 0, 0, 1]])).int()[0].tolist()
        [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]]
    """
    b, q = parents.shape
    parents = parents.long()
    idx = torch.arange(q, device=parents.device)
    cur = idx.expand(b, q).clone()
    vis = torch.zeros(b, q, q, dtype=torch.bool, device=parents.device)
    steps = q if max_depth is None else max_depth + 1
    for _ in range(steps):
        vis |= idx == cur[..., None]  # cur == -1 matches nothing
        alive = cur >= 0
        if max_depth is None and not bool(alive.any()):
            break
        cur = torch.where(alive, parents.gather(1, cur.clamp(min=0)), cur)
    return vis


def tree_attention_reference(q, k, v, prefix_valid, parents, scale: float | None = None,
                             max_depth: int | None = None) -> torch.Tensor:
    """Plain-torch tree attention in float32 (the oracle): softmax over the visible keys, cast back to q's dtype.

    Example:
        >>> q = torch.randn(1, 1, 2, 4); k = torch.randn(1, 1, 3, 4); v = torch.randn(1, 1, 3, 4)
        >>> out = tree_attention_reference(q, k, v, torch.tensor([[True]]), torch.tensor([[-1, 0]]))
        >>> torch.allclose(out[0, 0, 0], v[0, 0, :2].mT @ torch.softmax(k[0, 0, :2] @ q[0, 0, 0] / 2, 0))
        True
    """
    b, hq, nq, d = q.shape
    hkv = k.shape[1]
    n_prefix = k.shape[2] - nq
    scale = d**-0.5 if scale is None else scale
    seen = torch.cat([prefix_valid.bool()[:, None, :].expand(b, nq, n_prefix),
                      tree_visibility(parents, max_depth)], dim=2)
    kf = k.float().repeat_interleave(hq // hkv, dim=1)
    vf = v.float().repeat_interleave(hq // hkv, dim=1)
    s = (q.float() @ kf.transpose(-1, -2)) * scale
    s = s.masked_fill(~seen[:, None], float("-inf"))
    return (torch.softmax(s, dim=-1) @ vf).to(q.dtype)


def tree_attention_supported(q: torch.Tensor, k: torch.Tensor) -> str | None:
    """``None`` when the Triton kernel takes these inputs, else why it does not (the reference runs instead)."""
    if q.shape[-1] not in _HEAD_DIMS:
        return f"head dim {q.shape[-1]} (the kernel covers {', '.join(map(str, _HEAD_DIMS))})"
    if q.dtype not in (torch.float32, torch.float16, torch.bfloat16) or k.dtype != q.dtype:
        return f"dtype {q.dtype}/{k.dtype}"
    if q.dtype == torch.bfloat16 and (q.device.type == "cpu" or interpreting()):
        return "bfloat16 in Triton's interpreter (it has no bfloat16)"
    return None


def tree_attention(q, k, v, prefix_valid, parents, scale: float | None = None, max_depth: int | None = None,
                   backend: str | None = None) -> torch.Tensor:
    """Attention of a batch of draft trees over their rows' caches: ``[B, Hq, Q, D]`` in q's dtype.

    ``backend`` (``"triton"`` / ``"reference"``) overrides :func:`mmspec.kernels.dispatch.backend`; the
    Triton path falls back to the reference for inputs it does not cover (:func:`tree_attention_supported`).
    ``max_depth`` (the deepest node's depth) saves a device sync when the caller knows it.

    Example:
        >>> q = torch.randn(2, 4, 3, 64); k = torch.randn(2, 2, 7, 64); v = torch.randn(2, 2, 7, 64)
        >>> valid = torch.ones(2, 4, dtype=torch.bool); parents = torch.tensor([[-1, 0, 1], [-1, 0, 0]])
        >>> out = tree_attention(q, k, v, valid, parents, backend="reference")
        >>> out.shape
        torch.Size([2, 4, 3, 64])
    """
    b, hq, nq, d = q.shape
    if k.shape != v.shape or k.shape[0] != b or k.shape[3] != d or k.shape[2] < nq or hq % k.shape[1]:
        raise ValueError(f"tree_attention: q {tuple(q.shape)} does not fit k {tuple(k.shape)} / v {tuple(v.shape)}")
    if prefix_valid.shape != (b, k.shape[2] - nq) or parents.shape != (b, nq):
        raise ValueError(f"tree_attention: prefix_valid {tuple(prefix_valid.shape)} / parents {tuple(parents.shape)} "
                         f"do not fit q {tuple(q.shape)} and k {tuple(k.shape)}")
    name = backend or _backend(q.device)
    if name != "triton" or tree_attention_supported(q, k) is not None:
        return tree_attention_reference(q, k, v, prefix_valid, parents, scale, max_depth)
    return _tree_attention_triton(q, k, v, prefix_valid, parents, scale, max_depth)


def _tree_attention_triton(q, k, v, prefix_valid, parents, scale, max_depth):
    b, hq, nq, d = q.shape
    hkv = k.shape[1]
    group = hq // hkv
    n_prefix = k.shape[2] - nq
    scale = d**-0.5 if scale is None else scale
    if max_depth is None:
        max_depth = int(_depths(parents).max()) if nq else 0
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    valid = prefix_valid.to(torch.int8).contiguous()
    parents = parents.to(torch.int32).contiguous()
    out = torch.empty(b, nq, hq, d, dtype=q.dtype, device=q.device)  # the layout attention modules reshape
    rows = group * nq
    block_m = min(64, max(16, _next_pow2(rows)))
    block_n = 64 if d == 64 else 32
    grid = (-(-rows // block_m), b * hkv)
    from ._attention_kernel import tree_attention_kernel

    tree_attention_kernel[grid](
        q, k, v, out, valid, parents,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), out.stride(0), out.stride(2), out.stride(1),
        valid.stride(0), parents.stride(0),
        hkv, group, nq, n_prefix, max_depth, scale * 1.4426950408889634,
        HEAD_DIM=d, BLOCK_M=block_m, BLOCK_N=block_n,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
    )
    return out.transpose(1, 2)


def _depths(parents: torch.Tensor) -> torch.Tensor:
    vis = tree_visibility(parents)
    return vis.sum(-1) - 1


def _next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())
