"""``mmspec bench --workload images``: the AR image generator, plain and speculative, and the quality of its images.

Systems (``--systems``; default ``ar`` alone, so the quick default bench stays quick): ``ar`` (the plain pipeline, :func:`~.generator.generate_codes`) and
``sjd`` (Speculative Jacobi Decoding through :func:`mmspec.generate`, :mod:`mmspec.image_ar.sjd`), ``spatial`` (the
trained spatial head, :mod:`mmspec.image_ar.ssd`; ``spatial:DIR`` another one; ``spatial;rounds=1`` its lossy
verify-and-correct mode) with its options
(``sjd;draft_len=8;init=random``, ``sjd;branch=4``) and an acceptance rule (``sjd;rule=lantern++:lambda=2``, ``sjd;rule=csd``,
``sjd;rule=gsd``: relaxed, ``lossless: false``). Any system takes ``cfg_scale=S`` (``sjd;cfg_scale=1.5``): it then
runs under classifier-free guidance ``S`` (conditional and unconditional rows in one batch) and is compared with
``ar`` at the same scale, which the bench adds when it is not asked for. Without it a system runs at the
generator's own scale.

Per batch size, after one untimed warm-up call of every system, the items' prompts go through
:class:`~mmspec.image_ar.generator.ImageARPipeline` in batches, the systems interleaved on each batch (seeded per
batch, the same seed in every system; temperature 1, no top-k). A speculative sampler keeps AR's distribution, not
its draws, so images are not compared pixel for pixel; ``lossless`` is the acceptance rule's own declaration.
Each record carries ``speedup_vs_ar`` (sum of AR's call times over the system's, ``total`` = codes + VQ decode),
``speedup_median`` (per batch), ``speedup_generate`` (the code loop alone), ``target_forwards`` (target passes over
the run, one pass covering the batch; AR makes one per code), ``latency_ms`` per stage and ``quality``:
``prompt_accuracy`` (every asked field read back by the world classifier), per-field rates, ``fid`` on the
classifier's features with ``fid_n`` images per side (an FID on a few images is biased upwards and noisy: compare
values at equal ``fid_n`` only), ``code_nll`` (the target's mean negative log-likelihood of the generated codes
under the guided distribution the system samples, teacher-forced: no classifier needed) and, when speculative
systems run, the noise floor of each figure: an untimed second AR run per guidance scale on another seed set gives
``fid_noise_floor`` = |FID(AR, seeds A) - FID(AR, seeds B)|, ``prompt_accuracy_noise`` and ``code_nll_noise``
likewise (a difference from AR below these is noise).

The speed / quality table, tolerances, bars and Pareto plot of a run's JSON: ``python -m mmspec.image_ar pareto
BENCH.json --png PLOT.png --md TABLE.md`` (:mod:`mmspec.image_ar.pareto`).

Example:
    >>> parse_image_system("sjd;draft_len=8;rule=lantern++:lambda=2;cfg_scale=1.5")
    {'name': 'sjd;draft_len=8;rule=lantern++:lambda=2;cfg_scale=1.5', 'drafter': 'sjd;draft_len=8', 'rule': 'lantern++;lambda=2', 'cfg_scale': 1.5}
    >>> from mmspec.bench import BenchConfig                                           # doctest: +SKIP
    >>> examples = get_workload("images").examples("test", 8)                         # doctest: +SKIP
    >>> bench_images("image_ar/assets/image-gen", examples, BenchConfig(systems=["ar", "sjd"]))  # doctest: +SKIP
"""

from __future__ import annotations

import math
import statistics
import sys
import time

import torch

from mmspec.bench import plain_record, split_rule
from mmspec.checkpoints import dtype_note, resolve_dtype
from mmspec.errors import InvalidInputError

from .generator import ImageARPipeline

__all__ = ["bench_images", "parse_image_system", "DEFAULT_SYSTEMS"]

DEFAULT_SYSTEMS = ("ar",)
_USAGE = ("image systems: 'ar', 'sjd' (options draft_len=N, init=random|repeat, branch=K) or 'spatial[:DIR]' (options "
          "draft_len=N, k_h=N, k_v=N, draft=argmax|sample, jacobi=true|false, rounds=R: lossy verify-and-correct), each "
          "with optional "
          "';rule=NAME:key=value' (not ar) and ';cfg_scale=S'")


def parse_image_system(spec: str) -> dict:
    """One image system spec -> ``{"name", "drafter", "rule", "cfg_scale"}`` (``drafter`` ``None`` for AR,
    ``cfg_scale`` ``None`` for the generator's own); raises :class:`~mmspec.InvalidInputError` on a bad one.

    Example:
        >>> parse_image_system("ar;cfg_scale=1.5")["cfg_scale"], parse_image_system("sjd")["rule"]
        (1.5, None)
    """
    from mmspec.acceptance import get_rule
    from mmspec.registry import make_drafter

    if not isinstance(spec, str) or not spec.strip():
        raise InvalidInputError(f"empty image system; {_USAGE}")
    rest, rule = split_rule(spec.strip())
    parts = [p.strip() for p in rest.split(";") if p.strip()]
    head, scale, kept = parts[0], None, []
    for p in parts[1:]:
        key, _, value = p.partition("=")
        if key.strip() == "cfg_scale":
            try:
                scale = float(value)
            except ValueError:
                scale = math.nan
            if not math.isfinite(scale) or scale < 1.0:
                raise InvalidInputError(f"system {spec!r}: cfg_scale must be a finite number >= 1")
        else:
            kept.append(p)
    if head == "ar":
        if kept or rule is not None:
            raise InvalidInputError(f"system {spec!r}: ar takes only cfg_scale; {_USAGE}")
        drafter = None
    elif head == "sjd" or head.split(":", 1)[0] == "spatial":
        drafter = ";".join([head] + kept)
        if head == "sjd":
            make_drafter(drafter, None)  # bad drafter options are said before anything loads
        else:  # a trained head loads against the target; its run options are checked here
            from .ssd import check_spec

            check_spec(drafter)
        if rule is not None:
            try:
                get_rule(rule, do_sample=True)
            except ValueError as e:
                raise InvalidInputError(f"system {spec!r}: {e}") from e
    else:
        raise InvalidInputError(f"unknown image system {spec!r}; {_USAGE}")
    return {"name": spec.strip(), "drafter": drafter, "rule": rule, "cfg_scale": scale}


def _systems(names) -> list:
    """Parsed systems, an AR at every guidance scale a system asks for first (each system's reference)."""
    systems = [parse_image_system(s) for s in (names or DEFAULT_SYSTEMS)]
    out, seen = [], set()
    for scale in dict.fromkeys(s["cfg_scale"] for s in systems):
        if not any(s["drafter"] is None and s["cfg_scale"] == scale for s in systems):
            out.append(parse_image_system("ar" if scale is None else f"ar;cfg_scale={scale:g}"))
    for s in out + systems:
        if s["name"] not in seen:
            seen.add(s["name"])
            yield s


@torch.no_grad()
def code_nll(pipe, prompts: list, codes: torch.Tensor, cfg_scale: float) -> list:
    """Per image, the mean negative log-likelihood (nats per code) of ``codes`` (``[B, n]``) under the guided
    distribution ``log_softmax(u + s (c - u))`` over the codes (temperature 1), teacher-forced in one pass.

    Example:
        >>> code_nll(pipe, ["a red circle"], pipe.last_codes, 1.0)                      # doctest: +SKIP
        [0.031]
    """
    from .generator import _request_ids, _unconditional, _with_codes

    lm = pipe._image_lm or pipe.model  # Janus: its image mode as a causal LM (JanusImageLM)
    offset = int(lm.generation_config.image_code_offset)
    ids, mask = _request_ids(pipe.tokenizer, prompts)
    dev = lm.device
    codes = codes.to(dev)
    rows = [ids] + ([_unconditional(ids, pipe.tokenizer)] if cfg_scale > 1 else [])
    logits = []
    for r in rows:
        seq, full, pos = _with_codes(r.to(dev), mask.to(dev), codes + offset)
        out = lm(input_ids=seq, attention_mask=full, position_ids=pos).logits
        logits.append(out[:, ids.shape[1] - 1: -1, offset:].float())
    guided = logits[0] if len(logits) == 1 else logits[1] + cfg_scale * (logits[0] - logits[1])
    nll = -torch.log_softmax(guided, dim=-1).gather(-1, codes[..., None]).squeeze(-1)
    return nll.mean(dim=1).tolist()


def bench_images(model: str, examples: list, cfg, progress: bool = True) -> list[dict]:
    """Measure the generator at ``model`` on ``examples`` at each of ``cfg.batch_sizes`` for each of
    ``cfg.systems`` (see the module docstring)."""
    from tqdm.auto import tqdm

    from mmspec.registry import make_drafter

    from . import quality

    systems = list(_systems(cfg.systems))  # checked before the model loads
    device = cfg.resolved_device()
    pipe = ImageARPipeline.from_pretrained(model, dtype=resolve_dtype(cfg.dtype, model, device))
    pipe.model.to(device)
    if pipe.vq is not None:
        pipe.vq.to(device)
    lm = pipe._image_lm or pipe.model  # the causal LM over [text | codes] the speculative loop drives
    for s in systems:
        s["drafter_obj"] = make_drafter(s["drafter"], lm) if s["drafter"] else None
    clf_path = quality.bundled_classifier()
    clf = quality.WorldClassifier.from_pretrained(clf_path) if clf_path else None
    prompts = [ex.prompt for ex in examples]
    real = [ex.meta["image"] for ex in examples]
    real_acc = quality.prompt_accuracy(clf, real, prompts)["all"] if clf is not None else None
    records = []
    for bs in cfg.batch_sizes:
        chunks = [prompts[i:i + bs] for i in range(0, len(prompts), bs)]
        runs = {s["name"]: {"stages": {"generate": [], "decode": [], "total": []}, "images": [], "tokens": 0,
                            "forwards": 0, "stats": None, "nll": []} for s in systems}

        def call(s, chunk, seed):
            pipe.drafter, pipe.rule = s["drafter_obj"], s["rule"]
            t0 = time.perf_counter()
            out = pipe(chunk, seed=seed, cfg_scale=s["cfg_scale"])
            return out, (time.perf_counter() - t0) * 1e3

        for s in systems:
            call(s, chunks[0], cfg.seed)  # warm-up, untimed
        bar = tqdm(total=len(chunks) * len(systems), desc=f"images bs={bs}", file=sys.stderr, disable=not progress,
                   leave=False)
        for i, chunk in enumerate(chunks):
            for s in systems:  # interleaved: every system meets the same load on the same batch
                images, total = call(s, chunk, cfg.seed + i)
                run = runs[s["name"]]
                run["images"] += images
                run["stages"]["total"].append(total)
                run["stages"]["generate"].append(pipe.last_timings_ms["generate"])
                run["stages"]["decode"].append(pipe.last_timings_ms["decode"])
                run["tokens"] += pipe.last_timings_ms["tokens"] * len(chunk)
                run["forwards"] += pipe.last_timings_ms["target_forwards"]
                if pipe.last_stats is not None:
                    run["stats"] = pipe.last_stats if run["stats"] is None else run["stats"].merge(pipe.last_stats)
                run["nll"] += code_nll(pipe, chunk, pipe.last_codes, _scale(pipe, s))  # untimed
                bar.update(1)
        bar.close()
        noise = _noise_floor(pipe, systems, chunks, cfg.seed) if len(systems) > 1 else {}
        figures = {}  # per system: the quality figures the noise floor compares
        for s in systems:
            run = runs[s["name"]]
            scale = _scale(pipe, s)
            q = {"cfg_scale": scale, "fid_n": len(run["images"]), "code_nll": statistics.fmean(run["nll"])}
            if clf is None:
                q["note"] = "no world classifier bundled: prompt accuracy and FID not measured"
            else:
                acc = quality.prompt_accuracy(clf, run["images"], prompts)
                q.update(prompt_accuracy=acc.pop("all"), field_accuracy=acc,
                         fid=quality.fid(clf, run["images"], real) if len(run["images"]) > 1 else None,
                         real_prompt_accuracy=real_acc)
            figures[s["name"]] = q
            st = run["stats"]
            note = (f"ImageARPipeline ({pipe.backend}), classifier-free guidance {scale}"
                    f"{' (batch doubled)' if scale > 1 else ''}, temperature 1, seeded per batch (same seeds in every "
                    "system); " + (f"{s['drafter']} through mmspec.generate, rule {st.rule}; " if st else "")
                    + (dtype_note(cfg.dtype, model, device) or "stored dtype"))
            rec = plain_record("images", bs, len(examples), [t / 1e3 for t in run["stages"]["total"]], run["tokens"],
                               run["stages"], q, note, dtype=pipe.model.dtype)
            rec.update(system=s["name"], spec=s["name"], target_forwards=run["forwards"])
            if st is not None:
                rec.update(kind="mmspec", tau=st.tau, accept_rate=st.accept_rate, accepted_hist=st.accepted_hist,
                           ceiling_rounds=st.ceiling_rounds, forwards_per_token=st.forwards_per_token,
                           lossless=st.lossless, rule=st.rule, drafter_counters=st.drafter_counters,
                           identical_to_ar=None, identical_rate=None, divergences=None)
            rec["quality"]["lossless"] = rec["lossless"]
            records.append(rec)
        floors = {}  # per guidance scale: AR (seed set A, timed) against AR (seed set B)
        for scale, b in noise.items():
            a = figures[next(x["name"] for x in systems if x["drafter"] is None and x["cfg_scale"] == scale)]
            floors[scale] = {"code_nll_noise": abs(a["code_nll"] - b["code_nll"])}
            if clf is not None:
                fid_b = quality.fid(clf, b["images"], real) if len(b["images"]) > 1 else None
                floors[scale].update(
                    prompt_accuracy_noise=abs(a["prompt_accuracy"] - quality.prompt_accuracy(clf, b["images"],
                                                                                             prompts)["all"]),
                    fid_noise_floor=abs(a["fid"] - fid_b) if fid_b is not None and a["fid"] is not None else None)
        by_name = {r["system"]: r for r in records[-len(systems):]}
        for s in systems:
            ref = next(x for x in systems if x["drafter"] is None and x["cfg_scale"] == s["cfg_scale"])
            mine, ar = runs[s["name"]]["stages"], runs[ref["name"]]["stages"]
            rec = by_name[s["name"]]
            rec["speedup_vs_ar"] = sum(ar["total"]) / sum(mine["total"])
            rec["speedup_median"] = statistics.median(a / m for a, m in zip(ar["total"], mine["total"]))
            rec["speedup_generate"] = sum(ar["generate"]) / sum(mine["generate"])
            rec["reference"] = ref["name"]
            rec["quality"].update(floors.get(s["cfg_scale"], {}))
    return records


def _scale(pipe, system: dict) -> float:
    return pipe.cfg_scale if system["cfg_scale"] is None else system["cfg_scale"]


def _noise_floor(pipe, systems: list, chunks: list, seed: int) -> dict:
    """Per guidance scale of the run, AR again (untimed) on a disjoint seed set (seed set B): how far AR's
    figures move with the seeds alone. ``{cfg_scale: {"images", "code_nll"}}``."""
    out = {}
    for s in systems:
        if s["drafter"] is not None or s["cfg_scale"] in out:
            continue
        pipe.drafter, pipe.rule = None, None
        images, nll = [], []
        for i, chunk in enumerate(chunks):
            images += pipe(chunk, seed=seed + 1_000_003 + i, cfg_scale=s["cfg_scale"])
            nll += code_nll(pipe, chunk, pipe.last_codes, _scale(pipe, s))
        out[s["cfg_scale"]] = {"images": images, "code_nll": statistics.fmean(nll)}
    return out
