"""Triton source of :mod:`mmspec.kernels.acceptance` (imported only when a kernel runs). One program per row."""

import triton.language as tl

from ._launch import kernel


def _greedy(
    tokens_ptr, parents_ptr, n_nodes_ptr, target_ptr, active_ptr, len_ptr, path_ptr, committed_ptr,
    stride_tok, stride_par, stride_tgt, stride_path, stride_com, max_steps,
    BLOCK: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    n = tl.load(n_nodes_ptr + b)
    idx = tl.arange(0, BLOCK)
    ok = idx < n
    tok = tl.load(tokens_ptr + b * stride_tok + idx, mask=ok, other=-1)
    par = tl.load(parents_ptr + b * stride_par + 1 + idx, mask=ok, other=-2)
    going = tl.load(active_ptr + b) != 0
    cur = 0
    length = 0
    # Each step either accepts the first child of `cur` holding the target's argmax or writes the bonus
    # token and stops: at most max_steps (the tree size bounds the depth) + 1 steps.
    for _ in range(max_steps + 1):
        if going:
            want = tl.load(target_ptr + b * stride_tgt + cur)
            hit = ok & (par == cur) & (tok == want)
            first = tl.min(tl.where(hit, idx, BLOCK), 0)
            tl.store(committed_ptr + b * stride_com + length, want)
            if first < BLOCK:
                tl.store(path_ptr + b * stride_path + length, first)
                length += 1
                cur = first + 1
            else:
                going = False
    tl.store(len_ptr + b, length)


def _sampling(
    tokens_ptr, parents_ptr, n_nodes_ptr, target_ptr, draft_ptr, uniforms_ptr, exp_ptr, active_ptr, scratch_ptr,
    len_ptr, path_ptr, committed_ptr,
    stride_tok, stride_par, stride_tb, stride_tq, stride_db, stride_dn, stride_u, stride_e, stride_path, stride_com,
    vocab,
    HAS_Q: tl.constexpr, BLOCK_V: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    n = tl.load(n_nodes_ptr + b)
    cols0 = tl.arange(0, BLOCK_V)
    scratch = scratch_ptr + b * vocab
    cur = tl.full((), 0, tl.int64)  # the node loop's index is int64: keep `cur` the same type
    length = 0
    fresh = 1  # 1: the residual p' is the target's p at `cur` as given; 0: it lives in `scratch`
    if tl.load(active_ptr + b) != 0:
        # Children are tested in node order and every child follows its parent, so one pass over the
        # nodes walks the whole tree: after an acceptance only the new node's children match `cur`.
        for i in range(0, n):
            if tl.load(parents_ptr + b * stride_par + 1 + i) == cur:
                x = tl.load(tokens_ptr + b * stride_tok + i)
                u = tl.load(uniforms_ptr + b * stride_u + i)
                base = target_ptr + b * stride_tb + cur * stride_tq
                resid = tl.where(fresh == 1, base, scratch)  # where p' lives now
                px = tl.load(resid + x)
                qx = 0.0
                if HAS_Q:
                    qx = tl.load(draft_ptr + b * stride_db + i * stride_dn + x)
                if qx <= 0.0:
                    accept = u < px  # a deterministic proposal: one-hot q
                else:
                    accept = u * qx < px
                if accept:
                    tl.store(path_ptr + b * stride_path + length, i)
                    tl.store(committed_ptr + b * stride_com + length, x)
                    length += 1
                    cur = i + 1
                    fresh = 1
                else:
                    # p' <- max(0, p' - q) (one-hot q: p'[x] <- 0), then normalise; a zero total keeps p.
                    total = 0.0
                    for start in range(0, vocab, BLOCK_V):
                        cols = start + cols0
                        m = cols < vocab
                        r = tl.load(resid + cols, mask=m, other=0.0)
                        if qx <= 0.0:
                            r = tl.where(cols == x, 0.0, r)
                        else:
                            q = tl.load(draft_ptr + b * stride_db + i * stride_dn + cols, mask=m, other=0.0)
                            r = tl.maximum(r - q, 0.0)
                        tl.store(scratch + cols, r, mask=m)
                        total += tl.sum(r, 0)
                    if total <= 0.0:
                        fresh = 1
                    else:
                        for start in range(0, vocab, BLOCK_V):
                            cols = start + cols0
                            m = cols < vocab
                            tl.store(scratch + cols, tl.load(scratch + cols, mask=m, other=0.0) / total, mask=m)
                        fresh = 0
        # The next token: argmax of p' / E over the vocabulary (E ~ Exp(1)), first index on ties.
        resid = tl.where(fresh == 1, target_ptr + b * stride_tb + cur * stride_tq, scratch)
        best = -1.0
        best_i = 0
        for start in range(0, vocab, BLOCK_V):
            cols = start + cols0
            m = cols < vocab
            r = tl.load(resid + cols, mask=m, other=0.0)
            e = tl.load(exp_ptr + b * stride_e + cols, mask=m, other=1.0)
            ratio = tl.where(m, r / e, -1.0)
            top = tl.max(ratio, 0)
            arg = tl.argmax(ratio, 0) + start
            take = top > best
            best_i = tl.where(take, arg, best_i)
            best = tl.where(take, top, best)
        tl.store(committed_ptr + b * stride_com + length, best_i)
    tl.store(len_ptr + b, length)


greedy_kernel = kernel(_greedy)
sampling_kernel = kernel(_sampling)
