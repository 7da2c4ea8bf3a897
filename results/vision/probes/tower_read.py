# How well the vision tower alone reads: the "ordered" reader of a vision-only run (its state.pt or probes.pt) writes
# each merged token's characters in order; per-character accuracy and the share of tokens read exactly, on docs test
# items with real and scrambled text. Usage: python results/vision/probes/tower_read.py RUN_DIR [N] [line,block,page]
import os, sys, torch
torch.set_num_threads(1)
from transformers import AutoProcessor, Qwen2VLForConditionalGeneration
from mmspec.vision.testbed import make_batch, merge_size
from mmspec.vision.testbed_train import _ordered_reader, load_probes, ordered_targets
from mmspec.errors import InvalidInputError
from mmspec.workloads import get_workload
path = sys.argv[1]; n = int(sys.argv[2]) if len(sys.argv) > 2 else 16
MODES = (sys.argv[3] if len(sys.argv) > 3 else "line,block,page").split(",")
model = Qwen2VLForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()
proc = AutoProcessor.from_pretrained(path)
merge = merge_size(proc)
try:  # the run's state.pt, or the probes.pt of a train_gpu.sh checkpoint; an "ordered" reader only
    reader = _ordered_reader(load_probes(path), model.config.text_config.hidden_size, merge, path)
except InvalidInputError as e:
    sys.exit(f"{os.path.basename(sys.argv[0])}: {e}")
slots = reader.cells
for scr in (0.0, 1.0):
    for mode in MODES:
        wl = get_workload("docs", mode=mode, scrambled_fraction=scr, char_boxes=True)
        right = chars = exact = toks = 0
        with torch.no_grad():
            for s in range(0, n, 4):
                exs = wl.examples("test", 4, start=s)
                b = make_batch(proc, exs)
                h = model.model.visual(b["pixel_values"], grid_thw=b["image_grid_thw"]).pooler_output
                pred = reader(h).argmax(-1)
                y = torch.cat([ordered_targets(ex, tuple(g), merge, slots)
                               for ex, g in zip(exs, b["image_grid_thw"][:, 1:].tolist())])
                drawn = y > 0
                right += (pred[drawn] == y[drawn]).sum().item(); chars += drawn.sum().item()
                has = y[:, 0] > 0
                exact += (pred[has] == y[has]).all(-1).sum().item(); toks += has.sum().item()
        print(os.path.basename(path.rstrip("/")), "scrambled" if scr else "real", mode,
              "char_acc", round(right / chars, 3), "token_exact", round(exact / toks, 3), "tokens", toks, flush=True)
