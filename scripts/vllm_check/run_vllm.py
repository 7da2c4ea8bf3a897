"""`make vllm-check`, vLLM's side (run with the separate vLLM venv, not mmspec's): the target served by vLLM's
offline engine without speculation, with the exported EAGLE-3 head, or with vLLM's own ngram drafter, one prompt at a
time (batch 1, greedy, fp32), after one warm-up request; or one request to `vllm serve` over localhost HTTP.

    python scripts/vllm_check/run_vllm.py --work WORK --mode none|eagle3|ngram
    python scripts/vllm_check/run_vllm.py --work WORK --mode serve --port 8765

Reads WORK/prompts.json (written by prepare.py); writes WORK/vllm-MODE.json.
"""

from __future__ import annotations

import argparse
import json
import os
import time


def spec_config(meta: dict, mode: str):
    if mode == "eagle3":
        return {"method": "eagle3", "model": meta["head"], "num_speculative_tokens": meta["k"]}
    if mode == "ngram":
        return {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 2}
    return None


def counters(llm) -> dict:
    out = {}
    for m in llm.get_metrics():
        if m.name.startswith("vllm:spec_decode_num_") and hasattr(m, "value"):
            out[m.name] = out.get(m.name, 0) + m.value
    return out


def offline(args, meta: dict) -> dict:
    from vllm import LLM, SamplingParams

    llm = LLM(model=meta["target"], dtype="float32", enforce_eager=True, max_model_len=2048, seed=0,
              speculative_config=spec_config(meta, args.mode), disable_log_stats=False)
    sp = SamplingParams(temperature=0.0, max_tokens=meta["max_new_tokens"])
    prompts = [{"prompt_token_ids": ids} for ids in meta["prompt_token_ids"]]
    llm.generate(prompts[:1], sp, use_tqdm=False)  # warm-up
    before = counters(llm)
    outs, texts, tokens, t0 = [], [], 0, time.perf_counter()
    for p in prompts:  # batch 1
        o = llm.generate([p], sp, use_tqdm=False)[0].outputs[0]
        outs.append(list(o.token_ids))
        texts.append(o.text)
        tokens += len(o.token_ids)
    secs = time.perf_counter() - t0
    after = counters(llm)
    d = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    drafts = d.get("vllm:spec_decode_num_drafts", 0)
    acc = 1 + d.get("vllm:spec_decode_num_accepted_tokens", 0) / drafts if drafts else 1.0
    return {"mode": args.mode, "outputs": outs, "texts": texts, "tokens": tokens, "seconds": secs,
            "tokens_per_s": tokens / secs, "mean_acceptance_length": acc, "counters": d}


def serve(args, meta: dict) -> dict:
    """One completion request to a running `vllm serve` (started by check.sh), compared with the offline run."""
    import urllib.request

    body = {"model": meta["target"], "prompt": meta["prompt_token_ids"][0], "max_tokens": meta["max_new_tokens"],
            "temperature": 0.0}
    req = urllib.request.Request(f"http://127.0.0.1:{args.port}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        text = json.load(r)["choices"][0]["text"]
    ref = json.load(open(os.path.join(args.work, "vllm-none.json")))["texts"][0]
    return {"mode": "serve", "text": text, "verdict": "identical to offline without speculation" if text == ref
            else f"DIFFERS from offline without speculation: {text[:80]!r} vs {ref[:80]!r}"}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", required=True)
    ap.add_argument("--mode", choices=("none", "eagle3", "ngram", "serve"), required=True)
    ap.add_argument("--port", type=int, default=8765)
    a = ap.parse_args()
    meta = json.load(open(os.path.join(a.work, "prompts.json")))
    res = serve(a, meta) if a.mode == "serve" else offline(a, meta)
    with open(os.path.join(a.work, f"vllm-{a.mode}.json"), "w") as f:
        json.dump(res, f)
    if a.mode != "serve":
        print(f"vllm-check: {a.mode}: {res['tokens_per_s']:.1f} tokens/s, acceptance {res['mean_acceptance_length']:.2f}")
