"""Synthetic, deterministic workloads for the testbed: rendered document pages and charts.

Why: no real checkpoint or data set can be downloaded here, so the project trains and measures on worlds
it generates itself. Each item is a pure function of ``(workload, seed, split, index)`` (seeded through
SHA-256, see :mod:`mmspec.workloads`), generated on the fly in a few milliseconds, with train and test drawn from
different random streams. ``docs`` gives verbatim-copy transcription (pages and single-block crops to
Markdown); ``charts`` gives copy, grounded-QA and caption regimes. :mod:`mmspec.vision` registers both,
so ``mmspec.workloads.get_workload("docs")`` finds them; driving and image-generation worlds can build on
:class:`SeededWorkload` the same way.

Example:
    >>> from mmspec.workloads import get_workload
    >>> ex = get_workload("charts").example("test", 0)
    >>> ex.id, ex.images[0].mode
    ('charts/test/0', 'RGB')
"""

from mmspec.workloads import SeededWorkload, check_item, rngs_for, seed_for
from .charts import CHART_TYPES, REGIMES, ChartsWorkload
from .docs import BLOCK_TYPES, DocsWorkload, block_markdown, page_markdown
from .text import TextGen, all_text

__all__ = [
    "SeededWorkload", "seed_for", "rngs_for", "check_item",
    "DocsWorkload", "BLOCK_TYPES", "block_markdown", "page_markdown",
    "ChartsWorkload", "CHART_TYPES", "REGIMES",
    "TextGen", "all_text",
]
