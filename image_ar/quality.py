"""Quality measures for generated images of the image world: a classifier trained on the world's own
pictures, an FID on its features, and prompt accuracy (the CLIP-score analogue).

* :class:`WorldClassifier`: a timm ``resnet10t`` trunk (random init, trained here) with one softmax head
  per field of :data:`~mmspec.image_ar.world.LABEL_HEADS` (shape, colour, size of each object, layout,
  glyph, background pattern and colour).
* :func:`fid`: the Fréchet distance between Gaussian fits of the trunk's pooled features of two image
  sets (the Inception-FID recipe with this world's classifier in place of Inception).
* :func:`prompt_accuracy`: the fraction of images whose predicted fields *all* equal what their prompt
  asked (and the per-field rates).

Example:
    >>> clf = train_classifier("world-clf", steps=1500)                               # doctest: +SKIP
    >>> fid(clf, generated_images, real_images), prompt_accuracy(clf, images, prompts)  # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .vq import to_tensor
from .world import LABEL_HEADS, parse_prompt, spec_labels

__all__ = ["WorldClassifier", "train_classifier", "features", "fid", "frechet_distance", "prompt_accuracy",
           "bundled_classifier", "export_classifier", "CLASSIFIER_DIR"]

CLASSIFIER_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "assets", "world-classifier")


def bundled_classifier() -> str | None:
    """The bundled world classifier's folder (``None`` if this install has none): the image world's measuring
    stick for FID and prompt accuracy.

    Example:
        >>> bundled_classifier() is None or os.path.isfile(os.path.join(bundled_classifier(), "config.json"))
        True
    """
    return CLASSIFIER_DIR if os.path.isfile(os.path.join(CLASSIFIER_DIR, "model.safetensors")) else None


class WorldClassifier(nn.Module):
    """timm ``resnet10t`` trunk + one linear head per label field; ``forward(x) -> {field: logits}``."""

    def __init__(self, arch: str = "resnet10t"):
        super().__init__()
        import timm

        self.arch = arch
        self.trunk = timm.create_model(arch, pretrained=False, num_classes=0)
        self.heads = nn.ModuleDict({k: nn.Linear(self.trunk.num_features, len(v)) for k, v in LABEL_HEADS.items()})

    def forward(self, x):
        f = self.trunk(x)
        return {k: h(f) for k, h in self.heads.items()}

    def save_pretrained(self, path: str, dtype=None) -> None:
        """``config.json`` and ``model.safetensors`` (floating weights in ``dtype`` if given)."""
        from mmspec.checkpoints import save_state_compact

        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "config.json"), "w") as f:
            json.dump({"model_type": "mmspec-world-classifier", "arch": self.arch}, f)
        save_state_compact(self.state_dict(), os.path.join(path, "model.safetensors"), dtype)

    @classmethod
    def from_pretrained(cls, path: str) -> "WorldClassifier":
        from safetensors.torch import load_file

        with open(os.path.join(path, "config.json")) as f:
            clf = cls(json.load(f)["arch"])
        clf.load_state_dict(load_file(os.path.join(path, "model.safetensors")))
        return clf.eval()


def export_classifier(src: str, out: str = CLASSIFIER_DIR, dtype=torch.bfloat16) -> str:
    """The shippable copy of a trained classifier: weights in ``dtype`` (loaded as float32) and its log."""
    from mmspec.checkpoints import copy_training_files

    WorldClassifier.from_pretrained(src).save_pretrained(out, dtype=dtype)
    copy_training_files(src, out)
    return out


def train_classifier(out: str, steps: int = 1500, batch_size: int = 64, lr: float = 2e-3, size: int = 64,
                     seed: int = 0, progress: bool = True) -> WorldClassifier:
    """Train the classifier on the ``images`` workload's train split (fresh pictures every step); saves it and
    ``train_log.jsonl`` under ``out``."""
    from tqdm import tqdm

    from mmspec.drafters.eagle import warmup_cosine
    from mmspec.workloads import get_workload

    torch.manual_seed(seed)
    clf = WorldClassifier()
    opt = torch.optim.AdamW(clf.parameters(), lr=lr, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(50, steps))
    wl = get_workload("images", size=size)
    os.makedirs(out, exist_ok=True)
    log = os.path.join(out, "train_log.jsonl")
    open(log, "w").close()
    clf.train()
    for step in tqdm(range(steps), disable=not progress, desc="world classifier"):
        t0 = time.perf_counter()
        exs = wl.examples("train", batch_size, start=step * batch_size)
        out_ = clf(to_tensor([ex.meta["image"] for ex in exs]))
        loss = sum(F.cross_entropy(out_[k], torch.tensor([ex.meta["labels"][k] for ex in exs])) for k in LABEL_HEADS)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        with open(log, "a") as f:
            f.write(json.dumps({"step": step + 1, "loss": round(loss.item(), 4),
                                "sec": round(time.perf_counter() - t0, 3)}) + "\n")
    clf.eval().save_pretrained(out)
    return clf


@torch.no_grad()
def features(clf: WorldClassifier, images, batch_size: int = 128) -> np.ndarray:
    """Pooled trunk features ``[n, d]`` of PIL images (resized to the classifier's 64 px if needed)."""
    out = []
    for i in range(0, len(images), batch_size):
        chunk = [im if im.size == (64, 64) else im.resize((64, 64)) for im in images[i:i + batch_size]]
        out.append(clf.trunk(to_tensor(chunk)).double().numpy())
    return np.concatenate(out)


def frechet_distance(mu1, cov1, mu2, cov2) -> float:
    """``|mu1 - mu2|^2 + Tr(C1 + C2 - 2 (C1 C2)^(1/2))``, the trace of the root computed from the symmetric
    product ``C1^(1/2) C2 C1^(1/2)`` (same eigenvalues as ``C1 C2``, and PSD, so no complex roots).

    Example:
        >>> round(frechet_distance(np.zeros(2), np.eye(2), np.ones(2), np.eye(2)), 6)
        2.0
    """
    w, v = np.linalg.eigh(cov1)
    root1 = (v * np.sqrt(np.clip(w, 0, None))) @ v.T
    mid = np.linalg.eigvalsh(root1 @ cov2 @ root1)
    tr_root = np.sqrt(np.clip(mid, 0, None)).sum()
    return float(((mu1 - mu2) ** 2).sum() + np.trace(cov1) + np.trace(cov2) - 2 * tr_root)


def fid(clf: WorldClassifier, images_a, images_b) -> float:
    """FID between two lists of PIL images on the classifier's features."""
    fa, fb = features(clf, images_a), features(clf, images_b)
    return frechet_distance(fa.mean(0), np.cov(fa, rowvar=False), fb.mean(0), np.cov(fb, rowvar=False))


def kernel_mmd2(fa: np.ndarray, fb: np.ndarray) -> float:
    """The unbiased estimate of the squared MMD between feature sets ``fa [m, d]`` and ``fb [n, d]`` under the cubic
    polynomial kernel ``k(x, y) = (x . y / d + 1) ** 3``: the Kernel Inception Distance (Binkowski et al. 2018) on
    whatever features are given. Unbiased, so it is usable at small n where FID's covariances are rank-deficient;
    it can be slightly negative when the two sets come from one distribution.

    Example:
        >>> x = np.random.default_rng(0).normal(size=(200, 8))
        >>> abs(kernel_mmd2(x[:100], x[100:])) < 0.05, kernel_mmd2(x[:100], x[100:] + 1.0) > 0.5
        (True, True)
    """
    fa, fb = np.asarray(fa, dtype=np.float64), np.asarray(fb, dtype=np.float64)
    m, n, d = len(fa), len(fb), fa.shape[1]
    if m < 2 or n < 2:
        raise ValueError("KID needs at least 2 samples in each set")
    kaa, kbb, kab = ((fa @ fa.T / d + 1) ** 3, (fb @ fb.T / d + 1) ** 3, (fa @ fb.T / d + 1) ** 3)
    return float((kaa.sum() - np.trace(kaa)) / (m * (m - 1)) + (kbb.sum() - np.trace(kbb)) / (n * (n - 1))
                 - 2 * kab.mean())


def kid(clf: WorldClassifier, images_a, images_b) -> float:
    """KID (:func:`kernel_mmd2`) between two lists of PIL images on the classifier's features."""
    return kernel_mmd2(features(clf, images_a), features(clf, images_b))


@torch.no_grad()
def prompt_accuracy(clf: WorldClassifier, images, prompts) -> dict:
    """``{"all": fraction with every field right, field: per-field rate}`` of images against their prompts."""
    want = [spec_labels(parse_prompt(p)) for p in prompts]
    hits = {k: 0 for k in LABEL_HEADS}
    all_ok = 0
    for i in range(0, len(images), 128):
        chunk = [im if im.size == (64, 64) else im.resize((64, 64)) for im in images[i:i + 128]]
        pred = {k: v.argmax(-1).tolist() for k, v in clf(to_tensor(chunk)).items()}
        for j, w in enumerate(want[i:i + 128]):
            ok = [pred[k][j] == w[k] for k in LABEL_HEADS]
            all_ok += all(ok)
            for k, o in zip(LABEL_HEADS, ok):
                hits[k] += o
    n = max(1, len(images))
    return {"all": all_ok / n, **{k: v / n for k, v in hits.items()}}
