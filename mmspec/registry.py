"""The registry: how the core finds pipelines and drafters without importing modality packages.

Why: arrows point one way (DESIGN.md). ``mmspec.vision``, ``mmspec.drivers`` and ``mmspec.image_ar``
import the core and register what they provide here; the core never imports them at module import
time. This module is the only place in the core that imports them, lazily, the first time someone asks
for a pipeline or a drafter kind it does not know yet. Adding a modality touches no core file: the
package calls :func:`register_pipeline` / :func:`register_drafter` in its ``__init__`` and is listed in
``MODALITY_PACKAGES``.

Example:
    >>> from mmspec.registry import make_drafter
    >>> make_drafter("lookup", None).kind
    'lookup'
    >>> make_drafter({"kind": "lookup", "num_draft_tokens": 4}, None).num_draft_tokens
    4
"""

from __future__ import annotations

import importlib
import json
import os
import warnings

from .errors import InvalidInputError, UnsupportedModelError

__all__ = [
    "check_drafter_spec",
    "register_pipeline",
    "pipeline_class_for",
    "supported_tasks",
    "supported_model_types",
    "register_drafter",
    "make_drafter",
    "drafter_kinds",
    "register_command",
    "registered_commands",
    "MODALITY_PACKAGES",
    "DEFAULT_TASK",
]

MODALITY_PACKAGES = ("mmspec.vision", "mmspec.drivers", "mmspec.image_ar")
"""Packages imported (lazily, once) so that they register their pipelines and drafters."""

DEFAULT_TASK = "vlm"
"""The task used when neither a task nor a model type is given."""

_PIPELINES: dict[str, type] = {}
_MODEL_TYPES: dict[str, str] = {}  # model_type -> task
_DRAFTERS: dict[str, object] = {}
_COMMANDS: dict[str, tuple] = {}  # name -> (help, add_arguments, run)
_loaded = False
_load_errors: dict[str, str] = {}


# ---------------------------------------------------------------------------- modality packages
def load_modalities() -> None:
    """Import every modality package once so its ``__init__`` registers what it provides.

    A package that fails to import because an optional dependency is missing is skipped with a
    warning (its error is named later if someone asks for what it would have provided); other
    errors propagate, since they are bugs.
    """
    global _loaded
    if _loaded:
        return
    _loaded = True
    for name in MODALITY_PACKAGES:
        try:
            importlib.import_module(name)
        except ImportError as e:  # an optional dependency of that modality is not installed
            _load_errors[name] = f"{type(e).__name__}: {e}"
            warnings.warn(f"mmspec: {name} is unavailable ({e}); its pipelines and drafters are not registered",
                          stacklevel=2)


def _unavailable_note() -> str:
    if not _load_errors:
        return ""
    return " (not loaded: " + "; ".join(f"{k}: {v}" for k, v in _load_errors.items()) + ")"


# ---------------------------------------------------------------------------- commands
def register_command(name: str, help: str, add_arguments, run) -> None:
    """Register an ``mmspec NAME`` subcommand provided by a modality package.

    Why: ``mmspec parse-docs`` and ``mmspec drive-sim`` belong to their modalities, and the core's command
    line must not import them. ``add_arguments(parser)`` fills the subcommand's ``argparse`` parser;
    ``run(args)`` does the work and returns the exit status. :class:`mmspec.MMSpecError` raised by ``run``
    prints one line and exits 2, as for the core's own commands. Registering a name again replaces it.

    Example:
        >>> register_command("hello", "say hello", lambda p: p.add_argument("--who", default="you"),
        ...                  lambda args: print("hello", args.who) or 0)
        >>> from mmspec.cli import main
        >>> main(["hello", "--who", "docs"])
        hello docs
        0
    """
    if not isinstance(name, str) or not name or name.startswith("-"):
        raise InvalidInputError("a command name must be a non-empty string not starting with '-'")
    if not callable(add_arguments) or not callable(run):
        raise InvalidInputError(f"command {name!r}: add_arguments and run must be callables")
    _COMMANDS[name] = (help, add_arguments, run)


def registered_commands() -> dict:
    """The subcommands modality packages registered: ``{name: (help, add_arguments, run)}``.

    Example:
        >>> isinstance(registered_commands(), dict)
        True
    """
    load_modalities()
    return dict(_COMMANDS)


# ---------------------------------------------------------------------------- pipelines
def register_pipeline(task: str, cls, model_types=()) -> None:
    """Register pipeline class ``cls`` for ``task`` and the transformers ``model_types`` it drives.

    Why: :meth:`mmspec.MMSpecPipeline.from_pretrained` reads a checkpoint's ``config.model_type`` and
    needs to know which pipeline serves it; modality packages call this from their ``__init__``.
    Registering the same class again is a no-op; a model type can belong to one task only (the last
    registration wins, with a warning if it moves).

    Example:
        >>> class MyPipe: ...
        >>> register_pipeline("my-task", MyPipe, model_types=["my_arch"])
        >>> pipeline_class_for(model_type="my_arch") is MyPipe
        True
    """
    if not isinstance(task, str) or not task:
        raise InvalidInputError("a pipeline task must be a non-empty string")
    _PIPELINES[task] = cls
    for mt in model_types:
        old = _MODEL_TYPES.get(mt)
        if old is not None and old != task:
            warnings.warn(f"mmspec: model type {mt!r} moves from task {old!r} to {task!r}", stacklevel=2)
        _MODEL_TYPES[mt] = task


def supported_tasks() -> list[str]:
    """Registered task names (modality packages loaded first).

    Example:
        >>> "vlm" in supported_tasks()
        True
    """
    load_modalities()
    return sorted(_PIPELINES)


def supported_model_types(task: str | None = None) -> list[str]:
    """Registered transformers model types, all or those of one ``task``: the one list users see.

    Example:
        >>> "qwen2_vl" in supported_model_types("vlm")
        True
    """
    load_modalities()
    return sorted(mt for mt, t in _MODEL_TYPES.items() if task is None or t == task)


def pipeline_class_for(task: str | None = None, model_type: str | None = None):
    """The pipeline class for an explicit ``task``, else for a checkpoint's ``model_type``.

    Why: one rule for choosing a pipeline. An explicit task wins (it lets a user force a pipeline on an
    architecture not listed yet); otherwise the model type decides; with neither, the default task
    ``"vlm"``. Anything unknown raises :class:`~mmspec.errors.UnsupportedModelError` naming what is
    supported.

    Example:
        >>> pipeline_class_for(model_type="qwen2_vl").__name__
        'VLMPipeline'
        >>> pipeline_class_for(task="vlm", model_type="some_new_arch").__name__
        'VLMPipeline'
    """
    load_modalities()
    if task is not None:
        if task not in _PIPELINES:
            raise UnsupportedModelError(
                f"unknown task {task!r}; supported tasks: {', '.join(sorted(_PIPELINES)) or 'none'}"
                + _unavailable_note()
            )
        return _PIPELINES[task]
    if model_type is None:
        if DEFAULT_TASK not in _PIPELINES:
            raise UnsupportedModelError(f"the default task {DEFAULT_TASK!r} is not registered" + _unavailable_note())
        return _PIPELINES[DEFAULT_TASK]
    if model_type not in _MODEL_TYPES:
        by_task = "; ".join(
            f"{t}: {', '.join(sorted(mt for mt, tt in _MODEL_TYPES.items() if tt == t))}" for t in sorted(_PIPELINES)
        )
        raise UnsupportedModelError(
            f"model type {model_type!r} is not supported. Supported tasks and model types: {by_task}. "
            "Pass task=... to force a pipeline for an unlisted decoder-only architecture." + _unavailable_note()
        )
    return _PIPELINES[_MODEL_TYPES[model_type]]


# ---------------------------------------------------------------------------- drafters
def register_drafter(kind: str, factory) -> None:
    """Register ``factory(target_model, **options) -> Drafter`` under the name ``kind``.

    Why: users name drafters as strings (``"lookup"``, ``"draft-model:PATH"``, a saved drafter's
    ``config.json`` kind) in code, in the CLI and in batch configs; modality packages add their own
    kinds (GLANCE, TIGER, ...) without touching the core. In the string form ``"kind:ARG"``, ``ARG`` is
    passed as ``path=ARG``.

    Example:
        >>> from mmspec.drafters import PromptLookupDrafter
        >>> register_drafter("lookup-3", lambda target, **kw: PromptLookupDrafter(num_draft_tokens=3, **kw))
        >>> make_drafter("lookup-3", None).num_draft_tokens
        3
    """
    if not isinstance(kind, str) or not kind or ":" in kind:
        raise InvalidInputError(f"a drafter kind must be a non-empty string without ':' (got {kind!r})")
    _DRAFTERS[kind] = factory


def drafter_kinds() -> list[str]:
    """Registered drafter kinds (modality packages loaded first).

    Example:
        >>> {"lookup", "draft-model"} <= set(drafter_kinds())
        True
    """
    load_modalities()
    return sorted(_DRAFTERS)


UNION_SEP = " & "
"""Joins drafter specs into one union drafter: ``"eagle:DIR & lookup;history_tokens=20000"`` (with the spaces,
so a path may hold an ``&``). The spec grammar lives here; :mod:`mmspec.drafters.union` imports it and registers
the ``union`` kind itself, so this module never imports the union drafter."""


def make_drafter(spec, target_model, **kw):
    """Turn a drafter spec into a drafter bound to ``target_model``.

    Why: every entry point (``MMSpecPipeline.from_pretrained``, the CLI, batch jobs) accepts the same
    spellings, and a drafter built for another target is refused here, before any work starts.

    Args:
        spec: ``None`` (no drafter: plain decoding through the same loop); a
            :class:`~mmspec.drafters.Drafter` instance (returned as is, after the target check);
            a kind name (``"lookup"``); ``"kind:ARG"`` (``"draft-model:/path/to/small-model"``), either
            followed by ``;key=value`` options (``"eagle:DIR;topk=4;tree_nodes=12"``, values read as JSON
            when they parse, else as strings); several of those joined by ``" & "`` (one
            :class:`~mmspec.drafters.union.UnionDrafter` proposing the union of their trees); or a dict
            ``{"kind": ..., **options}``.
        target_model: the loaded target (``None`` skips the target check and target-dependent loading).
        **kw: extra options for the factory (they override the dict's).

    Raises:
        InvalidInputError: unknown kind or malformed spec.
        DrafterMismatchError: the drafter does not fit the target (e.g. another vocabulary).

    Example:
        >>> make_drafter(None, None) is None
        True
        >>> make_drafter("lookup", None, max_matches=1).max_matches
        1
        >>> make_drafter("lookup;num_draft_tokens=7", None).num_draft_tokens
        7
        >>> make_drafter("lookup & lookup;history_tokens=100", None).members
        'lookup & lookup'
    """
    from .drafters.base import Drafter

    if spec is None:
        return None
    if isinstance(spec, Drafter):
        drafter = spec
    else:
        if isinstance(spec, os.PathLike):
            spec = os.fspath(spec)
        if isinstance(spec, str) and UNION_SEP in spec:
            # Factory options (tokenizer=, ...) go to every member.
            return make_drafter({"kind": "union", "drafters": [make_drafter(part.strip(), target_model, **kw)
                                                                for part in spec.split(UNION_SEP)]}, target_model)
        if isinstance(spec, str):
            head, *pairs = spec.split(";")
            kind, sep, arg = head.partition(":")
            options = {"path": arg} if sep else {}
            options.update(_spec_options(spec, pairs))
        elif isinstance(spec, dict):
            options = dict(spec)
            kind = options.pop("kind", None)
            if not isinstance(kind, str):
                raise InvalidInputError(f"a drafter dict needs a 'kind' string (got {spec!r})")
        else:
            raise InvalidInputError(
                f"cannot make a drafter from {type(spec).__name__}; pass None, a Drafter, a kind name such as "
                "'lookup', 'draft-model:PATH', or a dict {'kind': ..., ...}"
            )
        kind = kind.strip()
        if kind not in _DRAFTERS:
            load_modalities()
        if kind not in _DRAFTERS:
            raise InvalidInputError(
                f"unknown drafter kind {kind!r}; known kinds: {', '.join(sorted(_DRAFTERS))}" + _unavailable_note()
            )
        options.update(kw)
        drafter = _DRAFTERS[kind](target_model, **options)
    if target_model is not None:
        drafter.bind(target_model)
    return drafter


def check_drafter_spec(spec) -> None:
    """Refuse a malformed drafter spec or an unknown kind without building anything (no model needed), so that
    entry points can say so before they load a model.

    Raises:
        InvalidInputError: unknown kind, malformed options, an unusable type.

    Example:
        >>> check_drafter_spec("lookup;num_draft_tokens=3 & auto")
        >>> check_drafter_spec("foo")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        mmspec.errors.InvalidInputError: unknown drafter kind 'foo'; known kinds: ...
    """
    from .drafters.base import Drafter

    if spec is None or isinstance(spec, Drafter):
        return
    if isinstance(spec, os.PathLike):
        spec = os.fspath(spec)
    if isinstance(spec, str):
        parts = [p.strip() for p in spec.split(UNION_SEP)] if UNION_SEP in spec else [spec]
        for part in parts:
            head, *pairs = part.split(";")
            _spec_options(part, pairs)
            _check_kind(head.partition(":")[0].strip())
        return
    if isinstance(spec, dict):
        kind = spec.get("kind")
        if not isinstance(kind, str):
            raise InvalidInputError(f"a drafter dict needs a 'kind' string (got {spec!r})")
        _check_kind(kind.strip())
        return
    raise InvalidInputError(f"cannot make a drafter from {type(spec).__name__}; pass None, a Drafter, a kind name "
                            "such as 'lookup', 'draft-model:PATH', or a dict {'kind': ..., ...}")


def _check_kind(kind: str) -> None:
    if kind not in _DRAFTERS:
        load_modalities()
    if kind not in _DRAFTERS:
        raise InvalidInputError(
            f"unknown drafter kind {kind!r}; known kinds: {', '.join(sorted(_DRAFTERS))}" + _unavailable_note()
        )


def _spec_options(spec: str, pairs: list[str]) -> dict:
    """``["topk=4", "name=x"]`` -> ``{"topk": 4, "name": "x"}`` (JSON values where they parse)."""
    options = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not key.strip():
            raise InvalidInputError(f"bad option {pair!r} in drafter spec {spec!r}; use 'kind:ARG;key=value'")
        try:
            options[key.strip()] = json.loads(value)
        except ValueError:
            options[key.strip()] = value
    return options


# ---------------------------------------------------------------------------- built-in drafters
def _lookup_factory(target_model, path=None, **options):
    from .drafters.lookup import PromptLookupDrafter

    if path:
        raise InvalidInputError(f"the lookup drafter takes no path (got 'lookup:{path}')")
    try:
        return PromptLookupDrafter(**options)
    except (TypeError, ValueError) as e:
        raise InvalidInputError(f"bad lookup drafter options {options!r}: {e}") from e


def _reference_lookup_factory(target_model, path=None, references=(), **options):
    from .drafters.reference import ReferenceLookupDrafter

    if path:
        raise InvalidInputError(f"reference-lookup takes no path (got 'reference-lookup:{path}'); it needs each "
                                "request's reference tokens, given with set_references(...)")
    try:
        return ReferenceLookupDrafter(references, **options)
    except TypeError as e:
        raise InvalidInputError(f"bad reference-lookup options {sorted(options)}: {e}") from e


def _auto_class_for(target_model, config):
    """The transformers auto class that loads ``config``, preferring the one that loaded the target."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    order = [AutoModelForCausalLM, AutoModelForImageTextToText]
    if target_model is not None and type(target_model.config) in AutoModelForImageTextToText._model_mapping:
        order.reverse()
    for auto in order:
        if type(config) in auto._model_mapping:
            return auto
    raise UnsupportedModelError(
        f"the draft model's type {getattr(config, 'model_type', '?')!r} has no causal-LM or image-text-to-text "
        "class in transformers; a draft model must be a decoder-only (V)LM"
    )


def _draft_model_factory(target_model, path=None, model=None, num_draft_tokens: int = 4, temperature: float = 1.0,
                         trust_remote_code: bool = False, dtype=None, min_confidence=None, **load_kw):
    from .drafters.draft_model import DraftModelDrafter

    if model is None:
        if not path:
            raise InvalidInputError("the draft-model drafter needs a path: 'draft-model:PATH' or {'path': ...}")
        from .checks import check_local_folder

        path = check_local_folder(str(path), "draft model folder")
        from transformers import AutoConfig

        try:
            config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
        except (OSError, ValueError) as e:
            raise InvalidInputError(f"cannot read the draft model's config at {path}: {e}") from e
        auto = _auto_class_for(target_model, config)
        if dtype is None and target_model is not None:
            dtype = target_model.dtype
        model = auto.from_pretrained(path, config=config, dtype=dtype, trust_remote_code=trust_remote_code,
                                     **load_kw).eval()
        if target_model is not None and "device_map" not in load_kw and target_model.device.type != "meta":
            model = model.to(target_model.device)
    return DraftModelDrafter(model, num_draft_tokens=num_draft_tokens, temperature=temperature,
                             min_confidence=min_confidence)


register_drafter("lookup", _lookup_factory)
register_drafter("reference-lookup", _reference_lookup_factory)
register_drafter("draft-model", _draft_model_factory)
