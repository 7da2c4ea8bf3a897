"""The VQ-VAE tokenizer: shapes, a short training run that learns, resume, and save/load round trip."""

import json

import torch

from mmspec.image_ar.vq import VQVAE, psnr, to_image, to_tensor, train_vq
from mmspec.workloads import get_workload


def test_training_reconstructs_better_and_round_trips(tmp_path):
    torch.set_num_threads(1)
    kw = dict(codebook_size=32, code_dim=8, hidden=16)
    train_vq(str(tmp_path), steps=40, batch_size=8, save_every=20, progress=False, **kw)
    vq = train_vq(str(tmp_path), steps=60, batch_size=8, save_every=20, progress=False, **kw)  # resumes at 40
    log = [json.loads(line) for line in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == list(range(1, 61))
    assert sum(r["recon"] for r in log[-10:]) < 0.5 * sum(r["recon"] for r in log[:10])
    loaded = VQVAE.from_pretrained(str(tmp_path))
    x = to_tensor([ex.meta["image"] for ex in get_workload("images").examples("test", 4)])
    with torch.no_grad():
        codes = loaded.encode(x)
        assert torch.equal(codes, vq.encode(x)) and codes.shape == (4, 16, 16)
        assert int(codes.max()) < 32
        rec = loaded.decode(codes)
    assert rec.shape == x.shape and psnr(rec, x) > 12.0
    assert to_image(rec[0]).size == (64, 64)
