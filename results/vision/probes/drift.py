# Where do a testbed target's page errors start, and does it recover after a wrong token? (issue 14)
# Usage: python results/vision/probes/drift.py [MODEL_DIR or "" for the bundled target] [N pages]
# Prints per page: teacher-forced accuracy by token category (first token of a drawn line, inside a line,
# markup), the first divergence of the greedy output, and the CER of 30 greedy tokens after a reference prefix
# of 20 / 50 / 80 tokens, as is and with its last token replaced by the model's other top-2 choice.
import json, sys, torch, time
torch.set_num_threads(1)
from transformers import AutoProcessor, Qwen2VLForConditionalGeneration
from mmspec.inputs import edit_distance as _edit_distance
from mmspec.vision.testbed import bundled_target, make_batch
from mmspec.vision.testbed_train import char_locations
from mmspec.workloads import get_workload
path = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] else bundled_target()
N = int(sys.argv[2]) if len(sys.argv) > 2 else 12
model = Qwen2VLForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()
proc = AutoProcessor.from_pretrained(path)
tok = proc.tokenizer
wl = get_workload("docs", mode="page", char_boxes=True)
exs = wl.examples("test", N)
t0 = time.time()
res = []
with torch.no_grad():
  for ex in exs:
    batch = make_batch(proc, [ex])
    labels = batch.pop("labels")[0]
    a0 = int((labels != -100).nonzero()[0])
    logits = model(**batch).logits[0]
    ids = batch["input_ids"][0]
    ans = ids[a0:]  # answer + eos
    pred = logits[a0 - 1:-1].argmax(-1)
    right = (pred == ans)
    # visual line of each answer token
    prompt = proc.apply_chat_template([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": ex.prompt}]}], add_generation_prompt=True)
    enc = tok(prompt + ex.target, add_special_tokens=False, return_offsets_mapping=True)
    offs = [(c0 - len(prompt), c1 - len(prompt)) for c0, c1 in enc["offset_mapping"] if c0 >= len(prompt)]
    locs = char_locations(ex, ex.target)
    cats = []
    prev_y = None
    for (c0, c1) in offs:
      loc = next((locs[c] for c in range(max(c0,0), c1) if locs[c] is not None), None)
      if loc is None: cats.append("markup"); continue
      cats.append("linestart" if (prev_y is None or abs(loc[1] - prev_y) > 8) else "inline")
      prev_y = loc[1]
    cats = cats[:len(ans) - 1] + ["eos"]
    # free-running greedy
    gb = make_batch(proc, [ex], train=False)
    out = model.generate(**gb, max_new_tokens=220, do_sample=False)[0, gb["input_ids"].shape[1]:]
    out = out.tolist()
    ref = ans.tolist()
    first = next((i for i, (a, b) in enumerate(zip(out, ref)) if a != b), min(len(out), len(ref)))
    text = tok.decode(out, skip_special_tokens=True)
    cer = _edit_distance(text.strip(), ex.target.strip()) / len(ex.target.strip())
    # recovery: reference prefix to k, token k replaced by the model's own 2nd choice, greedy 30 more
    rec = []
    for k in (20, 50, 80):
      if k + 31 >= len(ref): continue
      for corrupt in (False, True):
        pre = list(ref[:k])
        if corrupt:
          top2 = logits[a0 - 1 + k].topk(2).indices.tolist()
          pre.append(top2[1] if top2[0] == ref[k] else top2[0])
        else:
          pre.append(ref[k])
        b2 = dict(gb)
        b2["input_ids"] = torch.cat([gb["input_ids"], torch.tensor([pre])], 1)
        b2["attention_mask"] = torch.ones_like(b2["input_ids"])
        if "mm_token_type_ids" in b2:
          b2["mm_token_type_ids"] = torch.cat([gb["mm_token_type_ids"], torch.zeros(1, len(pre), dtype=gb["mm_token_type_ids"].dtype)], 1)
        o = model.generate(**b2, max_new_tokens=30, do_sample=False)[0, b2["input_ids"].shape[1]:].tolist()
        want = tok.decode(ref[k+1:k+31]); got = tok.decode(o)
        rec.append((k, corrupt, round(_edit_distance(got, want) / max(1, len(want)), 3)))
    by = {}
    for c, r in zip(cats, right.tolist()):
      by.setdefault(c, [0, 0]); by[c][0] += r; by[c][1] += 1
    res.append(dict(id=ex.id, n_tok=len(ref), tf_acc=round(right.float().mean().item(), 3),
                    by={k: (v[0], v[1]) for k, v in by.items()}, first_div=first, first_cat=cats[first] if first < len(cats) else None,
                    cer=round(cer, 3), rec=rec, text=text[:200], ref=ex.target[:200],
                    wrong_pos=[i for i, r in enumerate(right.tolist()) if not r]))
    print(json.dumps(res[-1]), flush=True)
print("secs", time.time() - t0)
agg = {}
for r in res:
  for k, (a, n) in r["by"].items():
    agg.setdefault(k, [0, 0]); agg[k][0] += a; agg[k][1] += n
print("tf acc by cat", {k: (round(a / n, 3), n) for k, (a, n) in agg.items()})
print("first divergence", [(r["first_div"], r["first_cat"], r["n_tok"]) for r in res])
import statistics
for corrupt in (False, True):
  for k in (20, 50, 80):
    v = [c for r in res for (kk, cc, c) in r["rec"] if kk == k and cc == corrupt]
    if v: print("recovery k", k, "corrupt", corrupt, "mean cont CER", round(statistics.mean(v), 3), len(v))
