"""``mmspec bench --workload images``: the plain AR image generator's latency and the quality of its images.

One ``ar`` record per batch size. Per batch size, after one untimed warm-up call, the items' prompts go
through :class:`~mmspec.image_ar.generator.ImageARPipeline` in batches (seeded per batch, the generator's own
guidance scale, temperature 1, no top-k); ``latency_ms`` holds the mean per call of ``generate`` (the code
grid), ``decode`` (VQ decoder) and ``total``, and ``quality`` the image world's measures on the generated
images against the reference pictures of the same prompts: ``prompt_accuracy`` (every asked field read
back by the world classifier), per-field rates, and ``fid`` on the classifier's features with ``fid_n``
images per side (an FID on a few images is biased upwards: compare values at equal ``fid_n`` only).
Spatial speculation later adds its records beside these, measured the same way.

Example:
    >>> from mmspec.bench import BenchConfig                                           # doctest: +SKIP
    >>> examples = get_workload("images").examples("test", 8)                         # doctest: +SKIP
    >>> bench_images("image_ar/assets/image-gen", examples, BenchConfig())            # doctest: +SKIP
"""

from __future__ import annotations

import sys
import time

from mmspec.bench import plain_record
from mmspec.checkpoints import dtype_note, resolve_dtype

from .generator import ImageARPipeline

__all__ = ["bench_images"]


def bench_images(model: str, examples: list, cfg, progress: bool = True) -> list[dict]:
    """Measure the generator at ``model`` on ``examples`` at each of ``cfg.batch_sizes``."""
    from tqdm.auto import tqdm

    from . import quality

    device = cfg.resolved_device()
    pipe = ImageARPipeline.from_pretrained(model, dtype=resolve_dtype(cfg.dtype, model, device))
    pipe.model.to(device)
    if pipe.vq is not None:
        pipe.vq.to(device)
    clf_path = quality.bundled_classifier()
    clf = quality.WorldClassifier.from_pretrained(clf_path) if clf_path else None
    prompts = [ex.prompt for ex in examples]
    real = [ex.meta["image"] for ex in examples]
    records = []
    for bs in cfg.batch_sizes:
        chunks = [prompts[i:i + bs] for i in range(0, len(prompts), bs)]
        pipe(chunks[0], seed=cfg.seed)  # warm-up, untimed
        stages = {"generate": [], "decode": [], "total": []}
        images, tokens = [], 0
        for i, chunk in enumerate(tqdm(chunks, desc=f"images bs={bs}", file=sys.stderr, disable=not progress,
                                       leave=False)):
            t0 = time.perf_counter()
            images += pipe(chunk, seed=cfg.seed + i)
            stages["total"].append((time.perf_counter() - t0) * 1e3)
            stages["generate"].append(pipe.last_timings_ms["generate"])
            stages["decode"].append(pipe.last_timings_ms["decode"])
            tokens += pipe.last_timings_ms["tokens"] * len(chunk)
        q = {"cfg_scale": pipe.cfg_scale, "fid_n": len(images)}
        if clf is None:
            q["note"] = "no world classifier bundled: prompt accuracy and FID not measured"
        else:
            acc = quality.prompt_accuracy(clf, images, prompts)
            q.update(prompt_accuracy=acc.pop("all"), field_accuracy=acc,
                     fid=quality.fid(clf, images, real) if len(images) > 1 else None,
                     real_prompt_accuracy=quality.prompt_accuracy(clf, real, prompts)["all"])
        note = (f"ImageARPipeline ({pipe.backend}), classifier-free guidance {pipe.cfg_scale}"
                f"{' (batch doubled)' if pipe.cfg_scale > 1 else ''}, "
                "temperature 1, seeded per batch; " + (dtype_note(cfg.dtype, model, device) or "stored dtype"))
        records.append(plain_record("images", bs, len(examples), [t / 1e3 for t in stages["total"]], tokens,
                                    stages, q, note, dtype=pipe.model.dtype))
    return records
