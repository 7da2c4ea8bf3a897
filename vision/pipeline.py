"""The VLM pipeline: images + prompt in, text + stats out, speculatively decoded and lossless.

Why: the common case of the design's first user: a vision-language model (or a plain text LM) loaded
from a checkpoint, a chat prompt with zero or more images (or video clips, read with decord: see
:mod:`mmspec.vision.video`), and the same text ``model.generate`` would write, sooner. Everything that can be
wrong with the request (no tokens to generate, a bad image, an unreadable clip, a prompt past the context
window) raises a :class:`mmspec.MMSpecError` before the model runs.

Example:
    >>> from mmspec import MMSpecPipeline                                        # doctest: +SKIP
    >>> pipe = MMSpecPipeline.from_pretrained("path/to/qwen2-vl", drafter="lookup")  # doctest: +SKIP
    >>> pipe(images=["a.png", "b.png"], prompt="What differs?", max_new_tokens=64).text  # doctest: +SKIP
    >>> pipe(video="clip.mp4", fps=2, prompt="What happens?").text                # doctest: +SKIP
"""

from __future__ import annotations

import os

from mmspec.decode import generate
from mmspec.errors import InvalidInputError, UnsupportedModelError
from mmspec.pipelines import MMSpecPipeline, PipelineOutput, check_max_new_tokens
from mmspec.registry import make_drafter

from .images import load_image, probe_image
from .video import load_video

__all__ = ["VLMPipeline", "VLM_MODEL_TYPES"]

MIN_IMAGE_SIDE = 8
"""Images narrower or lower than this many pixels are refused: a processor would blow them up into a blur with
nothing to read (a 1 x 1 image once decoded silently)."""

VLM_MODEL_TYPES = (
    # vision-language models (AutoModelForImageTextToText)
    "qwen2_vl", "qwen2_5_vl", "qwen3_vl", "llava", "idefics3", "smolvlm", "paligemma",
    # text-only decoder LMs (AutoModelForCausalLM)
    "llama", "qwen2", "qwen3",
)
"""The model types :class:`VLMPipeline` drives (the registry's one list for the ``"vlm"`` task)."""

_UNSET = object()


class VLMPipeline(MMSpecPipeline):
    """Chat-style generation for VLMs and text LMs with a speculative drafter.

    Loads ``AutoProcessor`` and ``AutoModelForImageTextToText`` (``AutoModelForCausalLM`` for text-only
    targets); the tokenizer pads on the left, as batched generation needs.

    Example:
        >>> pipe = VLMPipeline.from_pretrained("path/to/tiny-vlm", drafter="lookup")   # doctest: +SKIP
        >>> out = pipe(images=[img], prompt="Describe the image.", max_new_tokens=32)   # doctest: +SKIP
        >>> out.text, str(out.stats)                                                   # doctest: +SKIP
    """

    task = "vlm"
    model_types = VLM_MODEL_TYPES
    default_drafter = "auto"

    @classmethod
    def check_request(cls, images=None, video=None) -> None:
        """Image files read from their headers only (missing, unreadable, too small, over the pixel limit), so a bad
        one is refused before the model loads; the pixels are decoded when the request runs.

        Example:
            >>> VLMPipeline.check_request(images=["/no/such/page.png"])
            Traceback (most recent call last):
            ...
            mmspec.errors.InvalidImageError: image file not found: /no/such/page.png
        """
        paths = [p for p in (images or []) if isinstance(p, (str, bytes, os.PathLike))]
        for p in paths:
            _check_side(probe_image(p), f"image file {os.fsdecode(os.fspath(p))}")

    def __init__(self, model, processor, drafter=None):
        super().__init__(model, processor, drafter=drafter)
        self.tokenizer = getattr(processor, "tokenizer", None) or processor
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None and self.tokenizer.eos_token is not None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.takes_images = getattr(processor, "image_processor", None) is not None
        # A video needs the processor's video processor and the model's video placeholder token.
        self.takes_videos = (getattr(processor, "video_processor", None) is not None
                             and getattr(model.config, "video_token_id", None) is not None)

    @classmethod
    def _from_config(cls, target, config, drafter=None, dtype=None, device_map=None, trust_remote_code=False, **kw):
        from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoProcessor, AutoTokenizer

        if type(config) in AutoModelForImageTextToText._model_mapping:
            auto, loader = AutoModelForImageTextToText, AutoProcessor
        elif type(config) in AutoModelForCausalLM._model_mapping:
            auto, loader = AutoModelForCausalLM, AutoTokenizer  # text-only: the tokenizer is the processor
        else:
            raise UnsupportedModelError(
                f"{config.model_type!r} has no image-text-to-text or causal-LM class in transformers; "
                f"supported model types: {', '.join(VLM_MODEL_TYPES)}"
            )
        from .reader import reader_checkpoint
        from .reader.processor import PageReaderProcessor

        # a shipped reader folder holds the eyes and the LM's adapter; the LM itself is assembled from its GGUF
        assembled = reader_checkpoint(target)
        if assembled != target:
            from transformers import AutoConfig

            target, config = assembled, AutoConfig.from_pretrained(assembled)
        if PageReaderProcessor.is_reader_folder(target):
            loader = PageReaderProcessor
        try:
            processor = loader.from_pretrained(target, trust_remote_code=trust_remote_code)
        except (OSError, ValueError) as e:
            raise InvalidInputError(f"cannot load the processor/tokenizer of {target}: {e}") from e
        load = dict(kw)
        if dtype is not None:
            load["dtype"] = dtype
        if device_map is not None:
            load["device_map"] = device_map
        model = auto.from_pretrained(target, config=config, trust_remote_code=trust_remote_code, **load).eval()
        return cls(model, processor, drafter=drafter)

    # ------------------------------------------------------------------ request handling
    def _normalize(self, images, prompt, video=None, fps=None, num_frames=None):
        """``(prompts, image_lists, batched, video_lists)`` with every image and clip loaded; raises on malformed
        requests."""
        if isinstance(prompt, str):
            prompts, batched = [prompt], False
            image_lists = [_as_list(images)]
            video_lists = [_as_list(video)]
        elif isinstance(prompt, (list, tuple)):
            prompts, batched = list(prompt), True
            if not prompts:
                raise InvalidInputError("the prompt list is empty")
            image_lists = _per_prompt(images, len(prompts), "images", "an image, a list of images")
            video_lists = _per_prompt(video, len(prompts), "video", "a clip, a list of clips")
        elif prompt is None:
            raise InvalidInputError("a prompt is required (a string, or a list of strings for a batch)")
        else:
            raise InvalidInputError(f"prompt must be a string or a list of strings (got {type(prompt).__name__})")
        for i, p in enumerate(prompts):
            if not isinstance(p, str):
                raise InvalidInputError(f"prompt {i} must be a string (got {type(p).__name__})")
        loaded = _load_all(image_lists, _load_usable_image, "image", batched)
        if any(video_lists) and not self.takes_videos:
            raise InvalidInputError(f"{type(self.model).__name__} takes no video (its processor has no video "
                                    "processor or the model no video token); pass frames as images instead")
        if (fps is not None or num_frames is not None) and not any(video_lists):
            raise InvalidInputError("fps / num_frames sample a video: pass video=PATH with them")
        multiple = int(getattr(getattr(self.processor, "video_processor", None), "temporal_patch_size", 1) or 1)
        clips = _load_all(video_lists, lambda v: load_video(v, fps=fps, num_frames=num_frames, frame_multiple=multiple),
                          "video", batched)
        for r, (p, row, vids) in enumerate(zip(prompts, loaded, clips)):
            if not p.strip() and not row and not vids:  # nothing to answer: a chat template alone makes it ramble
                which = f"prompt {r} is" if batched else "the prompt is"
                raise InvalidInputError(f"{which} empty and has no images; pass some text or an image")
        if any(loaded) and not self.takes_images:
            raise InvalidInputError(f"{type(self.model).__name__} is a text-only model; it takes no images")
        return prompts, loaded, batched, clips

    def _chat_text(self, prompt: str, n_images: int, n_videos: int = 0) -> str:
        template_owner = self.processor if self.takes_images else self.tokenizer
        if getattr(template_owner, "chat_template", None) is None:
            if n_images or n_videos:
                raise InvalidInputError(
                    "the processor has no chat template, so mmspec cannot place the image tokens; "
                    "pass a processor with a chat template"
                )
            return prompt
        if self.takes_images:
            content = ([{"type": "image"} for _ in range(n_images)] + [{"type": "video"} for _ in range(n_videos)]
                       + [{"type": "text", "text": prompt}])
        else:
            content = prompt
        messages = [{"role": "user", "content": content}]
        return template_owner.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

    def prepare(self, images=None, prompt=None, video=None, fps=None, num_frames=None):
        """The processor outputs (``input_ids``, ``attention_mask``, ``pixel_values``, ``pixel_values_videos``,
        ``video_grid_thw``, ...) for a request.

        Why: the exact inputs the pipeline decodes from, e.g. to compare with plain ``model.generate``
        (the demo and the tests do). Same arguments as :meth:`__call__`; validates the images.

        Example:
            >>> inputs = pipe.prepare(images=[img], prompt="Describe the image.")      # doctest: +SKIP
            >>> pipe.model.generate(**inputs, max_new_tokens=16, do_sample=False)       # doctest: +SKIP
        """
        prompts, image_lists, _, video_lists = self._normalize(images, prompt, video, fps, num_frames)
        return self._encode(prompts, image_lists, video_lists)

    def _encode(self, prompts, image_lists, video_lists=None):
        video_lists = video_lists or [[] for _ in prompts]
        texts = [self._chat_text(p, len(ims), len(vids)) for p, ims, vids in zip(prompts, image_lists, video_lists)]
        flat = [im for ims in image_lists for im in ims]
        clips = [v for vids in video_lists for v in vids]
        # mmspec sampled the frames already; the metadata carries the source rate and the sampled indices (what
        # Qwen2.5-VL turns into second_per_grid_ts).
        video_kw = dict(videos=[v.frames for v in clips], video_metadata=[v.metadata for v in clips],
                        do_sample_frames=False) if clips else {}
        try:
            if self.takes_images:
                return self.processor(images=flat or None, text=texts, return_tensors="pt", padding=True, **video_kw)
            has_template = getattr(self.tokenizer, "chat_template", None) is not None
            return self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=not has_template)
        except (ValueError, TypeError) as e:
            raise InvalidInputError(f"the processor rejected the request: {e}") from e

    def decode_new(self, sequences, prompt_length: int) -> list[str]:
        """Decode the generated part (after ``prompt_length`` columns) of each row, special tokens skipped.

        Example:
            >>> pipe.decode_new(out.sequences, inputs["input_ids"].shape[1])            # doctest: +SKIP
        """
        return self.tokenizer.batch_decode(sequences[:, prompt_length:], skip_special_tokens=True)

    def __call__(self, images=None, prompt=None, max_new_tokens: int = 64, video=None, fps=None, num_frames=None,
                 **generate_kwargs) -> PipelineOutput:
        """Generate a reply to ``prompt`` about ``images``; returns text, sequences and stats.

        Why: the one call most users make. Validation comes first (``max_new_tokens``, every image, the
        context window), then one :func:`mmspec.generate` over the processed batch.

        Args:
            images: ``None``, one image or a list of images for a single prompt (each a path, PIL image,
                numpy array or tensor); for a batch, a list with one entry per prompt (an image, a list of
                images, or ``None``).
            prompt: a string, or a list of strings for a batch.
            max_new_tokens: tokens to generate at most (> 0).
            video: ``None``, a clip (a file path decord reads, or a :class:`~mmspec.vision.video.Video`) or a list
                of clips for a single prompt; for a batch, one entry per prompt (a clip, a list, or ``None``).
                Placed after the prompt's images, before its text.
            fps, num_frames: how frames are sampled from each clip file: ``fps`` per second (rounded down to
                whole temporal patches) or ``num_frames`` evenly spaced; neither: 2 per second
                (:func:`~mmspec.vision.video.sample_indices`).
            **generate_kwargs: passed to :func:`mmspec.generate` (``do_sample``, ``temperature``,
                ``top_p``, ``seed``, ``stop_strings``, ``rule``, ...); ``drafter=`` overrides the pipeline's
                drafter for this call.

        Raises:
            InvalidInputError: ``max_new_tokens <= 0``, malformed prompt/images arguments.
            InvalidImageError: an image that cannot be read, is empty or has a zero-size side.
            InvalidInputError: a clip that is missing, unreadable or has no frames; more frames asked than it
                holds; a video for a target that takes none.
            ContextLengthError: a prompt (image tokens included) longer than the context window.

        Example:
            >>> out = pipe(images=["a.png"], prompt="Describe the image.", max_new_tokens=32)  # doctest: +SKIP
            >>> out = pipe(images=[["a.png"], ["b.png", "c.png"]], prompt=["Describe.", "Compare."])  # doctest: +SKIP
            >>> out = pipe(video="clip.mp4", num_frames=8, prompt="What happens?")     # doctest: +SKIP
        """
        max_new_tokens = check_max_new_tokens(max_new_tokens)
        drafter = generate_kwargs.pop("drafter", _UNSET)
        drafter = self.drafter if drafter is _UNSET else make_drafter(drafter, self.model)
        generate_kwargs.pop("tokenizer", None)
        prompts, image_lists, batched, video_lists = self._normalize(images, prompt, video, fps, num_frames)
        inputs = self._encode(prompts, image_lists, video_lists)
        self.check_context(inputs["attention_mask"].sum(dim=1).tolist(), max_new_tokens)
        out = generate(self.model, inputs, drafter=drafter, tokenizer=self.tokenizer, max_new_tokens=max_new_tokens,
                       **generate_kwargs)
        texts = self.decode_new(out.sequences, inputs["input_ids"].shape[1])
        return PipelineOutput(text=texts if batched else texts[0], sequences=out.sequences, stats=out.stats)


def _load_usable_image(x):
    """:func:`load_image`, refusing images with a side under :data:`MIN_IMAGE_SIDE` pixels."""
    img = load_image(x)
    _check_side(img.size)
    return img


def _check_side(size, what: str = "image") -> None:
    from mmspec.errors import InvalidImageError

    if min(size) < MIN_IMAGE_SIDE:
        raise InvalidImageError(f"{what} is {size[0]}x{size[1]} pixels; a VLM needs at least "
                                f"{MIN_IMAGE_SIDE} pixels a side to see anything")


def _load_all(lists, load, what: str, batched: bool) -> list[list]:
    """``load`` over each prompt's list; an error names the prompt (in a batch) and the item (of several)."""
    out = []
    for r, lst in enumerate(lists):
        row = []
        for j, x in enumerate(lst):
            try:
                row.append(load(x))
            except InvalidInputError as e:
                where = ([f"prompt {r}"] if batched else []) + ([f"{what} {j}"] if len(lst) > 1 else [])
                if not where:
                    raise
                raise type(e)(f"{', '.join(where)}: {e}") from e
        out.append(row)
    return out


def _per_prompt(items, n: int, name: str, what: str) -> list[list]:
    """A batch's ``images`` / ``video`` argument as one list per prompt."""
    if items is None:
        return [[] for _ in range(n)]
    if isinstance(items, (list, tuple)) and len(items) == n:
        return [_as_list(x) for x in items]
    raise InvalidInputError(f"for a batch of {n} prompts pass {name} as a list of {n} entries (each {what}, or None)")


def _as_list(images) -> list:
    if images is None:
        return []
    if isinstance(images, (list, tuple)):
        return list(images)
    return [images]
