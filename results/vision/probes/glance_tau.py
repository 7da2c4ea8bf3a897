"""τ of GLANCE vs the bundled EAGLE head (and the shuffled-image ablation) on N test items per workload.

Usage: python results/vision/probes/glance_tau.py HEAD_DIR [N] [system-name filters...]   (one thread; outputs checked against AR)"""
import sys, time, json
import torch
torch.set_num_threads(1)
import mmspec
from mmspec import MMSpecPipeline
from mmspec.registry import make_drafter
from mmspec.workloads import get_workload

head = sys.argv[1]
N = int(sys.argv[2]) if len(sys.argv) > 2 else 8
SYSTEMS = {
    "eagle (bundled)": "eagle:vision/assets/testbed-vlm-eagle",
    "eagle;min_confidence=none": "eagle:vision/assets/testbed-vlm-eagle;min_confidence=none",
    "glance chain": f"glance:{head}",
    "glance chain shuffled": f"glance:{head};image_features=shuffled",
    "glance tree k4 b16": f"glance:{head};branch_k=4;tree_budget=16",
    "glance tree k4 b16 shuffled": f"glance:{head};branch_k=4;tree_budget=16;image_features=shuffled",
}
if len(sys.argv) > 3:
    SYSTEMS = {k: v for k, v in SYSTEMS.items() if any(s in k for s in sys.argv[3:])}
pipe = MMSpecPipeline.from_pretrained("vision/assets/testbed-vlm")
model = pipe.model
print("dtype", model.dtype, flush=True)
rows = []
for w in ("docs", "charts"):
    wl = get_workload(w)
    items = [pipe.prepare(images=ex.images or None, prompt=ex.prompt) for ex in (wl.example("test", i) for i in range(N))]
    refs = [model.generate(**dict(x), max_new_tokens=64, do_sample=False) for x in items]
    for name, spec in SYSTEMS.items():
        d = make_drafter(spec, model)
        if "shuffled" in name:  # fill the donor bank: item k then reads item k-1's page (item 0: item N-1's)
            for x in items:
                mmspec.generate(model, dict(x), drafter=d, max_new_tokens=2)
            d.shuffler.kept_own = d.shuffler.swapped = 0
        stats, same, t0 = None, 0, time.perf_counter()
        for x, ref in zip(items, refs):
            out = mmspec.generate(model, dict(x), drafter=d, max_new_tokens=64)
            same += int(torch.equal(out.sequences, ref))
            stats = out.stats if stats is None else stats.merge(out.stats)
        el = time.perf_counter() - t0
        extra = f" swapped {d.shuffler.swapped} kept_own {d.shuffler.kept_own}" if "shuffled" in name else ""
        acc = [round(a, 2) for a in (stats.accept_rate or [])]
        row = {"workload": w, "system": name, "tau": round(stats.tau, 3), "accept_rate": acc, "same": f"{same}/{N}",
               "draft_s": round(stats.draft_time, 2), "verify_s": round(stats.verify_time, 2), "total_s": round(el, 2)}
        rows.append(row)
        print(json.dumps(row) + extra, flush=True)
