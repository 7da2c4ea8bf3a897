"""Triton source of :func:`mmspec.kernels.attention.tree_attention` (imported only when the kernel runs)."""

import triton.language as tl

from ._launch import kernel


def _tree_attention(
    q_ptr, k_ptr, v_ptr, o_ptr, valid_ptr, parents_ptr,
    stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_om,
    stride_valid, stride_parents,
    n_kv_heads, group, n_queries, n_prefix, depth_steps, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
):
    # One program: BLOCK_M rows of (query head in the kv head's group, query) for one (row, kv head). The
    # group's heads share their keys, so packing them into the rows reads each key tile once per group.
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // n_kv_heads).to(tl.int64)
    kvh = (pid_bh % n_kv_heads).to(tl.int64)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < group * n_queries
    qi = rows % n_queries
    head = kvh * group + rows // n_queries
    d = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + b * stride_qb + head[:, None] * stride_qh + qi[:, None] * stride_qm + d[None, :],
                mask=row_ok[:, None], other=0.0)
    k_base = k_ptr + b * stride_kb + kvh * stride_kh
    v_base = v_ptr + b * stride_vb + kvh * stride_vh
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.full([BLOCK_M], 0.0, tl.float32)
    acc = tl.full([BLOCK_M, HEAD_DIM], 0.0, tl.float32)

    # Keys: the cached prefix (committed slots only: left padding and holes are skipped by the validity
    # row), then the tree, where each query sees itself and its ancestors, found by walking the parents.
    n_keys = n_prefix + n_queries
    for start in range(0, n_keys, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        kt = tl.load(k_base + cols[:, None] * stride_kn + d[None, :], mask=(cols < n_keys)[:, None], other=0.0)
        vt = tl.load(v_base + cols[:, None] * stride_vn + d[None, :], mask=(cols < n_keys)[:, None], other=0.0)
        committed = tl.load(valid_ptr + b * stride_valid + cols, mask=cols < n_prefix, other=0) != 0
        if start + BLOCK_N > n_prefix:
            node = tl.where(cols >= n_prefix, cols - n_prefix, -2)  # -2: a prefix slot, never a query
            cur = tl.where(row_ok, qi, -1)
            seen = committed[None, :] | (node[None, :] == cur[:, None])
            for _ in range(depth_steps):
                cur = tl.load(parents_ptr + b * stride_parents + cur, mask=cur >= 0, other=-1)
                seen = seen | (node[None, :] == cur[:, None])
        else:
            seen = tl.broadcast_to(committed[None, :], (BLOCK_M, BLOCK_N))
        s = tl.dot(q, tl.trans(kt), input_precision=PRECISION) * qk_scale
        s = tl.where(seen, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # a fully hidden tile adds nothing, no NaN
        p = tl.exp2(s - m_use[:, None])
        alpha = tl.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(vt.dtype), vt, input_precision=PRECISION)
        m_i = m_new

    l_i = tl.where(row_ok, l_i, 1.0)  # every real query sees itself: l_i > 0 on real rows
    out = acc / l_i[:, None]
    tl.store(o_ptr + b * stride_ob + head[:, None] * stride_oh + qi[:, None] * stride_om + d[None, :],
             out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None])


tree_attention_kernel = kernel(_tree_attention)
