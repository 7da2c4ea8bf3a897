"""The ``hierarchical`` system of ``mmspec bench --workload docs``: hierarchical parallel decoding against
full-page decoding, with and without speculation, on the same pages in one run.

Why: HPD's gain has two sources, reading the blocks side by side and speculating inside each block; a claim
about it must separate them and say what it costs in quality. For each group of pages (``batch_size`` pages at
a time, the bench's batch sizes), every configuration the named systems need runs back to back on the same
pages, in an order rotated per batch, after an untimed warm-up on the first batch:

* ``full-page AR``: ``model.generate`` on each page with the page prompt (the reference of every ratio);
* ``full-page + drafter``: :func:`mmspec.generate` on the same pages (lossless: the same text);
* ``hierarchical AR``: :class:`~mmspec.vision.documents.hierarchical.HierarchicalParser` without a drafter
  (layout stage included in its time);
* ``hierarchical + drafter``: the same with speculative decoding inside each row.

Pages are decoded to their end (``page_tokens``, default 1024, and ``block_tokens``, default 512, are caps
that only a looping row reaches; the record counts those). Spec grammar:
``hierarchical[;pages=default|dense][;page_tokens=N][;block_tokens=N][;layout=DIR][;lines_per_row=N]
[;row_tokens=N][;drafter=SPEC]`` where ``lines_per_row`` and ``row_tokens`` plan the reader's rows
(:class:`~mmspec.vision.documents.hierarchical.SegmentedRows`) and ``drafter=`` comes last and takes the rest
of the string (a drafter spec may carry ``;`` options); a trained kind named bare (``drafter=eagle``) means the head shipped for the bundled target.

Example:
    >>> parse_hierarchical("hierarchical;pages=dense;drafter=eagle;topk=3", ["eagle:/heads/e"])["drafter"]
    'eagle:/heads/e;topk=3'
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from mmspec.errors import InvalidInputError

from ..reader.workloads import PAGE_PROMPTS as READER_PROMPTS
from ..reader.workloads import ReaderDocsWorkload
from ..workloads.docs import DENSE_PAGES, PAGE_PROMPTS, DocsWorkload, block_markdown
from .hierarchical import is_reader

__all__ = ["parse_hierarchical", "bench_hierarchical", "exact_blocks", "HierarchicalSystems", "HierarchicalDocsWorkload",
           "HierarchicalReaderDocsWorkload"]

_KEYS = {"pages": str, "page_tokens": int, "block_tokens": int, "layout": str, "lines_per_row": int,
         "row_tokens": int}


def parse_hierarchical(spec: str, bundled=()) -> dict:
    """A ``hierarchical`` system spec as a dict: ``pages``, ``page_tokens``, ``block_tokens``, ``layout``,
    ``drafter`` (a spec or ``None``) and ``label`` (the record's ``system``: every option as given, ``layout=``
    included, so two systems differing only in their detector stay apart). Raises on bad options.

    Example:
        >>> parse_hierarchical("hierarchical")["label"], parse_hierarchical("hierarchical;pages=dense")["pages"]
        ('hierarchical', 'dense')
        >>> parse_hierarchical("hierarchical;pages=tall")
        Traceback (most recent call last):
        ...
        mmspec.errors.InvalidInputError: system 'hierarchical;pages=tall': pages must be 'default' or 'dense'
    """
    head, sep, drafter = spec.partition(";drafter=")
    parts = head.split(";")
    if parts[0].strip() != "hierarchical":
        raise InvalidInputError(f"not a hierarchical system: {spec!r}")
    out = {"pages": "default", "page_tokens": 1024, "block_tokens": 512, "layout": None, "lines_per_row": None,
           "row_tokens": None, "drafter": drafter.strip() or None if sep else None}
    for opt in parts[1:]:
        key, eq, value = opt.partition("=")
        key = key.strip()
        if not eq or key not in _KEYS:
            raise InvalidInputError(f"system {spec!r}: unknown option {opt!r} (options: {', '.join(_KEYS)}, "
                                    "drafter=SPEC last)")
        try:
            out[key] = _KEYS[key](value.strip())
        except ValueError as e:
            raise InvalidInputError(f"system {spec!r}: bad {key}: {e}") from e
    if out["pages"] not in ("default", "dense"):
        raise InvalidInputError(f"system {spec!r}: pages must be 'default' or 'dense'")
    if out["page_tokens"] < 1 or out["block_tokens"] < 1:
        raise InvalidInputError(f"system {spec!r}: page_tokens and block_tokens must be positive")
    if any(out[k] is not None and out[k] < 1 for k in ("lines_per_row", "row_tokens")):
        raise InvalidInputError(f"system {spec!r}: lines_per_row and row_tokens must be positive")
    if out["layout"] is not None and (out["lines_per_row"] or out["row_tokens"]):
        raise InvalidInputError(f"system {spec!r}: lines_per_row and row_tokens plan the reader's rows; layout= is "
                                "the testbed's detector")
    if sep and out["drafter"] is None:
        raise InvalidInputError(f"system {spec!r}: drafter= names no drafter")
    label_opts = [p.strip() for p in parts[1:]]
    if out["drafter"]:
        from mmspec.bench import System

        shipped = {s.partition(":")[0]: s for s in bundled}
        kind = out["drafter"].split(";")[0]
        if kind in shipped:  # a trained kind named bare: the head that ships for the bundled target
            out["drafter"] = shipped[kind] + out["drafter"][len(kind):]
        label_opts.append("drafter=" + System(out["drafter"], None, 1).label)
    out["label"] = ";".join(["hierarchical"] + label_opts)
    return out


def _key(mode: str, drafter, plan: tuple) -> tuple:
    """A configuration's key among a group's runs (the default row plan keeps the short key)."""
    return (mode, drafter) if plan == (None, None) else (mode, drafter, plan)


def _plan(p: dict) -> tuple:
    """A parsed system's row plan: ``(lines_per_row, row_tokens)``, ``(None, None)`` for the default rows."""
    return p["lines_per_row"], p["row_tokens"]


def exact_blocks(text: str, blocks: list, types=None) -> tuple[int, int]:
    """``(found, total)``: how many of the page's gold ``blocks`` (workload dicts; only ``types`` when given)
    appear word for word as one blank-line-separated part of ``text``.

    Example:
        >>> exact_blocks("# A\\n\\nb c", [{"type": "heading", "level": 1, "text": "A"},
        ...                              {"type": "paragraph", "text": "b d"}])
        (1, 2)
    """
    parts = [p.strip() for p in text.split("\n\n")]
    found = total = 0
    for b in blocks:
        if types is not None and b["type"] not in types:
            continue
        total += 1
        md = block_markdown(b)
        if md in parts:
            parts.remove(md)
            found += 1
    return found, total


class _Run:
    """One configuration (full page or hierarchical, with or without a drafter) and what it accumulated."""

    def __init__(self, mode: str, drafter_spec, pipe, opts: dict, plan: tuple = (None, None)):
        from mmspec.registry import make_drafter

        from .hierarchical import HierarchicalParser, SegmentedRows

        self.mode, self.drafter_spec, self.pipe, self.opts = mode, drafter_spec, pipe, opts
        self.plan = plan if mode == "hierarchical" else (None, None)
        self.drafter = make_drafter(drafter_spec, pipe.model) if drafter_spec else None
        layout = opts["layout"]
        if self.plan != (None, None):  # the reader's rows, planned (checked by bench_hierarchical)
            layout = SegmentedRows(lines_per_row=self.plan[0] or 3, row_tokens=self.plan[1])
        self.parser = (HierarchicalParser(pipe, layout, drafter=self.drafter,
                                          max_new_tokens=opts["block_tokens"]) if mode == "hierarchical" else None)
        self.time, self.batch_times, self.texts, self.stats = 0.0, [], [], None
        self.truncated, self.rows, self.layout_time, self.status, self.new_tokens = 0, 0, 0.0, "ok", 0

    @property
    def key(self):
        return _key(self.mode, self.drafter_spec, self.plan)

    def forget(self):
        if self.drafter is not None:
            self.drafter.forget()

    def run(self, pages: list) -> tuple:
        """(texts, seconds, stats, truncated, rows, layout seconds, new tokens) for ``pages`` (PIL images); new
        tokens count each row's up to its end of turn."""
        from mmspec.decode import generate

        model = self.pipe.model
        t0 = time.perf_counter()
        if self.parser is not None:
            res = self.parser.parse(pages)
            seconds = time.perf_counter() - t0
            return ([p.text for p in res.pages], seconds, res.stats, sum(p.truncated for p in res.pages), res.rows,
                    res.timings["layout"], sum(b["new_tokens"] for p in res.pages for b in p.blocks))
        prompt = READER_PROMPTS[0] if is_reader(self.pipe) else PAGE_PROMPTS[0]  # the parser's rows get the same
        inputs = self.pipe.prepare(images=[[p] for p in pages], prompt=[prompt] * len(pages)).to(model.device)
        with torch.no_grad():
            if self.drafter is None:
                seq, stats = model.generate(**inputs, max_new_tokens=self.opts["page_tokens"], do_sample=False), None
            else:
                out = generate(model, inputs, drafter=self.drafter, max_new_tokens=self.opts["page_tokens"],
                               do_sample=False)
                seq, stats = out.sequences, out.stats
        seconds = time.perf_counter() - t0
        plen = inputs["input_ids"].shape[1]
        eos = model.generation_config.eos_token_id
        eos = set(eos if isinstance(eos, (list, tuple)) else [eos])
        rows = seq[:, plen:].tolist()
        cut = sum(not any(t in eos for t in row) for row in rows)
        new = sum(next((k + 1 for k, t in enumerate(row) if t in eos), len(row)) for row in rows)
        return self.pipe.decode_new(seq, plen), seconds, stats, cut, len(pages), 0.0, new


def _summary(run: _Run, n_pages: int, refs: list, gold: list) -> dict:
    from mmspec.inputs import text_quality

    q = text_quality(run.texts, refs) or {}
    # the reader's pages carry no block list: block counts are the testbed world's
    found = [exact_blocks(t, g) if g is not None else (0, 0) for t, g in zip(run.texts, gold)]
    tables = [exact_blocks(t, g, ("table",)) if g is not None else (0, 0) for t, g in zip(run.texts, gold)]
    return {"pages_per_s": n_pages / run.time if run.time else None, "time_s": run.time,
            "char_error_rate": q.get("char_error_rate"), "exact_pages": q.get("exact_match"),
            "exact_blocks": sum(f for f, _ in found) / max(1, sum(t for _, t in found)),
            "exact_tables": (sum(f for f, _ in tables) / sum(t for _, t in tables)) if sum(t for _, t in tables)
            else None,
            "tau": run.stats.tau if run.stats is not None else (1.0 if run.status == "ok" else None),
            "truncated": run.truncated, "rows": run.rows, "layout_s": run.layout_time, "status": run.status,
            "new_tokens": run.new_tokens, "tokens_per_s": run.new_tokens / run.time if run.time else None,
            "chars_per_page": sum(len(t) for t in run.texts) / max(1, len(run.texts))}


def bench_hierarchical(workload, pipe, systems: list, cfg, progress: bool = True, bundled=()) -> list[dict]:
    """Measure ``hierarchical`` systems (specs as given) on pages of ``workload``'s world with the loaded target
    pipeline ``pipe``; one record per system and batch size (see the module docstring).

    Example:
        >>> recs = bench_hierarchical(DocsWorkload(), pipe, ["hierarchical;drafter=eagle"], cfg)  # doctest: +SKIP
        >>> recs[0]["pages_per_s_vs_ar"], recs[0]["char_error_rate"], recs[0]["split"]          # doctest: +SKIP
    """
    from tqdm.auto import tqdm

    parsed = [(s, parse_hierarchical(s, bundled)) for s in systems]
    n, _ = cfg.resolved_sizes()
    records = []
    groups: dict = {}
    for spec, p in parsed:
        # row plans share a group: one full-page reference, every configuration in one rotation
        groups.setdefault((p["pages"], p["page_tokens"], p["block_tokens"], p["layout"]), []).append((spec, p))
    for (pages_opt, page_tokens, block_tokens, layout), members in groups.items():
        plans = list(dict.fromkeys(_plan(p) for _, p in members))
        if plans != [(None, None)] and not isinstance(workload, ReaderDocsWorkload):
            raise InvalidInputError("lines_per_row and row_tokens plan the reader's rows (the testbed's come from its "
                                    "layout detector)")
        opts = {"page_tokens": page_tokens, "block_tokens": block_tokens, "layout": layout}
        if cfg.sampling is not None:
            for spec, p in members:
                for bs in cfg.batch_sizes:
                    records.append(_record(workload.name, spec, p, bs, n, pipe, None, None, cfg,
                                           "unsupported: hierarchical decoding is measured greedily (no --sample)"))
            continue
        if isinstance(workload, ReaderDocsWorkload):  # the reader's own pages (it reads no other)
            if pages_opt == "dense" or isinstance(layout, str):
                raise InvalidInputError("on the reader, hierarchical rows come from its own segmentation: "
                                        "pages=dense and layout= are the testbed's")
            world = workload
        else:
            world = DocsWorkload(**DENSE_PAGES, seed=workload.seed) if pages_opt == "dense" else \
                DocsWorkload(mode="page", seed=workload.seed)
        examples = world.examples(cfg.split, n)
        refs = [e.target for e in examples]
        gold = [e.meta.get("blocks") for e in examples]
        drafters = list(dict.fromkeys(p["drafter"] for _, p in members if p["drafter"]))
        for bs in cfg.batch_sizes:
            runs = [_Run("full-page", None, pipe, opts)] + [_Run("full-page", d, pipe, opts) for d in drafters]
            for plan in plans:  # each plan's rows without a drafter (its reference), then with each it is asked with
                asked = list(dict.fromkeys(p["drafter"] for _, p in members if _plan(p) == plan and p["drafter"]))
                runs += [_Run("hierarchical", d, pipe, opts, plan) for d in [None] + asked]
            chunks = [examples[i:i + bs] for i in range(0, n, bs)]
            total = len(runs) * (len(chunks) + 1)
            with tqdm(total=total, desc=f"hierarchical {pages_opt} bs={bs}", file=sys.stderr,
                      disable=not progress, leave=False) as bar:
                for r in runs:  # warm-up, untimed; drafters then forget it
                    try:
                        r.run([e.images[0] for e in chunks[0]])
                    except Exception as e:  # noqa: BLE001 - a failing configuration is a result, not a crash
                        if r.key == ("full-page", None):
                            raise
                        r.status = f"error: warm-up: {type(e).__name__}: {' '.join(str(e).split())}"
                    r.forget()
                    bar.update(1)
                for i, chunk in enumerate(chunks):
                    images = [e.images[0] for e in chunk]
                    for r in runs[i % len(runs):] + runs[: i % len(runs)]:
                        bar.update(1)
                        if r.status != "ok":
                            continue
                        try:
                            texts, seconds, stats, cut, rows, lay, new = r.run(images)
                        except Exception as e:  # noqa: BLE001
                            if r.key == ("full-page", None):
                                raise
                            r.status = f"error: {type(e).__name__}: {' '.join(str(e).split())}"
                            continue
                        r.texts += texts
                        r.time += seconds
                        r.batch_times.append(seconds)
                        r.truncated += cut
                        r.rows += rows
                        r.layout_time += lay
                        r.new_tokens += new
                        if stats is not None:
                            r.stats = stats if r.stats is None else r.stats.merge(stats)
            by_key = {r.key: r for r in runs}
            summaries = {k: _summary(r, n, refs, gold) for k, r in by_key.items()}
            for spec, p in members:
                records.append(_record(workload.name, spec, p, bs, n, pipe, by_key, summaries, cfg, None,
                                       pages_opt=pages_opt))
    return records


def _record(workload: str, spec: str, p: dict, bs: int, n: int, pipe, runs, summaries, cfg, status,
            pages_opt: str = "default") -> dict:
    from mmspec.bench import MEASURED_FIELDS, dtype_name

    rec = {"workload": workload, "system": p["label"], "spec": spec, "kind": "hierarchical", "batch_size": bs,
           "n_examples": n, "dtype": dtype_name(getattr(pipe.model, "dtype", None)), "sampling": cfg.sampling,
           "note": None, "of_ceiling": None}
    rec.update(dict.fromkeys(MEASURED_FIELDS + ("pages_per_s", "pages_per_s_vs_ar", "char_error_rate",
                                                "ar_char_error_rate", "split")))
    d = p["drafter"]
    plan = _plan(p)
    main = runs.get(_key("hierarchical", d, plan)) if runs else None
    if status is None and main is not None and main.status != "ok":
        status = main.status
    rec["status"] = status or "ok"
    if rec["status"] != "ok":
        return rec
    ar = runs[("full-page", None)]
    s, a = summaries[_key("hierarchical", d, plan)], summaries[("full-page", None)]
    stats = main.stats
    split = {"pages": pages_opt, "page_tokens": p["page_tokens"], "block_tokens": p["block_tokens"],
             "lines_per_row": plan[0], "row_tokens": plan[1], "full_page_ar": a,
             "hierarchical_ar": summaries[_key("hierarchical", None, plan)]}
    hier_ar = runs[_key("hierarchical", None, plan)]
    split["gain_parallel_blocks"] = ar.time / hier_ar.time if hier_ar.time else None
    if d is not None:
        split["full_page_spec"] = summaries[("full-page", d)]
        full_spec = runs[("full-page", d)]
        split["gain_speculation_hierarchical"] = hier_ar.time / main.time if main.time else None
        split["gain_speculation_full_page"] = (ar.time / full_spec.time if full_spec.time and full_spec.status == "ok"
                                               else None)
        split["full_page_spec_identical_to_ar"] = full_spec.texts == ar.texts if full_spec.status == "ok" else None
        split["hierarchical_spec_identical_to_hierarchical_ar"] = main.texts == hier_ar.texts
    rec.update(
        pages_per_s=s["pages_per_s"], pages_per_s_vs_ar=ar.time / main.time if main.time else None,
        char_error_rate=s["char_error_rate"], ar_char_error_rate=a["char_error_rate"], split=split,
        speedup_vs_ar=ar.time / main.time if main.time else None,
        speedup_median=statistics.median(x / y for x, y in zip(ar.batch_times, main.batch_times)),
        tau=s["tau"], accept_rate=stats.accept_rate if stats else None,
        accepted_hist=list(stats.accepted_hist) if stats else None,
        ceiling_rounds=stats.ceiling_rounds if stats else None,
        forwards_per_token=stats.forwards_per_token if stats else None, time_s=main.time,
        new_tokens=s["new_tokens"], tokens_per_s=s["tokens_per_s"],
        tokens_per_s_vs_ar=s["tokens_per_s"] / a["tokens_per_s"] if s["tokens_per_s"] and a["tokens_per_s"] else None,
        quality={"char_error_rate": s["char_error_rate"], "exact_match": s["exact_pages"],
                 "exact_blocks": s["exact_blocks"], "exact_tables": s["exact_tables"], "n": n},
        # not lossless against the reference (full-page AR): the page text differs by design; each row's exactness
        # against hierarchical AR is in ``split`` (hierarchical_spec_identical_to_hierarchical_ar)
        lossless=False, identical_to_ar=None, identical_rate=None, divergences=[],
        note=("outputs differ from full-page decoding by design (each block is read alone); each row is the "
              "target's greedy decoding of its block. Layout stage included in the time"),
    )
    return rec


class HierarchicalSystems:
    """The ``hierarchical`` systems a docs workload measures itself in ``mmspec bench`` (layout stage, then every
    block as a row of one batch; see the module docstring). Mixed into the docs workloads here, and registered by
    :mod:`mmspec.vision.documents` under their names, so the workload modules import no bench."""

    own_systems = ("hierarchical",)

    def check_own(self, systems, bundled=()):
        """Parse each ``hierarchical`` spec (raises on bad options) before the bench loads anything."""
        for s in systems:
            parse_hierarchical(s, bundled)

    def bench_own(self, pipe, systems, cfg, progress=True, bundled=()):
        """Measure ``hierarchical`` systems against full-page decoding on this world's pages
        (:func:`bench_hierarchical`)."""
        return bench_hierarchical(self, pipe, systems, cfg, progress, bundled)


class HierarchicalDocsWorkload(HierarchicalSystems, DocsWorkload):
    """The ``testbed-docs`` workload as ``mmspec bench`` measures it: the pages of
    :class:`~mmspec.vision.workloads.docs.DocsWorkload`, plus the ``hierarchical`` systems."""


class HierarchicalReaderDocsWorkload(HierarchicalSystems, ReaderDocsWorkload):
    """The reader's ``docs`` workload with the ``hierarchical`` systems (rows from the reader's own segmentation,
    :class:`~mmspec.vision.documents.hierarchical.SegmentedRows`)."""
