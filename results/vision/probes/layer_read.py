# Does the text model keep what the tower read? A fresh linear "ordered" reader (the characters of each vision token,
# in order) is fitted on the image tokens' states at the text model's input and after each of its first layers
# (frozen model; items from the train split), then scored on test items. Usage: python results/vision/probes/layer_read.py
# MODEL [N_TRAIN] [N_TEST] [SCRAMBLED_SHARE]
import sys, torch
torch.set_num_threads(1)
from transformers import AutoProcessor, Qwen2VLForConditionalGeneration
from mmspec.vision.testbed import make_batch, merge_size
from mmspec.vision.testbed_train import CHARSET, ordered_targets
from mmspec.workloads import get_workload
path = sys.argv[1]; n_train = int(sys.argv[2]) if len(sys.argv) > 2 else 48; n_test = int(sys.argv[3]) if len(sys.argv) > 3 else 16
scr = float(sys.argv[4]) if len(sys.argv) > 4 else 0.5
model = Qwen2VLForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()
proc = AutoProcessor.from_pretrained(path); merge = merge_size(proc); slots = 4 * merge
image_id = proc.tokenizer.convert_tokens_to_ids(proc.image_token)
wl = get_workload("docs", mode="mix", line_fraction=0.4, block_fraction=0.4, scrambled_fraction=scr, char_boxes=True)

def feats(split, n):
    xs, ys = {}, []
    for s in range(0, n, 4):
        exs = wl.examples(split, 4, start=s)
        b = make_batch(proc, exs); b.pop("labels")
        with torch.no_grad():
            out = model(**b, output_hidden_states=True)
        pos = b["input_ids"] == image_id
        for li, h in enumerate(out.hidden_states[:5]):  # 0: the text model's input (merged vision tokens)
            xs.setdefault(li, []).append(h[pos])
        ys.append(torch.cat([ordered_targets(ex, tuple(g), merge, slots)
                             for ex, g in zip(exs, b["image_grid_thw"][:, 1:].tolist())]))
    return {k: torch.cat(v) for k, v in xs.items()}, torch.cat(ys)

xtr, ytr = feats("train", n_train); xte, yte = feats("test", n_test)
for li in sorted(xtr):
    torch.manual_seed(0)
    mu, sd = xtr[li].mean(0), xtr[li].std(0) + 1e-5
    lin = torch.nn.Linear(xtr[li].shape[1], slots * (len(CHARSET) + 1))
    opt = torch.optim.Adam(lin.parameters(), lr=3e-3)
    for _ in range(300):
        logits = lin((xtr[li] - mu) / sd).view(-1, slots, len(CHARSET) + 1)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ytr.flatten())
        opt.zero_grad(); loss.backward(); opt.step()
    with torch.no_grad():
        pred = lin((xte[li] - mu) / sd).view(-1, slots, len(CHARSET) + 1).argmax(-1)
    drawn = yte > 0
    print(f"hidden_states[{li}]", "test char acc", round((pred[drawn] == yte[drawn]).float().mean().item(), 3),
          "train loss", round(loss.item(), 3), flush=True)
