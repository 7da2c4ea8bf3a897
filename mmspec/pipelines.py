"""Pipelines: ``MMSpecPipeline.from_pretrained(target, drafter=...)`` and its output type.

Why: most users hold a checkpoint, not a processor-and-model pair; they want one call that loads the
target the way transformers would, pairs it with a drafter, and returns text plus the run's statistics.
The base class reads the checkpoint's config, asks the registry (:mod:`mmspec.registry`) which pipeline
serves that model type, and lets the chosen class load itself. Modality packages provide the concrete
pipelines (``mmspec.vision.VLMPipeline`` for VLMs and text LMs) and register them; this module never
imports them.

Supported model types are declared once, on each pipeline class (``model_types``), registered from there,
and read back through :func:`supported_model_types` (and every "unsupported" error message).

Example:
    >>> from mmspec import MMSpecPipeline                                              # doctest: +SKIP
    >>> pipe = MMSpecPipeline.from_pretrained("path/to/qwen2-vl", drafter="lookup")     # doctest: +SKIP
    >>> out = pipe(images=["page.png"], prompt="Transcribe this page.", max_new_tokens=256)  # doctest: +SKIP
    >>> out.text, out.stats.tau                                                         # doctest: +SKIP
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from .checks import check_device_map, check_local_folder, check_max_new_tokens, context_window
from .errors import ContextLengthError, InvalidInputError, UnsupportedModelError
from .registry import check_drafter_spec, make_drafter, pipeline_class_for, supported_model_types, supported_tasks

DEFAULT_DRAFTER = type("DefaultDrafter", (), {"__repr__": lambda self: "<the pipeline's default drafter>"})()
"""``from_pretrained``'s ``drafter`` when none is named: the pipeline class's :attr:`MMSpecPipeline.default_drafter`."""
from .stats import SpecStats

__all__ = ["MMSpecPipeline", "PipelineOutput", "supported_model_types", "supported_tasks", "context_window",
           "load_target_config", "check_max_new_tokens", "TASK_KEY"]

TASK_KEY = "mmspec_task"
"""The ``config.json`` key by which a checkpoint names the mmspec task that serves it (``"driving"``,
``"images"``); :meth:`MMSpecPipeline.from_pretrained` reads it before the model type."""


@dataclass
class PipelineOutput:
    """What a pipeline call returns.

    Attributes:
        text: the generated text (new tokens only, special tokens skipped); a ``str`` for one prompt,
            a ``list[str]`` for a batch.
        sequences: ``[B, P + T]`` token ids, prompt included, exactly as ``model.generate`` returns them.
        stats: the run's :class:`~mmspec.SpecStats` (τ, acceptance, histogram, timings).
        info: extra facts about the run (e.g. the demo stores ``matches_generate`` here).
    """

    text: list[str] | str
    sequences: "torch.Tensor"
    stats: SpecStats
    info: dict = field(default_factory=dict)


def load_target_config(target, trust_remote_code: bool = False):
    """Read a checkpoint's config with ``AutoConfig`` (local folder or hub id), as errors mmspec names.

    Why: choosing a pipeline needs only the config, and a missing folder or an unknown architecture
    should fail here with a clear :class:`~mmspec.MMSpecError`, before any weights are read.

    Example:
        >>> load_target_config("/no/such/folder")
        Traceback (most recent call last):
        ...
        mmspec.errors.InvalidInputError: model folder not found: /no/such/folder
    """
    from transformers import AutoConfig

    target = check_local_folder(target)  # a missing local folder is said at once, not tried as a hub id
    try:
        return AutoConfig.from_pretrained(target, trust_remote_code=trust_remote_code)
    except ValueError as e:  # unknown model_type, or custom code without trust_remote_code
        raise UnsupportedModelError(
            f"cannot read the config of {target}: {e}. Supported model types: {', '.join(supported_model_types())}"
        ) from e
    except OSError as e:
        raise InvalidInputError(f"cannot read the config of {target}: {e}") from e


def _load_device(device_map) -> str:
    """The device type a ``device_map`` puts the model on (``"cuda"`` or ``"cpu"``), for choosing ``"auto"``'s
    dtype.

    Example:
        >>> _load_device(None), _load_device({"": "cpu"})
        ('cpu', 'cpu')
    """
    import torch

    values = list(device_map.values()) if isinstance(device_map, dict) else [device_map]
    for v in values:
        if isinstance(v, int) or (isinstance(v, str) and (v.startswith("cuda") or v == "auto")) or \
                (isinstance(v, torch.device) and v.type == "cuda"):
            if torch.cuda.is_available():
                return "cuda"
    return "cpu"


class MMSpecPipeline:
    """Base class of the task pipelines; ``MMSpecPipeline.from_pretrained`` picks the right one.

    Subclasses set ``task`` and ``model_types`` (the one list of model types they drive), implement
    :meth:`_from_config` (load model and processor) and ``__call__``, and are registered by their
    modality package with :func:`mmspec.registry.register_pipeline`.

    Attributes:
        model: the target, as loaded by transformers.
        processor: its processor (or tokenizer, for text-only targets).
        drafter: the drafter paired with the target (``None``: plain decoding through the same loop).
        drafter_choice: with ``drafter="auto"``, the :class:`~mmspec.drafters.auto.AutoChoice` (what was chosen,
            what was skipped and why); else ``None``.
        notes: lines about how the pipeline was set up (``"auto"``'s choice and skipped drafters).
    """

    task: str = ""
    model_types: tuple = ()

    def __init__(self, model, processor, drafter=None):
        self.model = model
        self.processor = processor
        self.drafter = make_drafter(drafter, model)
        self.drafter_choice = getattr(self.drafter, "auto_choice", None)
        self.notes = list(self.drafter_choice.notes) if self.drafter_choice is not None else []

    default_drafter = None
    """What ``from_pretrained`` drafts with when no drafter is named (the VLM pipeline: ``"auto"``; the driving and
    image pipelines decode plainly unless asked)."""

    @classmethod
    def check_request(cls, images=None, video=None) -> None:
        """Refuse what a request's files show to be unusable without loading the model (the command line calls it
        before ``from_pretrained``). Nothing to check by default; the VLM pipeline reads image headers.

        Example:
            >>> MMSpecPipeline.check_request(images=["page.png"])  # the base class checks nothing
        """

    @classmethod
    def _default_drafter_for(cls, pipe_cls, drafter):
        return pipe_cls.default_drafter if drafter is DEFAULT_DRAFTER else drafter

    @classmethod
    def from_pretrained(cls, target, drafter=DEFAULT_DRAFTER, task=None, dtype="auto", device_map=None,
                        drafter_dir=None, **kw):
        """Load ``target`` (local folder or hub id) into the pipeline that serves it, paired with ``drafter``.

        Why: one call from checkpoint to a ready speculative decoder; the pipeline class is chosen from
        the checkpoint's ``config.model_type`` (or forced with ``task``), and a drafter that does not fit
        the target is refused here, before any generation.

        Args:
            target: a folder written by ``save_pretrained`` or a hub id (hub ids need network access).
            drafter: by default the pipeline's :attr:`default_drafter` (``"auto"`` for VLMs, none for the driving
                and image pipelines); anything :func:`mmspec.registry.make_drafter` takes: ``None`` (plain
                decoding through the same loop), a Drafter,
                ``"lookup"``, ``"draft-model:PATH"``, ``{"kind": ..., ...}``; ``"auto"``: the saved drafter with
                the best validation τ for this target among those bundled with it, under ``drafter_dir`` and in
                the mmspec cache (:mod:`mmspec.drafters.auto`; the choice is in ``pipe.notes``).
            drafter_dir: with ``drafter="auto"``, a folder of saved drafters (or one saved drafter) to consider.
            task: force a pipeline (``"vlm"``, ``"driving"``, ``"images"``); by default the task the
                checkpoint's config names (``mmspec_task``, written by the driving and image pipelines'
                ``save_pretrained``), else chosen from the model type.
            dtype: ``"auto"`` (default): the dtype the checkpoint's weights are stored in (bf16 for the
                bundled models, whatever their ``config.json`` says), except on a device that would only
                emulate it (a CPU without AVX512-BF16/AMX: float32, see
                :func:`mmspec.checkpoints.dtype_note`); or ``"bfloat16"``, ``"float16"``, ``"float32"``, a
                ``torch.dtype``. Drafters built for the target follow its dtype.
            device_map: passed to the model's ``from_pretrained`` (``"auto"`` spreads a large target over
                the GPUs with accelerate).
            **kw: further ``from_pretrained`` arguments; ``trust_remote_code`` stays ``False`` unless passed.

        Raises:
            UnsupportedModelError: a model type no pipeline serves (the message lists those that are).
            InvalidInputError: the folder does not exist or cannot be read.
            DrafterMismatchError: the drafter was built for another target.

        Example:
            >>> pipe = MMSpecPipeline.from_pretrained("path/to/tiny-vlm", drafter="lookup")  # doctest: +SKIP
            >>> type(pipe).__name__                                                          # doctest: +SKIP
            'VLMPipeline'
            >>> pipe = MMSpecPipeline.from_pretrained("vlm", drafter="auto", drafter_dir="runs")  # doctest: +SKIP
            >>> pipe.notes                                                                   # doctest: +SKIP
        """
        from .checkpoints import resolve_dtype

        trust_remote_code = bool(kw.pop("trust_remote_code", False))
        if drafter_dir is not None:
            if drafter is DEFAULT_DRAFTER:
                drafter = "auto"
            if drafter != "auto":
                raise InvalidInputError(f"drafter_dir goes with drafter='auto' (got drafter={drafter!r})")
            drafter = {"kind": "auto", "drafter_dir": drafter_dir}
        check_device_map(device_map)
        dtype = resolve_dtype(dtype)  # a bad name fails before the folder is read
        if drafter is not DEFAULT_DRAFTER:
            check_drafter_spec(drafter)  # an unknown kind fails before the model loads
        config = load_target_config(target, trust_remote_code=trust_remote_code)
        if dtype == "auto":
            device = _load_device(device_map)
            dtype = resolve_dtype(dtype, os.path.expanduser(os.fspath(target)), device)
            if dtype == "auto":  # weights not readable here (a hub id, .bin files): the config's dtype, if native
                import torch

                from .checkpoints import native_dtype

                said = getattr(config, "dtype", None)
                said = getattr(torch, said, None) if isinstance(said, str) else said
                if isinstance(said, torch.dtype) and not native_dtype(said, device):
                    dtype = torch.float32
        model_type = getattr(config, "model_type", None)
        if cls is MMSpecPipeline:
            # A folder written for one of mmspec's own tasks says so in its config (a driving VLA is a qwen2_vl
            # whose trajectory head the VLM pipeline would silently drop); ``task=`` still forces one.
            task = task or getattr(config, TASK_KEY, None)
            pipe_cls = pipeline_class_for(task=task, model_type=model_type)
        else:
            pipe_cls = cls
        if getattr(config, "is_encoder_decoder", False):
            raise UnsupportedModelError(
                f"{model_type!r} is an encoder-decoder model; mmspec drives decoder-only (V)LMs. "
                f"Supported model types: {', '.join(supported_model_types())}"
            )
        drafter = cls._default_drafter_for(pipe_cls, drafter)
        return pipe_cls._from_config(os.path.expanduser(os.fspath(target)), config, drafter=drafter, dtype=dtype,
                                     device_map=device_map, trust_remote_code=trust_remote_code, **kw)

    @classmethod
    def _from_config(cls, target: str, config, drafter=None, dtype=None, device_map=None, trust_remote_code=False,
                     **kw):
        """Load the model and processor of ``target`` (whose config is ``config``) and build the pipeline."""
        raise NotImplementedError(f"{cls.__name__} does not implement _from_config")

    def __call__(self, *args, **kwargs) -> PipelineOutput:
        raise NotImplementedError(f"{type(self).__name__} does not implement __call__")

    # ------------------------------------------------------------------ helpers for subclasses
    @property
    def context_window(self) -> int | None:
        """The target's context window in tokens (``None`` if the config does not say)."""
        return context_window(self.model)

    def check_context(self, prompt_lengths, max_new_tokens: int) -> None:
        """Raise :class:`~mmspec.ContextLengthError` if a prompt does not fit the context window.

        A prompt that fits but leaves less than ``max_new_tokens`` of room only warns, as ``generate``
        does (generation may run past the trained window; RoPE models extrapolate, badly).
        """
        import warnings

        window = self.context_window
        if window is None:
            return
        lengths = [int(n) for n in prompt_lengths]
        for i, n in enumerate(lengths):
            if n > window:
                which = f"prompt {i} has" if len(lengths) > 1 else "the prompt has"
                raise ContextLengthError(
                    f"{which} {n} tokens (images included) but the model's context window is {window}; "
                    "shorten the prompt or use fewer/smaller images"
                )
        if max(lengths) + max_new_tokens > window:
            warnings.warn(
                f"prompt ({max(lengths)} tokens) + max_new_tokens ({max_new_tokens}) exceeds the context window "
                f"({window}); output past the window is unreliable",
                stacklevel=3,
            )
