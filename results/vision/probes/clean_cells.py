# Can the text model learn to copy when the image tokens are clean? The vision tower is replaced by the exact
# characters of each merged token (ordered_targets), embedded as a sum over reading-order slots of a learnt
# table E[slot, character] (independent random vectors; "shared": the character's own text embedding in every
# slot), so the text
# model sees perfect, noise-free "vision tokens" at the real positions (M-RoPE and all). Trains the text model
# and E on docs items (lm loss only) and reports teacher-forced accuracy on test items every EVAL steps.
# If this learns to copy scrambled text fast, the real target's problem is the tower's features; if it does not,
# it is the text model's copy itself.
# Saves the model (its tower untouched) and E (cells.pt) beside LOG at every evaluation.
# Usage: python results/vision/probes/clean_cells.py INIT LOG STEPS LR [BATCH] [SCRAMBLED] [EVAL] [fresh|warm] [random|shared]
import json, sys, time, torch
torch.set_num_threads(int(__import__("os").environ.get("THREADS", "1")))
from transformers import AutoProcessor, Qwen2VLForConditionalGeneration
from transformers.modeling_outputs import BaseModelOutputWithPooling
from mmspec.vision.testbed import make_batch, merge_size
from mmspec.vision.testbed_train import CHARSET, ordered_targets
from mmspec.workloads import get_workload
init, log, steps, lr = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
bs = int(sys.argv[5]) if len(sys.argv) > 5 else 8
scr = float(sys.argv[6]) if len(sys.argv) > 6 else 0.5
every = int(sys.argv[7]) if len(sys.argv) > 7 else 50
model = Qwen2VLForConditionalGeneration.from_pretrained(init, dtype=torch.float32)
proc = AutoProcessor.from_pretrained(init)
if len(sys.argv) > 8 and sys.argv[8] == "fresh":
    model.model.language_model.apply(model._init_weights)
merge, slots = merge_size(proc), 4 * merge_size(proc)
emb = model.get_input_embeddings().weight.detach()
tok = proc.tokenizer
# Independent random vectors per (slot, character), at the embeddings' scale: a sum of them keeps which character
# sits in which slot (a table shared across slots would give the text model an unordered bag of characters).
torch.manual_seed(0)  # E and the items are then the same in every run
E = torch.randn(slots, len(CHARSET) + 1, emb.shape[1]) * emb.std()
if len(sys.argv) > 9 and sys.argv[9] == "shared":  # the first try: the character's own embedding in every slot
    E = torch.randn(slots, len(CHARSET) + 1, emb.shape[1]) * 0.01
    for i, ch in enumerate(CHARSET):
        ids = tok(ch, add_special_tokens=False)["input_ids"]
        if len(ids) == 1:
            E[:, i + 1] += emb[ids[0]]
E = torch.nn.Parameter(E)
ctx = {}
model.model.visual.forward = lambda pixel_values, grid_thw=None, **kw: BaseModelOutputWithPooling(
    last_hidden_state=ctx["cells"], pooler_output=ctx["cells"])


def cells(exs, b):
    y = torch.cat([ordered_targets(ex, tuple(g), merge, slots) for ex, g in zip(exs, b["image_grid_thw"][:, 1:].tolist())])
    return E[torch.arange(slots), y].sum(1)


train = get_workload("docs", mode="mix", line_fraction=0.4, block_fraction=0.5, scrambled_fraction=scr, char_boxes=True)
tests = {f"{'scr' if s else 'real'}-{m}": get_workload("docs", mode=m, scrambled_fraction=s, char_boxes=True)
         for s in (1.0, 0.0) for m in ("line", "block", "page")}
params = list(model.model.language_model.parameters()) + [model.lm_head.weight, E]
params = list({id(p): p for p in params}.values())
opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20))


def evaluate():
    model.eval(); res = {}
    with torch.no_grad():
        for name, wl in tests.items():
            right = total = 0
            for s in range(0, 16, 4):
                exs = wl.examples("test", 4, start=s)
                b = make_batch(proc, exs)
                ctx["cells"] = cells(exs, b)
                lab = b.pop("labels")
                pred = model(**b).logits[:, :-1].argmax(-1)
                m = lab[:, 1:] != -100
                right += ((pred == lab[:, 1:]) & m).sum().item(); total += m.sum().item()
            res[name] = round(right / total, 3)
    model.train()
    return res


with open(log, "w") as f:
    f.write(json.dumps({"step": 0, **evaluate()}) + "\n")
model.train()
t0 = time.perf_counter()
for step in range(steps):
    exs = train.examples("train", bs, start=step * bs)
    b = make_batch(proc, exs)
    ctx["cells"] = cells(exs, b)
    loss = model(**b).loss
    opt.zero_grad(); loss.backward(); torch.nn.utils.clip_grad_norm_(params, 1.0); opt.step(); sched.step()
    if (step + 1) % 10 == 0:
        print(step + 1, round(loss.item(), 3), round((time.perf_counter() - t0) / (step + 1), 2), "s/step", flush=True)
    if (step + 1) % every == 0:
        with open(log, "a") as f:
            f.write(json.dumps({"step": step + 1, "loss": round(loss.item(), 4), **evaluate()}) + "\n")
        out = log.rsplit(".", 1)[0]
        model.save_pretrained(out); proc.save_pretrained(out)
        torch.save({"E": E.detach(), "step": step + 1}, out + "/cells.pt")
