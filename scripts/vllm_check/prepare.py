"""`make vllm-check`, mmspec's side (run with mmspec's venv): the target as safetensors, the head exported for vLLM,
the prompts as token ids, and mmspec's own tau with the same head on the same prompts.

    python scripts/vllm_check/prepare.py --work .vllm-check/work [--head DIR] [--n 32] [--max-new-tokens 64] [--k 3]
    python scripts/vllm_check/prepare.py --work .vllm-check/work --summarize

Without --head it uses the head that ships for SmolLM2 (vision/assets/smollm2-eagle3) when there is one, else an
UNTRAINED eagle3 head (random weights: it checks the loading path and identity only; acceptance will be ~1).
Writes WORK/target (a link to mmspec's converted SmolLM2 folder), WORK/head-vllm, WORK/prompts.json, WORK/mmspec.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

SHIPPED = os.path.join(os.path.dirname(__file__), "..", "..", "vision", "assets", "smollm2-eagle3")


def prepare(args) -> None:
    import torch

    import mmspec
    from mmspec.drafters.eagle import EagleDrafter
    from mmspec.export import export_head
    from mmspec.workloads import ChatWorkload
    from mmspec.vision.reader.lm import smollm2_path
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    os.makedirs(args.work, exist_ok=True)
    target = smollm2_path(print_fn=print)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(target)
    head = args.head or (SHIPPED if os.path.isdir(SHIPPED) else "")
    trained = bool(head)
    if not head:
        head = os.path.join(args.work, "head-untrained")
        d = EagleDrafter.from_target(model, tok, layer_ids=(2, 15, 27), layout="eagle3", draft_vocab_size=8192,
                                     seed=0, num_draft_tokens=args.k)
        d.set_draft_vocab(range(8192))
        d.save_pretrained(head)
        print(f"vllm-check: no trained head given or shipped; an UNTRAINED eagle3 head ({head}) checks loading only")
    out = os.path.join(args.work, "head-vllm")
    export_head(head, "vllm-eagle3", out, target, num_speculative_tokens=args.k, target_model=model, tokenizer=tok)
    print(f"vllm-check: exported {head} -> {out}")
    w, prompts, seen, i = ChatWorkload(), [], set(), 0
    while len(prompts) < args.n:  # the first N distinct test instructions
        p = w.example("test", i).prompt
        i += 1
        if p not in seen:
            seen.add(p)
            prompts.append(p)
    ids = [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True,
                                   return_dict=False) for p in prompts]
    ids = [list(x["input_ids"] if isinstance(x, dict) else x) for x in ids]
    with open(os.path.join(args.work, "prompts.json"), "w") as f:
        json.dump({"target": target, "head": out, "trained": trained, "k": args.k, "max_new_tokens": args.max_new_tokens,
                   "prompts": prompts, "prompt_token_ids": ids}, f)
    drafter = EagleDrafter.from_pretrained(head, target=model, tokenizer=tok)
    drafter.num_draft_tokens, drafter.topk = args.k, 1  # the chain vLLM drafts
    committed = rounds = 0
    outs, t0 = [], time.time()
    for x in ids:  # batch 1, greedy, fp32
        o = mmspec.generate(model, {"input_ids": torch.tensor([x]), "attention_mask": torch.ones(1, len(x), dtype=torch.long)},
                            drafter=drafter, max_new_tokens=args.max_new_tokens, do_sample=False)
        committed, rounds = committed + o.stats.committed, rounds + o.stats.row_rounds
        outs.append(o.sequences[0, len(x):].tolist())
    tau = committed / max(rounds, 1)
    with open(os.path.join(args.work, "mmspec.json"), "w") as f:
        json.dump({"tau": tau, "outputs": outs, "seconds": time.time() - t0}, f)
    print(f"vllm-check: mmspec tau {tau:.3f} over {len(ids)} prompts (k={args.k}, batch 1, fp32)")


def summarize(args) -> None:
    def load(name):
        p = os.path.join(args.work, name)
        return json.load(open(p)) if os.path.isfile(p) else None

    meta, mm, none, e3, ng, srv = (load(n) for n in ("prompts.json", "mmspec.json", "vllm-none.json",
                                                    "vllm-eagle3.json", "vllm-ngram.json", "vllm-serve.json"))
    same = sum(a == b for a, b in zip(none["outputs"], e3["outputs"]))
    M = len(none["outputs"])
    acc = e3["mean_acceptance_length"]
    speed = e3["tokens_per_s"] / none["tokens_per_s"]
    if ng:
        print(f"vllm-check: ngram {ng['tokens_per_s'] / none['tokens_per_s']:.2f}x "
              f"(acceptance {ng['mean_acceptance_length']:.2f}, identical "
              f"{sum(a == b for a, b in zip(none['outputs'], ng['outputs']))}/{M})")
    if srv:
        print(f"vllm-check: vllm serve with the head: {srv['verdict']}")
    mm_same = sum(a == b for a, b in zip(none["outputs"], mm["outputs"]))
    print(f"vllm-check: tokens/s without {none['tokens_per_s']:.1f}, with the head {e3['tokens_per_s']:.1f}; "
          f"mmspec's outputs equal vLLM's on {mm_same}/{M}; head {'trained' if meta['trained'] else 'UNTRAINED'}")
    print(f"vllm-check: identical {same}/{M}, vllm acceptance {acc:.2f}, mmspec tau {mm['tau']:.2f}, speedup {speed:.2f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", required=True)
    ap.add_argument("--head", default="")
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--summarize", action="store_true")
    a = ap.parse_args()
    sys.exit(summarize(a) if a.summarize else prepare(a))
