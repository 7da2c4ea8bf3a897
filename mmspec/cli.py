"""The ``mmspec`` command line: ``mmspec generate``, ``mmspec demo``, ``mmspec bench``, ``mmspec train`` and
``mmspec export``.

Why: trying a drafter on a checkpoint should not need a script. Errors a user can cause (a missing
image, a prompt past the context window, an unsupported model, a drafter for another target) print
one line to stderr and exit with status 2, without a traceback; anything else is a bug and shows one.

Example:
    $ mmspec demo
    $ mmspec generate --model ./tiny-vlm --image page.png --prompt "Describe the image." \\
          --drafter lookup --max-new-tokens 32 --json
    $ mmspec bench --quick --json bench.json --png bench.png
"""

from __future__ import annotations

import argparse
import json
import os
import sys

__all__ = ["main", "build_parser"]

EXIT_USER_ERROR = 2


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``mmspec`` (subcommands ``generate``, ``demo`` and ``bench``).

    Example:
        >>> build_parser().parse_args(["generate", "--model", "m", "--prompt", "hi"]).max_new_tokens
        64
    """
    from . import __version__

    parser = argparse.ArgumentParser(prog="mmspec", description="Lossless speculative decoding for (V)LMs.")
    parser.add_argument("--version", action="version", version=f"mmspec {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    g = sub.add_parser("generate", help="generate text for a prompt (and images) with a drafter",
                       description="Load a checkpoint with MMSpecPipeline.from_pretrained and generate.")
    g.add_argument("--model", default=None,
                   help="target checkpoint: a folder written by save_pretrained (or hub id); default: the bundled "
                        "document model (the reader, what `mmspec demo` runs)")
    g.add_argument("--image", action="append", default=[], metavar="PATH",
                   help="an image file; repeat for several images")
    g.add_argument("--video", action="append", default=[], metavar="PATH",
                   help="a video clip (read with decord); repeat for several")
    g.add_argument("--fps", type=float, default=None, help="with --video: frames sampled per second (default 2)")
    g.add_argument("--num-frames", type=int, default=None, help="with --video: frames sampled per clip, evenly spaced")
    g.add_argument("--prompt", default=None, help="the user prompt (or --inputs FILE.jsonl for many requests)")
    g.add_argument("--inputs", default=None, metavar="FILE.jsonl",
                   help='requests, one JSON object a line: {"images": [paths relative to the file], "prompt": ...}; '
                        "needs --out")
    g.add_argument("--out", default=None, metavar="OUT.jsonl",
                   help="with --inputs: one output line per request, in input order (a rerun skips those done)")
    g.add_argument("--batch-size", type=int, default=1, help="with --inputs: requests decoded together")
    g.add_argument("--no-progress", action="store_true", help="with --inputs: no progress bar")
    g.add_argument("--drafter", default="auto",
                   help="'auto' (default: the saved drafter with the best validation tau for this target, else the "
                        "target's training-free fallback), 'lookup', "
                        "'draft-model:PATH', another registered kind, or 'none'")
    g.add_argument("--max-new-tokens", type=int, default=64)
    g.add_argument("--do-sample", action="store_true", help="sample instead of greedy decoding")
    g.add_argument("--temperature", type=float, default=None)
    g.add_argument("--top-p", type=float, default=None)
    g.add_argument("--top-k", type=int, default=None)
    g.add_argument("--seed", type=int, default=None, help="random seed for sampling")
    _dtype_argument(g)
    g.add_argument("--device-map", default=None, help="e.g. auto, cpu, cuda:0")
    g.add_argument("--task", default=None, help="force a pipeline task (default: chosen from the model type)")
    g.add_argument("--trust-remote-code", action="store_true", help="allow custom code from the checkpoint")
    g.add_argument("--json", action="store_true", help='print {"text": ..., "stats": {...}} as JSON')

    d = sub.add_parser("demo", help="run the bundled demo (the trained testbed VLM on a document page)")
    d.add_argument("--random", action="store_true", help="use the tiny random Qwen2-VL (built locally) instead")
    d.add_argument("--out-dir", default=None,
                   help="where the tiny random model lives (implies --random; default ~/.cache/mmspec/tiny-vlm)")
    d.add_argument("--max-new-tokens", type=int, default=None)
    _dtype_argument(d)

    b = sub.add_parser("bench", help="AR vs transformers assisted generation vs mmspec drafters, in one run",
                       description="Interleaved benchmark on workloads: speedup over AR measured in one run, "
                                   "tau, forwards per token, identity to AR. Prints a table; --json/--png save it.")
    b.add_argument("--model", default=None,
                   help="target checkpoint, or NAME=PATH,... per workload (default: the workload's bundled "
                        "trained model, else the tiny demo VLM)")
    b.add_argument("--inputs", default=None, metavar="FILE.jsonl",
                   help="benchmark your own requests instead of a workload: one JSON object a line, "
                        '{"images": [paths relative to the file], "prompt": ..., "reference": optional}')
    b.add_argument("--workload", default=None,
                   help="comma-separated workloads (default: docs,charts); driving and images run their plain "
                        "pipelines (latency per stage and quality fields)")
    b.add_argument("--systems", default=None,
                   help="comma-separated: ar, hf-prompt-lookup, hf-assistant, lookup, draft-model, or another "
                        "registered drafter kind[:PATH] (default: all that apply)")
    b.add_argument("--draft-model", default=None, metavar="PATH",
                   help="small model with the target's tokenizer, for draft-model and hf-assistant")
    b.add_argument("--n", type=int, default=None, help="examples per workload (default 8; --quick 4)")
    b.add_argument("--max-new-tokens", type=int, default=None, help="default 64; --quick 16")
    b.add_argument("--batch-sizes", default=None,
                   help="comma-separated batch sizes (default 1,4; 16 with --quality full)")
    b.add_argument("--split", default="test", help="workload split (default test)")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--sample", default=None, metavar="SETTINGS",
                   help="sample instead of greedy: 'temperature=0.7,top_k=50,top_p=0.9' or 'default' (the model's "
                        "generation config); a system may name its acceptance rule, e.g. "
                        "'eagle;rule=sample_then_match' (default: the lossless speculative_sampling)")
    b.add_argument("--device", default=None, help="cpu, cuda, cuda:1... (default: cuda when available)")
    b.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    _dtype_argument(b)
    b.add_argument("--quick", action="store_true", help="few examples, short generations (< 2 min on a CPU)")
    b.add_argument("--json", default=None, metavar="PATH", help="write {results, meta} as JSON")
    b.add_argument("--png", default=None, metavar="PATH", help="write histogram and speedup charts")
    b.add_argument("--resume", default=None, metavar="CKPT.jsonl",
                   help="images workload: append every finished batch to this checkpoint; the same command again "
                        "continues after the last finished batch (a checkpoint from other flags is refused)")
    b.add_argument("--quality", choices=("quick", "full"), default="quick",
                   help="images workload: 'full' is the quality run, FID / KID / prompt accuracy / code NLL over "
                        ">= 1000 images per system (the default --n) with the AR-vs-AR noise floor; pair it with "
                        "--resume (hours on a CPU)")
    b.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")

    t = sub.add_parser("train", help="train a drafter on the target's own responses and hidden states",
                       description="Stage 1 regenerates responses with the target and writes its hidden states as "
                                   "safetensors shards (OUT/data, resumable); stage 2 trains the drafter with "
                                   "accelerate (use `accelerate launch` / `torchrun` for several processes). Writes "
                                   "OUT/train_log.jsonl, checkpoints and the drafter (save_pretrained) into OUT.")
    t.add_argument("--kind", default="eagle", help="drafter kind to train (default eagle)")
    t.add_argument("--target", required=True, help="target checkpoint folder")
    t.add_argument("--workload", default="docs,charts", help="comma-separated workloads (default docs,charts)")
    t.add_argument("--n-train", type=int, default=64, help="training items, round-robin over workloads")
    t.add_argument("--max-new-tokens", type=int, default=64, help="response length regenerated per item")
    t.add_argument("--layer-ids", default=None, help="comma-separated target layer ids (default: the kind's)")
    t.add_argument("--steps", type=int, default=300)
    t.add_argument("--batch-size", type=int, default=8, help="global batch size (over all processes)")
    t.add_argument("--lr", type=float, default=3e-3)
    t.add_argument("--warmup", type=int, default=20)
    t.add_argument("--weight-decay", type=float, default=0.0)
    t.add_argument("--no-ttt", action="store_true", help="no training-time test (one unroll step)")
    t.add_argument("--ttt-steps", type=int, default=None,
                   help="training-time-test unroll depth (default: the draft depth, --num-draft-tokens)")
    t.add_argument("--num-draft-tokens", type=int, default=None,
                   help="chain depth saved with the drafter (default: the kind's; 4, fastmtp 3)")
    t.add_argument("--options", type=_json_object, default=None, metavar="JSON",
                   help="the kind's own settings as a JSON object, e.g. '{\"num_anchors\": 16}' for glance")
    t.add_argument("--out", required=True, help="output folder")
    t.add_argument("--save-every", type=int, default=100, help="checkpoint period in steps (0: final only)")
    t.add_argument("--shard-size", type=int, default=16, help="records per data shard")
    t.add_argument("--val-shards", type=int, default=0,
                   help="hold the last N data shards out of training and score the drafter on them at every "
                        "checkpoint (OUT/val_log.jsonl)")
    t.add_argument("--split", default="train")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --out")
    t.add_argument("--stage", choices=("all", "data", "fit"), default="all",
                   help="data: stage 1 only; fit: stage 2 only (on existing shards); all: both (default)")
    t.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    t.add_argument("--data", default="", metavar="DIR",
                   help="read (and write) the target data here instead of OUT/data, e.g. another run's data folder")
    t.add_argument("--init-drafter", default="", metavar="DIR",
                   help="start stage 2 from this saved drafter (same kind and target) instead of a fresh one")
    _dtype_argument(t, "the target's dtype in the data stage")
    t.add_argument("--no-progress", action="store_true", help="no progress bars")

    e = sub.add_parser("export", help="write a trained head in a format another engine loads (vLLM's EAGLE-3)",
                       description="Write a head trained with `mmspec train` in a serving engine's format. "
                                   "vllm-eagle3: the speculators checkpoint format vLLM loads as an EAGLE-3 head "
                                   "(an EAGLE head trained with --options '{\"layout\": \"eagle3\"}'); its "
                                   "reduced-vocabulary LM head is read from the target's at export time.")
    e.add_argument("head", help="the saved head's folder (mmspec train --out)")
    e.add_argument("--format", required=True, choices=("vllm-eagle3",), help="the export format")
    e.add_argument("--target", required=True, help="the target's folder (the head is checked against it)")
    e.add_argument("--out", required=True, help="the folder to write")
    e.add_argument("--verifier", default=None,
                   help="how the config names the target for vLLM (default: --target's absolute path; e.g. a hub id)")
    e.add_argument("--num-speculative-tokens", type=int, default=None,
                   help="draft depth the config proposes to vLLM (default: the head's num_draft_tokens)")
    from .registry import registered_commands

    core = set(sub.choices)
    for name, (help_, add_arguments, _run) in sorted(registered_commands().items()):
        if name in core:  # a modality may not shadow a core command
            continue
        add_arguments(sub.add_parser(name, help=help_))
    return parser


def _dtype_argument(parser, what: str = "the dtype models run in") -> None:
    from .checkpoints import DTYPE_CHOICES

    parser.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES,
                        help=f"{what}: auto (default) is the dtype the checkpoint's weights are stored in "
                             "(bfloat16 for the bundled models); float32 for exactness checks")


def _json_object(text: str) -> dict:
    from .train import _json_dict

    return _json_dict(text)


def _generate(args) -> int:
    from .errors import InvalidInputError
    from .inputs import check_output, generate_requests, load_requests
    from .pipelines import MMSpecPipeline

    requests = None
    if args.inputs is not None:  # checked before the model loads
        if args.prompt is not None or args.image or args.video:
            raise InvalidInputError("--inputs carries the prompts and images: drop --prompt / --image / --video")
        if not args.out:
            raise InvalidInputError("--inputs needs --out OUT.jsonl (one output line per request)")
        if args.batch_size < 1:
            raise InvalidInputError(f"--batch-size must be >= 1 (got {args.batch_size})")
        requests = load_requests(args.inputs)
        check_output(requests, args.out)
    elif args.prompt is None:
        raise InvalidInputError("give --prompt (one request) or --inputs FILE.jsonl with --out (many)")
    elif args.out:
        raise InvalidInputError("--out goes with --inputs; a single --prompt prints its answer")
    drafter = None if args.drafter in (None, "", "none") else args.drafter
    from .registry import check_drafter_spec

    check_drafter_spec(drafter)  # an unknown drafter is said before the model loads
    if args.model is None:
        from .workloads import get_workload

        args.model = get_workload("docs").bundled_model() or get_workload("testbed-docs").bundled_model()
        if args.model is None:
            raise InvalidInputError("no bundled document model in this install: pass --model PATH")
    _check_text_task(args.model, args.task)
    if args.image:
        _check_images(args.model, args.task, args.image)  # a bad image is said before the model loads
    pipe = MMSpecPipeline.from_pretrained(args.model, drafter=drafter, task=args.task, dtype=args.dtype,
                                          device_map=args.device_map, trust_remote_code=args.trust_remote_code)
    kwargs = {}
    ignored = [f"--{n.replace('_', '-')}" for n in ("temperature", "top_p", "top_k", "seed")
               if getattr(args, n) is not None]
    if ignored and not args.do_sample:
        # Greedy decoding has no use for them; a user who set them expects sampling and should hear otherwise.
        print(f"mmspec: warning: {', '.join(ignored)} ignored without --do-sample (greedy decoding)", file=sys.stderr)
    if args.do_sample:
        kwargs["do_sample"] = True
        for name in ("temperature", "top_p", "top_k"):
            if getattr(args, name) is not None:
                kwargs[name] = getattr(args, name)
        if args.seed is not None:
            kwargs["seed"] = args.seed
    else:
        kwargs["do_sample"] = False
    if requests is not None:
        done = generate_requests(pipe, requests, args.out, batch_size=args.batch_size, progress=not args.no_progress,
                                 max_new_tokens=args.max_new_tokens, **kwargs)
        print(f"mmspec: {done['written']} requests written to {done['out']}"
              + (f" ({done['skipped']} already there, skipped)" if done["skipped"] else ""), file=sys.stderr)
        return 0
    if args.video or args.fps is not None or args.num_frames is not None:  # only the VLM pipeline takes clips
        kwargs.update(video=list(args.video) or None, fps=args.fps, num_frames=args.num_frames)
    out = pipe(images=list(args.image) or None, prompt=args.prompt, max_new_tokens=args.max_new_tokens, **kwargs)
    if args.json:
        print(json.dumps({"text": out.text, "stats": out.stats.to_dict()}))
    else:
        print(out.text)
        print(str(out.stats))
    return 0


def _check_text_task(model: str, task) -> None:
    """``mmspec generate`` writes text: refuse, by name, a folder whose config names another task (a driving VLA,
    an image generator) before any weights load, instead of failing on the drafter or the request."""
    from .errors import InvalidInputError
    from .pipelines import TASK_KEY, load_target_config

    if task is not None:
        return
    named = getattr(load_target_config(model), TASK_KEY, None)
    if named not in (None, "vlm"):
        cls = {"driving": "DrivingPipeline", "images": "ImageARPipeline"}.get(named, "its pipeline")
        raise InvalidInputError(f"{model} is a {named} model; `mmspec generate` writes text with a VLM or LM. Use "
                                f"`mmspec bench --workload {named}` or, in Python, MMSpecPipeline.from_pretrained(...) "
                                f"(a {cls})")


def _check_images(model: str, task, images) -> None:
    """The image files of a request, checked from their headers by the pipeline that will serve ``model``."""
    from .errors import UnsupportedModelError
    from .pipelines import load_target_config
    from .registry import pipeline_class_for

    try:
        model_type = None if task is not None else getattr(load_target_config(model), "model_type", None)
        cls = pipeline_class_for(task=task, model_type=model_type)
    except UnsupportedModelError:
        return  # from_pretrained says so, with the full list of what is supported
    cls.check_request(images=images)


def _demo(args) -> int:
    from .demo import run_demo

    out = run_demo(out_dir=args.out_dir, max_new_tokens=args.max_new_tokens, random_model=args.random,
                   dtype=args.dtype)
    # Exact equality is the contract in float32; in bf16 / fp16 a near-tie may round the other way (the
    # demo says so), which is not a failure of the decoder.
    exact_mode = out.info.get("dtype", "float32") == "float32"
    return 0 if out.info.get("matches_generate", True) or not exact_mode else 1


def _bench(args) -> int:
    from .bench import QUALITY_FULL_BATCH, BenchConfig, check_outputs, parse_csv, parse_sampling, run_bench

    check_outputs(args.json, args.png)
    cfg = BenchConfig(model=args.model, workloads=parse_csv(args.workload), systems=parse_csv(args.systems),
                      draft_model=args.draft_model, n=args.n, max_new_tokens=args.max_new_tokens,
                      batch_sizes=parse_csv(args.batch_sizes, int, "batch size") if args.batch_sizes is not None else
                      [QUALITY_FULL_BATCH] if args.quality == "full" else [1, 4], split=args.split, seed=args.seed,
                      quick=args.quick, device=args.device, threads=args.threads, dtype=args.dtype,
                      inputs=args.inputs, sampling=parse_sampling(args.sample), resume=args.resume,
                      quality=args.quality)
    report = run_bench(cfg, progress=not args.no_progress)
    print(report.table())
    if args.json:
        report.save_json(args.json)
    if args.png:
        report.save_png(args.png)
    return 0


def _export(args) -> int:
    from .export import export_head

    out = export_head(args.head, args.format, args.out, args.target, verifier=args.verifier,
                      num_speculative_tokens=args.num_speculative_tokens)
    print(f"mmspec export: {args.format} head written to {out}")
    return 0


def _train(args) -> int:
    from .bench import parse_csv
    from .train import TrainConfig, collect_data, fit, train

    layer_ids = None if args.layer_ids is None else tuple(parse_csv(args.layer_ids, int, "layer id"))
    cfg = TrainConfig(kind=args.kind, target=args.target, out=args.out, workloads=tuple(parse_csv(args.workload)),
                      n_train=args.n_train, max_new_tokens=args.max_new_tokens, layer_ids=layer_ids, steps=args.steps,
                      batch_size=args.batch_size, lr=args.lr, warmup=args.warmup, weight_decay=args.weight_decay,
                      ttt=not args.no_ttt, ttt_steps=args.ttt_steps, save_every=args.save_every,
                      shard_size=args.shard_size, num_draft_tokens=args.num_draft_tokens, resume=args.resume,
                      val_shards=args.val_shards, options=args.options or {},
                      seed=args.seed, split=args.split, threads=args.threads, progress=not args.no_progress,
                      dtype=args.dtype, data=args.data, init_drafter=args.init_drafter)
    {"all": train, "data": collect_data, "fit": fit}[args.stage](cfg)
    from .train import run_summary

    if os.environ.get("RANK", "0") == "0":  # one line per run, not one per process of a launched run
        print(run_summary(cfg, args.stage))
    return 0


def _quiet_transformers() -> None:
    # Weight-loading progress bars and advisory warnings are noise on a command line.
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:  # pragma: no cover - transformers is a hard dependency
        return
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def main(argv=None) -> int:
    """Run the ``mmspec`` command line with ``argv`` (default ``sys.argv[1:]``); returns the exit status.

    Why: the console script (``mmspec = mmspec.cli:main``) and tests call the same function; tests run it
    in-process. User errors (:class:`mmspec.MMSpecError`) print ``mmspec: error: ...`` and return 2.

    Example:
        >>> main(["generate", "--model", "/no/such/model", "--prompt", "hi"])     # doctest: +SKIP
        mmspec: error: model folder not found: /no/such/model
        2
    """
    from .errors import MMSpecError

    args = build_parser().parse_args(argv)
    _quiet_transformers()
    try:
        if args.command == "generate":
            return _generate(args)
        if args.command == "bench":
            return _bench(args)
        if args.command == "train":
            return _train(args)
        if args.command == "demo":
            return _demo(args)
        if args.command == "export":
            return _export(args)
        from .registry import registered_commands

        return registered_commands()[args.command][2](args)
    except MMSpecError as e:
        msg = " ".join(str(e).split())
        print(f"mmspec: error: {msg}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("mmspec: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
