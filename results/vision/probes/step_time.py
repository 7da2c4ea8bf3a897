# One-token decode step of a testbed target: (generate 33 tokens - generate 1) / 32 after a docs page,
# median of 3, one thread. Usage: python results/vision/probes/step_time.py MODEL_DIR bfloat16|float32
import sys, time, statistics, torch
torch.set_num_threads(1)
from transformers import AutoProcessor, Qwen2VLForConditionalGeneration
from mmspec.vision.testbed import make_batch
from mmspec.workloads import get_workload
path, dtype = sys.argv[1], getattr(torch, sys.argv[2])
model = Qwen2VLForConditionalGeneration.from_pretrained(path, dtype=dtype).eval()
proc = AutoProcessor.from_pretrained(path)
ex = get_workload("docs", mode="page").example("test", 0)
b = make_batch(proc, [ex], train=False)
with torch.no_grad():
    out = model.generate(**b, max_new_tokens=1, do_sample=False, return_dict_in_generate=True)
    # time generate of 33 tokens minus 1: per-token decode cost including HF's loop overhead
    ts = []
    for _ in range(3):
        t = time.perf_counter(); model.generate(**b, max_new_tokens=1, min_new_tokens=1, do_sample=False); t1 = time.perf_counter() - t
        t = time.perf_counter(); model.generate(**b, max_new_tokens=33, min_new_tokens=33, do_sample=False); t33 = time.perf_counter() - t
        ts.append((t33 - t1) / 32)
print(path, sys.argv[2], "ms per decode step (generate, median of 3):", round(1000 * statistics.median(ts), 2))
