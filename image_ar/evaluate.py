"""Measure the image world's models, and the command line that trains and measures them.

* :func:`evaluate_vq`: reconstruction PSNR / MSE of the VQ-VAE on test pictures, and the codebook use.
* :func:`evaluate_generator`: the AR generator's FID and prompt accuracy on test prompts, next to the
  references that make them readable: the FID between two disjoint sets of *real* test pictures of the same
  size (the floor an ideal generator reaches at this ``n``), the FID of VQ reconstructions of the real
  pictures (the ceiling the tokenizer allows), and the classifier's prompt accuracy on the real pictures.

``python -m mmspec.image_ar train-vq|train-classifier|train-generator|eval|export`` runs them (progress bars,
checkpoints, resume).

Example:
    >>> pipe = ImageARPipeline.from_pretrained("image_ar/assets/image-gen")                 # doctest: +SKIP
    >>> clf = WorldClassifier.from_pretrained("image_ar/assets/world-classifier")           # doctest: +SKIP
    >>> evaluate_generator(pipe, clf, n=200)                                                # doctest: +SKIP
"""

from __future__ import annotations

import json
import sys

import torch

from .quality import WorldClassifier, fid, prompt_accuracy
from .vq import VQVAE, psnr, to_image, to_tensor

__all__ = ["evaluate_vq", "evaluate_generator", "teacher_forced_accuracy", "main"]


@torch.no_grad()
def evaluate_vq(vq: VQVAE, n: int = 256, batch_size: int = 64, split: str = "test") -> dict:
    """``{"psnr_db", "mse", "codes_used", "codebook_size", "n"}`` on ``n`` pictures of ``split`` (MSE in the
    ``[-1, 1]`` range the model sees)."""
    from mmspec.workloads import get_workload

    wl = get_workload("images")
    errs, used, total_psnr = [], set(), 0.0
    for start in range(0, n, batch_size):
        x = to_tensor([ex.meta["image"] for ex in wl.examples(split, min(batch_size, n - start), start=start)])
        codes = vq.encode(x)
        recon = vq.decode(codes)
        used |= set(codes.flatten().tolist())
        errs.append(torch.nn.functional.mse_loss(recon.clamp(-1, 1), x).item() * len(x))
        total_psnr += psnr(recon, x) * len(x)
    return {"n": n, "psnr_db": total_psnr / n, "mse": sum(errs) / n, "codes_used": len(used),
            "codebook_size": vq.codebook_size}


@torch.no_grad()
def evaluate_generator(pipe, clf: WorldClassifier, n: int = 200, cfg_scale: float | None = None, batch_size: int = 8,
                       split: str = "test", seed: int = 0, progress: bool = True, temperature: float = 1.0,
                       top_k: int | None = None) -> dict:
    """FID and prompt accuracy of ``n`` images generated for the first ``n`` prompts of ``split``, with the
    real-vs-real FID floor, the VQ-reconstruction FID and the classifier's accuracy on real pictures.
    ``cfg_scale=None``: the generator's own guidance scale."""
    from tqdm.auto import tqdm

    from mmspec.workloads import get_workload

    wl = get_workload("images")
    exs = wl.examples(split, n)
    others = [ex.meta["image"] for ex in wl.examples(split, n, start=n)]
    prompts = [ex.prompt for ex in exs]
    real = [ex.meta["image"] for ex in exs]
    generated = []
    cfg_scale = pipe.cfg_scale if cfg_scale is None else cfg_scale
    for i in tqdm(range(0, n, batch_size), desc="generate", file=sys.stderr, disable=not progress):
        generated += pipe(prompts[i:i + batch_size], seed=seed + i, cfg_scale=cfg_scale, temperature=temperature,
                          top_k=top_k)
    out = {"n": n, "cfg_scale": cfg_scale, "temperature": temperature, "top_k": top_k,
           "fid": fid(clf, generated, real), "fid_real_vs_real": fid(clf, others, real)}
    acc = prompt_accuracy(clf, generated, prompts)
    out["prompt_accuracy"], out["field_accuracy"] = acc.pop("all"), acc
    out["real_prompt_accuracy"] = prompt_accuracy(clf, real, prompts)["all"]
    if pipe.vq is not None:
        out.update(teacher_forced_accuracy(pipe, exs))
        recon = [to_image(r) for i in range(0, n, 64)
                 for r in pipe.vq.decode(pipe.vq.encode(to_tensor(real[i:i + 64])))]
        out["fid_vq_reconstruction"] = fid(clf, recon, real)
        out["vq_prompt_accuracy"] = prompt_accuracy(clf, recon, prompts)["all"]
    return out


@torch.no_grad()
def teacher_forced_accuracy(pipe, examples, batch_size: int = 32) -> dict:
    """Top-1 accuracy of a llama generator on the reference codes of ``examples`` given the true codes before
    each one, with the prompt (``teacher_forced_accuracy``) and with the prompt blanked as guidance's
    unconditional rows see it (``unconditional_teacher_forced_accuracy``): how sharp each half of guidance is.

    Example:
        >>> teacher_forced_accuracy(pipe, get_workload("images").examples("test", 32))  # doctest: +SKIP
        {'teacher_forced_accuracy': 0.99, 'unconditional_teacher_forced_accuracy': 0.94}
    """
    from .generator import _request_ids, _unconditional, _with_codes

    model, tok = pipe.model, pipe.tokenizer
    offset = int(model.generation_config.image_code_offset)
    hits = {"teacher_forced_accuracy": 0, "unconditional_teacher_forced_accuracy": 0}
    total = 0
    for i in range(0, len(examples), batch_size):
        exs = examples[i:i + batch_size]
        codes = pipe.vq.encode(to_tensor([ex.meta["image"] for ex in exs])).flatten(1).to(model.device)
        ids, mask = (t.to(model.device) for t in _request_ids(tok, [ex.prompt for ex in exs]))
        for key, rows in (("teacher_forced_accuracy", ids), ("unconditional_teacher_forced_accuracy",
                                                              _unconditional(ids, tok))):
            seq, full_mask, pos = _with_codes(rows, mask, codes + offset)
            logits = model(input_ids=seq, attention_mask=full_mask,
                           position_ids=pos).logits[:, ids.shape[1] - 1:-1, offset:]
            hits[key] += int((logits.argmax(-1) == codes).sum())
        total += codes.numel()
    return {k: v / total for k, v in hits.items()}


def main(argv=None) -> int:
    """``python -m mmspec.image_ar COMMAND``: train the VQ-VAE, the world classifier or the generator, or
    evaluate them (JSON lines on stdout); ``pareto BENCH.json`` tabulates and plots a bench run
    (:mod:`mmspec.image_ar.pareto`)."""
    import argparse

    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["pareto"]:  # its own parser: the options are the module's
        from .pareto import main as pareto_main

        return pareto_main(argv[1:])

    from .generator import ImageARPipeline, train_generator
    from .quality import train_classifier
    from .vq import train_vq

    p = argparse.ArgumentParser(prog="python -m mmspec.image_ar")
    sub = p.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser("train-vq", help="train (or resume) the VQ-VAE tokenizer")
    v.add_argument("--out", required=True)
    v.add_argument("--steps", type=int, default=3000)
    v.add_argument("--batch-size", type=int, default=32)
    c = sub.add_parser("train-classifier", help="train the world classifier (FID features, prompt accuracy)")
    c.add_argument("--out", required=True)
    c.add_argument("--steps", type=int, default=1500)
    c.add_argument("--batch-size", type=int, default=64)
    g = sub.add_parser("train-generator", help="train (or resume) the AR generator over a trained VQ-VAE")
    g.add_argument("--out", required=True)
    g.add_argument("--vq", required=True)
    g.add_argument("--steps", type=int, default=3000)
    g.add_argument("--batch-size", type=int, default=16)
    g.add_argument("--lr", type=float, default=1e-3)
    g.add_argument("--size", default="small", choices=["tiny", "medium", "small"])
    g.add_argument("--image-size", type=int, default=64, help="pixels per side (the VQ-VAE's grid: 64 -> 16 x 16, "
                                                               "128 -> 32 x 32)")
    g.add_argument("--device", default=None, help="e.g. cuda (bf16 autocast there); default cpu")
    g.add_argument("--workers", type=int, default=0, help="processes drawing the training pictures")
    g.add_argument("--save-every", type=int, default=250)
    e = sub.add_parser("eval", help="VQ reconstruction, and the generator's FID and prompt accuracy")
    e.add_argument("--generator", default=None)
    e.add_argument("--vq", default=None)
    e.add_argument("--classifier", default=None, help="default: the bundled world classifier")
    e.add_argument("--n", type=int, default=200)
    e.add_argument("--cfg-scale", type=float, default=None, help="default: the generator's own")
    e.add_argument("--temperature", type=float, default=1.0)
    e.add_argument("--top-k", type=int, default=None)
    sub.add_parser("pareto", help="table, bars and Pareto plot of a `mmspec bench --workload images` JSON "
                                  "(pareto BENCH.json --png PATH --md PATH)")
    x = sub.add_parser("export", help="write the shippable (bfloat16) copies into image_ar/assets")
    x.add_argument("--generator", default=None)
    x.add_argument("--classifier", default=None)
    for sp in (v, c, g, e, x):
        sp.add_argument("--threads", type=int, default=0)
    args = p.parse_args(argv)
    if args.cmd == "eval" and not (args.generator or args.vq):
        # It once printed nothing and exited 0: a run that measured nothing must not look like a success.
        p.error("eval needs --generator PATH (FID and prompt accuracy) and/or --vq PATH (reconstruction); the bundled "
                "generator is image_ar/assets/image-gen")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.cmd == "train-vq":
        train_vq(args.out, steps=args.steps, batch_size=args.batch_size)
    elif args.cmd == "train-classifier":
        train_classifier(args.out, steps=args.steps, batch_size=args.batch_size)
    elif args.cmd == "train-generator":
        train_generator(args.out, args.vq, steps=args.steps, batch_size=args.batch_size, lr=args.lr, size=args.size,
                        image_size=args.image_size, device=args.device, workers=args.workers,
                        save_every=args.save_every)
    elif args.cmd == "export":
        from .generator import export_generator
        from .quality import export_classifier

        if args.generator:
            print(export_generator(args.generator))
        if args.classifier:
            print(export_classifier(args.classifier))
    else:
        from mmspec.errors import InvalidInputError

        from .quality import bundled_classifier

        if args.vq:
            print(json.dumps({"vq": evaluate_vq(VQVAE.from_pretrained(args.vq))}))
        if args.generator:
            path = args.classifier or bundled_classifier()
            if not path:
                raise InvalidInputError("no world classifier: pass --classifier PATH (train-classifier makes one)")
            pipe = ImageARPipeline.from_pretrained(args.generator)
            print(json.dumps({"generator": evaluate_generator(pipe, WorldClassifier.from_pretrained(path), n=args.n,
                                                              cfg_scale=args.cfg_scale, temperature=args.temperature,
                                                              top_k=args.top_k)}))
    return 0
