"""A document-parsing batch job: a folder of page images and a PDF in, one JSON line per page and Markdown out.

Writes a small sample folder (held-out typeset pages of the docs workload as PNG, and a few more as one PDF),
runs the same job as ``mmspec parse-docs FOLDER --out OUT`` through its Python entry point
(:func:`mmspec.vision.documents.parse_documents`) on the bundled reader with ``drafter="auto"``, then reads what
it wrote: ``OUT/pages.jsonl`` (one record per page: status, text, τ, timings, attempts of the repetition guard)
and ``OUT/markdown/`` (one file per document). Run it again with the same arguments and it resumes: pages
already written are not decoded twice.

Run:  python examples/parse_folder.py [--folder pages] [--out parsed] [--pngs 3] [--pdf-pages 2]
"""

from __future__ import annotations

import argparse
import json
import os

from mmspec.vision.documents import ParseConfig, parse_documents
from mmspec.vision.documents.job import format_summary
from mmspec.vision.documents.sample import write_sample_folder


def main(folder: str = "pages", out: str = "parsed", pngs: int = 3, pdf_pages: int = 2,
         max_new_tokens: int | None = None) -> dict:
    """Parse ``folder`` (written first when missing) into ``out``; returns the job summary and the records."""
    if not os.path.isdir(folder):
        write_sample_folder(folder, n_png=pngs, n_pdf_pages=pdf_pages)  # docs test pages, then a PDF of the next
    summary = parse_documents(ParseConfig(inputs=[folder], out=out, batch_size=2, max_new_tokens=max_new_tokens,
                                          progress=True))
    with open(os.path.join(out, "pages.jsonl")) as f:
        records = [json.loads(line) for line in f]
    for r in sorted(records, key=lambda r: (r["source"], r["page"])):
        print(f"{r['source']} page {r['page']}: {r['status']}, {r['tokens']} tokens, tau {r['tau']}, "
              f"{r['text'][:60]!r}")
    for root, _, files in os.walk(os.path.join(out, "markdown")):
        for name in sorted(files):
            print("markdown:", os.path.relpath(os.path.join(root, name), out))
    print(format_summary(summary))
    return {"summary": summary, "records": records}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--folder", default="pages", help="input folder (a sample is written there if it is missing)")
    ap.add_argument("--out", default="parsed")
    ap.add_argument("--pngs", type=int, default=3)
    ap.add_argument("--pdf-pages", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=None, help="default: each page to its end")
    a = ap.parse_args()
    main(a.folder, a.out, a.pngs, a.pdf_pages, a.max_new_tokens)
