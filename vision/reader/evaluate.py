"""The reader's report card: how well it reads, measured on held-out test items (index 1000 on), greedy.

What it measures (each item decoded once, the text compared with the item's Markdown):

* ``docs``: free-running character error rate (CER) and exact match on document pages;
* ``charts``: CER of the chart's Markdown table;
* ``heldout``: CER on pages whose names, places and numbers never occur in training;
* ``shuffled``: CER against each page's own Markdown when the reader is shown *another* item's page (near 1.0
  means it reads the image rather than a memory);
* ``page_lookup``: the training-free page-lookup drafter's τ on the first half of the docs pages (and how many
  of its texts equal the reference run's: decoding is lossless); ``--record`` writes it into the reader's
  ``reader.json`` as the τ a shipped head must beat for ``drafter="auto"`` to choose it;
* ``tau``: the mean accepted length of a drafter that knows the reference (it proposes the next 8 reference
  tokens after the longest match of the committed text), on the docs pages: how far the reader follows its page
  before it leaves it. Decoding is lossless, so these runs also give the docs CER;
* ``natural_spacing``: docs CER on the same kind of pages set with natural spacing (no gaps inside words): the
  alternative to token-spaced typesetting, measured;
* ``frontend``: the front end's nearest-embedding accuracy per tile, overall and by block type and by position
  in the line (where the errors are, when a bar is missed).

Example:
    $ python -m mmspec.vision.reader.evaluate --n 40 --json reader-eval.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from mmspec.inputs import edit_distance

__all__ = ["reader_report", "cer", "record_fallback_tau"]


def cer(texts, refs) -> dict:
    """Pooled character error rate and exact match of ``texts`` against ``refs`` (both stripped), and how the
    errors are spread: the share of them in the worst item, and the items whose own CER is over 0.5 (a loop or
    a lost page: one such item can outweigh all the others in the pooled rate).

    Example:
        >>> cer(["abc", "xy"], ["abd", "xy"])
        {'n': 2, 'cer': 0.2, 'exact': 0.5, 'worst_item_share': 1.0, 'items_over_half': 0}
    """
    errs = [edit_distance(t.strip(), r.strip()) for t, r in zip(texts, refs)]
    lens = [max(1, len(r.strip())) for r in refs]
    return {"n": len(refs), "cer": round(sum(errs) / max(sum(lens), 1), 4),
            "exact": round(sum(t.strip() == r.strip() for t, r in zip(texts, refs)) / max(len(refs), 1), 4),
            "worst_item_share": round(max(errs, default=0) / max(sum(errs), 1), 4),
            "items_over_half": sum(e > 0.5 * n for e, n in zip(errs, lens))}


def _decode(pipe, examples, *, images=None, drafter="none", batch: int = 4, max_new_tokens: int = 700,
            references=None, progress=None) -> tuple[list, list]:
    """Texts and per-batch stats for ``examples`` (their own images unless ``images`` is given)."""
    from mmspec.registry import make_drafter

    texts, stats = [], []
    for a in range(0, len(examples), batch):
        exs = examples[a:a + batch]
        ims = [(images[a + k] if images is not None else ex.images[0]) for k, ex in enumerate(exs)]
        d = drafter
        if references is not None:
            d = make_drafter({"kind": "reference-lookup", "depth": 8}, pipe.model)
            d.set_references([pipe.tokenizer(r + "<|im_end|>", add_special_tokens=False)["input_ids"]
                              for r in references[a:a + batch]])
        out = pipe(images=[[im] for im in ims], prompt=[ex.prompt for ex in exs], max_new_tokens=max_new_tokens,
                   do_sample=False, drafter=d)
        texts += out.text
        stats.append(out.stats)
        if progress:
            progress(len(texts))
    return texts, stats


def _tau(stats) -> float:
    """Tokens committed per row round, over a run's batches."""
    return round(sum(s.committed for s in stats) / max(1, sum(s.row_rounds for s in stats)), 3)


@torch.no_grad()
def frontend_errors(pipe, examples, tokenizer) -> dict:
    """The reader's own front end on the test pages' tiles: nearest-embedding accuracy overall, by the kind of
    line (heading, list, table, paragraph) and by the box's position in its line (first, second, later)."""
    from .train import labelled_page, target_table
    from .typeset import Typesetter

    model = pipe.model
    E = model.get_input_embeddings().weight.float()
    space = tokenizer(" ", add_special_tokens=False)["input_ids"][0]
    digits = [tokenizer(str(d), add_special_tokens=False)["input_ids"][0] for d in range(10)]
    table = target_table(E, space, digits)
    sq = (table * table).sum(1)
    ts = Typesetter(tokenizer)
    tally: dict = {}

    def add(key, ok):
        t = tally.setdefault(key, [0, 0])
        t[0] += int(ok)
        t[1] += 1

    from .processor import tiles_to_pixels

    for ex in examples:
        page = _page_of(ex, ts)
        layout, labels = labelled_page(page)
        if not len(layout.tiles):
            continue
        pix = tiles_to_pixels(layout.tiles).to(model.dtype)
        h = model.model.vision_model(pixel_values=pix).last_hidden_state
        v = model.model.connector(h).squeeze(1).float()
        pred = (2 * v @ table.T - sq).argmax(-1).numpy()
        k = 0
        for line, n in zip(page.lines, layout.line_sizes):
            text = line.text
            kind = ("heading" if text.startswith("#") else "table" if text.startswith("|") else
                    "list" if text[:2] == "- " or text[:1].isdigit() and ". " in text[:4] else "text")
            for j in range(n):
                ok = labels[k + j] >= 0 and pred[k + j] == labels[k + j]
                add("all", ok)
                add(f"kind:{kind}", ok)
                add(f"position:{min(j, 2)}", ok)
            k += n
    return {key: round(a / max(b, 1), 4) for key, (a, b) in sorted(tally.items())} | {"tiles": tally.get("all", [0, 0])[1]}


def _page_of(ex, ts):
    """The typeset page of a workload example (re-typeset from its meta: same lines, same boxes)."""
    from .typeset import Line, Page, TokenBox

    lines = [Line(0, 0, [TokenBox(0, 0, c, ()) for c in boxes], text)
             for text, boxes in zip(ex.meta["lines"], ex.meta["boxes"])]
    return Page(ex.images[0], ex.target, lines, dict(ex.meta))


def reader_report(model: str | None = None, *, n: int = 40, n_charts: int | None = None, batch: int = 4,
                  dtype: str = "float32", start: int = 1000, print_fn=print) -> dict:
    """Every figure of the module docstring for ``model`` (default: the bundled reader), in one dict.

    Example:
        >>> reader_report(n=4)["docs"]["cer"] <= 1.0          # doctest: +SKIP
        True
    """
    from mmspec import MMSpecPipeline

    from .bundled import bundled_reader
    from .workloads import ReaderChartsWorkload, ReaderDocsWorkload

    torch.manual_seed(0)
    path = model or bundled_reader()
    pipe = MMSpecPipeline.from_pretrained(path, dtype=dtype, drafter=None)
    report = {"model": str(path), "dtype": dtype, "start": start, "threads": torch.get_num_threads()}
    docs = ReaderDocsWorkload().examples("test", n, start=start)
    charts = ReaderChartsWorkload().examples("test", n_charts or n, start=start)
    held = ReaderDocsWorkload(words="heldout").examples("test", n, start=start)
    t0 = time.time()

    def say(what):
        return lambda k: print_fn(f"  {what}: {k} items, {time.time() - t0:.0f} s")

    texts, stats = _decode(pipe, docs, references=[ex.target for ex in docs], batch=batch, progress=say("docs"))
    report["docs"] = cer(texts, [ex.target for ex in docs])
    docs_texts = texts
    print_fn(f"  docs {report['docs']}")
    report["tau_reference_depth8"] = _tau(stats)
    report["docs_samples"] = [{"id": ex.id, "target": ex.target[:300], "text": t[:300]} for ex, t in
                              zip(docs[:3], texts[:3])]
    texts, _ = _decode(pipe, charts, batch=batch, references=[ex.target for ex in charts], progress=say("charts"))
    report["charts"] = cer(texts, [ex.target for ex in charts])
    print_fn(f"  charts {report['charts']}")
    texts, _ = _decode(pipe, held, batch=batch, references=[ex.target for ex in held], progress=say("heldout"))
    report["heldout"] = cer(texts, [ex.target for ex in held])
    print_fn(f"  heldout {report['heldout']}")
    m = min(n, max(2, n // 2))
    others = [docs[(k + 1) % m].images[0] for k in range(m)]
    texts, _ = _decode(pipe, docs[:m], images=others, batch=batch, drafter="lookup", progress=say("shuffled"))
    report["shuffled"] = cer(texts, [ex.target for ex in docs[:m]])
    # the training-free page lookup on the first docs pages: its tau is what "auto" ranks shipped heads against
    texts_pl, stats = _decode(pipe, docs[:m], batch=batch, drafter="page-lookup", progress=say("page lookup"))
    report["page_lookup"] = {"n": m, "tau": _tau(stats),
                             "same_as_reference_run": sum(a == b for a, b in zip(texts_pl, docs_texts[:m]))}
    report["frontend"] = frontend_errors(pipe, docs[: min(n, 16)], pipe.tokenizer)
    natural = ReaderDocsWorkload(spacing="natural").examples("test", m, start=start)
    texts, _ = _decode(pipe, natural, batch=batch, drafter="lookup", progress=say("natural spacing"))
    report["natural_spacing"] = cer(texts, [ex.target for ex in natural])
    report["seconds"] = round(time.time() - t0, 1)
    return report


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m mmspec.vision.reader.evaluate",
                                description="The reader's CER on docs, charts, held-out words and shuffled pages, "
                                            "the reference drafter's tau, and the front end's accuracy.")
    p.add_argument("--model", default=None, help="a reader folder (default: the bundled one)")
    p.add_argument("--n", type=int, default=40, help="items per condition")
    p.add_argument("--n-charts", type=int, default=None)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--json", default=None, help="write the report here")
    p.add_argument("--record", action="store_true",
                   help="write the page lookup's tau into the reader folder's reader.json (what auto ranks heads by)")
    args = p.parse_args(argv)
    rep = reader_report(args.model, n=args.n, n_charts=args.n_charts, batch=args.batch, dtype=args.dtype,
                        print_fn=lambda s: print(s, file=sys.stderr))
    text = json.dumps(rep, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    if args.record:
        record_fallback_tau(args.model, rep)
    return 0


def record_fallback_tau(model: str | None, report: dict) -> str:
    """Write ``report``'s page-lookup τ into the reader folder's ``reader.json`` as ``fallback_validation``:
    ``drafter="auto"`` then chooses a shipped head only when its validation τ is higher. Returns the manifest path.

    Example:
        >>> record_fallback_tau("vision/assets/reader", reader_report(n=40))    # doctest: +SKIP
    """
    import os

    from .bundled import bundled_reader
    from .model import READER_MANIFEST

    path = os.path.join(model or bundled_reader(), READER_MANIFEST)
    with open(path) as f:
        manifest = json.load(f)
    pl = report["page_lookup"]
    manifest["fallback_validation"] = {
        "tau": pl["tau"], "source": f"page lookup on {pl['n']} docs test pages from {report['start']}, greedy, "
                                    f"{report['dtype']} (python -m mmspec.vision.reader.evaluate)"}
    with open(path, "w") as f:
        json.dump(manifest, f, indent=2)
        f.write("\n")
    return path


if __name__ == "__main__":
    sys.exit(main())
