"""mmspec.vision: image/video preprocessing and the VLM pipeline.

Importing this package registers :class:`~mmspec.vision.pipeline.VLMPipeline` for the ``"vlm"`` task and
the model types it drives, the ``docs`` and ``charts`` workloads (the reader's pages, :mod:`mmspec.vision.reader`;
the testbed's own as ``testbed-docs`` / ``testbed-charts``, :mod:`mmspec.vision.workloads`), and the
``glance`` drafter and trainer (:mod:`mmspec.vision.glance`); the core imports it only lazily, through
:mod:`mmspec.registry`.

Example:
    >>> from mmspec.vision import load_image
    >>> import numpy as np
    >>> load_image(np.zeros((2, 3, 3), np.uint8)).size
    (3, 2)
"""

from mmspec.registry import register_pipeline
from mmspec.workloads import register_workload

from .images import load_image, load_images
from .pipeline import VLM_MODEL_TYPES, VLMPipeline
from .reader.workloads import ReaderChartsWorkload, ReaderDocsWorkload
from .workloads import ChartsWorkload, DocsWorkload

register_pipeline(VLMPipeline.task, VLMPipeline, model_types=VLM_MODEL_TYPES)
# the reader's worlds are "docs" and "charts" (the defaults of bench, demo and parse-docs); the 12M testbed
# target's own pages stay as "testbed-docs" / "testbed-charts" (a small test fixture)
register_workload(ReaderDocsWorkload)
register_workload(ReaderChartsWorkload)
register_workload(DocsWorkload)
register_workload(ChartsWorkload)

from . import glance  # noqa: E402  (registers the glance drafter and trainer; it imports the core only)
from . import tiger  # noqa: E402  (registers the tiger drafter and trainer)
from . import documents  # noqa: E402  (registers the parse-docs command)
from . import reader  # noqa: E402  (registers the page-lookup drafter)

__all__ = ["load_image", "load_images", "VLMPipeline", "VLM_MODEL_TYPES", "DocsWorkload", "ChartsWorkload"]
