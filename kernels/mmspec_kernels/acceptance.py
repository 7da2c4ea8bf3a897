"""Fused acceptance over a ragged batch of draft trees: the greedy walk and speculative sampling.

Inputs use the verify pass's packed layout (``mmspec.target.PackedTrees``): ``tokens[B, N]`` node tokens,
``parents[B, 1 + N]`` in query indexing (column 0 is the root, ``-1``; node ``i`` is column ``1 + i``,
its parent ``0`` when it hangs off the root), ``n_nodes[B]``. Query ``j``'s target outputs are row ``j``
of ``target_ids[B, 1 + N]`` (greedy: the argmax of the processed scores) or ``target_probs[B, 1 + N, V]``
(sampling: the softmax of the processed scores). Rows with ``active`` false (finished) accept nothing.

Terms, as in vLLM's rejection sampler: the *accepted path* is the node indices (tree-local) kept from the
root down; the *next token* is the bonus token (every tested child failed, or the walk reached a leaf),
drawn from the target (greedy: its argmax; sampling: the residual distribution).

Speculative sampling is ``mmspec.acceptance.SpeculativeSamplingRule`` (recursive rejection over the
children of each node; Leviathan/Chen on a chain), with its random draws made beforehand so that kernel
and reference decide alike: ``uniforms[b, i]`` is the uniform tested against node ``i`` when the walk
tests it (each node is tested at most once), and the next token is ``argmax(p' / exponentials[b])``
over the final residual ``p'`` with ``exponentials`` i.i.d. Exp(1): the exponential race, an exact
sample from ``p'`` that needs no normaliser. ``draft_probs[B, N, V]`` is each node's proposal ``q``; an
all-zero row (or ``draft_probs=None``) is a deterministic proposal, as in the core rule.

Outputs (:class:`AcceptOutput`): ``lengths[B]`` accepted nodes per row, ``path[B, N]`` their indices and
``committed[B, N + 1]`` the committed tokens (the path's tokens, then the next token), ``-1`` padded.
Kernel and reference agree exactly on these integers; the only float reduction is the residual's
normaliser after a rejected sibling, whose summation order differs (a decision could flip only for a
uniform within one rounding step of its threshold).

Example:
    >>> import torch
    >>> tokens = torch.tensor([[5, 6, 7]]); parents = torch.tensor([[-1, 0, 1, 0]])
    >>> out = greedy_accept(tokens, parents, torch.tensor([3]), torch.tensor([[5, 6, 9, 2]]), backend="reference")
    >>> out.lengths.tolist(), out.path.tolist(), out.committed.tolist()
    ([2], [[0, 1, -1]], [[5, 6, 9, -1]])
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from .dispatch import backend as _backend

__all__ = ["AcceptOutput", "greedy_accept", "greedy_accept_reference", "sampling_accept",
           "sampling_accept_reference", "draw_randomness"]


class AcceptOutput(NamedTuple):
    """``lengths[B]`` (int64), ``path[B, N]`` and ``committed[B, N + 1]`` (``-1`` padded, int64)."""

    lengths: torch.Tensor
    path: torch.Tensor
    committed: torch.Tensor

    @property
    def next_tokens(self) -> torch.Tensor:
        """``int64[B]``: the bonus/corrected token of each row (``-1`` for inactive rows)."""
        return self.committed.gather(1, self.lengths[:, None]).squeeze(1)


def _check(tokens, parents, n_nodes, per_query, name):
    b, n = tokens.shape
    if parents.shape != (b, n + 1) or n_nodes.shape != (b,) or tuple(per_query.shape[:2]) != (b, n + 1):
        raise ValueError(f"acceptance: tokens {tuple(tokens.shape)}, parents {tuple(parents.shape)}, n_nodes "
                         f"{tuple(n_nodes.shape)} and {name} {tuple(per_query.shape)} do not fit one packed batch")


def _empty_output(b: int, n: int, device) -> AcceptOutput:
    return AcceptOutput(torch.zeros(b, dtype=torch.long, device=device),
                        torch.full((b, n), -1, dtype=torch.long, device=device),
                        torch.full((b, n + 1), -1, dtype=torch.long, device=device))


def _children_in_order(parents_row: list, n: int):
    """Node indices in order, with their parent's query index (the walk tests children in node order)."""
    return [(i, parents_row[1 + i]) for i in range(n)]


# ---------------------------------------------------------------------------------------------- greedy
def greedy_accept_reference(tokens, parents, n_nodes, target_ids, active=None) -> AcceptOutput:
    """Plain loops: from the root, follow the first child whose token is the target's argmax.

    Example:
        >>> out = greedy_accept_reference(torch.tensor([[4]]), torch.tensor([[-1, 0]]), torch.tensor([1]),
        ...                               torch.tensor([[3, 8]]))
        >>> out.lengths.tolist(), out.committed.tolist()
        ([0], [[3, -1]])
    """
    _check(tokens, parents, n_nodes, target_ids, "target_ids")
    b, n = tokens.shape
    rows = []
    toks, pars, want_all = tokens.tolist(), parents.tolist(), target_ids.tolist()
    for r in range(b):
        if active is not None and not bool(active[r]):
            rows.append(None)
            continue
        path, cur = [], 0
        while True:
            want = want_all[r][cur]
            nxt = next((i for i, p in _children_in_order(pars[r], int(n_nodes[r])) if p == cur and toks[r][i] == want),
                       None)
            if nxt is None:
                break
            path.append(nxt)
            cur = nxt + 1
        rows.append((path, [toks[r][i] for i in path] + [want]))
    return _output(rows, n, tokens.device)


def greedy_accept(tokens, parents, n_nodes, target_ids, active=None, backend: str | None = None) -> AcceptOutput:
    """The greedy tree walk for every row in one launch (Triton) or in plain loops (reference).

    Example:
        >>> out = greedy_accept(torch.tensor([[4, 4]]), torch.tensor([[-1, 0, 0]]), torch.tensor([2]),
        ...                     torch.tensor([[4, 7, 1]]), backend="reference")
        >>> out.path.tolist(), out.next_tokens.tolist()
        ([[0, -1]], [7])
    """
    _check(tokens, parents, n_nodes, target_ids, "target_ids")
    if (backend or _backend(tokens.device)) != "triton":
        return greedy_accept_reference(tokens, parents, n_nodes, target_ids, active)
    from ._acceptance_kernel import greedy_kernel

    b, n = tokens.shape
    out = _empty_output(b, n, tokens.device)
    if b == 0:
        return out
    active = _active(active, b, tokens.device)
    tokens, parents, target_ids, n_nodes = (t.contiguous() for t in (tokens, parents, target_ids, n_nodes))
    greedy_kernel[(b,)](tokens, parents, n_nodes, target_ids, active, out.lengths, out.path, out.committed,
                        tokens.stride(0), parents.stride(0), target_ids.stride(0), out.path.stride(0),
                        out.committed.stride(0), n, BLOCK=_block(n))
    return out


# ---------------------------------------------------------------------------------------------- sampling
def sampling_accept_reference(tokens, parents, n_nodes, target_probs, uniforms, exponentials, draft_probs=None,
                              active=None) -> AcceptOutput:
    """Plain loops: ``SpeculativeSamplingRule``'s walk with the draws given (see the module docstring).

    Example:
        >>> p = torch.tensor([[[0.5, 0.5], [0.9, 0.1]]])
        >>> out = sampling_accept_reference(torch.tensor([[1]]), torch.tensor([[-1, 0]]), torch.tensor([1]), p,
        ...                                 torch.tensor([[0.2]]), torch.ones(1, 2))
        >>> out.committed.tolist()  # 0.2 < p(1) = 0.5: node 0 accepted, then the argmax of p / 1
        [[1, 0]]
    """
    _check(tokens, parents, n_nodes, target_probs, "target_probs")
    b, n = tokens.shape
    rows = []
    toks, pars, us = tokens.tolist(), parents.tolist(), uniforms.float().tolist()
    for r in range(b):
        if active is not None and not bool(active[r]):
            rows.append(None)
            continue
        cur, path = 0, []
        p = target_probs[r, 0].float().clone()
        for i, parent in _children_in_order(pars[r], int(n_nodes[r])):
            if parent != cur:
                continue
            x, u = toks[r][i], np.float32(us[r][i])
            q = None if draft_probs is None else draft_probs[r, i].float()
            qx = np.float32(0.0 if q is None else float(q[x]))
            px = float(p[x])
            if qx <= 0:  # a deterministic proposal (one-hot q): rejection removes x from p'
                ok = u < px
                if not ok:
                    p[x] = 0.0
            else:
                ok = u * qx < px  # float32 product, as the kernel computes it
                if not ok:
                    p = torch.clamp(p - q, min=0.0)
            if ok:
                path.append(i)
                cur = i + 1
                p = target_probs[r, cur].float().clone()
                continue
            total = p.sum()
            p = target_probs[r, cur].float().clone() if total <= 0 else p / total
        nxt = int(torch.argmax(p / exponentials[r].float()))
        rows.append((path, [toks[r][i] for i in path] + [nxt]))
    return _output(rows, n, tokens.device)


def sampling_accept(tokens, parents, n_nodes, target_probs, uniforms, exponentials, draft_probs=None, active=None,
                    backend: str | None = None) -> AcceptOutput:
    """Speculative sampling (chains and multi-draft trees) for every row in one launch, with given draws.

    ``target_probs`` and ``draft_probs`` are float32 distributions; :func:`draw_randomness` draws
    ``uniforms`` and ``exponentials`` of the right shapes from a generator.

    Example:
        >>> p = torch.tensor([[[0.5, 0.5], [0.9, 0.1]]])
        >>> u, e = draw_randomness(1, 1, 2, torch.Generator().manual_seed(0))
        >>> sampling_accept(torch.tensor([[1]]), torch.tensor([[-1, 0]]), torch.tensor([1]), p, u, e,
        ...                 backend="reference").lengths.shape
        torch.Size([1])
    """
    _check(tokens, parents, n_nodes, target_probs, "target_probs")
    b, n = tokens.shape
    v = target_probs.shape[-1]
    if uniforms.shape != (b, n) or exponentials.shape != (b, v) or (
            draft_probs is not None and draft_probs.shape != (b, n, v)):
        raise ValueError(f"sampling_accept: uniforms {tuple(uniforms.shape)}, exponentials {tuple(exponentials.shape)}"
                         f" or draft_probs do not fit {b} rows, {n} nodes and {v} tokens")
    if (backend or _backend(tokens.device)) != "triton":
        return sampling_accept_reference(tokens, parents, n_nodes, target_probs, uniforms, exponentials,
                                         draft_probs, active)
    from ._acceptance_kernel import sampling_kernel

    out = _empty_output(b, n, tokens.device)
    if b == 0:
        return out
    active = _active(active, b, tokens.device)
    target_probs = target_probs.float().contiguous()
    draft = target_probs if draft_probs is None else draft_probs.float().contiguous()
    uniforms, exponentials = uniforms.float().contiguous(), exponentials.float().contiguous()
    tokens, parents, n_nodes = tokens.contiguous(), parents.contiguous(), n_nodes.contiguous()
    scratch = torch.empty(b, v, dtype=torch.float32, device=tokens.device)  # each row's residual p'
    sampling_kernel[(b,)](tokens, parents, n_nodes, target_probs, draft, uniforms, exponentials, active, scratch,
                          out.lengths, out.path, out.committed,
                          tokens.stride(0), parents.stride(0), target_probs.stride(0), target_probs.stride(1),
                          draft.stride(0), draft.stride(1), uniforms.stride(0), exponentials.stride(0),
                          out.path.stride(0), out.committed.stride(0), v,
                          HAS_Q=draft_probs is not None, BLOCK_V=min(1024, _block(v)))
    return out


def draw_randomness(b: int, n: int, v: int, generator: torch.Generator | None = None, device=None):
    """``uniforms[b, n]`` in [0, 1) and ``exponentials[b, v]`` ~ Exp(1), drawn from ``generator``.

    Example:
        >>> u, e = draw_randomness(2, 3, 5, torch.Generator().manual_seed(0))
        >>> tuple(u.shape), tuple(e.shape), bool((e > 0).all())
        ((2, 3), (2, 5), True)
    """
    device = device if device is not None else (generator.device if generator is not None else "cpu")
    uniforms = torch.rand(b, n, generator=generator, device=device)
    exponentials = torch.empty(b, v, device=device).exponential_(generator=generator)
    return uniforms, exponentials


def _output(rows: list, n: int, device) -> AcceptOutput:
    """Pack per-row ``(path, committed)`` lists (``None`` for an inactive row) into an :class:`AcceptOutput`."""
    lengths = [0 if row is None else len(row[0]) for row in rows]
    path = [[-1] * n if row is None else row[0] + [-1] * (n - len(row[0])) for row in rows]
    committed = [[-1] * (n + 1) if row is None else row[1] + [-1] * (n + 1 - len(row[1])) for row in rows]
    return AcceptOutput(torch.tensor(lengths, dtype=torch.long, device=device),
                        torch.tensor(path, dtype=torch.long, device=device).reshape(len(rows), n),
                        torch.tensor(committed, dtype=torch.long, device=device).reshape(len(rows), n + 1))


def _active(active, b: int, device) -> torch.Tensor:
    if active is None:
        return torch.ones(b, dtype=torch.int8, device=device)
    return active.to(device=device, dtype=torch.int8).contiguous()


def _block(n: int) -> int:
    return max(16, 1 << max(0, (int(n) - 1).bit_length()))
