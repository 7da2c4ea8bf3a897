"""Training the reader on this CPU, in two resumable stages.

Stage 1, the eyes (:func:`train_vision`): the vision transformer and connector alone. Every tile the processor
cuts from a rendered page has a known class (the token in its box, :mod:`.typeset`); the connector's output
``v`` is trained to be that token's input embedding in the frozen LM: cross-entropy over the negative squared
distances to every embedding (nearest-embedding classification over the 49,152 tokens and the ten
space-digit classes) plus a small squared-error term that pulls ``v`` onto the embedding itself. No LM forward
runs in the loop.

Stage 2, the transcription habit (:func:`train_adapter`): a LoRA adapter on the LM (:mod:`.lora`), trained
on prompts whose image positions hold the target embeddings of the page's boxes, noised (or, with
``frontend=``, the trained front end's own outputs), and whose answer is the page's Markdown. It teaches the
LM to write what it sees verbatim: keep line breaks, add no lead-in, turn a chart's rows into a table.

Both stages write ``OUT/state.pt`` (weights, optimiser, step, pages consumed) every ``save_every`` steps,
atomically, and continue from it when run again; ``OUT/log.jsonl`` gets one line per logged step and eval.
Pages come from a seeded generator (page index -> page), so a resumed run sees the pages it would have seen.

Example:
    $ python -m mmspec.vision.reader.train vision --out runs/reader-vision --steps 6000
    $ python -m mmspec.vision.reader.train adapter --out runs/reader-lora --steps 600
    $ python -m mmspec.vision.reader.train export --vision runs/reader-vision --adapter runs/reader-lora \\
          --out vision/assets/reader
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

__all__ = ["VisionConfig", "AdapterConfig", "train_vision", "train_adapter", "export_reader", "page_stream", "labelled_page",
           "target_table", "evaluate_frontend", "average_adapters"]


# ---------------------------------------------------------------------------------------------- data
def make_page(ts, split: str, index: int, *, seed: int = 0, kind: str | None = None, words: str = "normal",
              tokenizer=None, clean: bool = False):
    """The ``index``-th page of a seeded stream: a document page or (about one in six) a chart.

    Example:
        >>> page = make_page(ts, "train", 0)          # doctest: +SKIP
    """
    from .pages import chart_spec, page_spec, render_chart, render_page

    for attempt in range(20):
        s = (seed * 1_000_003 + index) * 31 + attempt + (0 if split == "train" else 7_777_777)
        rng, nrng = random.Random(s), np.random.default_rng(s)
        k = kind or ("chart" if rng.random() < 0.16 else "doc")
        if k == "chart":
            page = render_chart(ts, rng, nrng, chart_spec(rng, split, words=words), clean=clean)
        else:
            page = render_page(ts, rng, nrng, page_spec(rng, split, words=words, tokenizer=tokenizer), clean=clean)
        if page is not None:
            page.meta["kind"] = k
            return page
    raise RuntimeError(f"no page could be typeset for {split} {index}")


def labelled_page(page):
    """``(layout, labels)``: the processor's view of ``page`` and each tile's box class, ``-1`` where the found
    lines do not match the typeset ones box for box (those tiles are not trained on, and count as errors when
    measuring)."""
    from .processor import page_layout

    layout = page_layout(page.image)
    labels = np.full(len(layout.tiles), -1, np.int64)
    if len(layout.line_sizes) == len(page.lines):
        k = 0
        for found, truth in zip(layout.line_sizes, page.lines):
            if found == len(truth.boxes):
                labels[k:k + found] = [b.cls for b in truth.boxes]
            k += found
    return layout, labels


class page_stream(torch.utils.data.IterableDataset):
    """Batches of about ``tiles`` labelled tiles from consecutive pages, starting at page ``start``; each batch
    carries the index of the next page (what a resumed run starts from)."""

    def __init__(self, tokenizer_dir: str, start: int, tiles: int, seed: int = 0):
        super().__init__()
        self.tokenizer_dir, self.start, self.tiles, self.seed = tokenizer_dir, start, tiles, seed

    def __iter__(self):
        from transformers import AutoTokenizer

        from .typeset import Typesetter

        tok = AutoTokenizer.from_pretrained(self.tokenizer_dir)
        ts = Typesetter(tok)
        i = self.start
        while True:
            xs, ys = [], []
            n = 0
            while n < self.tiles:
                page = make_page(ts, "train", i, seed=self.seed, tokenizer=tok)
                i += 1
                layout, labels = labelled_page(page)
                keep = labels >= 0
                xs.append(layout.tiles[keep])
                ys.append(labels[keep])
                n += int(keep.sum())
            yield torch.from_numpy(np.concatenate(xs)), torch.from_numpy(np.concatenate(ys)), i


def target_table(embeddings: torch.Tensor, space_id: int, digit_ids: list) -> torch.Tensor:
    """The vectors of all box classes: the LM's input embeddings, then one per space-digit class (the mean of
    the space's and the digit's embeddings).

    Example:
        >>> E = torch.eye(12)
        >>> target_table(E, 11, list(range(10))).shape
        torch.Size([22, 12])
    """
    extra = torch.stack([(embeddings[space_id] + embeddings[d]) / 2 for d in digit_ids])
    return torch.cat([embeddings, extra])


# ---------------------------------------------------------------------------------------------- stage 1
@dataclass
class VisionConfig:
    """Stage 1's settings (saved in ``OUT/config.json``; a resumed run must match them)."""

    out: str
    steps: int = 6000
    tiles: int = 384
    lr: float = 5e-4
    warmup: int = 200
    weight_decay: float = 0.02
    mse_weight: float = 0.25
    hidden: int = 256
    layers: int = 6
    heads: int = 4
    seed: int = 0
    save_every: int = 100
    eval_every: int = 500
    eval_pages: int = 24
    threads: int = 2
    bf16: bool = True
    init: str | None = None  # start from these weights: a shipped reader folder or a vision.safetensors


def _lr(step: int, cfg) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    t = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))


def _atomic_save(obj, path: str) -> None:
    tmp = path + ".tmp"
    torch.save(obj, tmp)
    os.replace(tmp, path)


def _log(out: str, rec: dict) -> None:
    with open(os.path.join(out, "log.jsonl"), "a") as f:
        f.write(json.dumps(rec) + "\n")


def _check_config(out: str, cfg, keys: tuple) -> None:
    path = os.path.join(out, "config.json")
    mine = asdict(cfg)
    if os.path.isfile(path):
        with open(path) as f:
            old = json.load(f)
        diff = {k: (old.get(k), mine[k]) for k in keys if old.get(k) != mine[k]}
        if diff:
            raise SystemExit(f"{out} was trained with other settings {diff}; use another --out")
    with open(path, "w") as f:
        json.dump(mine, f, indent=2)


def _lm_embeddings():
    from safetensors import safe_open
    from transformers import AutoTokenizer

    from .lm import smollm2_path

    path = smollm2_path()
    with safe_open(os.path.join(path, "model.safetensors"), "pt") as f:
        E = f.get_tensor("model.embed_tokens.weight").float()
    tok = AutoTokenizer.from_pretrained(path)
    space = tok(" ", add_special_tokens=False)["input_ids"][0]
    digits = [tok(str(d), add_special_tokens=False)["input_ids"][0] for d in range(10)]
    return path, tok, E, target_table(E, space, digits)


class FrontEnd(torch.nn.Module):
    """The reader's eyes alone: vision transformer + connector, tiles in, one LM-space vector per tile out."""

    def __init__(self, config):
        super().__init__()
        from .model import vision_modules

        self.vision_model, self.connector = vision_modules(config)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        h = self.vision_model(pixel_values=pixels).last_hidden_state
        return self.connector(h).squeeze(1)

    def reader_state(self) -> dict:
        """The weights under the full model's names (``model.vision_model.*``, ``model.connector.*``)."""
        return {f"model.{k}": v.detach().clone() for k, v in self.state_dict().items()}


def _frontend(hidden: int, layers: int, heads: int, lm_dir: str) -> FrontEnd:
    from transformers import AutoConfig

    from .model import reader_config

    return FrontEnd(reader_config(AutoConfig.from_pretrained(lm_dir).to_dict(), hidden=hidden, layers=layers,
                                  heads=heads))


def _class_logits(v: torch.Tensor, table: torch.Tensor, sq: torch.Tensor) -> torch.Tensor:
    return 2 * v @ table.T - sq


@torch.no_grad()
def evaluate_frontend(model: FrontEnd, table: torch.Tensor, ts, tokenizer, *, pages: int = 24, split: str = "test",
                      words: str = "normal", seed: int = 0, batch: int = 512) -> dict:
    """Nearest-embedding accuracy of the front end on ``pages`` pages of ``split`` (tiles of mis-segmented
    lines count as wrong), overall, on charts, and the rate of pages segmented box for box.

    Example:
        >>> evaluate_frontend(model, table, ts, tok, pages=4)["acc"]      # doctest: +SKIP
        0.99
    """
    from .processor import tiles_to_pixels

    model.eval()
    sq = (table * table).sum(1)
    right = total = seg_ok = 0
    chart_right = chart_total = 0
    for i in range(pages):
        page = make_page(ts, split, i, seed=seed, words=words, tokenizer=tokenizer)
        layout, labels = labelled_page(page)
        n_truth = sum(len(line.boxes) for line in page.lines)
        seg_ok += int((labels >= 0).all() and len(labels) == n_truth)
        pred = []
        for a in range(0, len(layout.tiles), batch):
            v = model(tiles_to_pixels(layout.tiles[a:a + batch])).float()
            pred.append(_class_logits(v, table, sq).argmax(-1).numpy())
        pred = np.concatenate(pred) if pred else np.zeros(0, np.int64)
        hit = int(((pred == labels) & (labels >= 0)).sum())
        right += hit
        total += n_truth
        if page.meta.get("kind") == "chart":
            chart_right += hit
            chart_total += n_truth
    model.train()
    return {"acc": right / max(total, 1), "chart_acc": chart_right / max(chart_total, 1),
            "seg_pages": seg_ok / max(pages, 1), "tiles": total}


def train_vision(cfg: VisionConfig) -> str:
    """Stage 1 (see the module docstring); resumable; returns ``cfg.out``.

    Example:
        >>> train_vision(VisionConfig(out="runs/reader-vision", steps=10))   # doctest: +SKIP
    """
    from safetensors.torch import save_file

    from .processor import tiles_to_pixels
    from .typeset import Typesetter

    torch.set_num_threads(cfg.threads)
    os.makedirs(cfg.out, exist_ok=True)
    _check_config(cfg.out, cfg, ("hidden", "layers", "heads", "seed", "tiles", "lr", "steps"))
    lm_dir, tok, _, table = _lm_embeddings()
    sq = (table * table).sum(1)
    torch.manual_seed(cfg.seed)
    model = _frontend(cfg.hidden, cfg.layers, cfg.heads, lm_dir)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    step, next_page = 0, 0
    state_path = os.path.join(cfg.out, "state.pt")
    if os.path.isfile(state_path):
        st = torch.load(state_path, weights_only=True)
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
        step, next_page = int(st["step"]), int(st["next_page"])
        print(f"resumed at step {step} (page {next_page})", file=sys.stderr)
    elif cfg.init:
        from safetensors.torch import load_file

        path = os.path.join(cfg.init, "vision.safetensors") if os.path.isdir(cfg.init) else cfg.init
        weights = {k.removeprefix("model."): v.float() for k, v in load_file(path).items()}
        model.load_state_dict(weights)
        # a continued run sees pages the first one did not (its page stream starts elsewhere)
        next_page = 10_000_000
        print(f"initialised from {path}", file=sys.stderr)
    ts = Typesetter(tok)
    loader = torch.utils.data.DataLoader(page_stream(lm_dir, next_page, cfg.tiles, cfg.seed), batch_size=None,
                                         num_workers=1, prefetch_factor=4)
    model.train()
    t0, seen = time.time(), 0
    it = iter(loader)
    while step < cfg.steps:
        tiles, labels, next_page = next(it)
        for g in opt.param_groups:
            g["lr"] = _lr(step, cfg)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.bf16):
            v = model(tiles_to_pixels(tiles.numpy()))
            logits = _class_logits(v.float(), table, sq) if not cfg.bf16 else _class_logits(v, table, sq)
        logits = logits.float()
        ce = torch.nn.functional.cross_entropy(logits, labels)
        mse = ((v.float() - table[labels]) ** 2).sum(-1).mean()
        loss = ce + cfg.mse_weight * mse
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        seen += len(labels)
        if step % 20 == 0:
            acc = (logits.argmax(-1) == labels).float().mean().item()
            rate = seen / (time.time() - t0)
            _log(cfg.out, {"step": step, "ce": round(ce.item(), 4), "mse": round(mse.item(), 4),
                           "train_acc": round(acc, 4), "lr": _lr(step, cfg), "tiles_per_s": round(rate, 1),
                           "page": int(next_page)})
            print(f"step {step}/{cfg.steps} ce {ce.item():.3f} mse {mse.item():.3f} acc {acc:.3f} "
                  f"{rate:.0f} tiles/s", file=sys.stderr, flush=True)
        if step % cfg.save_every == 0 or step == cfg.steps:
            _atomic_save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step,
                          "next_page": int(next_page)}, state_path)
            save_file({k: v.contiguous() for k, v in model.reader_state().items()},
                      os.path.join(cfg.out, "vision.safetensors"))
        if step % cfg.eval_every == 0 or step == cfg.steps:
            rec = evaluate_frontend(model, table, ts, tok, pages=cfg.eval_pages, seed=cfg.seed)
            _log(cfg.out, {"step": step, "eval": rec})
            print(f"eval step {step}: {rec}", file=sys.stderr, flush=True)
    return cfg.out


# ---------------------------------------------------------------------------------------------- stage 2
@dataclass
class AdapterConfig:
    """Stage 2's settings."""

    out: str
    steps: int = 600
    batch: int = 4
    lr: float = 3e-4
    warmup: int = 30
    rank: int = 16
    alpha: float = 32.0
    noise: float = 0.25  # the largest relative norm of the Gaussian noise added to a page's target embeddings
    seed: int = 0
    save_every: int = 20
    threads: int = 2
    frontend: str | None = None  # a stage-1 OUT folder: feed its outputs instead of noised targets
    train_connector: bool = False  # with frontend: the connector learns end to end too (the tower stays frozen)
    init_lora: str | None = None  # an earlier stage-2 OUT folder to start the adapter from
    max_page_tokens: int = 420
    chart_share: float | None = None  # the share of chart pages (None: the page stream's own, about one in six)


from .workloads import CHART_PROMPTS, PAGE_PROMPTS  # noqa: E402  (the prompts the reader is asked)


def adapter_example(ts, proc, tok, index: int, seed: int = 0, split: str = "train", chart_share: float | None = None):
    """One stage-2 example: ``(prompt_ids, page_classes, answer_ids, tiles)`` where ``prompt_ids`` holds image
    tokens at the page's boxes and ``page_classes`` their classes in order (``-1`` for a box of a mis-segmented
    line: its target is unknown, so the front end's output or a random token's embedding stands there).
    ``chart_share`` draws the page's kind from its own seeded stream (charts more often than the default mix)."""
    kind = None
    if chart_share is not None:
        kind = "chart" if random.Random(f"kind-{seed}-{index}").random() < chart_share else "doc"
    page = make_page(ts, split, index, seed=seed + 1, tokenizer=tok if split == "train" else None, kind=kind)
    layout, labels = labelled_page(page)
    rng = random.Random(index * 7 + seed)
    prompts = CHART_PROMPTS if page.meta.get("kind") == "chart" else PAGE_PROMPTS
    text = proc.apply_chat_template([{"role": "user", "content": [{"type": "image"},
                                                                 {"type": "text", "text": rng.choice(prompts)}]}],
                                    add_generation_prompt=True)
    ids = proc.encode_prompt(text, [layout])
    answer = tok(page.markdown + "<|im_end|>", add_special_tokens=False)["input_ids"]
    return ids, labels, answer, layout.tiles


def train_adapter(cfg: AdapterConfig) -> str:
    """Stage 2 (see the module docstring); resumable; returns ``cfg.out``.

    Example:
        >>> train_adapter(AdapterConfig(out="runs/reader-lora", steps=10))   # doctest: +SKIP
    """
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    from .lora import add_lora, lora_state_dict
    from .model import IMAGE_TOKEN
    from .processor import PageReaderProcessor, tiles_to_pixels
    from .typeset import Typesetter

    torch.set_num_threads(cfg.threads)
    os.makedirs(cfg.out, exist_ok=True)
    _check_config(cfg.out, cfg, ("rank", "alpha", "seed", "batch", "lr", "steps", "frontend", "train_connector",
                                 "init_lora", "chart_share"))
    if cfg.train_connector and not cfg.frontend:
        raise SystemExit("train_connector needs frontend (the stage-1 run whose connector is trained)")
    lm_dir, tok, E, table = _lm_embeddings()
    model = AutoModelForCausalLM.from_pretrained(lm_dir, dtype=torch.bfloat16)
    for p in model.parameters():
        p.requires_grad_(False)
    add_lora(model, cfg.rank, cfg.alpha)
    for m in model.modules():
        if hasattr(m, "lora_A"):
            m.lora_A.data = m.lora_A.data.float()
            m.lora_B.data = m.lora_B.data.float()
    params = [p for p in model.parameters() if p.requires_grad]
    front = None
    if cfg.frontend:
        with open(os.path.join(cfg.frontend, "config.json")) as f:
            fc = json.load(f)
        front = _frontend(fc["hidden"], fc["layers"], fc["heads"], lm_dir)
        st = torch.load(os.path.join(cfg.frontend, "state.pt"), weights_only=True)
        front.load_state_dict(st["model"])
        front.eval()
        for p in front.parameters():
            p.requires_grad_(False)
        if cfg.train_connector:
            for p in front.connector.parameters():
                p.requires_grad_(True)
            params += list(front.connector.parameters())
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    step = 0
    state_path = os.path.join(cfg.out, "state.pt")
    if os.path.isfile(state_path):
        st = torch.load(state_path, weights_only=True)
        model.load_state_dict(st["lora"], strict=False)
        if "connector" in st and front is not None:
            front.connector.load_state_dict(st["connector"])
        opt.load_state_dict(st["opt"])
        step = int(st["step"])
        print(f"resumed at step {step}", file=sys.stderr)
    elif cfg.init_lora:
        st = torch.load(os.path.join(cfg.init_lora, "state.pt"), weights_only=True)
        model.load_state_dict(st["lora"], strict=False)
        if "connector" in st and front is not None:
            front.connector.load_state_dict(st["connector"])  # a run that trained it end to end goes on from there
        print(f"adapter initialised from {cfg.init_lora} (step {st['step']})", file=sys.stderr)
    ts = Typesetter(tok)
    proc = PageReaderProcessor(tok, image_token=IMAGE_TOKEN)
    emb = model.get_input_embeddings()
    model.train()
    t0 = time.time()
    start_step = step
    while step < cfg.steps:
        for g in opt.param_groups:
            g["lr"] = _lr(step, cfg)
        seqs, lab_rows = [], []
        for b in range(cfg.batch):
            ids, classes, answer, tiles = adapter_example(ts, proc, tok, step * cfg.batch + b, cfg.seed,
                                                          chart_share=cfg.chart_share)
            ids_t = torch.tensor(ids + answer)
            x = emb(ids_t).float()
            pos = (ids_t[:len(ids)] == proc.image_token_id).nonzero().squeeze(1)
            known = torch.from_numpy(classes) >= 0
            rng = torch.Generator().manual_seed(step * 1000 + b)
            if front is not None:
                with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
                    h = front.vision_model(pixel_values=tiles_to_pixels(tiles)).last_hidden_state
                with torch.set_grad_enabled(cfg.train_connector), torch.autocast("cpu", dtype=torch.bfloat16):
                    vis = front.connector(h.float()).squeeze(1).float()
            else:
                cls = torch.from_numpy(np.where(classes >= 0, classes, 0))
                vis = table[cls].clone()
                rand = torch.randint(0, E.shape[0], (len(cls),), generator=rng)
                vis[~known] = E[rand[~known]]
                sigma = cfg.noise * torch.rand((), generator=rng).item()
                noise = torch.randn(vis.shape, generator=rng)
                vis = vis + noise * (sigma * vis.norm(dim=-1, keepdim=True) / noise.norm(dim=-1, keepdim=True))
            x = x.index_put((pos,), vis)
            lab = torch.full((len(ids) + len(answer),), -100)
            lab[len(ids):] = torch.tensor(answer)
            seqs.append(x)
            lab_rows.append(lab)
        width = max(len(s) for s in seqs)
        xb = torch.zeros(len(seqs), width, E.shape[1])
        lb = torch.full((len(seqs), width), -100)
        mask = torch.zeros(len(seqs), width, dtype=torch.long)
        for r, (s, lab) in enumerate(zip(seqs, lab_rows)):
            xb[r, :len(s)] = s
            lb[r, :len(s)] = lab
            mask[r, :len(s)] = 1
        out = model(inputs_embeds=xb.to(torch.bfloat16), attention_mask=mask, labels=lb)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        rate = (time.time() - t0) / (step - start_step)
        _log(cfg.out, {"step": step, "loss": round(out.loss.item(), 4), "lr": _lr(step, cfg),
                       "s_per_step": round(rate, 2), "tokens": int(mask.sum())})
        print(f"step {step}/{cfg.steps} loss {out.loss.item():.4f} {rate:.1f} s/step", file=sys.stderr, flush=True)
        if step % cfg.save_every == 0 or step == cfg.steps:
            lora = {k: v for k, v in model.state_dict().items() if "lora_" in k}
            state = {"lora": lora, "opt": opt.state_dict(), "step": step}
            if cfg.train_connector:
                state["connector"] = front.connector.state_dict()
                save_file({f"model.connector.{k}": v.detach().contiguous() for k, v in front.connector.state_dict().items()},
                          os.path.join(cfg.out, "connector.safetensors"))
            _atomic_save(state, state_path)
            save_file({k: v.contiguous() for k, v in lora_state_dict(model).items()},
                      os.path.join(cfg.out, "lora.safetensors"))
    return cfg.out


def average_adapters(runs: list, weights=None) -> tuple[dict, dict | None]:
    """The exact (weighted) mean of several stage-2 runs' adapters: their LoRA factors concatenated along the rank
    (each run's ``B`` scaled by its weight, so the merged update is the weighted mean of the runs' updates, at the
    sum of their ranks) and their end-to-end connectors averaged weight by weight (``None`` when no run trained
    one). ``weights``: one per run, summing to 1 (default: equal).

    Why: two continuations of one adapter on different page streams (2c on seed 1, 2d on seed 2 with more charts)
    erred on different items; their mean keeps what each learned (weight averaging of fine-tunes from one start).

    Example:
        >>> lora, connector = average_adapters(["runs/reader-lora-c", "runs/reader-lora-d"])    # doctest: +SKIP
    """
    from safetensors.torch import load_file

    loras = [load_file(os.path.join(r, "lora.safetensors")) for r in runs]
    w = [1.0 / len(runs)] * len(runs) if weights is None else [float(x) for x in weights]
    if len(w) != len(runs) or abs(sum(w) - 1.0) > 1e-6 or min(w) < 0:
        raise ValueError(f"weights must be one per run, non-negative, summing to 1 (got {weights} for {len(runs)} runs)")
    out = {}
    for key in loras[0]:
        if not key.endswith(".lora_A"):
            continue
        path = key[: -len(".lora_A")]
        scales = {float(lo[path + ".scale"]) for lo in loras}
        if len(scales) != 1:
            raise ValueError(f"adapters of {runs} have different scales at {path}: {sorted(scales)}")
        out[key] = torch.cat([lo[key].float() for lo in loras], 0)
        out[path + ".lora_B"] = torch.cat([lo[path + ".lora_B"].float() * x for lo, x in zip(loras, w)], 1)
        out[path + ".scale"] = loras[0][path + ".scale"]
    conns = [os.path.join(r, "connector.safetensors") for r in runs]
    if not any(os.path.isfile(c) for c in conns):
        return out, None
    if not all(os.path.isfile(c) for c in conns):
        raise ValueError(f"some of {runs} trained the connector and some did not; average like with like")
    states = [load_file(c) for c in conns]
    return out, {n: sum(st[n].float() * x for st, x in zip(states, w)) for n in states[0]}


def export_reader(vision_dir: str, adapter_dir, out: str, dtype=torch.bfloat16, adapter_weights=None) -> str:
    """Write a shipped reader folder from a stage-1 run and (optionally) stage-2 runs: ``config.json`` (the
    ``Idefics3Config``), ``reader.json`` (manifest: vision shape, weight files, the LM's package and digest, the
    runs' settings and last evals), ``vision.safetensors``, ``lora.safetensors`` and ``tokenizer/``; returns
    ``out``. ``adapter_dir``: one stage-2 run, or a list of runs whose adapters are averaged
    (:func:`average_adapters`, with ``adapter_weights``). The LM's own weights are never written here (:func:`~.model.assemble_reader`
    joins them).

    Example:
        >>> export_reader("runs/reader-vision", "runs/reader-lora", "vision/assets/reader")   # doctest: +SKIP
    """
    from safetensors.torch import load_file, save_file
    from transformers import AutoConfig, AutoTokenizer

    from .lm import GGUF_NAME, GGUF_SHA256, LM_PACKAGE, smollm2_path
    from .model import READER_MANIFEST, reader_config

    with open(os.path.join(vision_dir, "config.json")) as f:
        vcfg = json.load(f)
    vision = {"hidden": vcfg["hidden"], "layers": vcfg["layers"], "heads": vcfg["heads"]}
    os.makedirs(out, exist_ok=True)
    runs = [adapter_dir] if isinstance(adapter_dir, str) else list(adapter_dir or [])

    def cast(d):
        return {k: v.to(dtype).contiguous() if v.is_floating_point() and v.ndim else v.contiguous() for k, v in d.items()}

    vision_state = load_file(os.path.join(vision_dir, "vision.safetensors"))
    lora, connector = average_adapters(runs, adapter_weights) if runs else (None, None)
    if connector is not None:
        vision_state.update(connector)  # trained end to end
    save_file(cast(vision_state), os.path.join(out, "vision.safetensors"))
    manifest = {"vision": vision, "vision_weights": "vision.safetensors", "lora": None,
                "lm": {"package": LM_PACKAGE, "gguf": GGUF_NAME, "sha256": GGUF_SHA256},
                "training": {"vision": _summary(vision_dir)}}
    if runs:
        save_file(cast(lora), os.path.join(out, "lora.safetensors"))
        manifest["lora"] = "lora.safetensors"
        summaries = [_summary(r) for r in runs]
        manifest["training"]["adapter"] = summaries[0] if len(runs) == 1 else \
            {"average_of": summaries, "weights": adapter_weights or [1 / len(runs)] * len(runs),
             "how": "weighted mean of the runs' adapter updates (ranks concatenated) and connectors"}
    lm_dir = smollm2_path()
    cfg = reader_config(AutoConfig.from_pretrained(lm_dir).to_dict(), **vision)
    cfg.dtype = "bfloat16"
    from mmspec.drafters.auto import FALLBACK_KEY

    setattr(cfg, FALLBACK_KEY, "page-lookup")
    cfg.save_pretrained(out)
    AutoTokenizer.from_pretrained(lm_dir).save_pretrained(os.path.join(out, "tokenizer"))
    with open(os.path.join(out, READER_MANIFEST), "w") as f:
        json.dump(manifest, f, indent=2)
    return out


def _summary(run: str) -> dict:
    """A run's settings, its last step and its last eval (for the shipped manifest)."""
    with open(os.path.join(run, "config.json")) as f:
        cfg = json.load(f)
    cfg.pop("out", None)
    last, last_eval = None, None
    path = os.path.join(run, "log.jsonl")
    if os.path.isfile(path):
        with open(path) as f:
            for line in f:
                rec = json.loads(line)
                if "eval" in rec:
                    last_eval = rec
                else:
                    last = rec
    return {"config": cfg, "last": last, "last_eval": last_eval}


def main(argv=None) -> int:
    """``python -m mmspec.vision.reader.train vision|adapter --out DIR [--steps N ...]``."""
    p = argparse.ArgumentParser(prog="python -m mmspec.vision.reader.train")
    p.add_argument("stage", choices=["vision", "adapter", "export"])
    p.add_argument("--out", required=True, help="the run's folder (export: the reader folder to write)")
    p.add_argument("--vision", help="export: the stage-1 run")
    p.add_argument("--adapter", action="append",
                   help="export: the stage-2 run (repeat it to ship the average of several runs' adapters)")
    p.add_argument("--adapter-weights", help="export: comma-separated weights of the --adapter runs (default equal)")
    p.add_argument("--steps", type=int)
    p.add_argument("--threads", type=int)
    p.add_argument("--frontend", help="adapter stage: a stage-1 folder whose outputs replace the noised targets")
    p.add_argument("--tiles", type=int)
    p.add_argument("--batch", type=int)
    p.add_argument("--lr", type=float)
    p.add_argument("--warmup", type=int)
    p.add_argument("--seed", type=int, help="page stream seed (a continued run on new pages: another seed)")
    p.add_argument("--init-lora", help="adapter stage: start from this earlier adapter run")
    p.add_argument("--init", help="vision stage: start from these weights (a reader folder or vision.safetensors)")
    p.add_argument("--chart-share", type=float, help="adapter stage: the share of chart pages (default: about 1 in 6)")
    p.add_argument("--train-connector", action="store_true", default=None,
                   help="adapter stage with --frontend: train the connector end to end too")
    args = p.parse_args(argv)
    if args.stage == "export":
        if not args.vision:
            p.error("export needs --vision RUN")
        weights = [float(x) for x in args.adapter_weights.split(",")] if args.adapter_weights else None
        print(export_reader(args.vision, args.adapter, args.out, adapter_weights=weights))
        return 0
    kw = {k: v for k, v in vars(args).items()
          if v is not None and k not in ("stage", "vision", "adapter", "adapter_weights")}
    if args.stage == "vision":
        for k in ("frontend", "batch", "init_lora", "train_connector"):
            kw.pop(k, None)
        train_vision(VisionConfig(**kw))
    else:
        kw.pop("tiles", None)
        kw.pop("init", None)
        train_adapter(AdapterConfig(**kw))
    return 0


if __name__ == "__main__":
    sys.exit(main())
