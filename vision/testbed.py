"""The testbed target at run time: build or load it, make its batches, evaluate it.

The testbed target is a small Qwen2-VL (12M parameters) trained on CPU to read the testbed's docs and charts
workloads (``testbed-docs``, ``testbed-charts``): acceptance lengths and speedups only mean something on a target
that produces structured, partly predictable output the way real document/chart VLMs do, and no real checkpoint
can be downloaded here. It is a real ``Qwen2VLForConditionalGeneration`` (M-RoPE: the hard case) with a BPE
tokenizer trained on the workloads' text, saved and loaded with ``save_pretrained`` / ``from_pretrained`` like
a hub model.

Why two modules: this one is what runs the target (the driving pipeline's batches, the workloads' bundled
model, benches, the tests); its training (the supervised vision tower, probes, ``train`` / ``export`` /
``grow`` / ``remerge`` / ``ungroup-kv``) lives in :mod:`mmspec.vision.testbed_train`, which imports this module
and is never imported by it or by any other runtime module: a reader of the runtime never has to learn the
training, and importing the runtime loads none of it.

``python -m mmspec.vision.testbed eval ...`` evaluates a target (exact match, character error rate, grounding,
the reference drafter's τ); ``python -m mmspec.vision.testbed_train train|export|grow|remerge|ungroup-kv ...``
trains and converts one.

Example:
    >>> testbed_workload("charts").name
    'testbed-charts'
    >>> model, processor = build_target("tiny", tokenizer_texts=100, vocab_size=400)     # doctest: +SKIP
    >>> batch = make_batch(processor, testbed_workload("docs").examples("test", 2), train=False)  # doctest: +SKIP
    >>> evaluate(model, processor, "docs", n=2, max_new_tokens=8)["n"]                  # doctest: +SKIP
    2
"""

from __future__ import annotations

import json

import torch

from mmspec.demo import build_qwen2vl, train_tokenizer
from mmspec.inputs import edit_distance, text_quality
from mmspec.workloads import get_workload

from .workloads.bundled import BUNDLED, EAGLE_DIR, TARGET_DIR, bundled_eagle, bundled_target  # noqa: F401

TESTBED_WORKLOADS = {"docs": "testbed-docs", "charts": "testbed-charts"}
"""The testbed target reads the testbed's own pages: its workloads by their short names."""


def testbed_workload(name: str, **options):
    """The testbed world ``name`` (``"docs"`` / ``"charts"`` mean the testbed's pages, not the reader's).

    Example:
        >>> testbed_workload("docs").name
        'testbed-docs'
    """
    return get_workload(TESTBED_WORKLOADS.get(name, name), **options)


testbed_workload.__test__ = False  # not a test, whatever its name (pytest collects test* in a file given by path)

__all__ = ["SIZES", "build_target", "make_batch", "evaluate", "grounding", "reference_ids", "reference_tau",
           "bundled_target", "bundled_eagle"]

PATCH = 14
MERGE = 2
# Text sizes: DESIGN.md measured 1-token steps of 2.3 / 8.1 / 16.4 ms for 4x256 / 8x384 / 12x512 on this CPU;
# "small" is the default target (a target forward must cost clearly more than a 1-layer drafter's).
SIZES = {
    "tiny": dict(text=dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2),
                 vision=dict(depth=2, embed_dim=96, num_heads=3, mlp_ratio=2)),
    "small": dict(text=dict(hidden_size=384, intermediate_size=1024, num_hidden_layers=6, num_attention_heads=6,
                            num_key_value_heads=2),
                  vision=dict(depth=4, embed_dim=192, num_heads=3, mlp_ratio=2)),
}
# Workload images are multiples of 28 px and at most 336 x 448: the processor must not resize them, so the
# renderer's character positions stay valid in the vision tower's patch grid.
PIXELS = dict(min_pixels=28 * 28, max_pixels=336 * 448)


def _rope(head_dim: int) -> dict:
    half = head_dim // 2
    temporal = half - 2 * (3 * half // 8)
    return {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [temporal, 3 * half // 8, 3 * half // 8]}


def build_target(size: str = "small", tokenizer_texts: int = 3000, vocab_size: int = 1024, seed: int = 0):
    """A fresh (untrained) testbed target and its processor; the tokenizer is trained on workload text.

    Returns ``(model, processor)``.

    Example:
        >>> model, processor = build_target("tiny", tokenizer_texts=100, vocab_size=400)    # doctest: +SKIP
        >>> model.config.text_config.num_hidden_layers                                     # doctest: +SKIP
        2
    """
    from .workloads import all_text

    texts = []
    for name in ("docs", "charts"):
        texts += list(all_text(testbed_workload(name), "train", tokenizer_texts, include_prompts=True))
    spec = SIZES[size]
    text = dict(spec["text"], max_position_embeddings=2048, initializer_range=0.02,
                rope_parameters=_rope(spec["text"]["hidden_size"] // spec["text"]["num_attention_heads"]))
    return build_qwen2vl(train_tokenizer(texts, vocab_size), text=text, vision=dict(spec["vision"]),
                         pixels=PIXELS, seed=seed)


def merge_size(processor) -> int:
    """Patches per side of one vision token of ``processor``'s target (Qwen2-VL's ``spatial_merge_size``, 2 unless
    a target was remerged: :func:`~mmspec.vision.testbed_train.remerge_target`).

    Example:
        >>> from types import SimpleNamespace
        >>> merge_size(SimpleNamespace(image_processor=SimpleNamespace(merge_size=1))), merge_size(None)
        (1, 2)
    """
    return int(getattr(getattr(processor, "image_processor", None), "merge_size", MERGE))


def _chat_prompts(processor, examples) -> list[str]:
    return [processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}] * len(ex.images) + [{"type": "text", "text": ex.prompt}]}],
        add_generation_prompt=True) for ex in examples]


def make_batch(processor, examples, train: bool = True) -> dict:
    """Processor inputs for ``examples`` (chat template, images), with ``labels`` on the answer only.

    With ``train`` the answer and its end-of-turn are appended and right padding is used (labels align);
    otherwise the prompt alone is returned, left-padded, ready for ``generate``.

    Example:
        >>> examples = testbed_workload("charts").examples("test", 2)  # doctest: +SKIP
        >>> batch = make_batch(processor, examples)                                      # doctest: +SKIP
        >>> sorted(batch)                                                                # doctest: +SKIP
        ['attention_mask', 'image_grid_thw', 'input_ids', 'labels', 'pixel_values']
        >>> model.generate(**make_batch(processor, examples, train=False), max_new_tokens=8)  # doctest: +SKIP
    """
    tok = processor.tokenizer
    prompts = _chat_prompts(processor, examples)
    images = [img for ex in examples for img in ex.images]
    if not train:
        tok.padding_side = "left"
        return dict(processor(images=images, text=prompts, return_tensors="pt", padding=True))
    tok.padding_side = "right"
    full = [p + ex.target + tok.eos_token for p, ex in zip(prompts, examples)]
    batch = dict(processor(images=images, text=full, return_tensors="pt", padding=True))
    tok.padding_side = "left"
    labels = batch["input_ids"].clone()
    labels[batch["attention_mask"] == 0] = -100
    # Prompt lengths with each image placeholder expanded as the processor expanded it (no second image pass).
    per_image = (batch["image_grid_thw"].prod(-1) // merge_size(processor) ** 2).tolist()
    pad = processor.image_token
    k = 0
    for i, (p, ex) in enumerate(zip(prompts, examples)):
        for _ in ex.images:
            p = p.replace(pad, "\0" * per_image[k], 1)
            k += 1
        labels[i, : len(tok(p.replace("\0", pad), add_special_tokens=False)["input_ids"])] = -100
    batch["labels"] = labels
    return batch


@torch.no_grad()
def evaluate(model, processor, workload: str, n: int = 20, max_new_tokens: int = 256, batch_size: int = 4,
             options: dict | None = None) -> dict:
    """Exact match and normalised character edit distance of greedy answers on the test split, overall, by
    regime (charts: copy / grounded / caption) and by kind (docs: page / block); ``options`` are the
    workload's constructor arguments (e.g. ``{"mode": "block"}``).

    Example:
        >>> evaluate(model, processor, "charts", n=8)          # doctest: +SKIP
        {'workload': 'charts', 'n': 8, 'exact_match': 0.75, 'char_error_rate': 0.04, ...}
    """
    wl = testbed_workload(workload, **(options or {}))
    exact, errors, chars, by_regime, by_kind = 0, 0, 0, {}, {}
    model.eval()
    for start in range(0, n, batch_size):
        exs = wl.examples("test", min(batch_size, n - start), start=start)
        batch = make_batch(processor, exs, train=False)
        out = model.generate(**batch, max_new_tokens=max_new_tokens, do_sample=False)
        texts = processor.batch_decode(out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)
        for ex, text in zip(exs, texts):
            ok = text.strip() == ex.target.strip()
            err = edit_distance(text.strip(), ex.target.strip())
            exact += ok
            errors += err
            chars += max(1, len(ex.target.strip()))
            for table, key in ((by_regime, ex.meta.get("regime", "copy")), (by_kind, ex.meta.get("kind", "-"))):
                hit = table.setdefault(key, [0, 0, 0, 0])  # exact, items, edit errors, target characters
                hit[0] += ok
                hit[1] += 1
                hit[2] += err
                hit[3] += max(1, len(ex.target.strip()))
    return {"workload": workload, "n": n, "exact_match": exact / n, "char_error_rate": errors / chars,
            "exact_by_regime": {k: v[0] / v[1] for k, v in by_regime.items()},
            "cer_by_regime": {k: v[2] / v[3] for k, v in by_regime.items()},
            "exact_by_kind": {k: v[0] / v[1] for k, v in by_kind.items()},
            "cer_by_kind": {k: v[2] / v[3] for k, v in by_kind.items()}}


@torch.no_grad()
def grounding(model, processor, workload: str, n: int = 16, batch_size: int = 4, options: dict | None = None) -> dict:
    """How much the answers depend on the image: teacher-forced next-token accuracy on the answer tokens of
    ``n`` test items with the real image, and again with each image replaced by a white one of the same size.

    A target that reads scores far higher with the page than without it; one that answers from the text
    prior (the first bundled target: docs blocks at 11-14 px 0.63 with the page, 0.60 blank) scores about
    the same.
    Accuracies are by kind (docs: page / block; charts: regime) and overall.

    Example:
        >>> grounding(model, processor, "docs", n=8, options={"mode": "block"})   # doctest: +SKIP
        {'workload': 'docs', 'n': 8, 'accuracy': 0.91, 'accuracy_blank': 0.12, 'by_kind': {...}}
    """
    from dataclasses import replace

    from PIL import Image

    wl = testbed_workload(workload, **(options or {}))
    tally: dict = {}  # kind -> [right with image, right blank, answer tokens]
    model.eval()
    for start in range(0, n, batch_size):
        exs = wl.examples("test", min(batch_size, n - start), start=start)
        blank = [replace(ex, images=[Image.new("RGB", im.size, "white") for im in ex.images]) for ex in exs]
        right = []
        for items in (exs, blank):  # the same answers (labels) with the page and with a blank one
            batch = make_batch(processor, items)
            want = batch.pop("labels")[:, 1:]
            pred = model(**batch).logits[:, :-1].argmax(-1)
            right.append(((pred == want) & (want != -100)).sum(-1))
        counted = (want != -100).sum(-1)
        for ex, r, rb, c in zip(exs, right[0].tolist(), right[1].tolist(), counted.tolist()):
            key = ex.meta.get("kind") or ex.meta.get("regime", "-")
            t = tally.setdefault(key, [0, 0, 0])
            t[0] += r
            t[1] += rb
            t[2] += c
    total = [sum(t[i] for t in tally.values()) for i in range(3)]
    return {"workload": workload, "n": n, "accuracy": total[0] / max(total[2], 1),
            "accuracy_blank": total[1] / max(total[2], 1),
            "by_kind": {k: {"accuracy": t[0] / max(t[2], 1), "accuracy_blank": t[1] / max(t[2], 1)}
                        for k, t in tally.items()}}


def reference_ids(processor, example) -> list[int]:
    """The token ids a target that copies ``example.target`` exactly would generate (end-of-turn included):
    the answer tokenised after its chat prompt, as in training (see :func:`make_batch`).

    Example:
        >>> ex = testbed_workload("charts").example("test", 0)                            # doctest: +SKIP
        >>> processor.tokenizer.decode(reference_ids(processor, ex)[:-1]) == ex.target   # doctest: +SKIP
        True
    """
    tok = processor.tokenizer
    prompt = _chat_prompts(processor, [example])[0]
    full = tok(prompt + example.target + tok.eos_token, add_special_tokens=False)["input_ids"]
    head = tok(prompt, add_special_tokens=False)["input_ids"]
    if full[:len(head)] == head:
        return full[len(head):]
    # The answer's first token merged with the prompt's end (e.g. "\n4."): the answer on its own.
    return tok(example.target + tok.eos_token, add_special_tokens=False)["input_ids"]


@torch.no_grad()
def reference_tau(model, processor, workload: str, n: int = 20, max_new_tokens: int = 256, depth: int = 8,
                  batch_size: int = 4, options: dict | None = None) -> dict:
    """τ of the reference-knowing audit drafter (:class:`~mmspec.drafters.reference.ReferenceLookupDrafter`,
    ``depth`` deep) on ``n`` test items: how much of the target's greedy output is the reference, in the
    units a drafter that reads the page would be paid in. Overall and by kind (docs: page / block; charts:
    regime); items are batched within a kind. ``accept_rate[d]``: share of rounds that reached depth ``d + 1``
    and accepted it. The outputs are the target's greedy ones (the drafter is lossless), so their exact match
    and character error rate (as :func:`evaluate` counts them) come with it, from the same pass.

    Why: a target that drifts off the page caps every page-reading drafter's τ, however good; this figure
    says by how much (the target bundled before issue 14: about 1.9 on docs, 1.3 on charts, in bf16).

    Example:
        >>> reference_tau(model, processor, "docs", n=8, max_new_tokens=64)          # doctest: +SKIP
        {'workload': 'docs', 'n': 8, 'depth': 8, 'reference_tau': 1.93, 'accept_rate': [...], 'by_kind': {...}}
    """
    from mmspec.decode import generate
    from mmspec.drafters.reference import ReferenceLookupDrafter
    from mmspec.stats import SpecStats

    wl = testbed_workload(workload, **(options or {}))
    groups: dict = {}
    for ex in wl.examples("test", n):
        groups.setdefault(ex.meta.get("kind") or ex.meta.get("regime", "-"), []).append(ex)
    drafter = ReferenceLookupDrafter(depth=depth)
    by_kind, texts = {}, {}
    model.eval()
    for kind, items in groups.items():
        stats = SpecStats()
        for start in range(0, len(items), batch_size):
            exs = items[start:start + batch_size]
            drafter.set_references([reference_ids(processor, ex) for ex in exs])
            batch = make_batch(processor, exs, train=False)
            out = generate(model, batch, drafter=drafter, do_sample=False, max_new_tokens=max_new_tokens)
            stats = stats.merge(out.stats)
            texts.setdefault(kind, []).extend(processor.batch_decode(out.sequences[:, batch["input_ids"].shape[1]:],
                                                                     skip_special_tokens=True))
        by_kind[kind] = stats
    total = SpecStats()
    for stats in by_kind.values():
        total = total.merge(stats)
    quality = {k: text_quality(texts[k], [ex.target for ex in groups[k]]) for k in groups}
    overall = text_quality([t for k in groups for t in texts[k]], [ex.target for k in groups for ex in groups[k]])
    return {"workload": workload, "n": n, "depth": depth, "dtype": str(model.dtype).removeprefix("torch."),
            "reference_tau": total.tau, "accept_rate": total.accept_rate[:depth],
            "exact_match": overall["exact_match"], "char_error_rate": overall["char_error_rate"],
            "by_kind": {k: {"reference_tau": s.tau, "rounds": s.row_rounds, "exact_match": quality[k]["exact_match"],
                            "char_error_rate": quality[k]["char_error_rate"]} for k, s in by_kind.items()}}


TRAINING_COMMANDS = ("train", "grow", "remerge", "ungroup-kv", "export")
"""The subcommands of :mod:`mmspec.vision.testbed_train` (``python -m mmspec.vision.testbed`` had them before)."""


def main(argv=None) -> int:
    """``python -m mmspec.vision.testbed eval ...``: evaluate the testbed target (the bundled one by default).

    Training and conversions (:data:`TRAINING_COMMANDS`) are ``python -m mmspec.vision.testbed_train``'s; asked for
    here, they end with a usage error that names it.

    Example:
        >>> main(["eval", "--n", "4", "--max-new-tokens", "32", "--workload", "charts"])   # doctest: +SKIP
        {"workload": "charts", "n": 4, "exact_match": 0.5, "char_error_rate": 0.08, ...}
    """
    import argparse
    import sys

    p = argparse.ArgumentParser(prog="python -m mmspec.vision.testbed",
                                epilog="train, export, grow, remerge, ungroup-kv: "
                                       "python -m mmspec.vision.testbed_train")
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("eval")
    e.add_argument("--model", default=None, help="default: the bundled target")
    e.add_argument("--n", type=int, default=20)
    e.add_argument("--max-new-tokens", type=int, default=256)
    e.add_argument("--workload", default="docs,charts")
    e.add_argument("--docs-mode", default=None, choices=["page", "block", "mix"],
                   help="docs items: pages, block crops, or the workload's default mix")
    e.add_argument("--workload-options", type=json.loads, default={}, metavar="JSON",
                   help='constructor arguments per workload, e.g. \'{"docs": {"scrambled_fraction": 1.0}}\'')
    e.add_argument("--grounding", action="store_true",
                   help="also report teacher-forced accuracy with each image and with a blank one")
    e.add_argument("--reference-tau", action="store_true",
                   help="report the tau of a drafter that knows the reference (depth --depth), with exact match and "
                        "character error rate by kind from the same greedy pass (in place of the plain evaluation)")
    e.add_argument("--depth", type=int, default=8, help="draft depth of --reference-tau")
    e.add_argument("--dtype", default=None, choices=["float32", "bfloat16"],
                   help="load the target in this dtype (default: its config's)")
    e.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    words = sys.argv[1:] if argv is None else list(argv)
    if words and words[0] in TRAINING_COMMANDS:
        p.error(f"{words[0]!r} is python -m mmspec.vision.testbed_train {words[0]} (training lives in testbed_train)")
    args = p.parse_args(words)
    args.model = args.model or bundled_target()
    from transformers import AutoProcessor, Qwen2VLForConditionalGeneration

    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = {"dtype": getattr(torch, args.dtype)} if args.dtype else {}
    model = Qwen2VLForConditionalGeneration.from_pretrained(args.model, **dtype).eval()
    processor = AutoProcessor.from_pretrained(args.model)
    for name in args.workload.split(","):
        options = dict(args.workload_options.get(name, {}))
        if name == "docs" and args.docs_mode:
            options["mode"] = args.docs_mode
        if args.reference_tau:  # the same greedy outputs: one pass gives τ and quality
            print(json.dumps(reference_tau(model, processor, name, n=args.n, max_new_tokens=args.max_new_tokens,
                                           depth=args.depth, options=options)))
        else:
            print(json.dumps(evaluate(model, processor, name, n=args.n, max_new_tokens=args.max_new_tokens,
                                      options=options)))
        if args.grounding:
            print(json.dumps(grounding(model, processor, name, n=args.n, options=options)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
