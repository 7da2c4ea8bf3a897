"""``python -m mmspec.kernels.bench``: each kernel against its reference (and attention against dense SDPA).

On a CUDA device it first checks every Triton kernel against its reference on that device (bf16
included), then times, per shape, the Triton kernel, the plain-torch reference and, for attention, dense
SDPA fed the same ancestor mask as a ``[B, 1, Q, L + Q]`` boolean tensor (today's verification path).
Times are medians of CUDA-event timings after a warm-up, in microseconds.

Without a GPU it says that timings need one and runs the correctness sweep in Triton's interpreter
(small shapes: the interpreter runs every program in numpy). Exit status 1 when any check fails.

    python -m mmspec.kernels.bench                      # CUDA if present, else the CPU sweep
    python -m mmspec.kernels.bench --json out.json      # also write every row as JSON

Example:
    >>> rows = sweep(torch.device("cpu"), quick=True)    # doctest: +SKIP
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import torch

from .acceptance import draw_randomness, greedy_accept, sampling_accept
from .attention import tree_attention, tree_attention_supported, tree_visibility
from .compaction import gather_slots
from .dispatch import using

__all__ = ["sweep", "timings", "main", "random_parents"]

# (atol, rtol) for attention outputs: the kernel rounds softmax weights to the input dtype before P @ V.
ATTN_TOL = {torch.float32: (2e-5, 1e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}


def random_parents(b: int, n_nodes: list, width: int, generator: torch.Generator) -> torch.Tensor:
    """``int64[b, 1 + width]`` parent arrays in query indexing (as ``pack_trees`` packs them): random trees
    of ``n_nodes[r]`` nodes, a quarter of nodes hanging off the root; padding nodes hang off the root.

    Example:
        >>> random_parents(2, [3, 0], 3, torch.Generator().manual_seed(0))[:, 0].tolist()
        [-1, -1]
    """
    parents = torch.zeros(b, 1 + width, dtype=torch.long)
    parents[:, 0] = -1
    for r in range(b):
        for i in range(n_nodes[r]):
            if i and float(torch.rand((), generator=generator)) > 0.25:
                parents[r, 1 + i] = 1 + int(torch.randint(0, i, (), generator=generator))
    return parents


def _attention_inputs(b, hq, hkv, prefix, nodes, d, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    width = max(nodes)
    q = torch.randn(b, hq, 1 + width, d, generator=g).to(device, dtype)
    k = torch.randn(b, hkv, prefix + 1 + width, d, generator=g).to(device, dtype)
    v = torch.randn(b, hkv, prefix + 1 + width, d, generator=g).to(device, dtype)
    valid = torch.ones(b, prefix, dtype=torch.bool)
    for r in range(b):
        valid[r, : min(prefix - 1, r * 3)] = False  # left padding of different lengths
    parents = random_parents(b, nodes, width, g)
    return q, k, v, valid.to(device), parents.to(device)


def _acceptance_inputs(b, nodes, vocab, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    width = max(nodes)
    parents = random_parents(b, nodes, width, g)
    tokens = torch.randint(0, vocab, (b, width), generator=g)
    logits = torch.randn(b, 1 + width, vocab, generator=g)
    for r in range(b):  # the target likes the drafted tokens, so walks go deep
        for i in range(nodes[r]):
            logits[r, parents[r, 1 + i], tokens[r, i]] += 6
    probs = torch.softmax(logits, -1)
    draft = torch.softmax(torch.randn(b, width, vocab, generator=g), -1)
    uniforms, exps = draw_randomness(b, width, vocab, g)
    n = torch.tensor(nodes)
    return [t.to(device) for t in (tokens, parents, n, probs, draft, uniforms, exps)]


def _dense_sdpa(q, k, v, valid, parents, scale):
    import torch.nn.functional as F

    b, _, nq, _ = q.shape
    mask = torch.cat([valid[:, None, :].expand(b, nq, -1), tree_visibility(parents)], dim=2)[:, None]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)


# ---------------------------------------------------------------------------------------------- correctness
def sweep(device: torch.device, quick: bool = False) -> list[dict]:
    """Every kernel against its reference on ``device``; one dict per case with ``ok`` and the error.

    On CPU the kernels run in Triton's interpreter (``TRITON_INTERPRET=1`` is set for the call).
    """
    if device.type != "cuda":
        os.environ["TRITON_INTERPRET"] = "1"
    rows = []
    dtypes = [torch.float32, torch.float16] + ([torch.bfloat16] if device.type == "cuda" else [])
    attn_shapes = [(2, 4, 2, 9, [5, 0], 64), (3, 2, 1, 1, [7, 3, 1], 128), (1, 3, 3, 70, [12], 64)]
    if device.type == "cuda" and not quick:
        attn_shapes += [(4, 32, 8, 1500, [64, 1, 0, 33], 128), (8, 16, 2, 700, [16] * 8, 64)]
    for dtype in dtypes:
        for seed, (b, hq, hkv, prefix, nodes, d) in enumerate(attn_shapes):
            q, k, v, valid, parents = _attention_inputs(b, hq, hkv, prefix, nodes, d, dtype, device, seed)
            depth = int(tree_visibility(parents).sum(-1).max()) - 1
            with using("triton"):
                got = tree_attention(q, k, v, valid, parents, max_depth=depth)
            want = tree_attention(q, k, v, valid, parents, backend="reference")
            diff = (got.float() - want.float()).abs()
            atol, rtol = ATTN_TOL[dtype]
            ok = bool((diff <= atol + rtol * want.float().abs()).all())
            rows.append(_row("tree_attention", f"B{b} Hq{hq}/Hkv{hkv} L{prefix} N{max(nodes)} D{d}", dtype,
                             ok, f"max abs err {float(diff.max()):.2e}", tree_attention_supported(q, k)))
    for seed, (b, nodes, vocab) in enumerate([(4, [9, 0, 14, 3], 50), (2, [1, 6], 300)]):
        tokens, parents, n, probs, draft, u, e = _acceptance_inputs(b, nodes, vocab, device, seed)
        ids = probs.argmax(-1)
        active = torch.ones(b, dtype=torch.bool, device=device)
        active[-1] = False
        for name, args in (("greedy_accept", (tokens, parents, n, ids)),
                           ("greedy_accept", (tokens, parents, n, ids, active))):
            rows.append(_exact(name, f"B{b} N{max(nodes)}" + (" finished row" if len(args) > 4 else ""),
                               greedy_accept, args))
        for q_name, q in (("deterministic", None), ("with q", draft)):
            rows.append(_exact("sampling_accept", f"B{b} N{max(nodes)} V{vocab} {q_name}", sampling_accept,
                               (tokens, parents, n, probs, u, e, q)))
    g = torch.Generator().manual_seed(0)
    for dtype in dtypes:
        keys = torch.randn(3, 2, 40, 64, generator=g).to(device, dtype)
        values = torch.randn(3, 2, 40, 64, generator=g).to(device, dtype)
        index = torch.randint(0, 40, (2, 33), generator=g).to(device)
        rows_sel = torch.tensor([2, 0], device=device)
        rows.append(_exact("gather_slots", "B3->2 H2 S40->33 D64", gather_slots, (keys, values, index, rows_sel),
                           dtype))
    return rows


def _exact(name, shape, fn, args, dtype=None) -> dict:
    with using("triton"):
        got = fn(*args)
    want = fn(*args, backend="reference")
    ok = all(torch.equal(a, b) for a, b in zip(got, want))
    return _row(name, shape, dtype, ok, "exact" if ok else "DIFFERS", None)


def _row(kernel, shape, dtype, ok, detail, fallback) -> dict:
    return {"kernel": kernel, "shape": shape, "dtype": None if dtype is None else str(dtype).replace("torch.", ""),
            "ok": bool(ok), "check": detail, "ran": "reference (" + fallback + ")" if fallback else "triton"}


# ---------------------------------------------------------------------------------------------- timings
# Timed shapes: attention (B, Hq, Hkv, cached L, tree nodes, head dim), Qwen2.5-7B-like heads first;
# acceptance (B, tree nodes, vocab); compaction (B, kv heads, slots, head dim).
ATTN_SHAPES = [(1, 32, 8, 1024, 16, 128), (1, 32, 8, 4096, 64, 128), (8, 32, 8, 2048, 64, 128),
               (8, 28, 4, 1024, 32, 128), (4, 16, 16, 2048, 64, 64)]
ACCEPT_SHAPES = [(1, 16, 152064), (8, 64, 152064), (32, 8, 32000)]
GATHER_SHAPES = [(8, 8, 2113, 128), (32, 4, 1089, 128)]


def _time_us(fn, reps: int = 20) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000)
    times.sort()
    return times[len(times) // 2]


def timings(device: torch.device, quick: bool = False) -> list[dict]:
    """Per shape: the Triton kernel, its reference and (attention) dense SDPA with the same mask, in µs."""
    rows = []
    for b, hq, hkv, prefix, width, d in ATTN_SHAPES[:2] if quick else ATTN_SHAPES:
        for dtype in (torch.bfloat16, torch.float16):
            q, k, v, valid, parents = _attention_inputs(b, hq, hkv, prefix, [width] * b, d, dtype, device)
            depth = int(tree_visibility(parents).sum(-1).max()) - 1
            scale = d**-0.5
            row = {"kernel": "tree_attention", "shape": f"B{b} Hq{hq}/Hkv{hkv} L{prefix} Q{1 + width} D{d}",
                   "dtype": str(dtype).replace("torch.", "")}
            with using("triton"):
                row["triton_us"] = _time_us(lambda: tree_attention(q, k, v, valid, parents, scale, depth))
            row["reference_us"] = _time_us(lambda: tree_attention(q, k, v, valid, parents, scale, depth,
                                                                  backend="reference"))
            row["dense_sdpa_us"] = _time_us(lambda: _dense_sdpa(q, k, v, valid, parents, scale))
            rows.append(row)
            print(_format(row), flush=True)
    for b, width, vocab in ACCEPT_SHAPES:
        tokens, parents, n, probs, draft, u, e = _acceptance_inputs(b, [width] * b, vocab, device)
        ids = probs.argmax(-1)
        cases = [("greedy_accept", greedy_accept, (tokens, parents, n, ids)),
                 ("sampling_accept", sampling_accept, (tokens, parents, n, probs, u, e, None)),
                 ("sampling_accept+q", sampling_accept, (tokens, parents, n, probs, u, e, draft))]
        for name, fn, args in cases:
            row = {"kernel": name, "shape": f"B{b} N{width} V{vocab}", "dtype": "float32"}
            with using("triton"):
                row["triton_us"] = _time_us(lambda: fn(*args))
            row["reference_us"] = _time_us(lambda: fn(*args, backend="reference"), reps=3)
            rows.append(row)
            print(_format(row), flush=True)
    for b, h, s, d in GATHER_SHAPES:
        keys = torch.randn(b, h, s, d, device=device, dtype=torch.bfloat16)
        values = torch.randn_like(keys)
        keep = torch.arange(0, b, 2, device=device)
        index = torch.sort(torch.randint(0, s, (len(keep), s - 40), device=device), dim=1).values
        row = {"kernel": "gather_slots", "shape": f"B{b}->{len(keep)} H{h} S{s} D{d} (K+V)", "dtype": "bfloat16"}
        with using("triton"):
            row["triton_us"] = _time_us(lambda: gather_slots(keys, values, index, keep))
        row["reference_us"] = _time_us(lambda: gather_slots(keys, values, index, keep, backend="reference"))
        rows.append(row)
        print(_format(row), flush=True)
    return rows


def _format(row: dict) -> str:
    if "ok" in row:
        return (f"{'ok ' if row['ok'] else 'FAIL'} {row['kernel']:<16} {row['shape']:<40} {row['dtype'] or '':<9} "
                f"{row['check']:<22} ran {row['ran']}")
    cols = [f"{row['kernel']:<18}", f"{row['shape']:<38}", f"{row['dtype']:<9}"]
    for key in ("triton_us", "reference_us", "dense_sdpa_us"):
        if key in row:
            cols.append(f"{key[:-3]} {row[key]:9.1f} us")
    ref = row.get("dense_sdpa_us", row["reference_us"])
    cols.append(f"x{ref / row['triton_us']:.2f} vs {'sdpa' if 'dense_sdpa_us' in row else 'reference'}")
    return "  ".join(cols)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mmspec.kernels.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--quick", action="store_true", help="fewer shapes")
    parser.add_argument("--json", default=None, help="also write the rows to this JSON file")
    args = parser.parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda":
        print(f"device: {torch.cuda.get_device_name(device)}; torch {torch.__version__}", flush=True)
    else:
        print("timings need a GPU (none here): running the correctness sweep in Triton's interpreter", flush=True)
    t0 = time.perf_counter()
    print("== correctness: Triton kernel vs its plain-torch reference", flush=True)
    checks = []
    for row in sweep(device, quick=args.quick):
        print(_format(row), flush=True)
        checks.append(row)
    print(f"   {sum(r['ok'] for r in checks)}/{len(checks)} ok in {time.perf_counter() - t0:.1f} s", flush=True)
    times = []
    if device.type == "cuda":
        print("== timings (median, us)", flush=True)
        times = timings(device, quick=args.quick)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": str(device), "checks": checks, "timings": times}, f, indent=1,
                      default=lambda x: None if isinstance(x, float) and math.isnan(x) else str(x))
    return 0 if all(r["ok"] for r in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
