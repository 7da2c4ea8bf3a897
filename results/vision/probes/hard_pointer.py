# Does a sharper pointer fix reading? Teacher-forced accuracy on docs test items when head 0 of the reading layers
# (2, 3) puts all its attention on one image token at every answer position that has a reading target
# (where >= 0): its own argmax ("hard"), or the token the reading targets name ("oracle"), against the model as
# it is ("as is"). If "oracle" reads far better, the
# values carry the characters and the soft pointer blurs them; if not, what the head passes on is the problem.
# Usage: python results/vision/probes/hard_pointer.py RUN_DIR [N] [SCRAMBLED_SHARE] [line,block] [LAYERS]
import sys, torch
torch.set_num_threads(1)
from transformers import AutoProcessor, Qwen2VLForConditionalGeneration
from transformers.models.qwen2_vl import modeling_qwen2_vl as mq
from mmspec.vision.testbed import make_batch
from mmspec.vision.testbed_train import reading_targets
from mmspec.workloads import get_workload
path = sys.argv[1]; n = int(sys.argv[2]) if len(sys.argv) > 2 else 16
scr = float(sys.argv[3]) if len(sys.argv) > 3 else 1.0
MODES = (sys.argv[4] if len(sys.argv) > 4 else "line,block").split(",")
LAYERS = [int(x) for x in (sys.argv[5] if len(sys.argv) > 5 else "2,3").split(",")]
model = Qwen2VLForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()
model.set_attn_implementation({"text_config": "eager"})
proc = AutoProcessor.from_pretrained(path)
plain = mq.eager_attention_forward
ctx = {"mode": "as is", "where": None}


def patched(module, query, key, value, attention_mask, scaling, dropout=0.0, **kw):
    out, w = plain(module, query, key, value, attention_mask, scaling, dropout, **kw)
    if ctx["mode"] == "as is" or getattr(module, "layer_idx", -1) not in LAYERS or w.shape[2] == 1:
        return out, w
    where = ctx["where"]
    bi, qi = (where >= 0).nonzero(as_tuple=True)
    target = w[bi, 0, qi].argmax(-1) if ctx["mode"] == "hard" else where[bi, qi]
    w = w.clone()
    w[bi, 0, qi] = 0.0
    w[bi, 0, qi, target] = 1.0
    v = mq.repeat_kv(value, module.num_key_value_groups)
    return torch.matmul(w, v).transpose(1, 2).contiguous(), w


mq.eager_attention_forward = patched
for mode in MODES:
    wl = get_workload("docs", mode=mode, scrambled_fraction=scr, char_boxes=True)
    acc = {m: [0, 0] for m in ("as is", "hard", "oracle")}
    with torch.no_grad():
        for s in range(0, n, 4):
            exs = wl.examples("test", 4, start=s)
            b = make_batch(proc, exs)
            where = reading_targets(proc, exs, b)
            lab = b.pop("labels")
            ctx["where"] = where
            bi, qi = (where >= 0).nonzero(as_tuple=True)
            for m in acc:
                ctx["mode"] = m
                pred = model(**b).logits[:, :-1].argmax(-1)
                acc[m][0] += (pred[bi, qi] == lab[bi, qi + 1]).sum().item(); acc[m][1] += len(bi)
    print(path.rstrip("/").split("/")[-1], mode, "scrambled", scr, "layers", LAYERS,
          " ".join(f"{m}: {a / max(1, t):.3f}" for m, (a, t) in acc.items()), "n", acc["as is"][1], flush=True)
