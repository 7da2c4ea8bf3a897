"""Document parsing at scale: the ``mmspec parse-docs`` batch job and the repetition guard.

Importing this package registers the ``parse-docs`` and ``train-layout`` subcommands
(:func:`mmspec.registry.register_command`) and the ``testbed-docs`` workload with its ``hierarchical`` bench systems
(:class:`~.hpd_bench.HierarchicalDocsWorkload`). :mod:`.job` runs the job (work manifest, resumable output,
processes splitting the work), :mod:`.sources` finds and rasterises the pages, :mod:`.store` keeps the shared
output consistent, :mod:`.guard` detects and stops loops; :mod:`.layout` (the layout detector) and
:mod:`.hierarchical` (every block of a page as a row of one batch) are hierarchical parallel decoding, measured
by :mod:`.hpd_bench` (``mmspec bench``'s ``hierarchical`` system).

Example:
    >>> from mmspec.registry import registered_commands
    >>> "parse-docs" in registered_commands() and "train-layout" in registered_commands()
    True
"""

from mmspec.registry import register_command
from mmspec.workloads import register_workload

from . import cli, layout
from .hpd_bench import HierarchicalDocsWorkload, HierarchicalReaderDocsWorkload
from .guard import DEFAULT_LADDER, OLMOCR_LADDER, GuardSettings, RepetitionGuard, find_loop
from .job import ParseConfig, default_prompt, document_markdown, parse_documents

# the testbed's pages with the "hierarchical" systems mmspec bench hands them (replaces the plain DocsWorkload that
# mmspec.vision registers first under the same name)
register_workload(HierarchicalDocsWorkload)
register_workload(HierarchicalReaderDocsWorkload)  # the reader's pages ('docs'), the same systems
register_command("parse-docs", cli.HELP, cli.add_arguments, cli.run)
register_command("train-layout", layout.TRAIN_HELP, layout.add_train_arguments, layout.run_train)

__all__ = ["ParseConfig", "parse_documents", "default_prompt", "document_markdown", "RepetitionGuard",
           "GuardSettings", "find_loop", "DEFAULT_LADDER", "OLMOCR_LADDER"]
