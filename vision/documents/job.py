"""The document-parsing batch job behind ``mmspec parse-docs``: pages in, one JSON record per page and one
Markdown file per document out; resumable, split over processes, and one bad file never stops it.

Why: document teams run OCR over thousands of pages (DESIGN.md's third user). The shape follows olmOCR's
pipeline (research/anchors_domains.md §3.5): a work manifest fixed before any model work, done-records
that make a restarted job skip finished pages, per-page retries on a temperature ladder against loops, and
a failed page recorded, not fatal.

* **Work manifest**: every page of every input is an item ``<source>#<page>`` (``OUT/manifest.json``, with
  the settings the outputs depend on: a rerun with other settings on the same folder is refused).
* **Done list**: ``OUT/pages.jsonl`` (see :mod:`.store`); a page is done when its record is there, so a job
  killed at any moment redoes only the pages of the batch it was in, and writes none twice.
* **Processes**: under ``torchrun --nproc_per_node N`` (or ``accelerate launch``) each process reads
  ``RANK`` / ``WORLD_SIZE`` and takes the items whose manifest index is its rank modulo the world size;
  they share the output folder. ``LOCAL_RANK`` picks the GPU when there are GPUs.
* **Decoding**: ``batch_size`` pages at a time through the pipeline's batched, speculative
  :func:`mmspec.generate` (lossless: the text is the target's own). With the repetition guard on (the
  default here, and only here), a page whose decode ends in a loop is cut inside verification and decoded
  again at the next temperature of the ladder; each try is in the record's ``attempts``, and
  ``changed_by_guard`` says whether the text differs from plain greedy decoding because of it.

Example:
    >>> cfg = ParseConfig(inputs=["scans/"], out="parsed/")                        # doctest: +SKIP
    >>> summary = parse_documents(cfg)                                            # doctest: +SKIP
    >>> summary["failed"], summary["pages_per_s"]                                 # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass, field

from mmspec.errors import InvalidInputError, MMSpecError
from mmspec.stats import SpecStats

from .guard import DEFAULT_LADDER, GuardSettings, RepetitionGuard
from .sources import PageLoader, Source, count_pages, discover
from .store import SharedJsonlWriter, atomic_write

__all__ = ["ParseConfig", "parse_documents", "default_prompt", "document_markdown", "process_share",
           "markdown_path"]

MANIFEST = "manifest.json"
PAGES = "pages.jsonl"
MARKDOWN = "markdown"


def default_prompt() -> str:
    """The full-page transcription prompt of the docs workload (the testbed target was trained on it).

    Example:
        >>> default_prompt()
        'Transcribe this page to Markdown.'
    """
    from ..workloads.docs import PAGE_PROMPTS

    return PAGE_PROMPTS[0]


@dataclass
class ParseConfig:
    """Settings of a parse-docs job (the command line's options).

    Attributes:
        inputs: files and folders of images (PNG, JPEG, TIFF, WebP) and PDFs.
        out: output folder (created): ``pages.jsonl``, ``manifest.json``, ``markdown/<input tree>.md``.
        model: target checkpoint (default: the bundled reader; in a checkout without it, the testbed target).
        drafter: a drafter spec, as :func:`mmspec.registry.make_drafter` takes; ``"auto"`` (default): the saved
            drafter with the best validation τ for the target (:mod:`mmspec.drafters.auto`), else the fallback the
            target names (the reader's page lookup, which its shipped heads do not beat) or ``lookup``;
            ``None`` / ``"none"``: plain decoding.
        prompt: the instruction sent with each page (default :func:`default_prompt`).
        batch_size: pages decoded together.
        max_new_tokens: token cap per page; ``None``: the room the context window leaves (pages are decoded
            to their end; a page that reaches the cap counts as a failed try, like a loop).
        longest_side: PDF pages are rendered at this longest side in pixels; ``None``: as large as the
            processor takes without shrinking it (``max_pixels``), else 1288.
        guard: the repetition guard (on by default here; it changes the outputs of looping pages).
        guard_settings: loop definition and retry temperatures (:class:`~.guard.GuardSettings`).
        dtype, device, threads: how the target runs (``device``: default ``cuda:LOCAL_RANK`` with a GPU).
        rank, world_size: this process's share; default from ``RANK`` / ``WORLD_SIZE`` (torchrun).
        progress: a progress bar with pages/s on stderr (rank 0).
        hierarchical: decode each page hierarchically (:mod:`.hierarchical`): the layout stage finds its blocks,
            every block of the batch's pages is one row (``prompt``: the block prompt, default the docs
            workload's), each with the guard and its retries, and the page is assembled in reading order; the
            record's ``blocks`` lists them (type, box, order, text, attempts). A page with no block found is
            decoded whole with the page prompt (``blocks`` empty, ``layout_fallback`` true).
        layout: the layout detector's folder for ``hierarchical`` (default: the bundled one).
    """

    inputs: list
    out: str
    model: str | None = None
    drafter: str | None = "auto"
    prompt: str | None = None
    batch_size: int = 4
    max_new_tokens: int | None = None
    longest_side: int | None = None
    guard: bool = True
    guard_settings: GuardSettings = field(default_factory=GuardSettings)
    dtype: str = "auto"
    device: str | None = None
    threads: int | None = None
    rank: int | None = None
    world_size: int | None = None
    progress: bool = True
    hierarchical: bool = False
    layout: str | None = None


def process_share(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """``(rank, world_size)`` of this process: the arguments, else torchrun's ``RANK`` / ``WORLD_SIZE``.

    Example:
        >>> process_share(1, 2)
        (1, 2)
    """
    try:
        world = int(world_size if world_size is not None else os.environ.get("WORLD_SIZE", "1"))
        rank = int(rank if rank is not None else os.environ.get("RANK", "0"))
    except ValueError as e:
        raise InvalidInputError(f"RANK / WORLD_SIZE must be integers ({e})") from None
    if world < 1 or not 0 <= rank < world:
        raise InvalidInputError(f"rank {rank} is not in a world of {world} processes")
    return rank, world


def markdown_path(out: str, name: str, taken: set | None = None) -> str:
    """Where the Markdown of source ``name`` goes: ``out/markdown/<name without suffix>.md``, or
    ``<name>.md`` when two sources share a stem (``a.pdf`` and ``a.png``).

    Example:
        >>> markdown_path("o", "scans/a.pdf")
        'o/markdown/scans/a.md'
        >>> markdown_path("o", "scans/a.pdf", taken={"scans/a"})
        'o/markdown/scans/a.pdf.md'
    """
    stem = os.path.splitext(name)[0]
    rel = name if taken and stem in taken else stem
    return os.path.join(out, MARKDOWN, rel + ".md")


def document_markdown(records: list) -> str:
    """One document's Markdown from its page records: the pages' texts in order; a document of several pages
    marks each with ``<!-- page N -->``, and a failed page with its error.

    Example:
        >>> document_markdown([{"page": 1, "status": "ok", "text": "# A"}])
        '# A\\n'
        >>> print(document_markdown([{"page": 1, "status": "ok", "text": "a"},
        ...                          {"page": 2, "status": "failed", "text": "", "error": "broken"}]))
        <!-- page 1 -->
        <BLANKLINE>
        a
        <BLANKLINE>
        <!-- page 2: failed: broken -->
        <BLANKLINE>
    """
    records = sorted(records, key=lambda r: r["page"])
    if len(records) == 1 and records[0]["status"] == "ok":
        return records[0]["text"].strip() + "\n"
    parts = []
    for r in records:
        if r["status"] == "ok":
            parts.append(f"<!-- page {r['page']} -->\n\n{r['text'].strip()}")
        else:
            parts.append(f"<!-- page {r['page']}: failed: {' '.join(str(r.get('error')).split())} -->")
    return "\n\n".join(parts) + "\n"


@dataclass
class _Item:
    id: str
    source: Source
    page: int
    pages: int
    error: str | None  # the document could not be opened: the item fails with this


def _manifest(sources: list[Source]) -> list[_Item]:
    items = []
    for s in sources:
        n, err = count_pages(s)
        items += [_Item(f"{s.name}#{p}", s, p, n, err) for p in range(1, n + 1)]
    return items


def _settings(cfg: ParseConfig, model: str, prompt: str) -> dict:
    """What a page's text depends on: a rerun into the same folder must agree (the drafter and the batch size
    do not change a greedy text, so they may change between runs)."""
    if cfg.hierarchical:  # the key only in hierarchical jobs: earlier full-page manifests stay as they were
        from .layout import bundled_layout

        lay = cfg.layout or bundled_layout()
        return {**_settings(ParseConfig(**{**cfg.__dict__, "hierarchical": False}), model, prompt),
                "hierarchical": {"layout": os.path.realpath(lay) if lay else None}}
    return {"model": os.path.realpath(model) if os.path.isdir(model) else model, "prompt": prompt,
            "max_new_tokens": cfg.max_new_tokens, "longest_side": cfg.longest_side, "dtype": cfg.dtype,
            "repetition_guard": cfg.guard_settings.to_dict() if cfg.guard else None}


def _check_job(out: str, settings: dict, items: list[_Item], rank: int) -> None:
    path = os.path.join(out, MANIFEST)
    if os.path.isfile(path):
        try:
            with open(path, encoding="utf-8") as f:
                old = json.load(f)
        except (OSError, ValueError):
            old = None
        if not isinstance(old, dict) or "settings" not in old:
            raise InvalidInputError(f"{path} is not a parse-docs manifest; use another --out")
        if old["settings"] != settings:
            diff = sorted(k for k in set(settings) | set(old["settings"]) if settings.get(k) != old["settings"].get(k))
            raise InvalidInputError(f"{out} holds a job with other settings ({', '.join(diff)}); use another --out "
                                    "or the same settings")
    if rank == 0:  # every process computes the same manifest; one writes it
        atomic_write(path, json.dumps({"settings": settings, "pages": len(items),
                                       "items": [{"id": it.id, "source": it.source.name, "page": it.page,
                                                  "path": it.source.path} for it in items]}, indent=1))


def _default_model(model):
    """``model``, else the bundled reader, else (a checkout without the reader) the bundled testbed target."""
    from mmspec.workloads import get_workload

    if model is None:
        model = get_workload("docs").bundled_model() or get_workload("testbed-docs").bundled_model()
        if model is None:
            raise InvalidInputError("this install has no bundled document model: pass --model")
    return model


def _reads_with_the_reader(pipe, cfg: ParseConfig) -> bool:
    """Whether the job's model is the reader (a loaded pipeline's processor, else the model folder's files)."""
    from ..reader.bundled import is_reader_assets
    from ..reader.processor import PageReaderProcessor
    from .hierarchical import is_reader

    if pipe is not None:
        return is_reader(pipe)
    try:
        model = _default_model(cfg.model)
    except InvalidInputError:
        return False  # said again, with the job's other checks, where the model is needed
    return is_reader_assets(model) or PageReaderProcessor.is_reader_folder(model)


def _load_pipe(model: str, drafter, cfg: ParseConfig):
    import torch

    from mmspec.pipelines import MMSpecPipeline

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    device = cfg.device
    if device is None and torch.cuda.is_available():
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    return MMSpecPipeline.from_pretrained(model, drafter=drafter, dtype=cfg.dtype,
                                          device_map=None if device in (None, "cpu") else device)


def _max_pixels(pipe) -> int | None:
    ip = getattr(pipe.processor, "image_processor", None)
    if ip is None:
        return None
    size = getattr(ip, "size", None) or {}
    return getattr(ip, "max_pixels", None) or (size.get("longest_edge") if isinstance(size, dict) else None)


def _eos_ids(model) -> list[int]:
    eos = model.generation_config.eos_token_id
    eos = eos if isinstance(eos, (list, tuple)) else [eos]
    return [int(e) for e in eos if e is not None]


class _Decoder:
    """Decodes a batch of pages, retrying those that loop on the guard's temperature ladder."""

    def __init__(self, pipe, cfg: ParseConfig, prompt: str):
        self.pipe, self.cfg, self.prompt = pipe, cfg, prompt
        self.eos = _eos_ids(pipe.model)
        if cfg.guard and not self.eos:
            raise InvalidInputError("the repetition guard needs the model's eos_token_id (generation config)")
        self.temps = cfg.guard_settings.temperatures if cfg.guard else (0.0,)
        self.stats = SpecStats()
        self.calls = 0  # pipeline calls so far: an attempt's ``call`` (rows of one call share its time)

    def _max_new(self, images) -> int:
        if self.cfg.max_new_tokens is not None:
            return self.cfg.max_new_tokens
        window = self.pipe.context_window
        if window is None:
            return 4096
        lengths = self.pipe.prepare(images=[[im] for im in images], prompt=[self.prompt] * len(images))
        return max(1, window - int(lengths["attention_mask"].sum(dim=1).max()))

    def _call(self, ids: list, images: list, temperature: float, attempt: int) -> list:
        """One pipeline call over ``images``; per row ``(text, attempt)``, the attempt's record: temperature, seed,
        how it finished (``eos``, ``loop``: the guard ended it, ``length``: the token cap), tokens, τ, rounds."""
        tokens = [[] for _ in images]
        calls = [0] * len(images)

        def on_tokens(r, kept):
            tokens[r].extend(int(t) for t in kept)
            calls[r] += 1

        kw = {"max_new_tokens": self._max_new(images), "on_tokens": on_tokens}
        seed = None
        if temperature > 0:
            seed = int(hashlib.sha256(f"{ids[0]}|{attempt}".encode()).hexdigest()[:8], 16)
            kw.update(do_sample=True, temperature=temperature, seed=seed)
        else:
            kw["do_sample"] = False
        if self.cfg.guard:
            from transformers import LogitsProcessorList

            kw["logits_processor"] = LogitsProcessorList([RepetitionGuard(self.eos[0], self.cfg.guard_settings)])
        t0 = time.perf_counter()
        out = self.pipe(images=[[im] for im in images], prompt=[self.prompt] * len(images), **kw)
        dt = time.perf_counter() - t0
        self.calls += 1
        self.stats.merge(out.stats)
        rows = []
        for text, toks, n_calls in zip(out.text, tokens, calls):
            loop = None
            if toks and toks[-1] in self.eos:
                loop = self.cfg.guard_settings.find(toks[:-1]) if self.cfg.guard else None
                finish = "loop" if loop else "eos"
            else:
                finish = "length"
            rounds = max(0, n_calls - 1)  # the first token comes from the prefill, not a verify round
            tau = (len(toks) - min(1, len(toks))) / rounds if rounds else None
            att = {"temperature": temperature, "seed": seed, "finish": finish, "tokens": len(toks), "tau": tau,
                   "rounds": rounds, "decode_s": dt, "batch": len(images), "call": self.calls}
            if loop:
                att["loop"] = {"period": loop[0], "start": loop[1]}
            rows.append((text, att))
        return rows

    def decode_pages(self, ids: list, images: list) -> list:
        """Per page ``(text, attempts, error, blocks)``; full-page decoding has no blocks (``None``)."""
        return [(t, a, e, None) for t, a, e in self.decode(ids, images)]

    def decode(self, ids: list, images: list) -> list:
        """Per page ``(text, attempts, error)``; ``error`` is ``None`` when a try ended on its own."""
        results: list = [None] * len(ids)
        attempts = [[] for _ in ids]
        last_text = [""] * len(ids)
        pending = list(range(len(ids)))
        for k, temp in enumerate(self.temps, 1):
            if not pending:
                break
            try:
                rows = self._call([ids[i] for i in pending], [images[i] for i in pending], temp, k)
            except MMSpecError:
                # One page the pipeline refuses (e.g. past the context window) must not fail its batch.
                rows = []
                for i in pending:
                    try:
                        rows += self._call([ids[i]], [images[i]], temp, k)
                    except MMSpecError as e:
                        rows.append((None, {"temperature": temp, "finish": "error", "error": str(e)}))
            still = []
            for i, (text, att) in zip(pending, rows):
                attempts[i].append(att)
                if att["finish"] == "error":
                    results[i] = ("", attempts[i], att["error"])
                    continue
                last_text[i] = text
                if att["finish"] == "eos":
                    results[i] = (text, attempts[i], None)
                else:
                    still.append(i)
            pending = still
        for i in pending:
            what = {"loop": "a repetition loop", "length": "the token cap without ending"}
            ends = sorted({what[a["finish"]] for a in attempts[i]})
            results[i] = (last_text[i], attempts[i], f"every try ({len(attempts[i])}) ended in " + " or ".join(ends))
        return results


class _HierarchicalDecoder:
    """Hierarchical pages: the layout stage finds each page's blocks, and every block of the batch's pages is
    one row of a :class:`_Decoder` over the block crops (so each block has the guard and its own retries); a
    page is assembled from its blocks in reading order, and fails when one of its blocks failed. A page where the
    layout stage finds no block is decoded whole with the page prompt (``layout_fallback``): an empty page
    recorded "ok" would hide a missed layout."""

    def __init__(self, pipe, cfg: ParseConfig, prompt: str):
        from .hierarchical import HierarchicalParser

        self.parser = HierarchicalParser(pipe, cfg.layout)  # its layout stage and crops; rows go to _Decoder
        self.rows = _Decoder(pipe, cfg, prompt)
        self.pages = _Decoder(pipe, cfg, cfg.prompt if cfg.prompt is not None else default_prompt())
        self.stats = self.pages.stats = self.rows.stats

    def decode_pages(self, ids: list, images: list) -> list:
        from .hierarchical import assemble

        t0 = time.perf_counter()
        layouts = self.parser.detect(images)
        layout_s = (time.perf_counter() - t0) / max(1, len(images))
        crops, block_ids = [], []
        for pid, page, blocks in zip(ids, images, layouts):
            crops += self.parser.crops(page, blocks)
            block_ids += [f"{pid}/block{b['order']}" for b in blocks]
        rows = iter(self.rows.decode(block_ids, crops) if crops else [])
        empty = [i for i, blocks in enumerate(layouts) if not blocks]
        whole = dict(zip(empty, self.pages.decode([ids[i] for i in empty], [images[i] for i in empty])
                         if empty else []))
        out = []
        for i, blocks in enumerate(layouts):
            if i in whole:
                text, atts, error = whole[i]
                final = atts[-1] if atts else {}
                out.append((text, atts, error, {
                    "layout_s": layout_s, "blocks": [], "layout_fallback": True, "tokens": final.get("tokens", 0),
                    "rounds": final.get("rounds", 0), "tau": final.get("tau"), "changed": _changed(atts),
                    "decode_s": _call_seconds(atts)}))
                continue
            done = [(b, *next(rows)) for b in blocks]
            errors = [f"block {b['order']}: {e}" for b, _, _, e in done if e]
            attempts = [dict(a, block=b["order"]) for b, _, atts, _ in done for a in atts]
            listed = [dict(b, text=(t or "").strip(), attempts=len(atts), error=e) for b, t, atts, e in done]
            text = assemble(blocks, [t or "" for _, t, _, _ in done])
            finals = [atts[-1] for _, _, atts, _ in done if atts]  # each block's last try: what the page holds
            tokens, rounds = sum(a.get("tokens", 0) for a in finals), sum(a.get("rounds", 0) for a in finals)
            tau = sum(max(0, a.get("tokens", 0) - 1) for a in finals) / rounds if rounds else None
            out.append((text, attempts, "; ".join(errors) or None,
                        {"layout_s": layout_s, "blocks": listed, "layout_fallback": False, "tokens": tokens,
                         "rounds": rounds, "tau": tau, "changed": any(_changed(atts) for _, _, atts, _ in done),
                         "decode_s": _call_seconds(attempts)}))
        return out


def _changed(attempts: list) -> bool:
    """Whether one row's tries differ from plain greedy decoding: retried, or its last try ended by the guard."""
    return bool(attempts) and (len(attempts) > 1 or attempts[-1].get("finish") == "loop")


def _call_seconds(attempts: list) -> float:
    """Seconds of the pipeline calls behind ``attempts``, each call once (the rows of one call share its time)."""
    return sum({a.get("call", ("untimed", k)): a.get("decode_s", 0.0) for k, a in enumerate(attempts)}.values())


def _retried(record: dict) -> bool:
    """Whether a page record holds a retry: of one of its blocks (hierarchical), else of the page."""
    if record.get("blocks"):
        return any(b["attempts"] > 1 for b in record["blocks"])
    return len(record["attempts"]) > 1


def _record(item: _Item, text: str, attempts: list, error: str | None, load_s: float, guard: bool, rank: int,
            blocks: dict | None = None) -> dict:
    final = attempts[-1] if attempts else {}
    ok = error is None
    # per row: a hierarchical page is changed when one of its blocks is, not because it has several blocks
    changed = guard and (blocks["changed"] if blocks else _changed(attempts))
    return {
        "id": item.id, "source": item.source.name, "page": item.page, "pages": item.pages,
        "status": "ok" if ok else "failed", "error": error, "text": text or "",
        "blocks": blocks["blocks"] if blocks else None,  # None: full-page decoding (the page is one block)
        "tokens": blocks["tokens"] if blocks else final.get("tokens", 0),
        "tau": blocks["tau"] if blocks else final.get("tau"),
        **({"layout_fallback": blocks["layout_fallback"]} if blocks else {}),
        "attempts": attempts, "changed_by_guard": changed,
        "timings": {"load_s": load_s, "decode_s": blocks["decode_s"] if blocks else _call_seconds(attempts),
                    **({"layout_s": blocks["layout_s"]} if blocks else {})},
        "stats": {"rounds": blocks["rounds"] if blocks else final.get("rounds", 0), "batch": final.get("batch")},
        "rank": rank,  # the process that decoded it (which worker to look at when a page is odd)
    }


def _write_markdown(out: str, names: list, store: SharedJsonlWriter, by_source: dict, taken: set) -> int:
    """Write the Markdown of every document in ``names`` whose pages are all done; returns how many."""
    n = 0
    for name in names:
        ids = by_source[name]
        if all(i in store.done for i in ids):
            atomic_write(markdown_path(out, name, taken), document_markdown([store.rows[i] for i in ids]))
            n += 1
    return n


def parse_documents(cfg: ParseConfig, pipe=None) -> dict:
    """Run (or resume) a parse-docs job; returns its summary (see :func:`_summary`).

    ``pipe``: an already loaded pipeline (else ``cfg.model`` is loaded, only if this process has pages to do).

    Raises:
        InvalidInputError: bad settings, inputs that cannot be found, an ``out`` folder holding another job.

    Example:
        >>> parse_documents(ParseConfig(inputs=["pages/"], out="parsed/", batch_size=8))["pages"]  # doctest: +SKIP
        120
    """
    if isinstance(cfg.batch_size, bool) or not isinstance(cfg.batch_size, int) or cfg.batch_size < 1:
        raise InvalidInputError(f"--batch-size must be a positive integer (got {cfg.batch_size!r})")
    if cfg.max_new_tokens is not None and (not isinstance(cfg.max_new_tokens, int) or cfg.max_new_tokens < 1):
        raise InvalidInputError(f"--max-new-tokens must be a positive integer (got {cfg.max_new_tokens!r})")
    if cfg.longest_side is not None and (not isinstance(cfg.longest_side, int) or cfg.longest_side < 28):
        raise InvalidInputError(f"--longest-side must be an integer >= 28 (got {cfg.longest_side!r})")
    rank, world = process_share(cfg.rank, cfg.world_size)
    out = os.path.abspath(os.path.expanduser(os.fspath(cfg.out)))
    if os.path.exists(out) and not os.path.isdir(out):
        raise InvalidInputError(f"--out {out} is a file; name a folder")
    sources = discover(cfg.inputs, exclude=out)
    if cfg.layout is not None and not cfg.hierarchical:
        raise InvalidInputError("--layout applies to --hierarchical decoding")
    reader = _reads_with_the_reader(pipe, cfg)
    if cfg.hierarchical and reader and cfg.layout is not None:
        raise InvalidInputError("--layout names a layout detector; on the reader, hierarchical rows come from its "
                                "own segmentation")
    if cfg.hierarchical and not reader:  # an unreadable detector is said before any page is counted or any model loads
        from .layout import LayoutDetector, bundled_layout

        if (cfg.layout or bundled_layout()) is None:
            raise InvalidInputError("no layout detector bundled: pass --layout DIR (from `mmspec train-layout`)")
        LayoutDetector.from_pretrained(cfg.layout or bundled_layout())
    if cfg.prompt is not None:
        prompt = cfg.prompt
    elif cfg.hierarchical and not reader:  # the reader reads a row as a small page, with its page prompt
        from ..workloads.docs import BLOCK_PROMPTS

        prompt = BLOCK_PROMPTS[0]
    else:
        prompt = default_prompt()
    if not prompt.strip():
        raise InvalidInputError("the prompt is empty")
    if pipe is None:
        model, drafter = _default_model(cfg.model), (None if cfg.drafter in ("", "none") else cfg.drafter)
        from mmspec.pipelines import load_target_config
        from mmspec.registry import check_drafter_spec

        check_drafter_spec(drafter)  # an unknown drafter is said before the job folder is written
        load_target_config(model)  # a missing or unreadable model is said before any page is counted
    else:
        model, drafter = getattr(pipe.model, "name_or_path", "") or "<pipeline>", None
    items = _manifest(sources)
    os.makedirs(out, exist_ok=True)
    _check_job(out, _settings(cfg, model, prompt), items, rank)
    store = SharedJsonlWriter(os.path.join(out, PAGES))
    by_source: dict = {}
    for it in items:
        by_source.setdefault(it.source.name, []).append(it.id)
    stems: dict = {}
    for name in by_source:
        stems.setdefault(os.path.splitext(name)[0], []).append(name)
    taken = {s for s, names in stems.items() if len(names) > 1}
    mine = [it for i, it in enumerate(items) if i % world == rank]
    todo = [it for it in mine if it.id not in store.done]
    t_start = time.perf_counter()
    decoder = None
    written, failed_now, retried, cut = 0, 0, 0, 0
    try:
        if todo:
            if pipe is None:
                pipe = _load_pipe(model, drafter, cfg)
                if rank == 0 and cfg.progress:
                    for note in getattr(pipe, "notes", []):
                        print(f"parse-docs: {note}", file=sys.stderr)
            decoder = (_HierarchicalDecoder if cfg.hierarchical else _Decoder)(pipe, cfg, prompt)
        loader = PageLoader(cfg.longest_side, _max_pixels(pipe) if pipe is not None else None)
        from tqdm.auto import tqdm

        t_start = time.perf_counter()
        bar = tqdm(total=len(mine), initial=len(mine) - len(todo), unit="page", file=sys.stderr,
                   desc="parse-docs" + (f" [rank {rank}/{world}]" if world > 1 else ""),
                   disable=not cfg.progress or rank != 0)
        with bar:
            for b in range(0, len(todo), cfg.batch_size):
                chunk = todo[b:b + cfg.batch_size]
                records, ok_items, images, loads = [], [], [], []
                for it in chunk:
                    t0 = time.perf_counter()
                    try:
                        if it.error:
                            raise InvalidInputError(it.error)
                        img = loader.load(it.source, it.page)
                    except MMSpecError as e:
                        records.append(_record(it, "", [], str(e), time.perf_counter() - t0, cfg.guard, rank))
                        continue
                    ok_items.append(it)
                    images.append(img)
                    loads.append(time.perf_counter() - t0)
                if ok_items:
                    for it, load_s, (text, attempts, error, blocks) in zip(
                            ok_items, loads, decoder.decode_pages([it.id for it in ok_items], images)):
                        records.append(_record(it, text, attempts, error, load_s, cfg.guard, rank, blocks))
                order = {it.id: k for k, it in enumerate(chunk)}
                records.sort(key=lambda r: order[r["id"]])
                written += store.write_many(records)
                failed_now += sum(r["status"] == "failed" for r in records)
                retried += sum(_retried(r) for r in records)
                cut += sum(any(a.get("finish") == "loop" for a in r["attempts"]) for r in records)
                _write_markdown(out, sorted({it.source.name for it in chunk}), store, by_source, taken)
                bar.update(len(chunk))
                bar.set_postfix(failed=failed_now, refresh=False)
        elapsed = time.perf_counter() - t_start
        loader.close()
        store.refresh()
        # Documents finished by other processes or earlier runs whose Markdown is missing (e.g. killed after the
        # last record but before the Markdown), and those this run touched.
        names = [n for n in by_source if not os.path.isfile(markdown_path(out, n, taken))]
        _write_markdown(out, names, store, by_source, taken)
        if world > 1 and cfg.world_size is None and os.environ.get("MASTER_ADDR"):
            # launched processes (torchrun): the job's totals once every one has finished its share (rank 0's line)
            _wait_for_all_ranks()
            store.refresh()
            names = [n for n in by_source if not os.path.isfile(markdown_path(out, n, taken))]
            _write_markdown(out, names, store, by_source, taken)
    finally:
        store.close()
    ids = {it.id for it in items}
    job_failed = sum(1 for rid, r in store.rows.items() if rid in ids and r.get("status") == "failed")
    stats = decoder.stats if decoder is not None else SpecStats()
    return {
        "out": out, "pages": len(items), "documents": len(by_source), "rank": rank, "world_size": world,
        "mine": len(mine), "done_before": len(mine) - len(todo), "decoded": written, "failed": failed_now,
        "retried": retried, "loops_cut": cut, "seconds": elapsed,
        "pages_per_s": (len(todo) / elapsed) if todo and elapsed > 0 else None,
        "tau": stats.tau if stats.row_rounds else None,
        "forwards_speedup": (1.0 / stats.forwards_per_token) if stats.generated else None,
        "job_done": sum(1 for i in ids if i in store.done), "job_failed": job_failed,
        "repetition_guard": cfg.guard_settings.to_dict() if cfg.guard else None,
        "drafter": stats.drafter or (drafter if pipe is not None else None),
    }


def _wait_for_all_ranks() -> None:
    """A barrier across the processes of a launched job (torchrun / accelerate launch), through accelerate."""
    from accelerate import PartialState

    PartialState(cpu=True).wait_for_everyone()


def format_summary(s: dict) -> str:
    """One or two lines for the terminal.

    Example:
        >>> print(format_summary({"pages": 3, "documents": 2, "rank": 0, "world_size": 1, "mine": 3, "done_before": 1,
        ...     "decoded": 2, "failed": 1, "retried": 0, "loops_cut": 0, "pages_per_s": 0.5, "tau": 2.0,
        ...     "forwards_speedup": 1.8, "job_done": 3, "job_failed": 1, "repetition_guard": None, "out": "o"}))
        parse-docs: 2 pages decoded (1 done before), 1 failed; 0.50 pages/s; tau 2.00, speedup estimate 1.80x (target forwards)
        job: 3/3 pages of 2 documents done, 1 failed -> o
    """
    who = f"[rank {s['rank']}/{s['world_size']}] " if s["world_size"] > 1 else ""
    rate = f"{s['pages_per_s']:.2f} pages/s" if s["pages_per_s"] else "no pages decoded"
    tau = (f"; tau {s['tau']:.2f}, speedup estimate {s['forwards_speedup']:.2f}x (target forwards)"
           if s.get("tau") else "")
    guard = ""
    if s["repetition_guard"] is not None:
        guard = (f"; repetition guard on (changes outputs of looping pages): {s['retried']} retried, "
                 f"{s['loops_cut']} loops cut")
    line = (f"parse-docs: {who}{s['decoded']} pages decoded ({s['done_before']} done before), {s['failed']} failed; "
            f"{rate}{tau}{guard}")
    if s["world_size"] > 1 and s["rank"] != 0:
        return line  # the job's totals: rank 0's line, written once every rank has finished
    return line + (f"\njob: {s['job_done']}/{s['pages']} pages of {s['documents']} documents done, "
                   f"{s['job_failed']} failed -> {s['out']}")
