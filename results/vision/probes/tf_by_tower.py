# Is the tower what limits reading? Teacher-forced accuracy of the next answer token on docs test items, split by
# whether the tower's own "ordered" reader (the run's state.pt or probes.pt) reads the vision token being read
# (reading_targets) exactly. If the text model read whatever the tower shows, accuracy would be high where the tower
# is right.
# Usage: python results/vision/probes/tf_by_tower.py RUN_DIR [N] [SCRAMBLED_SHARE] [line,block,page]
import os, sys, torch
torch.set_num_threads(1)
from transformers import AutoProcessor, Qwen2VLForConditionalGeneration
from mmspec.vision.testbed import make_batch, merge_size
from mmspec.vision.testbed_train import _ordered_reader, load_probes, ordered_targets, reading_targets
from mmspec.errors import InvalidInputError
from mmspec.workloads import get_workload
path = sys.argv[1]; n = int(sys.argv[2]) if len(sys.argv) > 2 else 16
scr = float(sys.argv[3]) if len(sys.argv) > 3 else 1.0
MODES = (sys.argv[4] if len(sys.argv) > 4 else "line,block").split(",")
model = Qwen2VLForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()
proc = AutoProcessor.from_pretrained(path)
merge = merge_size(proc)
try:  # the run's state.pt, or the probes.pt of a train_gpu.sh checkpoint; an "ordered" reader only
    reader = _ordered_reader(load_probes(path), model.config.text_config.hidden_size, merge, path)
except InvalidInputError as e:
    sys.exit(f"{os.path.basename(sys.argv[0])}: {e}")
slots = reader.cells
cap = {}
model.model.visual.register_forward_hook(lambda m, a, o: cap.__setitem__("h", o.pooler_output))
image_id = proc.tokenizer.convert_tokens_to_ids(proc.image_token)
for mode in MODES:
    wl = get_workload("docs", mode=mode, scrambled_fraction=scr, char_boxes=True)
    n_ok = {True: [0, 0], False: [0, 0]}
    with torch.no_grad():
        for s in range(0, n, 4):
            exs = wl.examples("test", 4, start=s)
            b = make_batch(proc, exs)
            where = reading_targets(proc, exs, b)
            lab = b.pop("labels")
            pred = model(**b).logits[:, :-1].argmax(-1)
            tower = reader(cap["h"]).argmax(-1)  # (image tokens of the batch, slots)
            y = torch.cat([ordered_targets(ex, tuple(g), merge, slots)
                           for ex, g in zip(exs, b["image_grid_thw"][:, 1:].tolist())])
            cell_ok = (tower == y).all(-1)
            offset = torch.cumsum(torch.tensor([0] + [int(g.prod()) // merge ** 2 for g in b["image_grid_thw"]]), 0)
            first = (b["input_ids"] == image_id).int().argmax(-1)
            bi, qi = (where >= 0).nonzero(as_tuple=True)
            for bb, qq in zip(bi.tolist(), qi.tolist()):
                k = offset[bb] + where[bb, qq] - first[bb]
                ok = bool(cell_ok[k])
                n_ok[ok][0] += int(pred[bb, qq] == lab[bb, qq + 1]); n_ok[ok][1] += 1
    print(os.path.basename(path.rstrip("/")), mode, "scrambled", scr,
          "tf_acc | tower reads the token exactly", round(n_ok[True][0] / max(1, n_ok[True][1]), 3), "n", n_ok[True][1],
          "| tower wrong", round(n_ok[False][0] / max(1, n_ok[False][1]), 3), "n", n_ok[False][1], flush=True)
