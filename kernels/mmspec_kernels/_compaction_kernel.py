"""Triton source of :func:`mmspec.kernels.compaction.gather_slots` (imported only when the kernel runs)."""

import triton.language as tl

from ._launch import kernel


def _gather(
    k_ptr, v_ptr, ok_ptr, ov_ptr, index_ptr, rows_ptr,
    stride_kb, stride_kh, stride_ks, stride_kd, stride_vb, stride_vh, stride_vs, stride_vd,
    stride_ob, stride_oh, stride_os, stride_index, n_slots, head_dim,
    BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
):
    # One program: BLOCK_T destination slots of one (output row, head), keys and values together.
    pid_t = tl.program_id(0)
    h = tl.program_id(1).to(tl.int64)
    i = tl.program_id(2).to(tl.int64)
    t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    d = tl.arange(0, BLOCK_D)
    t_ok = t < n_slots
    m = t_ok[:, None] & (d[None, :] < head_dim)
    src = tl.load(index_ptr + i * stride_index + t, mask=t_ok, other=0)
    row = tl.load(rows_ptr + i)
    kv = tl.load(k_ptr + row * stride_kb + h * stride_kh + src[:, None] * stride_ks + d[None, :] * stride_kd, mask=m)
    dest = i * stride_ob + h * stride_oh + t[:, None] * stride_os + d[None, :]
    tl.store(ok_ptr + dest, kv, mask=m)
    vv = tl.load(v_ptr + row * stride_vb + h * stride_vh + src[:, None] * stride_vs + d[None, :] * stride_vd, mask=m)
    tl.store(ov_ptr + dest, vv, mask=m)


gather_kernel = kernel(_gather)
