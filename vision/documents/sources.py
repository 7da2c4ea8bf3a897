"""Input documents for ``mmspec parse-docs``: image files, multi-page TIFFs and PDFs, found in files and folders.

Why: a batch job is pointed at folders of scans. Every page must become one work item before any model
work starts (so the job can be split and resumed), but no page is read or rasterised until its turn: PDFs
are opened only to count their pages, then rendered one page at a time with pypdfium2 (PDFium, the engine
Chrome uses) when the page is decoded. A file that cannot be opened is still a work item: its turn yields
a clear error, recorded as a failed page, and the job goes on.

Names: an input folder contributes its files by their paths inside it (``a/p1.png``: the input tree, mirrored in
the Markdown output); with several inputs, each folder's files come under its own name (``scans/a/p1.png``), so
that two folders stay apart; an input file contributes its base name.

Example:
    >>> import os, tempfile
    >>> from PIL import Image
    >>> d = tempfile.mkdtemp(); os.makedirs(os.path.join(d, "scans", "a"))
    >>> Image.new("RGB", (8, 8)).save(os.path.join(d, "scans", "a", "p1.png"))
    >>> [s.name for s in discover([os.path.join(d, "scans")])]
    ['a/p1.png']
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from mmspec.errors import InvalidImageError, InvalidInputError

__all__ = ["IMAGE_SUFFIXES", "PDF_SUFFIXES", "Source", "discover", "count_pages", "load_page", "render_size",
           "DEFAULT_LONGEST_SIDE"]

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".tif", ".tiff", ".webp")
PDF_SUFFIXES = (".pdf",)
DEFAULT_LONGEST_SIDE = 1288
"""Longest side of a rendered PDF page when the processor does not bound its pixels (olmOCR's default)."""


@dataclass(frozen=True)
class Source:
    """One input document: ``path`` on disk and ``name``, its path in the mirrored input tree."""

    path: str
    name: str

    @property
    def kind(self) -> str:
        return "pdf" if self.path.lower().endswith(PDF_SUFFIXES) else "image"


def _supported(path: str) -> bool:
    return path.lower().endswith(IMAGE_SUFFIXES + PDF_SUFFIXES)


def discover(inputs, exclude=None) -> list[Source]:
    """The documents under ``inputs`` (files and folders, walked recursively in sorted order).

    A document's name is its path relative to the folder it was found in (``scans/a.pdf``); with several inputs,
    prefixed by that folder's own name. In folders, hidden entries and files of other types are skipped, as is the folder ``exclude`` (the job's
    own output folder, if it lies inside an input). A file named explicitly must be of a supported type.

    Raises:
        InvalidInputError: a missing input, an explicit file of another type, two documents with the same
            name (pass their common parent folder instead), or no document at all.

    Example:
        >>> discover(["/no/such/folder"])
        Traceback (most recent call last):
        ...
        mmspec.errors.InvalidInputError: input not found: /no/such/folder
    """
    if isinstance(inputs, (str, os.PathLike)):
        inputs = [inputs]
    skip = os.path.realpath(exclude) if exclude else None
    found: dict[str, Source] = {}

    def add(path: str, name: str) -> None:
        name = name.replace(os.sep, "/")
        real = os.path.realpath(path)
        old = found.get(name)
        if old is not None and os.path.realpath(old.path) != real:
            raise InvalidInputError(f"two inputs are both named {name!r} ({old.path}, {path}); pass their common "
                                    "parent folder instead")
        found[name] = Source(os.path.abspath(path), name)

    inputs = list(inputs)
    for item in inputs:
        item = os.path.expanduser(os.fspath(item))
        if os.path.isdir(item):
            root = os.path.abspath(item)
            # names are relative to the folder; with several inputs, under the folder's own name to keep them apart
            base = (os.path.basename(root.rstrip(os.sep)) or "input") if len(inputs) > 1 else ""
            for folder, dirs, files in os.walk(root):
                dirs[:] = sorted(d for d in dirs if not d.startswith(".")
                                 and os.path.realpath(os.path.join(folder, d)) != skip)
                for f in sorted(files):
                    if f.startswith(".") or not _supported(f):
                        continue
                    full = os.path.join(folder, f)
                    add(full, os.path.join(base, os.path.relpath(full, root)))
        elif os.path.isfile(item):
            if not _supported(item):
                raise InvalidInputError(f"{item}: not a supported document (images: "
                                        f"{', '.join(IMAGE_SUFFIXES)}; {', '.join(PDF_SUFFIXES)})")
            add(item, os.path.basename(item))
        else:
            raise InvalidInputError(f"input not found: {item}")
    if not found:
        raise InvalidInputError(f"no documents found in {', '.join(map(str, inputs))} (images: "
                                f"{', '.join(IMAGE_SUFFIXES)}; {', '.join(PDF_SUFFIXES)})")
    return [found[k] for k in sorted(found)]


def _pdfium():
    try:
        import pypdfium2
    except ImportError as e:  # a declared dependency; say what to install rather than fail on a bare import
        raise InvalidInputError("reading PDFs needs pypdfium2: pip install pypdfium2") from e
    return pypdfium2


def _open_pdf(path: str):
    pdfium = _pdfium()
    try:
        return pdfium.PdfDocument(path)
    except pdfium.PdfiumError as e:
        msg = str(e)
        if "password" in msg.lower():
            raise InvalidInputError(f"encrypted PDF: a password is needed to open it ({msg})") from None
        raise InvalidInputError(f"cannot open PDF: {msg}") from None
    except OSError as e:  # gone since it was listed, or unreadable
        raise InvalidInputError(f"cannot open PDF: {e.strerror or e}: {path}") from None


def count_pages(source: Source) -> tuple[int, str | None]:
    """``(pages, error)``: the page count of ``source`` (1 for a one-frame image) and, if the file cannot
    be opened, ``(1, reason)``: the document is then one work item that fails with ``reason``.

    Example:
        >>> count_pages(Source("/no/such.pdf", "such.pdf"))[1].startswith("cannot open PDF")
        True
    """
    if source.kind == "pdf":
        try:
            doc = _open_pdf(source.path)
        except InvalidInputError as e:
            return 1, str(e)
        try:
            n = len(doc)
        finally:
            doc.close()
        return (n, None) if n > 0 else (1, "the PDF has no pages")
    if source.path.lower().endswith((".tif", ".tiff")):  # multi-page scans (fax, archives) are TIFFs
        from PIL import Image

        try:
            with Image.open(source.path) as im:
                return max(1, int(getattr(im, "n_frames", 1))), None
        except (OSError, ValueError, Image.DecompressionBombError):
            return 1, None  # the page load names the error
    return 1, None


def render_size(width: float, height: float, longest_side: int | None = None, max_pixels: int | None = None):
    """Pixel size ``(w, h)`` to render a ``width x height`` page at: its longest side ``longest_side`` if given,
    else as large as ``max_pixels`` (the processor's bound: a larger page would only be shrunk again), else
    :data:`DEFAULT_LONGEST_SIDE`.

    Example:
        >>> render_size(612, 792, longest_side=1000)
        (773, 1000)
        >>> render_size(336, 448, max_pixels=336 * 448)
        (336, 448)
    """
    if longest_side is not None:
        s = longest_side / max(width, height)
    elif max_pixels:
        s = math.sqrt(max_pixels / (width * height))
    else:
        s = DEFAULT_LONGEST_SIDE / max(width, height)
    return max(1, int(round(width * s))), max(1, int(round(height * s)))


class PageLoader:
    """Loads pages one at a time, keeping the last PDF open (consecutive pages of a document are the norm).

    Example:
        >>> PageLoader().load(Source("/no/such.png", "such.png"), 1)
        Traceback (most recent call last):
        ...
        mmspec.errors.InvalidImageError: image file not found: /no/such.png
    """

    def __init__(self, longest_side: int | None = None, max_pixels: int | None = None):
        self.longest_side, self.max_pixels = longest_side, max_pixels
        self._doc = self._doc_path = None

    def load(self, source: Source, page: int):
        """Page ``page`` (1-based) of ``source`` as an RGB PIL image; :class:`~mmspec.InvalidInputError` with a
        one-line reason if it cannot be read (corrupt, encrypted, empty)."""
        from ..images import load_image

        if source.kind == "image":
            if page == 1 and not source.path.lower().endswith((".tif", ".tiff")):
                return load_image(source.path)
            return self._frame(source, page, load_image)
        if self._doc_path != source.path:
            self.close()
            self._doc = _open_pdf(source.path)
            self._doc_path = source.path
        if page > len(self._doc):
            raise InvalidInputError(f"the PDF has {len(self._doc)} pages, not {page}")
        pdf_page = self._doc[page - 1]
        try:
            w, h = pdf_page.get_size()
            if w <= 0 or h <= 0:
                raise InvalidInputError(f"empty page ({w:g} x {h:g} points)")
            pw, _ = render_size(w, h, self.longest_side, self.max_pixels)
            img = pdf_page.render(scale=pw / w).to_pil()
        except _pdfium().PdfiumError as e:
            raise InvalidInputError(f"cannot render page {page}: {e}") from None
        finally:
            pdf_page.close()
        return load_image(img)

    @staticmethod
    def _frame(source: Source, page: int, load_image):
        from PIL import Image

        try:
            with Image.open(source.path) as im:
                im.seek(page - 1)
                return load_image(im.copy())
        except EOFError:
            raise InvalidImageError(f"{source.path} has no frame {page}") from None
        except (OSError, ValueError) as e:
            raise InvalidImageError(f"cannot read image file {source.path}: {e}") from None

    def close(self) -> None:
        if self._doc is not None:
            self._doc.close()
        self._doc = self._doc_path = None


def load_page(source: Source, page: int, longest_side: int | None = None, max_pixels: int | None = None):
    """One page as an RGB PIL image (see :class:`PageLoader`).

    Example:
        >>> import tempfile; from PIL import Image
        >>> p = os.path.join(tempfile.mkdtemp(), "x.png"); Image.new("RGB", (5, 4)).save(p)
        >>> load_page(Source(p, "x.png"), 1).size
        (5, 4)
    """
    loader = PageLoader(longest_side, max_pixels)
    try:
        return loader.load(source, page)
    finally:
        loader.close()
