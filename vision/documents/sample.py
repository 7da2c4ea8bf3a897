"""A sample input folder for ``mmspec parse-docs``: pages of the docs workload as PNG files and a PDF.

Why: the README's example and the measurements need documents the bundled testbed target can read, and
none can be downloaded here. The pages are the docs workload's full pages (test split, the renderer the
target was trained on); the PDF is written with Pillow's PDF writer, as a scanner would write one.

Example:
    >>> import tempfile
    >>> names = write_sample_folder(tempfile.mkdtemp(), n_png=2, n_pdf_pages=2)
    >>> [os.path.basename(n) for n in names]
    ['page-000.png', 'page-001.png', 'scan.pdf']

Command line: ``python -m mmspec.vision.documents.sample DIR [N_PNG] [N_PDF_PAGES]``.
"""

from __future__ import annotations

import os
import sys

__all__ = ["write_sample_folder"]


def write_sample_folder(folder, n_png: int = 8, n_pdf_pages: int = 2, split: str = "test", seed: int = 0,
                        workload: str = "docs") -> list:
    """Write ``n_png`` pages of ``workload`` (the reader's ``docs`` by default; ``testbed-docs`` for the testbed
    target's) as ``page-XXX.png`` and the next ``n_pdf_pages`` as ``scan.pdf`` into ``folder`` (created); returns
    the paths written."""
    from mmspec.workloads import get_workload

    os.makedirs(folder, exist_ok=True)
    w = get_workload(workload, seed=seed, **({"mode": "page"} if workload == "testbed-docs" else {}))
    paths = []
    for i in range(n_png):
        p = os.path.join(folder, f"page-{i:03d}.png")
        w.example(split, i).images[0].save(p)
        paths.append(p)
    if n_pdf_pages:
        imgs = [w.example(split, n_png + i).images[0] for i in range(n_pdf_pages)]
        p = os.path.join(folder, "scan.pdf")
        # resolution 72: one PDF point per pixel, so rendering at the page's own size gives the pixels back
        imgs[0].save(p, "PDF", save_all=True, append_images=imgs[1:], resolution=72.0)
        paths.append(p)
    return paths


if __name__ == "__main__":  # pragma: no cover - a convenience for the README
    args = sys.argv[1:]
    if not args:
        sys.exit("usage: python -m mmspec.vision.documents.sample DIR [N_PNG] [N_PDF_PAGES]")
    for path in write_sample_folder(args[0], *(int(a) for a in args[1:3])):
        print(path)
