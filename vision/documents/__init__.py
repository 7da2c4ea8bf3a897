"""Document parsing at scale: the ``mmspec parse-docs`` batch job and the repetition guard.

Importing this package registers the ``parse-docs`` subcommand (:func:`mmspec.registry.register_command`).
:mod:`.job` runs the job (work manifest, resumable output, processes splitting the work), :mod:`.sources`
finds and rasterises the pages, :mod:`.store` keeps the shared output consistent, :mod:`.guard` detects and
stops loops.

Example:
    >>> from mmspec.registry import registered_commands
    >>> "parse-docs" in registered_commands()
    True
"""

from mmspec.registry import register_command

from . import cli
from .guard import DEFAULT_LADDER, OLMOCR_LADDER, GuardSettings, RepetitionGuard, find_loop
from .job import ParseConfig, default_prompt, document_markdown, parse_documents

register_command("parse-docs", cli.HELP, cli.add_arguments, cli.run)

__all__ = ["ParseConfig", "parse_documents", "default_prompt", "document_markdown", "RepetitionGuard",
           "GuardSettings", "find_loop", "DEFAULT_LADDER", "OLMOCR_LADDER"]
