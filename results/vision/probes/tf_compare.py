# Teacher-forced LM loss and next-token accuracy of testbed targets on the same batches of the faithful run's
# training distribution that it never trains on (steps 5900-5929 of its batch sequence, batch 4: docs items 50%
# pages, 35% blocks, 15% lines; charts a quarter), by kind: a low-noise progress measure (issue 14).
# Usage: python results/vision/probes/tf_compare.py MODEL_DIR[,MODEL_DIR...] [N_BATCHES]
import sys, torch
torch.set_num_threads(1)
from transformers import AutoProcessor, Qwen2VLForConditionalGeneration
from mmspec.vision.testbed import make_batch
from mmspec.vision.testbed_train import TargetTrainConfig, _examples
from mmspec.workloads import get_workload
cfg = TargetTrainConfig(batch_size=4, docs_fraction=0.75,
                        workload_options={"docs": {"mode": "mix", "line_fraction": 0.15, "block_fraction": 0.35},
                                          "charts": {}})
wls = {n: get_workload(n, **cfg.workload_options.get(n, {})) for n in ("docs", "charts")}
batches = [_examples(cfg, s, wls) for s in range(5900, 5900 + int(sys.argv[2] if len(sys.argv) > 2 else 30))]
for path in sys.argv[1].split(","):
    model = Qwen2VLForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()
    proc = AutoProcessor.from_pretrained(path)
    tally = {}
    with torch.no_grad():
        for exs in batches:
            b = make_batch(proc, exs)
            lab = b.pop("labels")
            logits = model(**b).logits[:, :-1]
            want = lab[:, 1:]
            nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), want, ignore_index=-100, reduction="none")
            right = (logits.argmax(-1) == want)
            for i, ex in enumerate(exs):
                k = ex.meta.get("kind") or "chart-" + ex.meta.get("regime", "-")
                m = want[i] != -100
                t = tally.setdefault(k, [0.0, 0, 0])
                t[0] += nll[i][m].sum().item(); t[1] += right[i][m].sum().item(); t[2] += m.sum().item()
    tot = [sum(t[j] for t in tally.values()) for j in range(3)]
    print(path, "loss", round(tot[0] / tot[2], 4), "acc", round(tot[1] / tot[2], 4),
          {k: (round(t[0] / t[2], 3), round(t[1] / t[2], 3), t[2]) for k, t in sorted(tally.items())}, flush=True)
