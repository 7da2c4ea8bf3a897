# Teacher-forced accuracy and reading-attention hit rate by docs kind (line / block / page), 16 items each.
# Usage: python results/vision/probes/reading_head.py [MODEL_DIR or "" for the bundled target] [SCRAMBLED_SHARE] [MODES]
import sys, torch, json
torch.set_num_threads(1)
from transformers import AutoProcessor, Qwen2VLForConditionalGeneration
from mmspec.vision.testbed import bundled_target, make_batch
from mmspec.vision.testbed_train import reading_targets
from mmspec.workloads import get_workload
path = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] else bundled_target()
model = Qwen2VLForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()
model.set_attn_implementation({"text_config": "eager"})
proc = AutoProcessor.from_pretrained(path)
cap = {}
for li in (2, 3):
  model.model.language_model.layers[li].self_attn.register_forward_hook(lambda m, a, o, li=li: cap.__setitem__(li, o[1]))
SCR = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
for mode in (sys.argv[3] if len(sys.argv) > 3 else "line,block,page").split(","):
  wl = get_workload("docs", mode=mode, char_boxes=True, scrambled_fraction=SCR)
  acc = [0, 0]; hit = {2: [0, 0, 0], 3: [0, 0, 0]}; acc_att = [0, 0, 0, 0]
  for s in range(0, 16, 4):
    exs = wl.examples("test", 4, start=s)
    b = make_batch(proc, exs)
    where = reading_targets(proc, exs, b)
    lab = b.pop("labels")
    with torch.no_grad():
      lg = model(**b).logits
    pred = lg[:, :-1].argmax(-1); want = lab[:, 1:]
    m = want != -100
    acc[0] += ((pred == want) & m).sum().item(); acc[1] += m.sum().item()
    bi, qi = (where >= 0).nonzero(as_tuple=True)
    for li in (2, 3):
      am = cap[li][bi, 0, qi].argmax(-1)
      hit[li][0] += (am == where[bi, qi]).sum().item(); hit[li][2] += len(bi)
      # accuracy of the predicted token when the layer-3 head hits vs misses
      if li == 3:
        ok = (pred[bi, qi] == lab[bi, qi + 1])
        h = am == where[bi, qi]
        acc_att[0] += (ok & h).sum().item(); acc_att[1] += h.sum().item()
        acc_att[2] += (ok & ~h).sum().item(); acc_att[3] += (~h).sum().item()
  print(mode, "tf_acc", round(acc[0] / acc[1], 3), "n", acc[1], "read-head argmax hit L2", round(hit[2][0] / hit[2][2], 3),
        "L3", round(hit[3][0] / hit[3][2], 3), "acc|hit", round(acc_att[0] / max(1, acc_att[1]), 3), "acc|miss", round(acc_att[2] / max(1, acc_att[3]), 3), flush=True)
