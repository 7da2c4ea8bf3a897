"""Does the reader's GLANCE head draft at run time what its training forward predicts? (issue 33, 2026-12-04)

Usage: python results/vision/reader/drafters/glance_check.py  (needs drafters.sh's work folder, runs/reader-drafters)
Printed then: features equal; training-forward top-1 0.67 0.29 0.17 0.04 per position; run-time tau 1.81."""
import json, torch
from safetensors import safe_open
from safetensors.torch import load_file
from mmspec import MMSpecPipeline
from mmspec.registry import make_drafter
from mmspec.workloads import get_workload
from mmspec.drafters.block import collate_blocks, block_forward
f = 'runs/reader-drafters/data-run/data/shard-00024.safetensors'
meta = safe_open(f, 'pt').metadata(); items = json.loads(meta['items'])
d = load_file(f)
i = 0
a0, b0 = int(d['offsets'][i]), int(d['offsets'][i + 1])
rec = {k: d[k][a0:b0] for k in ('tokens', 'labels', 'features', 'positions', 'routable')}
rec['prompt_len'] = d['prompt_len'][i]
print(items[i], b0 - a0, int(rec['prompt_len']))
wl, split, idx = items[i].split('/')
ex = get_workload(wl).example(split, int(idx))
pipe = MMSpecPipeline.from_pretrained('vision/assets/reader', drafter=None)  # auto: bf16 here
model = pipe.model
inputs = pipe.prepare(images=[ex.images], prompt=[ex.prompt])
ids = inputs['input_ids'][0]
plen = int(rec['prompt_len'])
print('prompt ids equal:', torch.equal(ids, rec['tokens'][:plen]), len(ids), plen)
full = rec['tokens'][None]
with torch.no_grad():
    out = model(input_ids=full, pixel_values=inputs['pixel_values'], attention_mask=torch.ones_like(full), output_hidden_states=True)
feats = torch.cat([out.hidden_states[l][0].float() for l in (2, 15, 29)], -1)
rf = rec['features'].float()
err = (feats - rf).norm(dim=-1) / rf.norm(dim=-1)
print('feature rel err: prompt %.4f response %.4f' % (err[:plen].mean(), err[plen:].mean()))
print('labels = argmax next:', (out.logits[0].argmax(-1) == rec['labels']).float().mean().item())
dr = make_drafter('glance:runs/reader-drafters/glance', model)
head = dr.head.float()
anchors = torch.arange(plen + 1, b0 - a0 - 8, 7)[:64]
batch = collate_blocks([rec], 8, 64)
batch['anchors'] = torch.full((1, 64), -1); batch['anchors'][0, :len(anchors)] = anchors
with torch.no_grad():
    logits, target = block_forward(head, batch)
pred = logits.argmax(-1)[0, :len(anchors)]
tgt = target[0, :len(anchors)]
print('train-forward top1 per pos (recorded feats):', [round(x, 2) for x in (pred == tgt).float().mean(0).tolist()])
batch['features'] = feats[None]
with torch.no_grad():
    logits2, _ = block_forward(head, batch)
pred2 = logits2.argmax(-1)[0, :len(anchors)]
print('train-forward top1 per pos (fresh feats):', [round(x, 2) for x in (pred2 == tgt).float().mean(0).tolist()])
# run-time path: mmspec.generate with the drafter, from the record's prompt, compare accept rates
import mmspec
dr2 = make_drafter('glance:runs/reader-drafters/glance', model)
res = mmspec.generate(model, inputs, drafter=dr2, max_new_tokens=b0 - a0 - plen, do_sample=False)
print('runtime tau', res.stats.tau, [round(x, 2) for x in res.stats.accept_rate])
