"""Merge drive-sim closed-loop chunks (``--closed-loop-start``) into one record per system.

Incident counts and scenarios add up exactly; latency is per chunk (each chunk's stage medians are kept under
``chunks``) and the merged ``latency_ms`` is the median over chunks of each chunk's median (no per-tick list is
stored). Usage: python results/drivers/drive-sim/merge_chunks.py OUT.json CHUNK.json...
"""

import json
import statistics
import sys


def merge(paths: list) -> dict:
    chunks = [json.load(open(p))["results"] for p in paths]
    systems = list(dict.fromkeys(r["system"] for c in chunks for r in c))  # a system may run in chunks of its own
    out = []
    for s in systems:
        recs = sorted((r for c in chunks for r in c if r["system"] == s), key=lambda r: r["quality"]["first_scenario"])
        n = sum(r["quality"]["n_scenarios"] for r in recs)
        counts = {k: sum(r["quality"][k] for r in recs) for k in ("collision_count", "offroad_count", "red_light_count")}
        lat = {k: statistics.median(r["latency_ms"][k] for r in recs) for k in recs[0]["latency_ms"]}
        firsts = sorted(r["quality"]["first_scenario"] for r in recs)
        quality = {**counts, **{k.replace("_count", "_rate"): v / n for k, v in counts.items()}, "n_scenarios": n,
                   "scenarios": f"{firsts[0]}..{firsts[-1] + recs[-1]['quality']['n_scenarios'] - 1}"}
        heads = [r["quality"].get("mean_head_calls") for r in recs if r["quality"].get("mean_head_calls")]
        if heads:
            quality["mean_head_calls"] = statistics.mean(heads)
        rec = {"system": s, "n_chunks": len(recs), "latency_ms": lat, "hz": 1e3 / lat["total"], "quality": quality,
               "exact": all(r["exact"] for r in recs), "note": recs[0]["note"], "dtype": recs[0]["dtype"],
               "chunks": [{"first_scenario": r["quality"]["first_scenario"], "latency_ms": r["latency_ms"],
                           **{k: r["quality"][k] for k in counts}} for r in recs]}
        for k in ("exact_note", "speculation"):
            if k in recs[0]:
                rec[k] = recs[0][k] if k == "exact_note" else [r[k] for r in recs]
        out.append(rec)
    base = next((r for r in out if r["system"] == "plain"), None)
    if base is not None:
        for r in out:
            r["stage_ratio_vs_plain"] = {k: base["latency_ms"][k] / v for k, v in r["latency_ms"].items() if v}
    return {"results": out}


if __name__ == "__main__":
    json.dump(merge(sys.argv[2:]), open(sys.argv[1], "w"), indent=1)
