"""Side-by-side table of the shipped / target (M-RoPE) / flat / flat+text heads: held-out top-1 per offset at step 200
and drive-sim figures (tau, median decode and total ms) from the JSONs in this folder."""
import json, os, statistics as st

HERE = os.path.dirname(os.path.abspath(__file__))
NAMES = ["shipped", "target", "target-s1", "target-s2", "flat", "flat-s1", "flat-s2", "flattext", "flattext-s1",
         "flattext-s2"]


def val(name):
    p = "/work/main/results/drivers/training/driving-drafter/val_log.jsonl" if name == "shipped" else \
        os.path.join(HERE, f"fit-{name}", "val_log.jsonl")
    rows = [json.loads(l) for l in open(p)] if os.path.exists(p) else []
    return next((r["acc"] for r in rows if r["step"] == 200), None)


def sim(prefix, name):
    p = os.path.join(HERE, f"{prefix}-{name}.json")
    out = {}
    for r in (json.load(open(p))["results"] if os.path.exists(p) else []):
        sp = r.get("speculation") or {}
        out[r["system"]] = {"tau": sp.get("tau"), "dec": r["latency_ms"]["decode"], "total": r["latency_ms"]["total"]}
    return out


def fmt(d, sys, keys=("tau", "dec", "total")):
    t = d.get(sys)
    return "/".join(f"{t[k]:.2f}" if k == "tau" else f"{t[k]:.1f}" for k in keys) if t else "-"


print("head         held-out top-1, offsets 1-7 (step 200)       mean  | 4 clips r1 tau/dec/total: spec ; flashdrive"
      "      | r2 (one load): plain dec/total ; spec ; flashdrive                 | 16 clips tau: spec flashdrive")
rows = {}
for n in NAMES:
    a = val(n)
    r1, r2, s16 = sim("drive", n), sim("drive-r2", n), sim("drive16", n)
    rows[n] = (a, r1, r2, s16)
    acc = " ".join(f"{x:.3f}" for x in a) if a else "-"
    print(f"{n:11s}  {acc:45s}  {st.mean(a) if a else float('nan'):.3f} | {fmt(r1, 'spec'):16s} ; "
          f"{fmt(r1, 'flashdrive'):16s} | {fmt(r2, 'plain', ('dec', 'total')):11s} ; {fmt(r2, 'spec'):16s} ; "
          f"{fmt(r2, 'flashdrive'):16s} | {fmt(s16, 'spec', ('tau',))} {fmt(s16, 'flashdrive', ('tau',))}")


def agg(xs):
    xs = [x for x in xs if x is not None]
    return f"{st.mean(xs):.3f} [{min(xs):.3f}..{max(xs):.3f}]" if xs else "-"


print("\nper variant over seeds 0-2, mean [min..max]:")
cols = {"held-out mean top-1": lambda r: st.mean(r[0]) if r[0] else None,
        "held-out top-1 @7": lambda r: r[0][-1] if r[0] else None,
        "tau spec 4cl": lambda r: (r[1].get("spec") or {}).get("tau"),
        "tau fd 4cl": lambda r: (r[1].get("flashdrive") or {}).get("tau"),
        "tau spec 16cl": lambda r: (r[3].get("spec") or {}).get("tau"),
        "tau fd 16cl": lambda r: (r[3].get("flashdrive") or {}).get("tau"),
        "r2 spec dec ms": lambda r: (r[2].get("spec") or {}).get("dec"),
        "r2 spec total ms": lambda r: (r[2].get("spec") or {}).get("total"),
        "r2 fd dec ms": lambda r: (r[2].get("flashdrive") or {}).get("dec"),
        "r2 fd total ms": lambda r: (r[2].get("flashdrive") or {}).get("total"),
        "r2 plain dec ms": lambda r: (r[2].get("plain") or {}).get("dec")}
for g in ("target", "flat", "flattext"):
    members = [rows[n] for n in NAMES if n.split("-")[0] == g]
    print(f"  {g}:")
    for name, f in cols.items():
        print(f"    {name:18s} {agg([f(r) for r in members])}")
print("  shipped (reference, 1 fit):")
for name, f in cols.items():
    print(f"    {name:18s} {agg([f(rows['shipped'])])}")
