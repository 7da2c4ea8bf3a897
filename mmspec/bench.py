"""``mmspec bench``: plain AR, transformers' assisted generation and mmspec drafters, measured in one run.

Why: a speedup is only worth quoting as a ratio measured in one run, plain autoregressive decoding and
the speculative systems interleaved on the same inputs after a warm-up (DESIGN.md, conventions). This
module is that measurement, once, for every system: ``ar`` (``model.generate``), transformers' own
assisted generation (``hf-prompt-lookup``, ``hf-assistant``) and every mmspec drafter the registry
knows (``lookup``, ``draft-model``, and kinds later issues register: ``eagle:PATH``, ``glance:PATH``...).

How it measures, per (workload, batch size):

* each example goes through the target pipeline's own preprocessing (:meth:`VLMPipeline.prepare`: chat
  template, images; batches are left-padded by the processor);
* one untimed warm-up pass of every system over the first batch (then drafters forget what they
  remembered across requests: a timed request is never drafted from its own earlier output);
* then, batch by batch, every system runs back to back on the same inputs, in an order rotated per
  batch to spread drift, each timed with ``time.perf_counter`` (CUDA synchronised on GPU);
* ``speedup_vs_ar`` = (sum of AR times) / (sum of the system's times) over the same batches
  (``speedup_median``: the median of the per-batch ratios, robust to a disturbed run);
  ``identical_to_ar`` says whether every output equalled AR's token for token (greedy), ``identical_rate``
  the share of rows that did (up to each row's first eos); for a row that differs, ``divergences`` gives
  the first differing position, both tokens and the target's logit margin between them there (one
  teacher-forced pass over AR's output): in bf16 a pass over several tokens may round differently from a
  one-token step, so a near-tie can flip (margin of a rounding step) where fp32 is exact;
* τ, per-position acceptance and the accepted-length histogram are pooled over all rounds with
  :meth:`SpecStats.merge`; transformers does not expose its rounds, so τ is ``null`` there, but its
  target forward passes are counted with a forward pre-hook (``forwards_per_token``).

transformers' assisted generation is batch-1 only, so its batch>1 records say ``"unsupported: ..."``. A
system that raises is recorded as ``"error: ..."`` and the run goes on (transformers 5.24's prompt lookup
copies a chat prompt's image placeholder tokens into its drafts, which Qwen2-VL then rejects).

The parts, each a module of its own (this one re-exports their public names, so ``mmspec.bench`` stays the
one place to import from): :mod:`~mmspec.bench_options` (names and command-line values, checked before anything
loads), :mod:`~mmspec.bench_systems` (the systems), :mod:`~mmspec.bench_timing` (the interleaved, timed loop),
:mod:`~mmspec.bench_records` (the JSON records) and :mod:`~mmspec.bench_report` (table and plots); this module
keeps the run's configuration and the entry point, :func:`run_bench`.

Example:
    >>> cfg = BenchConfig(workloads=["docs"], quick=True)                       # doctest: +SKIP
    >>> report = run_bench(cfg)                                                 # doctest: +SKIP
    >>> print(report.table()); report.save_json("b.json"); report.save_png("b.png")  # doctest: +SKIP
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

# The parts of the bench; every name other modules and tests import from ``mmspec.bench`` is re-exported here
# (underscored ones included: tests reach into the loop), so callers never need to know the split.
from .bench_options import (  # noqa: F401 - re-exports
    BUDGET_SUFFIX, BUILTIN_SYSTEMS, CEILING_DEPTH, DEFAULT_WORKLOADS, HF_BATCH1_ONLY, LOOKUP_WITH_HISTORY,
    SAMPLING_KEYS, _check_models, _Named, _resolve_workloads, _same_folder, default_model_path, model_for,
    model_pairs, parse_csv, parse_sampling, split_rule)
from .bench_records import MEASURED_FIELDS, _meta, _of_ceiling, _record, dtype_name, plain_record  # noqa: F401
from .bench_report import BenchReport  # noqa: F401
from .bench_systems import (  # noqa: F401 - re-exports
    ARSystem, CeilingSystem, HFAssistedSystem, MMSpecSystem, System, _resolve_systems, build_systems, count_forwards,
    placeholder_token_ids)
from .bench_timing import _bench_cell, _divergences, _eos_ids, _row_tokens, _timed  # noqa: F401
from .checkpoints import dtype_note, resolve_dtype
from .errors import InvalidInputError
from .inputs import load_requests

__all__ = ["BenchConfig", "BenchReport", "System", "run_bench", "default_model_path", "parse_csv", "plain_record",
           "model_for", "model_pairs",
           "check_outputs", "count_forwards", "BUILTIN_SYSTEMS", "DEFAULT_WORKLOADS", "HF_BATCH1_ONLY"]

_QUICK = {"n": 4, "max_new_tokens": 16}
_FULL = {"n": 8, "max_new_tokens": 64}
# --quality full (images): FID's covariances over the classifier's 512-d features need more images than dimensions;
# 1000 per system is the floor of a quality run, generated in batches of 16 unless batch sizes are given.
# They stay in this module, beside BenchConfig that reads them: a test patches mmspec.bench.QUALITY_FULL_N.
QUALITY_FULL_N = 1000
QUALITY_FULL_BATCH = 16


# ---------------------------------------------------------------------------- configuration
@dataclass
class BenchConfig:
    """What to benchmark; ``None`` fields take defaults (``quick`` picks smaller ones).

    Attributes:
        model: target folder (default :func:`default_model_path`).
        workloads: workload names (default: those of ``docs``, ``charts`` that are registered).
        systems: system names: ``ar``, ``hf-prompt-lookup``, ``hf-assistant``, or an mmspec drafter spec
            (``lookup``, ``draft-model``, ``kind:PATH``, ``kind:PATH;key=value``), or ``ceiling`` (a perfect
            drafter, ``ceiling;depth=N``). Default: AR, the ceiling, HF prompt lookup and mmspec lookup, the drafters bundled for the default target (``eagle``) when no model
            is named, plus ``hf-assistant`` and ``draft-model`` when ``draft_model`` is given. AR always runs: it is
            the reference every ratio is taken against.
        draft_model: folder of a small model with the target's tokenizer (mmspec ``draft-model`` and the
            HF assistant share it).
        n: examples per workload; max_new_tokens: tokens generated per example.
        batch_sizes: batch sizes to measure (the processor left-pads a batch).
        lookup_tokens: draft depth of both prompt-lookup systems (HF ``prompt_lookup_num_tokens`` and
            mmspec lookup's ``num_draft_tokens``), so they compare like for like.
        device: ``"cpu"``, ``"cuda"``...; default CUDA when available.
        threads: ``torch.set_num_threads`` for the run (default: torch's choice). On a small, busy CPU one
            thread is often faster and steadier for tiny models.
        dtype: the dtype every model runs in: ``"auto"`` (default, the checkpoint's stored dtype: bf16 for
            the bundled models), ``"bfloat16"``, ``"float16"``, ``"float32"``.
        inputs: a JSONL file of the user's own requests (:mod:`mmspec.inputs`), measured instead of
            ``workloads`` as one workload named ``inputs:<file name>``; ``n`` (default: every line) takes
            the first ``n``. Quality fields come from the lines' ``reference``.
        sampling: ``None`` (greedy, the default) or the sampling settings every system runs with
            (``{"temperature": 1.0, "top_k": 50, "top_p": 0.9}``, see :func:`parse_sampling`): AR samples
            with ``generate(do_sample=True)``, mmspec systems with their acceptance rule (the lossless
            ``speculative_sampling`` unless a system names another, ``eagle;rule=sample_then_match``). Each
            batch gets the same seed in every system; outputs are not compared token for token (a lossless
            sampler keeps AR's distribution, not its draws), so identity fields are ``None`` and ``lossless``
            is the rule's own declaration. The ceiling, a greedy oracle, does not run.
        resume: a checkpoint file for workloads that support one (:attr:`~mmspec.workloads.Workload.resumable`:
            ``images``): each finished batch is appended to it, and a run with the same settings and path continues
            after the last finished batch (a checkpoint from other settings is refused).
        quality: ``"quick"`` (default) or ``"full"``, the quality run of workloads that have one
            (:attr:`~mmspec.workloads.Workload.quality_full`: ``images``): at least :data:`QUALITY_FULL_N` items
            (the default ``n``; fewer is refused), the AR-vs-AR noise floor always, records marked
            ``quality["mode"] = "full"``. Its speed fields are those of its batch sizes (the CLI's default there is
            :data:`QUALITY_FULL_BATCH`), not of the batch-1 latency table.

    Example:
        >>> BenchConfig(quick=True).resolved_sizes()
        (4, 16)
        >>> BenchConfig(quality="full").resolved_sizes()[0]
        1000
    """

    model: str | None = None
    workloads: list | None = None
    systems: list | None = None
    draft_model: str | None = None
    n: int | None = None
    max_new_tokens: int | None = None
    batch_sizes: list = field(default_factory=lambda: [1, 4])
    split: str = "test"
    seed: int = 0
    quick: bool = False
    lookup_tokens: int = 8
    device: str | None = None
    threads: int | None = None
    dtype: str | None = "auto"
    inputs: str | None = None
    sampling: dict | None = None
    resume: str | None = None
    quality: str = "quick"

    def resolved_device(self) -> torch.device:
        """``device``, or CUDA when available, else the CPU: where every system and plain pipeline runs.

        Example:
            >>> BenchConfig(device="cpu").resolved_device()
            device(type='cpu')
        """
        return torch.device(self.device or ("cuda" if torch.cuda.is_available() else "cpu"))

    def resolved_sizes(self) -> tuple[int, int]:
        """``(n, max_new_tokens)`` after defaults; raises on non-positive values."""
        if self.quality not in ("quick", "full"):
            raise InvalidInputError(f"quality must be 'quick' or 'full' (got {self.quality!r})")
        base = _QUICK if self.quick else _FULL
        full = self.quality == "full"
        n = (QUALITY_FULL_N if full else base["n"]) if self.n is None else self.n
        new = base["max_new_tokens"] if self.max_new_tokens is None else self.max_new_tokens
        for name, v in (("n", n), ("max_new_tokens", new)):
            if not isinstance(v, int) or v < 1:
                raise InvalidInputError(f"{name} must be a positive integer (got {v!r})")
        if full and (n < QUALITY_FULL_N or self.quick):
            raise InvalidInputError(f"--quality full measures at least {QUALITY_FULL_N} images per system (FID over "
                                    f"512-d features); got {'--quick' if self.quick else f'--n {n}'}")
        return n, new


# ---------------------------------------------------------------------------- entry point
@contextmanager
def _quiet_transformers():
    """Silence transformers' advisory warnings for the run (restoring the verbosity after)."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


def run_bench(cfg: BenchConfig, progress: bool = True) -> BenchReport:
    """Run the benchmark ``cfg`` describes and return its :class:`BenchReport`.

    Why: the one measurement every speedup claim of the project comes from (see the module docstring
    for the protocol). Everything a user can get wrong (unknown workload or system, a missing draft
    model, bad sizes) raises :class:`~mmspec.InvalidInputError` before the model is loaded; output paths
    are checked by :func:`check_outputs`.

    Example:
        >>> report = run_bench(BenchConfig(workloads=["docs"], systems=["lookup"], quick=True))  # doctest: +SKIP
        >>> [(r["system"], r["batch_size"], r["speedup_vs_ar"]) for r in report.results]     # doctest: +SKIP
    """
    from tqdm.auto import tqdm

    from .pipelines import MMSpecPipeline

    n, max_new = cfg.resolved_sizes()
    if not cfg.batch_sizes or any(not isinstance(b, int) or b < 1 for b in cfg.batch_sizes):
        raise InvalidInputError(f"batch sizes must be positive integers (got {cfg.batch_sizes!r})")
    requests = None
    if cfg.inputs is not None:
        if cfg.workloads:
            raise InvalidInputError("--inputs replaces --workload: give one or the other")
        requests = load_requests(cfg.inputs)
        n = len(requests) if cfg.n is None else min(n, len(requests))
    every = _resolve_workloads(cfg.workloads)
    plain = [w for w in every if w.plain_pipeline]
    workloads = [w for w in every if not w.plain_pipeline]
    if plain and cfg.sampling is not None:
        raise InvalidInputError(f"--sample applies to the VLM workloads; {', '.join(w.name for w in plain)} run "
                                "their own pipelines' decoding (measure them in a run without --sample)")
    if cfg.quality == "full" and (workloads or requests is not None or any(not w.quality_full for w in plain)):
        others = [w.name for w in every if not w.quality_full] or ["--inputs"]
        raise InvalidInputError(f"--quality full has no quality run for {', '.join(others)}; it is the images "
                                "workload's (--workload images)")
    if cfg.resume and (workloads or requests is not None or any(not w.resumable for w in plain)):
        others = [w.name for w in every if not w.resumable] or ["--inputs"]
        raise InvalidInputError(f"--resume is not supported for {', '.join(others)}: run without it")
    plain_models = {w.name: model_for(w.name, cfg.model) or w.bundled_model() for w in plain}
    for name, path in plain_models.items():
        if not path:
            raise InvalidInputError(f"no model for workload {name!r}: none is bundled; pass --model "
                                    f"{name}=PATH (or one --model for every workload)")
    for w in plain:
        if w.plain_systems:
            w.check_plain_systems(cfg.systems)  # an unknown system is said before any model loads
    fixed = [w for w in plain if not w.plain_systems]  # the others measure cfg.systems themselves
    if fixed and not workloads and any(s != "ar" for s in cfg.systems or []):
        raise InvalidInputError(f"workloads {', '.join(w.name for w in fixed)} have no speculative systems yet; "
                                "their plain pipeline is measured as 'ar'")
    vlm_models = {model_for(w.name, cfg.model) for w in workloads} if cfg.model else {None}
    if len(vlm_models) > 1:
        raise InvalidInputError(f"one run measures one target: --model names {sorted(map(str, vlm_models))} for "
                                f"{', '.join(w.name for w in workloads)}; run them separately")
    vlm_model = next(iter(vlm_models)) if workloads else None
    # The shipped drafters, when the target is the bundled one (named or by default): "eagle" means its head.
    bundled = next((w.bundled_drafters() for w in workloads
                    if w.bundled_model() and (not vlm_model or _same_folder(vlm_model, w.bundled_model()))), [])
    # Systems a workload measures itself (the docs workload's "hierarchical") go to its bench_own, not to the loop.
    own = {w.name: [s for s in cfg.systems or [] if s.split(";")[0].strip() in w.own_systems] for w in workloads}
    if any(own.values()) and requests is not None:
        raise InvalidInputError("systems a workload measures itself (e.g. 'hierarchical') run on its pages, not on "
                                "--inputs")
    for w in workloads:
        if own[w.name]:
            w.check_own(own[w.name], bundled)
    owned = {s for names_ in own.values() for s in names_}
    rest = None if cfg.systems is None else [s for s in cfg.systems if s not in owned]
    names = _resolve_systems(rest or (["ar"] if owned else rest), cfg.draft_model, bundled) if workloads else []
    _check_models(cfg.model, every)  # after the checks of the request itself, before anything loads
    torch.manual_seed(cfg.seed)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    results = []
    for w in plain:
        with _quiet_transformers():
            results += w.bench_plain(plain_models[w.name], w.examples(cfg.split, n), cfg, progress)
    if not workloads:
        return BenchReport(results, {**_meta(cfg, None, None, n, max_new), "models": plain_models})
    examples = {w.name: w.examples(cfg.split, n) for w in workloads} if requests is None else {}
    model_path = vlm_model or default_model_path(workloads)
    if requests is not None:  # the user's own requests, in place of the workloads (the default target stays)
        name = f"inputs:{os.path.basename(cfg.inputs)}"
        workloads, examples = [_Named(name)], {name: requests[:n]}
    with _quiet_transformers():
        device = cfg.resolved_device()
        pipe = MMSpecPipeline.from_pretrained(model_path, dtype=resolve_dtype(cfg.dtype, model_path, device))
        pipe.model.to(device)
        systems = build_systems(names, pipe.model, cfg, max_new)
        eos_ids = _eos_ids(pipe.model)
        total = sum((-(-n // bs) + 1) * len(systems) for bs in cfg.batch_sizes) * len(workloads)
        with tqdm(total=total, desc="mmspec bench", file=sys.stderr, disable=not progress, leave=False) as bar:
            for wl in workloads:
                for bs in cfg.batch_sizes:
                    chunks = [examples[wl.name][i:i + bs] for i in range(0, n, bs)]
                    batches = [pipe.prepare(images=[e.images for e in c], prompt=[e.prompt for e in c]).to(device)
                               for c in chunks]
                    ids = [",".join(e.id for e in c) for c in chunks]
                    bar.set_postfix_str(f"{wl.name} bs={bs}")
                    tok = pipe.tokenizer  # each answer as the target would emit it, end of turn included
                    references = [[tok(e.target + (tok.eos_token or ""), add_special_tokens=False)["input_ids"]
                                   if e.target else [] for e in c] for c in chunks]
                    tallies = _bench_cell(batches, ids, bs, systems, device, eos_ids, bar, decode=pipe.decode_new,
                                          references=references, seed=cfg.seed)
                    ar = tallies[0]
                    refs = [e.target if e.target or e.meta.get("has_reference") else None
                            for c in chunks for e in c]
                    results += _of_ceiling([_record(wl.name, bs, n, t, ar, refs) for t in tallies])
                if own.get(wl.name):
                    results += wl.bench_own(pipe, own[wl.name], cfg, progress, bundled)
    meta = _meta(cfg, model_path, pipe.model, n, max_new)
    meta["dtype_note"] = dtype_note(cfg.dtype, model_path, device)
    if plain_models:
        meta["models"] = {**plain_models, **{w.name: model_path for w in workloads}}
    return BenchReport(results, meta)


def check_outputs(json_path=None, png_path=None) -> None:
    """Fail before a long run, not after it: output folders must exist and ``--png`` needs matplotlib.

    Example:
        >>> check_outputs(json_path="/no/such/dir/b.json")
        Traceback (most recent call last):
        ...
        mmspec.errors.InvalidInputError: cannot write /no/such/dir/b.json: folder /no/such/dir does not exist
    """
    for path in (json_path, png_path):
        folder = os.path.dirname(os.path.abspath(path)) if path else None
        if folder and not os.path.isdir(folder):
            raise InvalidInputError(f"cannot write {path}: folder {folder} does not exist")
    if png_path:
        try:
            import matplotlib  # noqa: F401
        except ImportError as e:
            raise InvalidInputError("--png needs matplotlib: pip install 'mmspec[bench]'") from e
