"""The testbed target: a small Qwen2-VL trained on CPU to read the docs and charts workloads.

Why: acceptance lengths and speedups only mean something on a target that produces structured, partly
predictable output the way real document/chart VLMs do; no real checkpoint can be downloaded here. The
target is a real ``Qwen2VLForConditionalGeneration`` (M-RoPE: the hard case) with a BPE tokenizer trained
on the workloads' text, saved and loaded with ``save_pretrained`` / ``from_pretrained`` like a hub model.

From-scratch tiny VLMs learn the text prior and ignore the image (DESIGN.md, "The testbed"). Training
therefore adds a dense auxiliary loss on the vision tower, which the renderer makes possible: the
workloads record where every character was drawn, and a linear reader on each merged vision token must
say which characters lie under each of its 2 x 2 patches (multi-hot over printable ASCII). This is
supervision of the *target's* vision tower, used only to build the testbed; say so wherever its numbers
are reported.

Example:
    >>> cfg = TargetTrainConfig(steps=2, batch_size=2, size="tiny", out="/tmp/tb")      # doctest: +SKIP
    >>> train_target(cfg)                                                          # doctest: +SKIP
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass, field

import torch

from mmspec.demo import build_qwen2vl, train_tokenizer
from mmspec.workloads import get_workload

__all__ = ["SIZES", "TargetTrainConfig", "build_target", "make_batch", "aux_targets", "train_target", "evaluate",
           "CHARSET"]

CHARSET = "".join(chr(c) for c in range(32, 127))
_CHAR_INDEX = {c: i for i, c in enumerate(CHARSET)}
PATCH = 14
MERGE = 2

# Text sizes: DESIGN.md measured 1-token steps of 2.3 / 8.1 / 16.4 ms for 4x256 / 8x384 / 12x512 on this CPU;
# "small" is the default target (a target forward must cost clearly more than a 1-layer drafter's).
SIZES = {
    "tiny": dict(text=dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2),
                 vision=dict(depth=2, embed_dim=96, num_heads=3, mlp_ratio=2)),
    "small": dict(text=dict(hidden_size=384, intermediate_size=1024, num_hidden_layers=6, num_attention_heads=6,
                            num_key_value_heads=2),
                  vision=dict(depth=4, embed_dim=192, num_heads=3, mlp_ratio=2)),
}
# Workload images are multiples of 28 px and at most 336 x 448: the processor must not resize them, so the
# renderer's character positions stay valid in the vision tower's patch grid.
PIXELS = dict(min_pixels=28 * 28, max_pixels=336 * 448)


def _rope(head_dim: int) -> dict:
    half = head_dim // 2
    temporal = half - 2 * (3 * half // 8)
    return {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [temporal, 3 * half // 8, 3 * half // 8]}


def build_target(size: str = "small", tokenizer_texts: int = 3000, vocab_size: int = 1024, seed: int = 0):
    """A fresh (untrained) testbed target and its processor; the tokenizer is trained on workload text.

    Returns ``(model, processor)``.
    """
    from .workloads import all_text

    texts = []
    for name in ("docs", "charts"):
        texts += list(all_text(get_workload(name), "train", tokenizer_texts, include_prompts=True))
    spec = SIZES[size]
    text = dict(spec["text"], max_position_embeddings=2048, initializer_range=0.02,
                rope_parameters=_rope(spec["text"]["hidden_size"] // spec["text"]["num_attention_heads"]))
    return build_qwen2vl(train_tokenizer(texts, vocab_size), text=text, vision=dict(spec["vision"]),
                         pixels=PIXELS, seed=seed)


def aux_targets(example, grid_hw: tuple[int, int]) -> torch.Tensor:
    """Multi-hot ``[n_merged, 4, len(CHARSET)]``: which characters lie under each patch of each merged token.

    Merged token ``k`` covers merged row ``k // (w / 2)`` and column ``k % (w / 2)`` of the patch grid
    (``grid_hw`` in patches); its 4 patches are ordered row-major, as Qwen2-VL's patch merger reads them.
    Vertical (rotated) text runs are skipped: their character positions are not along x.
    """
    h, w = grid_hw
    out = torch.zeros(h // MERGE * (w // MERGE), MERGE * MERGE, len(CHARSET))
    for run in example.meta.get("runs", []):
        xs, text = run.get("chars"), run["text"]
        x0, y0, x1, y1 = run["box"]
        if not xs or len(xs) != len(text) + 1 or (y1 - y0) > 2 * (x1 - x0):
            continue
        py = int((y0 + y1) / 2) // PATCH
        for ch, a, b in zip(text, xs[:-1], xs[1:]):
            idx = _CHAR_INDEX.get(ch)
            px = int((a + b) / 2) // PATCH
            if idx is None or ch == " " or not (0 <= py < h and 0 <= px < w):
                continue
            k = (py // MERGE) * (w // MERGE) + px // MERGE
            out[k, (py % MERGE) * MERGE + px % MERGE, idx] = 1.0
    return out


def make_batch(processor, examples, train: bool = True) -> dict:
    """Processor inputs for ``examples`` (chat template, images), with ``labels`` on the answer only.

    With ``train`` the answer and its end-of-turn are appended and right padding is used (labels align);
    otherwise the prompt alone is returned, left-padded, ready for ``generate``.
    """
    tok = processor.tokenizer
    prompts = [processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}] * len(ex.images) + [{"type": "text", "text": ex.prompt}]}],
        add_generation_prompt=True) for ex in examples]
    images = [img for ex in examples for img in ex.images]
    if not train:
        tok.padding_side = "left"
        return dict(processor(images=images, text=prompts, return_tensors="pt", padding=True))
    tok.padding_side = "right"
    full = [p + ex.target + tok.eos_token for p, ex in zip(prompts, examples)]
    batch = dict(processor(images=images, text=full, return_tensors="pt", padding=True))
    tok.padding_side = "left"
    labels = batch["input_ids"].clone()
    labels[batch["attention_mask"] == 0] = -100
    # Prompt lengths with each image placeholder expanded as the processor expanded it (no second image pass).
    per_image = (batch["image_grid_thw"].prod(-1) // (MERGE * MERGE)).tolist()
    pad = processor.image_token
    k = 0
    for i, (p, ex) in enumerate(zip(prompts, examples)):
        for _ in ex.images:
            p = p.replace(pad, "\0" * per_image[k], 1)
            k += 1
        labels[i, : len(tok(p.replace("\0", pad), add_special_tokens=False)["input_ids"])] = -100
    batch["labels"] = labels
    return batch


@dataclass
class TargetTrainConfig:
    """Hyper-parameters of :func:`train_target` (saved beside the checkpoint)."""

    out: str = "testbed-target"
    size: str = "small"
    steps: int = 3000
    batch_size: int = 8
    lr: float = 1e-3
    warmup: int = 100
    aux_weight: float = 1.0
    docs_fraction: float = 0.5
    save_every: int = 250
    seed: int = 0
    threads: int = 0
    tokenizer_texts: int = 3000
    vocab_size: int = 1024
    workload_options: dict = field(default_factory=lambda: {"docs": {}, "charts": {}})


class _Reader(torch.nn.Module):
    """The auxiliary character reader on the merged vision tokens (training only, not saved with the target)."""

    def __init__(self, hidden: int):
        super().__init__()
        self.proj = torch.nn.Linear(hidden, MERGE * MERGE * len(CHARSET))

    def forward(self, h):
        return self.proj(h).view(h.shape[0], MERGE * MERGE, len(CHARSET))


def _examples(cfg: TargetTrainConfig, step: int, workloads: dict) -> list:
    """Training batch ``step``: a fixed, resumable sequence of (workload, index) pairs."""
    n_docs = round(cfg.batch_size * cfg.docs_fraction)
    docs = workloads["docs"].examples("train", n_docs, start=step * n_docs)
    charts = workloads["charts"].examples("train", cfg.batch_size - n_docs, start=step * (cfg.batch_size - n_docs))
    return docs + charts


def train_target(cfg: TargetTrainConfig, progress: bool = True) -> str:
    """Train (or resume) the testbed target; writes ``save_pretrained`` checkpoints under ``cfg.out``.

    Resumes from ``cfg.out/state.pt`` (optimizer, step; loaded with ``weights_only=True``) when present.
    Returns the output folder.
    """
    from tqdm import tqdm
    from transformers import AutoProcessor, Qwen2VLForConditionalGeneration

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    os.makedirs(cfg.out, exist_ok=True)
    state_path = os.path.join(cfg.out, "state.pt")
    resume = os.path.isfile(state_path) and os.path.isfile(os.path.join(cfg.out, "model.safetensors"))
    if resume:
        model = Qwen2VLForConditionalGeneration.from_pretrained(cfg.out)
        processor = AutoProcessor.from_pretrained(cfg.out)
    else:
        model, processor = build_target(cfg.size, cfg.tokenizer_texts, cfg.vocab_size, seed=cfg.seed)
    workloads = {name: get_workload(name, char_boxes=True, **cfg.workload_options.get(name, {}))
                 for name in ("docs", "charts")}
    reader = _Reader(model.config.text_config.hidden_size)
    params = list(model.parameters()) + list(reader.parameters())
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.01)
    start = 0
    if resume:
        saved = torch.load(state_path, weights_only=True)
        opt.load_state_dict(saved["optimizer"])
        reader.load_state_dict(saved["reader"])
        start = int(saved["step"])
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / cfg.warmup) * 0.5 * (
        1 + math.cos(math.pi * min(1.0, s / max(1, cfg.steps)))))
    for _ in range(start):
        sched.step()
    captured = {}
    hook = model.model.visual.register_forward_hook(lambda m, a, out: captured.__setitem__("h", out.pooler_output))
    log_path = os.path.join(cfg.out, "train_log.jsonl")
    if os.path.isfile(log_path):  # a killed job may have logged steps past its last checkpoint: drop them
        with open(log_path) as f:
            kept = [line for line in f if json.loads(line)["step"] <= start]
        with open(log_path, "w") as f:
            f.writelines(kept)
    model.train()
    bar = tqdm(range(start, cfg.steps), initial=start, total=cfg.steps, disable=not progress, desc="target")
    try:
        for step in bar:
            t0 = time.perf_counter()
            examples = _examples(cfg, step, workloads)
            batch = make_batch(processor, examples)
            out = model(**batch)
            grids = batch["image_grid_thw"][:, 1:].tolist()
            aux_y = torch.cat([aux_targets(ex, tuple(g)) for ex, g in zip(examples, grids)])
            aux_logits = reader(captured["h"])
            aux = torch.nn.functional.binary_cross_entropy_with_logits(aux_logits, aux_y, pos_weight=torch.tensor(8.0))
            loss = out.loss + cfg.aux_weight * aux
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            sched.step()
            rec = {"step": step + 1, "lm_loss": round(out.loss.item(), 4), "aux_loss": round(aux.item(), 4),
                   "lr": sched.get_last_lr()[0], "sec": round(time.perf_counter() - t0, 3)}
            bar.set_postfix(lm=rec["lm_loss"], aux=rec["aux_loss"])
            with open(log_path, "a") as f:
                f.write(json.dumps(rec) + "\n")
            if (step + 1) % cfg.save_every == 0 or step + 1 == cfg.steps:
                _save(model, processor, reader, opt, step + 1, cfg)
    finally:
        hook.remove()
    model.eval()
    return cfg.out


def _save(model, processor, reader, opt, step: int, cfg: TargetTrainConfig) -> None:
    """Checkpoint atomically enough for a killed job: weights first, then the step that points at them."""
    model.save_pretrained(cfg.out)
    processor.save_pretrained(cfg.out)
    tmp = os.path.join(cfg.out, "state.pt.tmp")
    torch.save({"optimizer": opt.state_dict(), "reader": reader.state_dict(), "step": step}, tmp)
    os.replace(tmp, os.path.join(cfg.out, "state.pt"))
    with open(os.path.join(cfg.out, "train_config.json"), "w") as f:
        json.dump(asdict(cfg), f, indent=2)


def _edit_distance(a: str, b: str) -> int:
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


@torch.no_grad()
def evaluate(model, processor, workload: str, n: int = 20, max_new_tokens: int = 256, batch_size: int = 4) -> dict:
    """Exact match and normalised character edit distance of greedy answers on the test split.

    Example:
        >>> evaluate(model, processor, "charts", n=8)          # doctest: +SKIP
        {'workload': 'charts', 'n': 8, 'exact_match': 0.75, 'char_error_rate': 0.04, ...}
    """
    wl = get_workload(workload)
    exact, errors, chars, by_regime = 0, 0, 0, {}
    model.eval()
    for start in range(0, n, batch_size):
        exs = wl.examples("test", min(batch_size, n - start), start=start)
        batch = make_batch(processor, exs, train=False)
        out = model.generate(**batch, max_new_tokens=max_new_tokens, do_sample=False)
        texts = processor.batch_decode(out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)
        for ex, text in zip(exs, texts):
            ok = text.strip() == ex.target.strip()
            exact += ok
            errors += _edit_distance(text.strip(), ex.target.strip())
            chars += max(1, len(ex.target.strip()))
            regime = ex.meta.get("regime", "copy")
            hit = by_regime.setdefault(regime, [0, 0])
            hit[0] += ok
            hit[1] += 1
    return {"workload": workload, "n": n, "exact_match": exact / n, "char_error_rate": errors / chars,
            "exact_by_regime": {k: v[0] / v[1] for k, v in by_regime.items()}}


def main(argv=None) -> int:
    """``python -m mmspec.vision.testbed train|eval ...``: train or evaluate the testbed target."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m mmspec.vision.testbed")
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train")
    for name, value in asdict(TargetTrainConfig()).items():
        if not isinstance(value, dict):
            t.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    e = sub.add_parser("eval")
    e.add_argument("--model", required=True)
    e.add_argument("--n", type=int, default=20)
    e.add_argument("--max-new-tokens", type=int, default=256)
    args = p.parse_args(argv)
    if args.cmd == "train":
        cfg = TargetTrainConfig(**{k: v for k, v in vars(args).items() if k != "cmd"})
        train_target(cfg)
        return 0
    from transformers import AutoProcessor, Qwen2VLForConditionalGeneration

    model = Qwen2VLForConditionalGeneration.from_pretrained(args.model).eval()
    processor = AutoProcessor.from_pretrained(args.model)
    for name in ("docs", "charts"):
        print(json.dumps(evaluate(model, processor, name, n=args.n, max_new_tokens=args.max_new_tokens)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
