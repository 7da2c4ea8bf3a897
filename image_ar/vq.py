"""A VQ-VAE image tokenizer for the image world: pictures <-> a grid of codebook indices.

An AR image generator predicts the grid in raster order; this module gives it its vocabulary. The
encoder downsamples by ``2 ** n_down`` with strided convolutions and residual blocks, each output vector
is replaced by its nearest codebook entry (straight-through gradient; the codebook follows the encoder
outputs by exponential moving averages, and entries nobody used for a while restart on a random encoder
output), and the decoder mirrors the encoder. Loss: pixel MSE plus ``beta`` times the commitment term.

Example:
    >>> vq = VQVAE(codebook_size=16, code_dim=8, hidden=16)
    >>> codes = vq.encode(torch.zeros(2, 3, 64, 64))
    >>> codes.shape, vq.decode(codes).shape
    (torch.Size([2, 16, 16]), torch.Size([2, 3, 64, 64]))
"""

from __future__ import annotations

import json
import math
import os
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["VQVAE", "train_vq", "to_tensor", "pixels_to_tensor", "to_image", "psnr"]


def to_tensor(images) -> torch.Tensor:
    """PIL images -> ``[B, 3, H, W]`` in ``[-1, 1]``."""
    return pixels_to_tensor(torch.from_numpy(np.stack([np.asarray(im.convert("RGB")) for im in images])))


def pixels_to_tensor(pixels: torch.Tensor) -> torch.Tensor:
    """``[B, H, W, 3]`` RGB bytes (uint8, on any device) -> ``[B, 3, H, W]`` float32 in ``[-1, 1]``.

    Example:
        >>> pixels_to_tensor(torch.full((1, 2, 2, 3), 255, dtype=torch.uint8)).flatten().tolist() == [1.0] * 12
        True
    """
    return pixels.permute(0, 3, 1, 2).float() / 127.5 - 1.0


def to_image(x: torch.Tensor):
    """``[3, H, W]`` in ``[-1, 1]`` -> a PIL image."""
    from PIL import Image

    arr = ((x.detach().clamp(-1, 1) + 1) * 127.5).round().byte().permute(1, 2, 0).cpu().numpy()
    return Image.fromarray(arr)


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    """Peak signal-to-noise ratio in dB between image batches in ``[-1, 1]``.

    Example:
        >>> round(psnr(torch.zeros(1, 3, 4, 4), torch.full((1, 3, 4, 4), 0.02)), 1)
        40.0
    """
    mse = F.mse_loss(a.clamp(-1, 1), b.clamp(-1, 1)).item() / 4.0  # range 2 -> range 1
    return float("inf") if mse == 0 else 10 * math.log10(1.0 / mse)


class _Res(nn.Module):
    def __init__(self, ch: int):
        super().__init__()
        self.body = nn.Sequential(nn.ReLU(), nn.Conv2d(ch, ch, 3, padding=1), nn.ReLU(), nn.Conv2d(ch, ch, 1))

    def forward(self, x):
        return x + self.body(x)


class VQVAE(nn.Module):
    """Convolutional VQ-VAE with an EMA codebook (see the module docstring).

    Args:
        codebook_size, code_dim: the codebook.
        hidden: channels of the convolutional trunk.
        n_down: stride-2 stages (2: 64 px -> a 16 x 16 grid).
        beta: commitment weight; decay: EMA decay of the codebook.
    """

    def __init__(self, codebook_size: int = 256, code_dim: int = 32, hidden: int = 64, n_down: int = 2,
                 beta: float = 0.25, decay: float = 0.99):
        super().__init__()
        self.config = dict(codebook_size=codebook_size, code_dim=code_dim, hidden=hidden, n_down=n_down, beta=beta,
                           decay=decay)
        enc = [nn.Conv2d(3, hidden, 4, 2, 1)]
        for _ in range(n_down - 1):
            enc += [nn.ReLU(), nn.Conv2d(hidden, hidden, 4, 2, 1)]
        self.encoder = nn.Sequential(*enc, _Res(hidden), _Res(hidden), nn.ReLU(), nn.Conv2d(hidden, code_dim, 1))
        dec = [nn.Conv2d(code_dim, hidden, 3, padding=1), _Res(hidden), _Res(hidden)]
        for _ in range(n_down - 1):
            dec += [nn.ReLU(), nn.ConvTranspose2d(hidden, hidden, 4, 2, 1)]
        self.decoder = nn.Sequential(*dec, nn.ReLU(), nn.ConvTranspose2d(hidden, 3, 4, 2, 1))
        self.register_buffer("codebook", torch.randn(codebook_size, code_dim) * 0.1)
        self.register_buffer("ema_count", torch.ones(codebook_size))
        self.register_buffer("ema_sum", self.codebook.clone())
        self.register_buffer("last_used", torch.zeros(codebook_size))
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))

    @property
    def codebook_size(self) -> int:
        return self.codebook.shape[0]

    def _nearest(self, z: torch.Tensor) -> torch.Tensor:
        flat = z.permute(0, 2, 3, 1).reshape(-1, z.shape[1])
        d = flat.pow(2).sum(1, keepdim=True) - 2 * flat @ self.codebook.t() + self.codebook.pow(2).sum(1)[None]
        return d.argmin(1).view(z.shape[0], z.shape[2], z.shape[3])

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Images ``[B, 3, H, W]`` in ``[-1, 1]`` -> code indices ``[B, h, w]``."""
        return self._nearest(self.encoder(x))

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """Code indices ``[B, h, w]`` -> images ``[B, 3, H, W]`` (roughly in ``[-1, 1]``)."""
        return self.decoder(self.codebook[codes].permute(0, 3, 1, 2))

    def forward(self, x: torch.Tensor):
        """``(reconstruction, {"recon", "commit", "loss", "perplexity"})``; updates the EMA codebook in training."""
        z = self.encoder(x)
        idx = self._nearest(z)
        q = self.codebook[idx].permute(0, 3, 1, 2)
        if self.training:
            self._ema_update(z.detach(), idx)
        commit = F.mse_loss(z, q.detach())
        recon = self.decoder(z + (q - z).detach())  # straight-through
        rec = F.mse_loss(recon, x)
        counts = torch.bincount(idx.flatten(), minlength=self.codebook_size).float()
        p = counts / counts.sum()
        perplexity = torch.exp(-(p[p > 0] * p[p > 0].log()).sum())
        return recon, {"recon": rec, "commit": commit, "loss": rec + self.config["beta"] * commit,
                       "perplexity": perplexity}

    @torch.no_grad()
    def _ema_update(self, z: torch.Tensor, idx: torch.Tensor) -> None:
        decay = self.config["decay"]
        flat = z.permute(0, 2, 3, 1).reshape(-1, z.shape[1])
        onehot = F.one_hot(idx.flatten(), self.codebook_size).type_as(flat)
        self.ema_count.mul_(decay).add_(onehot.sum(0), alpha=1 - decay)
        self.ema_sum.mul_(decay).add_(onehot.t() @ flat, alpha=1 - decay)
        n = self.ema_count.sum()
        count = (self.ema_count + 1e-5) / (n + self.codebook_size * 1e-5) * n
        self.codebook.copy_(self.ema_sum / count[:, None])
        self.steps += 1
        used = onehot.sum(0) > 0
        self.last_used[used] = self.steps.float()
        dead = (self.steps.float() - self.last_used) > 50
        if dead.any():  # restart unused entries on random encoder outputs
            pick = flat[torch.randint(0, flat.shape[0], (int(dead.sum()),), device=flat.device)]
            self.codebook[dead] = pick
            self.ema_sum[dead] = pick
            self.ema_count[dead] = 1.0
            self.last_used[dead] = self.steps.float()

    def save_pretrained(self, path: str, dtype=None) -> None:
        """``config.json`` and ``model.safetensors`` (floating weights in ``dtype`` if given)."""
        from mmspec.checkpoints import save_state_compact

        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "config.json"), "w") as f:
            json.dump({"model_type": "mmspec-vqvae", **self.config}, f, indent=2)
        save_state_compact(self.state_dict(), os.path.join(path, "model.safetensors"), dtype)

    @classmethod
    def from_pretrained(cls, path: str) -> "VQVAE":
        from safetensors.torch import load_file

        with open(os.path.join(path, "config.json")) as f:
            cfg = {k: v for k, v in json.load(f).items() if k != "model_type"}
        vq = cls(**cfg)
        vq.load_state_dict(load_file(os.path.join(path, "model.safetensors")))
        return vq.eval()


def train_vq(out: str, steps: int = 3000, batch_size: int = 32, lr: float = 2e-3, size: int = 64, seed: int = 0,
             save_every: int = 500, progress: bool = True, **vq_kwargs) -> VQVAE:
    """Train (or resume from ``out/state.pt``) a VQ-VAE on the ``images`` workload's train split; writes
    ``save_pretrained`` checkpoints and ``train_log.jsonl`` (recon MSE, PSNR, codebook perplexity)."""
    from tqdm import tqdm

    from mmspec.train import trim_log
    from mmspec.workloads import get_workload

    os.makedirs(out, exist_ok=True)
    state_path = os.path.join(out, "state.pt")
    torch.manual_seed(seed)
    resume = os.path.isfile(state_path)
    vq = VQVAE.from_pretrained(out) if resume else VQVAE(**vq_kwargs)
    opt = torch.optim.Adam(vq.parameters(), lr=lr)
    start = 0
    if resume:
        saved = torch.load(state_path, weights_only=True)
        opt.load_state_dict(saved["optimizer"])
        start = int(saved["step"])
    log = os.path.join(out, "train_log.jsonl")
    trim_log(log, start)
    wl = get_workload("images", size=size)
    vq.train()
    for step in tqdm(range(start, steps), initial=start, total=steps, disable=not progress, desc="vq-vae"):
        t0 = time.perf_counter()
        x = to_tensor([ex.meta["image"] for ex in wl.examples("train", batch_size, start=step * batch_size)])
        recon, parts = vq(x)
        opt.zero_grad(set_to_none=True)
        parts["loss"].backward()
        opt.step()
        with open(log, "a") as f:
            f.write(json.dumps({"step": step + 1, "recon": round(parts["recon"].item(), 5),
                                "psnr": round(psnr(recon, x), 2), "perplexity": round(parts["perplexity"].item(), 1),
                                "sec": round(time.perf_counter() - t0, 3)}) + "\n")
        if (step + 1) % save_every == 0 or step + 1 == steps:
            vq.eval().save_pretrained(out)
            vq.train()
            tmp = state_path + ".tmp"
            torch.save({"optimizer": opt.state_dict(), "step": step + 1}, tmp)
            os.replace(tmp, state_path)
    return vq.eval()
