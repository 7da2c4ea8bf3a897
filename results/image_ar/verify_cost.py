# A k-token pass against a one-token step at a given cache length (bf16, one thread), 16 x 16 and 32 x 32 generators.
# Usage: python results/image_ar/verify_cost.py (from the repository root); medians of 15.
import time, torch
from transformers import DynamicCache
from mmspec.image_ar.generator import ImageARPipeline
torch.set_num_threads(1)
def med(f, n=15):
    ts=[]
    for _ in range(n):
        t=time.perf_counter(); f(); ts.append(time.perf_counter()-t)
    return sorted(ts)[n//2]
for gen, ctx in (("image_ar/assets/image-gen", 150), ("image_ar/assets/image-gen-32", 600)):
    pipe = ImageARPipeline.from_pretrained(gen, dtype=torch.bfloat16); m = pipe.model
    ids = torch.randint(200, 400, (1, ctx))
    with torch.no_grad():
        cache = DynamicCache(config=m.config); m(input_ids=ids, cache=cache, use_cache=True)
        base = {}
        for k in (1, 8, 16, 32, 64):
            x = torch.randint(200, 400, (1, k))
            def step():
                m(input_ids=x, cache=cache, use_cache=True); cache.crop(-k)
            base[k] = med(step)
    print(gen, "ctx", ctx, " ".join(f"{k}:{base[k]/base[1]:.2f}x" for k in base), f"(1 token {base[1]*1e3:.2f} ms)")
