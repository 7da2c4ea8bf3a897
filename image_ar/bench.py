"""``mmspec bench --workload images``: the AR image generator, plain and speculative, and the quality of its images.

Systems (``--systems``; default :data:`DEFAULT_SYSTEMS`: ``ar``, ``sjd`` and ``spatial`` when a head ships for the
generator): ``ar`` (the plain pipeline, :func:`~.generator.generate_codes`) and
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

With ``cfg.resume`` (``mmspec bench --resume CKPT.jsonl``) the run is resumable: after every batch of prompts one
line is appended to the checkpoint (:class:`BenchCheckpoint`) with what each system's records need from it (its
call, code-loop and decode times, tokens, target forwards, ``SpecStats``, code NLLs, the codes and the images as
PNG), and likewise for every batch of the untimed seed-set-B AR run. Run the same command again after a kill: the
finished batches are read back (a torn last line is dropped), the rest is measured, and the records are those of an
uninterrupted run (timings are per batch, so every ratio stays paired per image). A checkpoint written by another
configuration (systems, prompts, seed, model, dtype, batch sizes, device, threads) is refused.

With ``cfg.quality == "full"`` (``mmspec bench --workload images --quality full``) the run is the quality run: at
least 1000 prompts (:data:`mmspec.bench.QUALITY_FULL_N`, the default ``--n``), so FID's covariances over the
classifier's 512-d features are full rank; batches of 16 unless ``--batch-sizes`` says otherwise (its speed fields
are throughput at that batch size, not the batch-1 latency table's); the seed-set-B noise floor even for AR alone;
every record's ``quality["mode"]`` says ``"full"``. Pair it with ``--resume``: it is hours on a CPU.

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

import base64
import hashlib
import io
import json
import math
import os
import statistics
import sys
import time
from dataclasses import fields

import torch

from mmspec.bench import plain_record, split_rule
from mmspec.checkpoints import dtype_note, file_sha256, resolve_dtype
from mmspec.errors import InvalidInputError

from .generator import ImageARPipeline

__all__ = ["bench_images", "parse_image_system", "BenchCheckpoint", "DEFAULT_SYSTEMS"]

DEFAULT_SYSTEMS = ("ar", "sjd", "spatial")
"""What ``mmspec bench --workload images`` measures when no systems are named: AR and the lossless speculative
systems (the relaxed, lossy rules are asked for by name)."""
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
    ``cfg.systems`` (see the module docstring); with ``cfg.resume`` (a checkpoint path) resumable."""
    from tqdm.auto import tqdm

    from mmspec.registry import make_drafter

    from . import quality

    systems = list(_systems(cfg.systems))  # checked before the model loads
    device = cfg.resolved_device()
    prompts = [ex.prompt for ex in examples]
    ckpt = None
    if getattr(cfg, "resume", None) and cfg.systems:  # refused before the model loads when another run wrote it
        ckpt = BenchCheckpoint(cfg.resume, _fingerprint(model, prompts, systems, cfg, device))
    pipe = ImageARPipeline.from_pretrained(model, dtype=resolve_dtype(cfg.dtype, model, device))
    pipe.model.to(device)
    if pipe.vq is not None:
        pipe.vq.to(device)
    lm = pipe._image_lm or pipe.model  # the causal LM over [text | codes] the speculative loop drives
    if not cfg.systems:
        from .ssd import bundled_spatial_head

        if bundled_spatial_head(lm) is None:  # the default list names the shipped head: none fits this generator
            systems = [s for s in systems if s["name"] != "spatial"]
            print("images bench: no spatial head ships for this generator; 'spatial' left out of the default "
                  "systems (name one with --systems spatial:DIR)", file=sys.stderr)
    if getattr(cfg, "resume", None) and ckpt is None:  # the default systems are known once the model is loaded
        ckpt = BenchCheckpoint(cfg.resume, _fingerprint(model, prompts, systems, cfg, device))
    for s in systems:
        s["drafter_obj"] = make_drafter(s["drafter"], lm) if s["drafter"] else None
    clf_path = quality.bundled_classifier()
    clf = quality.WorldClassifier.from_pretrained(clf_path) if clf_path else None
    real = [ex.meta["image"] for ex in examples]
    real_acc = quality.prompt_accuracy(clf, real, prompts)["all"] if clf is not None else None
    records = []
    full = getattr(cfg, "quality", "quick") == "full"  # --quality full: the noise floor even for AR alone
    for bs in cfg.batch_sizes:
        chunks = [prompts[i:i + bs] for i in range(0, len(prompts), bs)]
        runs = {s["name"]: {"stages": {"generate": [], "decode": [], "total": []}, "images": [], "tokens": 0,
                            "forwards": 0, "stats": None, "nll": []} for s in systems}
        done = ckpt.chunks(bs, "chunk") if ckpt is not None else []
        for entry in done:  # finished in an earlier session: read back, not measured again
            for s in systems:
                _absorb(runs[s["name"]], entry["systems"][s["name"]])

        def call(s, chunk, seed):
            pipe.drafter, pipe.rule = s["drafter_obj"], s["rule"]
            t0 = time.perf_counter()
            out = pipe(chunk, seed=seed, cfg_scale=s["cfg_scale"])
            return out, (time.perf_counter() - t0) * 1e3

        if len(done) < len(chunks):
            for s in systems:
                call(s, chunks[0], cfg.seed)  # warm-up, untimed
        bar = tqdm(total=len(chunks) * len(systems), initial=len(done) * len(systems), desc=f"images bs={bs}",
                   file=sys.stderr, disable=not progress, leave=False)
        for i in range(len(done), len(chunks)):
            chunk, entry = chunks[i], {}
            for s in systems:  # interleaved: every system meets the same load on the same batch
                images, total = call(s, chunk, cfg.seed + i)
                entry[s["name"]] = part = {
                    "total": total, "generate": pipe.last_timings_ms["generate"],
                    "decode": pipe.last_timings_ms["decode"], "tokens": pipe.last_timings_ms["tokens"] * len(chunk),
                    "forwards": pipe.last_timings_ms["target_forwards"], "stats": pipe.last_stats,
                    "nll": code_nll(pipe, chunk, pipe.last_codes, _scale(pipe, s)),  # untimed
                    "codes": pipe.last_codes.tolist(), "images": images}
                if ckpt is None:
                    _absorb(runs[s["name"]], part)
                bar.update(1)
            if ckpt is not None:  # the batch is on disk before it counts: a kill loses at most this batch
                for name, part in ckpt.append({"kind": "chunk", "batch_size": bs, "chunk": i,
                                               "systems": entry})["systems"].items():
                    _absorb(runs[name], part)
        bar.close()
        noise = _noise_floor(pipe, systems, chunks, cfg.seed, ckpt, bs, progress) if len(systems) > 1 or full else {}
        figures = {}  # per system: the quality figures the noise floor compares
        for s in systems:
            run = runs[s["name"]]
            scale = _scale(pipe, s)
            q = {"cfg_scale": scale, "fid_n": len(run["images"]), "code_nll": statistics.fmean(run["nll"]),
                 "mode": "full" if full else "quick"}
            if clf is None:
                q["note"] = "no world classifier bundled: prompt accuracy and FID not measured"
            else:
                acc = quality.prompt_accuracy(clf, run["images"], prompts)
                q.update(prompt_accuracy=acc.pop("all"), field_accuracy=acc,
                         fid=quality.fid(clf, run["images"], real) if len(run["images"]) > 1 else None,
                         kid=quality.kid(clf, run["images"], real) if len(run["images"]) > 1 else None,
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
                    fid_noise_floor=abs(a["fid"] - fid_b) if fid_b is not None and a["fid"] is not None else None,
                    kid_noise_floor=abs(a["kid"] - quality.kid(clf, b["images"], real))
                    if len(b["images"]) > 1 and a.get("kid") is not None else None)
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


def _absorb(run: dict, part: dict) -> None:
    """Add one system's share of one batch (measured now, or read back from a checkpoint) to its running totals."""
    for stage in ("total", "generate", "decode"):
        run["stages"][stage].append(part[stage])
    run["images"] += part["images"]
    run["tokens"] += part["tokens"]
    run["forwards"] += part["forwards"]
    if part["stats"] is not None:
        run["stats"] = part["stats"] if run["stats"] is None else run["stats"].merge(part["stats"])
    run["nll"] += part["nll"]


def _scale(pipe, system: dict) -> float:
    return pipe.cfg_scale if system["cfg_scale"] is None else system["cfg_scale"]


def _noise_floor(pipe, systems: list, chunks: list, seed: int, ckpt=None, bs: int = 0, progress: bool = False) -> dict:
    """Per guidance scale of the run, AR again (untimed) on a disjoint seed set (seed set B): how far AR's
    figures move with the seeds alone. ``{cfg_scale: {"images", "code_nll"}}``; batch by batch into ``ckpt``
    (a :class:`BenchCheckpoint`) when given, resuming after its last finished batch."""
    from tqdm.auto import tqdm

    out = {}
    for s in systems:
        if s["drafter"] is not None or s["cfg_scale"] in out:
            continue
        pipe.drafter, pipe.rule = None, None
        kind = f"noise:{s['cfg_scale']}"  # one seed-set-B run per guidance scale
        done = ckpt.chunks(bs, kind) if ckpt is not None else []
        images, nll = [], []
        for entry in done:
            images += entry["images"]
            nll += entry["nll"]
        for i in tqdm(range(len(done), len(chunks)), initial=len(done), total=len(chunks), file=sys.stderr,
                      desc=f"AR noise floor (seeds B) bs={bs}", disable=not progress, leave=False):
            part = {"images": pipe(chunks[i], seed=seed + 1_000_003 + i, cfg_scale=s["cfg_scale"])}
            part.update(nll=code_nll(pipe, chunks[i], pipe.last_codes, _scale(pipe, s)),
                        codes=pipe.last_codes.tolist())
            if ckpt is not None:
                part = ckpt.append({"kind": kind, "batch_size": bs, "chunk": i, **part})
            images += part["images"]
            nll += part["nll"]
        out[s["cfg_scale"]] = {"images": images, "code_nll": statistics.fmean(nll)}
    return out


def _fingerprint(model: str, prompts: list, systems: list, cfg, device) -> dict:
    """What must match for a checkpoint's batches to belong to this run: everything that decides the codes drawn
    (the generator's and the spatial heads' files, prompts, systems, seed, dtype, device, threads) and how the
    prompts are batched."""
    folders = {"model": model}
    for s in systems:
        head = (s["drafter"] or "").split(";")[0]
        if head.startswith("spatial"):  # a bare "spatial" is the shipped head (ssd.bundled_spatial_head)
            folders[head] = head.partition(":")[2] or os.path.join(os.path.dirname(__file__), "assets",
                                                                   "spatial-head")
    out = {"files": {k: _folder_digest(v) for k, v in folders.items()}, "systems": [s["name"] for s in systems],
           "n": len(prompts), "prompts_sha256": hashlib.sha256("\n".join(prompts).encode()).hexdigest(),
           "seed": cfg.seed, "dtype": cfg.dtype, "device": str(device), "threads": cfg.threads,
           "batch_sizes": list(cfg.batch_sizes)}
    if getattr(cfg, "quality", "quick") != "quick":  # absent from a quick run's header: older checkpoints still match
        out["quality"] = cfg.quality
    return out


def _folder_digest(path: str) -> dict:
    """``{relative file: sha256}`` of a model folder, logs (``*.jsonl``) left out so that an evaluation appended
    beside the weights does not orphan a checkpoint; files over 256 MB by size and mtime (hashing a 7B checkpoint
    would take minutes)."""
    out = {}
    for root, _, names in os.walk(path):
        for name in sorted(names):
            if name.endswith(".jsonl"):
                continue
            full = os.path.join(root, name)
            st = os.stat(full)
            if st.st_size > 256 << 20:
                out[os.path.relpath(full, path)] = f"{st.st_size}:{st.st_mtime_ns}"
            else:
                out[os.path.relpath(full, path)] = file_sha256(full)
    return dict(sorted(out.items()))


class BenchCheckpoint:
    """An append-only JSONL checkpoint of an images bench run: a header line (the run's fingerprint), then one line
    per finished batch (``{"kind": "chunk" | "noise:SCALE", "batch_size", "chunk", ...}``), each written with one
    ``write`` and ``fsync``. Opening an existing file reads its lines back; a torn last line (a kill mid-write) is
    cut off; a header from another configuration raises :class:`~mmspec.InvalidInputError`. Images are stored as
    PNG (exact pixels), ``SpecStats`` as their fields, so what is read back equals what was measured.

    Example:
        >>> import tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "ck.jsonl")
        >>> ck = BenchCheckpoint(path, {"seed": 0})
        >>> _ = ck.append({"kind": "noise:None", "batch_size": 1, "chunk": 0, "nll": [0.5], "images": []})
        >>> [e["nll"] for e in BenchCheckpoint(path, {"seed": 0}).chunks(1, "noise:None")]
        [[0.5]]
        >>> BenchCheckpoint(path, {"seed": 1})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        mmspec.errors.InvalidInputError: checkpoint ... was written by another run (seed differs: 0 there, 1 here); give the same flags, or another --resume path
    """

    _FORMAT = "mmspec-images-bench-checkpoint/1"

    def __init__(self, path: str, fingerprint: dict):
        self.path, self.fingerprint = path, json.loads(json.dumps(fingerprint))  # as JSON reads it back
        self._entries = []
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            raise InvalidInputError(f"cannot write checkpoint {path}: folder {folder} does not exist")
        raw = open(path, "rb").read() if os.path.exists(path) else b""
        lines, good = raw.split(b"\n"), 0  # good: bytes of complete, readable lines
        for n, line in enumerate(lines[:-1]):  # the piece after the last newline is a torn write (or empty)
            try:
                obj = json.loads(line)
            except ValueError:
                if n < len(lines) - 2:
                    raise InvalidInputError(f"checkpoint {path} is damaged at line {n + 1} (not JSON); move it "
                                            "away to start afresh") from None
                break  # a damaged last line: cut off like a torn one
            if n == 0:
                self._check_header(obj)
            else:
                self._entries.append(obj)
            good += len(line) + 1
        if good == 0:  # new (or only a torn header): start it
            with open(path, "wb") as f:
                self._write(f, {"format": self._FORMAT, "fingerprint": self.fingerprint})
        elif good < len(raw):
            with open(path, "r+b") as f:
                f.truncate(good)

    def _check_header(self, header: dict) -> None:
        if not isinstance(header, dict) or header.get("format") != self._FORMAT:
            raise InvalidInputError(f"{self.path} is not an images bench checkpoint (no {self._FORMAT} header)")
        theirs, mine = header.get("fingerprint", {}), self.fingerprint
        diff = [k for k in dict.fromkeys([*mine, *theirs]) if theirs.get(k) != mine.get(k)]
        if diff:
            k = diff[0]
            said = "" if k in ("files", "prompts_sha256", "systems") else \
                f": {theirs.get(k)!r} there, {mine.get(k)!r} here"
            raise InvalidInputError(f"checkpoint {self.path} was written by another run ({', '.join(diff)} "
                                    f"differ{'s' if len(diff) == 1 else ''}{said}); give the same flags, or another "
                                    "--resume path")

    @staticmethod
    def _write(f, obj: dict) -> None:
        f.write((json.dumps(obj, default=_encode) + "\n").encode())
        f.flush()
        os.fsync(f.fileno())

    def append(self, entry: dict) -> dict:
        """Write one finished batch (images, ``SpecStats`` and codes encoded) and return it as it reads back."""
        with open(self.path, "ab") as f:
            self._write(f, entry)
        self._entries.append(json.loads(json.dumps(entry, default=_encode)))
        return _decoded(self._entries[-1])

    def chunks(self, batch_size: int, kind: str) -> list[dict]:
        """The finished batches of one kind (``"chunk"``, or ``"noise:SCALE"``) at ``batch_size``, in order from
        the first; decoded (PIL images, ``SpecStats``)."""
        out = [e for e in self._entries if e.get("batch_size") == batch_size and e.get("kind") == kind]
        for i, e in enumerate(out):
            if e.get("chunk") != i:
                raise InvalidInputError(f"checkpoint {self.path}: {kind} batches at batch size {batch_size} are not "
                                        f"in order (batch {e.get('chunk')} where {i} was due); move it away")
        return [_decoded(e) for e in out]


def _encode(obj):
    """JSON for what a batch holds besides plain values: PIL images as base64 PNG, ``SpecStats`` as its fields."""
    from PIL import Image

    from mmspec.stats import SpecStats

    if isinstance(obj, Image.Image):
        buf = io.BytesIO()
        obj.save(buf, format="PNG")
        return {"png": base64.b64encode(buf.getvalue()).decode("ascii")}
    if isinstance(obj, SpecStats):
        return {"spec_stats": {f.name: getattr(obj, f.name) for f in fields(SpecStats)}}
    if hasattr(obj, "item"):  # a numpy / torch scalar among the drafter's counters
        return obj.item()
    raise TypeError(f"cannot checkpoint a {type(obj).__name__}")


def _decoded(obj):
    """Inverse of :func:`_encode` over a read-back entry."""
    from PIL import Image

    from mmspec.stats import SpecStats

    if isinstance(obj, list):
        return [_decoded(x) for x in obj]
    if not isinstance(obj, dict):
        return obj
    if set(obj) == {"png"}:
        img = Image.open(io.BytesIO(base64.b64decode(obj["png"])))
        img.load()
        return img.copy()  # a plain in-memory image, as the pipeline returns
    if set(obj) == {"spec_stats"}:
        return SpecStats(**obj["spec_stats"])
    return {k: _decoded(v) for k, v in obj.items()}
