"""``mmspec parse-docs INPUT... --out DIR``: the command line of the document-parsing batch job.

Registered from :mod:`mmspec.vision.documents` with :func:`mmspec.registry.register_command`; the work is
:func:`~.job.parse_documents`. Exit status: 0 when every page of the job is ``ok``, 1 when some page failed
(its record says why), 2 for a user error (bad option, missing input, an output folder of another job).

Example:
    $ mmspec parse-docs scans/ report.pdf --out parsed/ --batch-size 4
    $ torchrun --nproc_per_node 2 -m mmspec.cli parse-docs scans/ --out parsed/ --threads 1
"""

from __future__ import annotations

import json
import os
import sys

from mmspec.errors import InvalidInputError

from .guard import DEFAULT_LADDER, GuardSettings

__all__ = ["add_arguments", "run"]

HELP = "parse folders of page images and PDFs to Markdown (resumable batch job, several processes)"


def add_arguments(p) -> None:
    """Fill the ``parse-docs`` subparser.

    Example:
        >>> import argparse; p = argparse.ArgumentParser(); add_arguments(p)
        >>> p.parse_args(["a.pdf", "--out", "o"]).batch_size
        4
    """
    p.description = ("Transcribe every page of the inputs (images: PNG, JPEG, TIFF, WebP; PDFs, rendered page by "
                     "page) to OUT/pages.jsonl (one record per page) and OUT/markdown/<input tree>.md. A rerun on "
                     "the same OUT skips finished pages; under torchrun each process takes its share.")
    p.add_argument("inputs", nargs="+", metavar="INPUT", help="files and folders (walked recursively)")
    p.add_argument("--out", required=True, metavar="DIR", help="output folder (created; a rerun resumes it)")
    p.add_argument("--model", default=None, help="target checkpoint (default: the bundled testbed target)")
    p.add_argument("--drafter", default="auto",
                   help="'auto' (default: the saved drafter with the best validation tau for the target, e.g. the "
                        "bundled EAGLE head for the bundled target, else lookup), 'lookup', 'eagle:DIR', another "
                        "registered kind, or 'none'")
    p.add_argument("--prompt", default=None,
                   help="instruction sent with each page (default: the docs workload's full-page prompt, "
                        "'Transcribe this page to Markdown.')")
    p.add_argument("--batch-size", type=int, default=4, help="pages decoded together (default 4)")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="token cap per page (default: what the context window leaves, so pages end on their own)")
    p.add_argument("--longest-side", type=int, default=None,
                   help="render PDF pages at this longest side in pixels (default: as large as the processor "
                        "takes without shrinking)")
    p.add_argument("--no-repetition-guard", action="store_true",
                   help="decode each page once, greedily, without loop detection (outputs then equal the "
                        "target's greedy decoding; the guard changes the outputs of looping pages)")
    p.add_argument("--temperatures", default=",".join(f"{t:g}" for t in DEFAULT_LADDER),
                   help="retry ladder of the repetition guard, one temperature per try (0 = greedy; default "
                        "olmOCR's ladder with a greedy first try: %(default)s)")
    p.add_argument("--loop-repeats", type=int, default=3, help="a loop repeats its period at least this often")
    p.add_argument("--loop-min-tokens", type=int, default=32, help="and spans at least this many tokens")
    p.add_argument("--loop-max-period", type=int, default=256, help="longest period looked for, in tokens")
    from mmspec.checkpoints import DTYPE_CHOICES

    p.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES,
                   help="auto (default): the checkpoint's stored dtype where native; float32 for exactness")
    p.add_argument("--device", default=None, help="cpu, cuda:0 ... (default: cuda:LOCAL_RANK with a GPU, else cpu)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads per process")
    p.add_argument("--hierarchical", action="store_true",
                   help="hierarchical decoding: a layout stage finds each page's blocks, every block is one row of "
                        "the batch (--prompt is then the block prompt), pages assembled in reading order")
    p.add_argument("--layout", default=None, metavar="DIR",
                   help="layout detector for --hierarchical (default: the bundled one; `mmspec train-layout`)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")


def _floats(text: str) -> list:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InvalidInputError(f"--temperatures takes comma-separated numbers (got {text!r})") from None


def run(args) -> int:
    """Run the job from parsed arguments; the exit status (0 all ok, 1 some page failed)."""
    from .job import ParseConfig, _wait_for_all_ranks, format_summary, parse_documents

    settings = GuardSettings(min_repeats=args.loop_repeats, min_tokens=args.loop_min_tokens,
                             max_period=args.loop_max_period, temperatures=_floats(args.temperatures))
    drafter = None if args.drafter in ("", "none") else args.drafter
    cfg = ParseConfig(inputs=list(args.inputs), out=args.out, model=args.model, drafter=drafter, prompt=args.prompt,
                      batch_size=args.batch_size, max_new_tokens=args.max_new_tokens, longest_side=args.longest_side,
                      guard=not args.no_repetition_guard, guard_settings=settings, dtype=args.dtype,
                      device=args.device, threads=args.threads, progress=not args.no_progress,
                      hierarchical=args.hierarchical, layout=args.layout)
    summary = parse_documents(cfg)
    if args.json:
        print(json.dumps(summary))
    line = format_summary(summary)
    launched = summary["world_size"] > 1 and os.environ.get("MASTER_ADDR")
    if launched and summary["rank"] != 0:
        print(line, file=sys.stderr, flush=True)
    if launched:  # every other rank's line is out before rank 0's whole-job line, which comes last
        _wait_for_all_ranks()
    if not launched or summary["rank"] == 0:
        print(line, file=sys.stderr, flush=True)
    return 1 if summary["job_failed"] else 0
