# Where the misses go on scrambled docs lines: is a wrong single-character prediction a neighbour of the right one
# (within two tokens), the same letter in the other case, or something else? Usage: python results/vision/probes/tf_near.py MODEL
import sys, torch
torch.set_num_threads(1)
from collections import Counter
from transformers import AutoProcessor, Qwen2VLForConditionalGeneration
from mmspec.vision.testbed import make_batch
from mmspec.workloads import get_workload
path = sys.argv[1]
model = Qwen2VLForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()
proc = AutoProcessor.from_pretrained(path); tok = proc.tokenizer
wl = get_workload("docs", mode="line", scrambled_fraction=1.0)
c = Counter()
with torch.no_grad():
    for s in range(0, 24, 4):
        exs = wl.examples("test", 4, start=s)
        b = make_batch(proc, exs)
        lab = b.pop("labels")
        pred = model(**b).logits[:, :-1].argmax(-1); want = lab[:, 1:]
        for i in range(len(exs)):
            m = want[i] != -100
            ws, ps = want[i][m].tolist(), pred[i][m].tolist()
            text = [tok.decode([w]) for w in ws]
            for j, (p, w) in enumerate(zip(ps, ws)):
                if p == w or len(text[j].strip()) != 1: continue
                pc = tok.decode([p])
                near = {d: text[j + d] for d in (-2, -1, 1, 2) if 0 <= j + d < len(text)}
                hit = [d for d, t in near.items() if t == pc]
                c["next+%d" % hit[0] if hit and hit[0] > 0 else "prev%d" % hit[0] if hit else
                  ("case" if pc.strip().lower() == text[j].strip().lower() else "other")] += 1
print(c)
