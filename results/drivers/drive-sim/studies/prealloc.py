"""One expert head call with the backbone's DynamicCache (concatenation per call) vs a per-tick preallocated K/V buffer written in place."""
import torch, time
import os, tempfile
torch.set_num_threads(1)
from mmspec.drivers import DrivingPipeline
from mmspec.drivers.train_vla import DrivingVLA, bundled_vla
from mmspec.drivers.vla import time_embedding, expert_attention_mask
from mmspec.workloads import get_workload
vla = DrivingVLA.from_pretrained(bundled_vla(), dtype=torch.float32).eval()
fd = DrivingPipeline(vla, flashdrive={"stream": False})
ex = get_workload("driving").examples("test", 1)[0]
fd.step(ex.images, ex.meta["history"], ex.meta["speed"], seed=0)
cache, start, valid = fd.engine.last_context
E = vla.expert
N = E.horizon

class Prealloc:
    """Per tick: the cache's K/V copied once into buffers with room for the action tokens; each call writes them in place."""
    def __init__(self, cache, n):
        self.L = cache.get_seq_length()
        self.buf = []
        for layer in cache.layers:
            k, v = layer.keys, layer.values
            bk = k.new_empty(k.shape[0], k.shape[1], self.L + n, k.shape[3]); bk[:, :, :self.L] = k
            bv = v.new_empty(v.shape[0], v.shape[1], self.L + n, v.shape[3]); bv[:, :, :self.L] = v
            self.buf.append((bk, bv))
    def update(self, k, v, layer_idx, *a, **kw):
        bk, bv = self.buf[layer_idx]
        bk[:, :, self.L:] = k; bv[:, :, self.L:] = v
        return bk, bv
    def get_seq_length(self, *a):
        return self.L
x = torch.randn(1, N, 2)
t = torch.full((1,), 0.3)
pos = (start[:, None] + torch.arange(N)[None]).long()[None].expand(3, 1, N)
mask = expert_attention_mask(valid, N, "sdpa", torch.float32)
te = time_embedding(t, E.hidden_size)
def call_dyn():
    return E.velocity(x, t, cache, start, valid, mask=mask, positions=pos, t_emb=te)
def call_pre(pc):
    emb = E.in_proj(torch.cat([x, te[:, None].expand(1, N, -1)], dim=-1))
    out = E.decoder(inputs_embeds=emb, attention_mask={"full_attention": mask}, position_ids=pos, cache=pc, use_cache=True)
    return E.out_proj(out.last_hidden_state)
with torch.no_grad():
    pc = Prealloc(cache, N)
    a, b = call_dyn(), call_pre(pc)
    print("max diff", (a - b).abs().max().item())
    for rep in range(3):
        for name, f in (("dynamic", call_dyn), ("prealloc", lambda: call_pre(pc))):
            for _ in range(3): f()
            t0 = time.perf_counter(); n = 20
            for _ in range(n): f()
            print(name, round((time.perf_counter() - t0) / n * 1e3, 2), "ms/call", flush=True)
    t0 = time.perf_counter()
    for _ in range(20): Prealloc(cache, N)
    print("prealloc build", round((time.perf_counter() - t0) / 20 * 1e3, 2), "ms/tick", cache.get_seq_length())
