"""Where each head's draft attention goes on the held-out shard: the share of attention mass (queries: every drafted
block position of the final pass, anchors at every generated position; averaged over heads and queries) on image
positions, on the prompt's text positions, on the generated reasoning before the anchor and on the block itself.
Usage: python attention.py HEAD_DIR [HEAD_DIR ...]"""
import sys

import torch
import torch.nn.functional as F

import mmspec.drafters.block as B
from mmspec.train import read_shard
from mmspec.vision.glance import GlanceDrafter
from mmspec.vision.glance.train import text_context

IMAGE_ID = 151655  # overwritten from the VLA config below
from transformers import AutoConfig

cfg = AutoConfig.from_pretrained("/work/main/drivers/assets/driving-vla")
IMAGE_ID = cfg.image_token_id
records = read_shard("/work/runs/flat/drafter/data/shard-00015.safetensors")[:32]
torch.manual_seed(0)

captured = []
orig = F.scaled_dot_product_attention


def spy(q, k, v, attn_mask=None, **kw):
    s = (q.float() @ k.float().transpose(-1, -2)) / q.shape[-1] ** 0.5
    if attn_mask is not None:
        s = s.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else s + attn_mask
    captured.append(torch.softmax(s, -1))
    return orig(q, k, v, attn_mask=attn_mask, **kw)


for path in sys.argv[1:]:
    d = GlanceDrafter.from_pretrained(path).float().eval()
    shares = torch.zeros(5)
    for rec in records:
        n, P = len(rec["tokens"]), int(rec["prompt_len"])
        batch = B.collate_blocks([rec], d.block_size, 64, n_axes=d.head.n_axes, rope=d.rope)
        anchors = torch.arange(P, n - 1)[None]
        batch["anchors"] = anchors
        if d.context == "text":
            batch = text_context(batch, [IMAGE_ID])
        captured.clear()
        F.scaled_dot_product_attention = spy
        try:
            with torch.no_grad():
                B.block_forward(d.head, batch)
        finally:
            F.scaled_dot_product_attention = orig
        att = captured[-1][0]  # last pass, batch row 0: [heads, N*Bs, T + N*Bs]
        Bs, N = d.block_size, anchors.shape[1]
        att = att.view(att.shape[0], N, Bs, -1)[:, :, 1:]  # drafted positions only
        T = n
        img = (rec["tokens"] == IMAGE_ID)
        last_img = int(img.nonzero().max())
        frame_text = torch.zeros(T, dtype=torch.bool); frame_text[:last_img] = ~img[:last_img]  # template, markers
        ego_text = torch.zeros(T, dtype=torch.bool); ego_text[last_img + 1:P] = True  # ego speed, history, question
        gen = torch.zeros(T, dtype=torch.bool); gen[P:] = True
        ctx = att[..., :T]
        shares += torch.stack([ctx[..., img].sum(-1).mean(), ctx[..., frame_text].sum(-1).mean(),
                               ctx[..., ego_text].sum(-1).mean(), ctx[..., gen].sum(-1).mean(),
                               att[..., T:].sum(-1).mean()])
    shares /= len(records)
    print(f"{path}: rope={d.rope} context={d.context}  image {shares[0]:.3f}  template/markers {shares[1]:.3f}  "
          f"ego text (speed, history, question) {shares[2]:.3f}  reasoning so far {shares[3]:.3f}  "
          f"own block {shares[4]:.3f}   (records {len(records)}, "
          f"image tokens/prompt {int(img[:P].sum())}/{P})")
