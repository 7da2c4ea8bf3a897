# Teacher-forced accuracy on scrambled docs lines of single-character answer tokens, by the character's rank inside its
# vision token (0: first in reading order). Usage: python results/vision/probes/tf_offset.py MODEL
import sys, torch
torch.set_num_threads(1)
from collections import Counter
from transformers import AutoProcessor, Qwen2VLForConditionalGeneration
from mmspec.vision.testbed import make_batch, PATCH, merge_size, _chat_prompts
from mmspec.vision.testbed_train import char_locations
from mmspec.workloads import get_workload
path = sys.argv[1]
model = Qwen2VLForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()
proc = AutoProcessor.from_pretrained(path); tok = proc.tokenizer; M = merge_size(proc); S = PATCH * M
wl = get_workload("docs", mode="line", scrambled_fraction=1.0, char_boxes=True)
right, tot = Counter(), Counter()
with torch.no_grad():
    for s in range(0, 32, 4):
        exs = wl.examples("test", 4, start=s)
        b = make_batch(proc, exs); lab = b.pop("labels")
        pred = model(**b).logits[:, :-1].argmax(-1); want = lab[:, 1:]
        prompts = _chat_prompts(proc, exs)
        for i, ex in enumerate(exs):
            enc = tok(prompts[i] + ex.target, add_special_tokens=False, return_offsets_mapping=True)
            n0 = len(prompts[i])
            offs = [(a - n0, c - n0) for a, c in enc["offset_mapping"] if a >= n0]
            locs = char_locations(ex, ex.target)
            cells = {}
            for ci, l in enumerate(locs):
                if l is not None: cells.setdefault((int(l[1]) // S, int(l[0]) // S), []).append((l[0], ci))
            rank = {}
            for k, v in cells.items():
                for r, (_, ci) in enumerate(sorted(v)): rank[ci] = r
            m = (want[i] != -100).nonzero().flatten().tolist()
            for j, q in enumerate(m[:len(offs)]):
                a, c = offs[j]
                if c - a != 1 or locs[a] is None: continue
                r = min(rank.get(a, -1), 3)
                tot[r] += 1; right[r] += int(pred[i, q] == want[i, q])
print({r: (round(right[r] / tot[r], 3), tot[r]) for r in sorted(tot)})
