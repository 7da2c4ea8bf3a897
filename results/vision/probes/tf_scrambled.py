# Teacher-forced accuracy on docs items with real vs scrambled text (no language prior): how much of the
# target's accuracy is reading. Usage: python results/vision/probes/tf_scrambled.py MODEL [N] [0,1] [line,block,page]
import sys, torch
torch.set_num_threads(1)
from transformers import AutoProcessor, Qwen2VLForConditionalGeneration
from mmspec.vision.testbed import make_batch
from mmspec.workloads import get_workload
path = sys.argv[1]; n = int(sys.argv[2]) if len(sys.argv) > 2 else 16
model = Qwen2VLForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()
proc = AutoProcessor.from_pretrained(path)
SCR = [float(x) for x in (sys.argv[3] if len(sys.argv) > 3 else "0,1").split(",")]
MODES = (sys.argv[4] if len(sys.argv) > 4 else "line,block,page").split(",")
for scr in SCR:
    for mode in MODES:
        wl = get_workload("docs", mode=mode, scrambled_fraction=scr)
        right = tot = 0
        with torch.no_grad():
            for s in range(0, n, 4):
                b = make_batch(proc, wl.examples("test", 4, start=s))
                lab = b.pop("labels")
                pred = model(**b).logits[:, :-1].argmax(-1)
                want = lab[:, 1:]; m = want != -100
                right += (pred == want)[m].sum().item(); tot += m.sum().item()
        print(path.split("/")[-1], "scrambled" if scr else "real", mode, "acc", round(right / tot, 3), tot, flush=True)
