"""``drafter="auto"``: the saved drafter with the best validation τ for this target, or a fallback that says so.

Why: a user holding a target and a few trained heads (the ones that ship with it, the runs of ``mmspec train``,
a colleague's folder) should not have to know which is best: each saved drafter's ``config.json`` names its kind,
the fingerprint of the target it was trained for and, when it was trained with held-out shards, its validation
figures (:mod:`mmspec.drafters.validation`). ``"auto"`` gathers the candidates from three places:

* **bundled**: the drafters that ship with the target (:func:`mmspec.workloads.bundled_drafter_specs`: a
  workload bundles both, and the target was loaded from that folder);
* **folder**: a folder the user names (``"auto:DIR"``, ``make_drafter("auto", model, drafter_dir=DIR)`` or
  ``MMSpecPipeline.from_pretrained(target, drafter="auto", drafter_dir=DIR)``): ``DIR`` itself when it is a saved
  drafter, else every saved drafter one level below it (e.g. a folder of ``mmspec train`` outputs);
* **cache**: every saved drafter one level below :func:`drafter_cache_dir` (``$MMSPEC_CACHE/drafters``, else
  ``$XDG_CACHE_HOME/mmspec/drafters``, else ``~/.cache/mmspec/drafters``).

A candidate is skipped, with its reason kept, when its fingerprint does not match the target (model type, sizes,
layer ids, tokenizer hash where the target's tokenizer can be read), its kind is not registered, its weights
are missing, or it fails to load, or (when the target's config records the fallback's own measured τ) its
validation τ does not beat the fallback's. Among the rest the highest validation ``tau`` wins (ties: folder, then cache,
then bundled, then path); drafters without validation figures come after every measured one. When none is
left the fallback (``"lookup"``, prompt lookup, by default) is used and the notes say why. The choice is kept on
the drafter (``drafter.auto_choice``, an :class:`AutoChoice`), logged on the ``mmspec`` logger, and shown by
pipelines as ``pipe.notes``.

Example:
    >>> pipe = MMSpecPipeline.from_pretrained("vision/assets/testbed-vlm", drafter="auto")  # doctest: +SKIP
    >>> pipe.notes                                                                          # doctest: +SKIP
    ['auto: chose eagle (bundled) vision/assets/testbed-vlm-eagle, validation tau 2.58 (val_log step 3000)']
    >>> choose_drafter(None).fallback
    'lookup'
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

from ..errors import DrafterMismatchError, InvalidInputError
from .saving import WEIGHTS_NAME, check_fingerprint

__all__ = ["Candidate", "AutoChoice", "drafter_cache_dir", "find_candidates", "choose_drafter", "auto_factory",
           "FALLBACK_KEY", "FALLBACK_VALIDATION_KEY"]

logger = logging.getLogger("mmspec")

SOURCES = ("folder", "cache", "bundled")
"""Where candidates come from, in the order that breaks ties of equal validation τ."""


def drafter_cache_dir() -> str:
    """The mmspec drafter cache: ``$MMSPEC_CACHE/drafters``, else ``$XDG_CACHE_HOME/mmspec/drafters``, else
    ``~/.cache/mmspec/drafters`` (the root the tiny demo model uses too). ``"auto"`` looks one level below it.

    Example:
        >>> drafter_cache_dir().endswith("drafters")
        True
    """
    root = os.environ.get("MMSPEC_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "mmspec")
    return os.path.join(root, "drafters")


@dataclass
class Candidate:
    """One saved drafter ``"auto"`` considered.

    Attributes:
        path: its folder.
        source: ``"bundled"``, ``"folder"`` or ``"cache"``.
        kind: the ``drafter_kind`` of its config (``None`` if unreadable).
        spec: the spec that builds it (``{"kind": ..., "path": DIR}``; a bundled one is its shipped spec string,
            options included).
        validation: its config's validation block (``None``: not measured).
        reason: why it was skipped (``None``: eligible).
        below_fallback: skipped because its validation τ does not beat the fallback's measured one.
    """

    path: str
    source: str
    kind: str | None = None
    spec: str | dict = ""
    validation: dict | None = None
    reason: str | None = None
    below_fallback: bool = False

    @property
    def tau(self) -> float | None:
        """The validation τ estimate (``None`` without validation figures)."""
        tau = (self.validation or {}).get("tau")
        return float(tau) if isinstance(tau, (int, float)) else None

    def describe(self) -> str:
        tau = "no validation figures" if self.tau is None else \
            f"validation tau {self.tau:.2f} ({(self.validation or {}).get('source', '?')})"
        return f"{self.kind} ({self.source}) {self.path}, {tau}"


@dataclass
class AutoChoice:
    """The outcome of ``"auto"``: the chosen candidate (``None``: the fallback was used), every candidate seen
    (ranked: eligible ones first, best first) and the fallback spec used, if any."""

    chosen: Candidate | None
    candidates: list = field(default_factory=list)
    fallback: str | None = None

    @property
    def fallback_won(self) -> bool:
        """The fallback was used because it beat the saved drafters' validation τ (a choice, not a miss)."""
        return self.chosen is None and any(c.below_fallback for c in self.candidates)

    @property
    def skipped(self) -> list:
        """The candidates left out, each with its ``reason``."""
        return [c for c in self.candidates if c.reason is not None]

    @property
    def notes(self) -> list[str]:
        """Human-readable lines: the choice (or the fallback and why), then each skipped candidate and its reason.

        Example:
            >>> AutoChoice(None, [], "lookup").notes
            ['auto: no saved drafter matches this target; using the fallback drafter lookup']
        """
        if self.chosen is not None:
            lines = [f"auto: chose {self.chosen.describe()}"]
        elif self.fallback_won:
            lines = [f"auto: no saved drafter beats the fallback drafter {self.fallback}; using it"]
        else:
            lines = [f"auto: no saved drafter matches this target; using the fallback drafter {self.fallback}"]
        lines += [f"auto: skipped {c.kind or 'drafter'} ({c.source}) {c.path}: {c.reason}" for c in self.skipped]
        return lines


def _saved_drafters(folder: str) -> list[str]:
    """``folder`` itself if it is a saved drafter, else the saved drafters one level below it (sorted)."""
    from .validation import read_drafter_config

    if read_drafter_config(folder) is not None:
        return [folder]
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    return [os.path.join(folder, n) for n in names
            if os.path.isdir(os.path.join(folder, n)) and read_drafter_config(os.path.join(folder, n)) is not None]


def _target_tokenizer(target_model):
    """The tokenizer of a target loaded from a local folder (for the fingerprint's tokenizer hash), else None."""
    folder = getattr(target_model, "name_or_path", None)
    if not folder or not os.path.isdir(folder):
        return None
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(folder)
    except (OSError, ValueError, TypeError):
        return None


def find_candidates(target_model, drafter_dir=None, cache_dir: str | None = "default", tokenizer=None) -> list:
    """Every saved drafter ``"auto"`` would consider for ``target_model``, each checked (``reason`` set when it
    cannot serve), unranked: folder, then cache, then bundled, each folder's drafters by path; a folder seen twice
    (by real path) is kept once, from its first source.

    Args:
        target_model: the loaded target.
        drafter_dir: a folder the user names (see the module docstring); must exist when given.
        cache_dir: the drafter cache (``"default"``: :func:`drafter_cache_dir`; ``None``: not searched).
        tokenizer: the target's tokenizer, for the fingerprint's tokenizer hash (default: loaded from the target's
            folder when it is local; not compared when there is none).

    Raises:
        InvalidInputError: ``drafter_dir`` does not exist or is not a folder.
    """
    from ..registry import drafter_kinds
    from ..workloads import bundled_drafter_specs
    from .validation import VALIDATION_KEY, read_drafter_config  # lazily: `python -m` runs that module

    found: list[tuple[str, str, str | None]] = []  # (path, source, spec)
    if drafter_dir is not None:
        d = os.path.expanduser(os.fspath(drafter_dir))
        if not os.path.isdir(d):
            raise InvalidInputError(f"drafter folder not found: {d}")
        found += [(p, "folder", None) for p in _saved_drafters(d)]
    if cache_dir == "default":
        cache_dir = drafter_cache_dir()
    if cache_dir and os.path.isdir(cache_dir):
        found += [(os.path.join(cache_dir, n), "cache", None) for n in sorted(os.listdir(cache_dir))
                  if read_drafter_config(os.path.join(cache_dir, n)) is not None]
    for spec in bundled_drafter_specs(target_model):
        path = spec.split(";")[0].partition(":")[2]
        if path:
            found.append((path, "bundled", spec))
    if tokenizer is None and found:
        tokenizer = _target_tokenizer(target_model)
    kinds = set(drafter_kinds())
    seen, out = set(), []
    for path, source, spec in found:
        real = os.path.realpath(path)
        if real in seen:
            continue
        seen.add(real)
        config = read_drafter_config(path)
        if config is None:
            out.append(Candidate(path, source, spec=spec or "", reason="no readable config.json with drafter_kind"))
            continue
        kind = config["drafter_kind"]
        validation = config.get(VALIDATION_KEY) if isinstance(config.get(VALIDATION_KEY), dict) else None
        # A dict spec, so a path holding ';' or ' & ' stays one path.
        c = Candidate(path, source, kind=kind, spec=spec or {"kind": kind, "path": path}, validation=validation)
        fingerprint = config.get("target_fingerprint")
        if kind not in kinds:
            c.reason = f"drafter kind {kind!r} is not registered (known: {', '.join(sorted(kinds))})"
        elif not os.path.isfile(os.path.join(path, WEIGHTS_NAME)):
            c.reason = f"no {WEIGHTS_NAME}"
        elif validation is not None and c.tau is None:
            c.reason = f"its validation block has no numeric tau ({validation!r})"
        elif not isinstance(fingerprint, dict) or not fingerprint:
            c.reason = "its config has no target_fingerprint, so it cannot be matched to this target"
        else:
            try:
                check_fingerprint(fingerprint, target_model, tokenizer)
            except DrafterMismatchError as e:
                c.reason = f"fingerprint does not match: {e}"
        out.append(c)
    return out


def _rank_key(c: Candidate):
    return (c.tau is None, -(c.tau or 0.0), SOURCES.index(c.source), c.path)


def choose_drafter(target_model, drafter_dir=None, cache_dir: str | None = "default", tokenizer=None,
                   fallback: str | None = "lookup", fallback_validation: dict | None = None) -> AutoChoice:
    """Rank the candidates of :func:`find_candidates` (highest validation τ first; unmeasured ones last) and pick
    the best eligible one; nothing is loaded here (:func:`auto_factory` loads, and moves on if loading fails).

    ``fallback_validation`` (``{"tau": ..., "source": ...}``, what the target's config records under
    :data:`FALLBACK_VALIDATION_KEY`): the fallback's own measured τ; a saved drafter must beat it to be chosen
    (the reader's training-free page lookup reaches τ ~6 on its pages, a small head trained here less).

    Example:
        >>> choice = choose_drafter(None)
        >>> choice.chosen is None, choice.notes[0]
        (True, 'auto: no saved drafter matches this target; using the fallback drafter lookup')
    """
    candidates = find_candidates(target_model, drafter_dir, cache_dir, tokenizer) if target_model is not None else []
    measured = fallback_validation or {}
    bar = measured.get("tau") if fallback else None
    if isinstance(bar, (int, float)):
        where = measured.get("source", "measured")
        for c in candidates:
            if c.reason is None and (c.tau is None or c.tau <= bar):
                mine = "no validation figures" if c.tau is None else f"validation tau {c.tau:.2f}"
                c.reason = f"{mine}, not above the fallback {fallback}'s tau {bar:.2f} ({where})"
                c.below_fallback = True
    ranked = sorted((c for c in candidates if c.reason is None), key=_rank_key)
    ranked += [c for c in candidates if c.reason is not None]
    chosen = ranked[0] if ranked and ranked[0].reason is None else None
    return AutoChoice(chosen, ranked, None if chosen is not None else fallback)


FALLBACK_KEY = "mmspec_fallback_drafter"
"""Config key by which a checkpoint names the training-free drafter that suits it (the reader: ``page-lookup``);
``"auto"`` falls back to it instead of ``"lookup"`` when no saved drafter matches."""
FALLBACK_VALIDATION_KEY = "mmspec_fallback_validation"
"""Config key holding that drafter's measured τ (``{"tau": ..., "source": ...}``): saved drafters must beat it."""


def auto_factory(target_model, path=None, drafter_dir=None, cache=True, fallback=None, tokenizer=None,
                 **options):
    """What the registry calls for ``"auto"``: the best eligible candidate, built by its own kind's factory (one
    that fails to load is marked skipped and the next is tried), else the fallback; ``drafter.auto_choice`` holds
    the :class:`AutoChoice`.

    Options (spec ``"auto:DIR;cache=false;fallback=none"``, or keywords): ``path`` / ``drafter_dir`` the user's
    folder, ``cache`` whether to search :func:`drafter_cache_dir`, ``fallback`` the spec used when nothing matches
    (default: the one the target's config names under :data:`FALLBACK_KEY`, else ``"lookup"``; ``"none"``: raise
    instead, for jobs that must not run without a trained drafter), ``tokenizer`` the target's.

    Raises:
        InvalidInputError: ``"auto"`` without a target, unknown options, a folder named twice or missing, or no
            match with ``fallback="none"``.

    Example:
        >>> auto_factory(None)
        Traceback (most recent call last):
        ...
        mmspec.errors.InvalidInputError: 'auto' chooses a drafter for a target: pass the loaded target model
    """
    from ..registry import make_drafter

    if options:
        raise InvalidInputError(f"unknown options for 'auto': {', '.join(sorted(options))} (it takes drafter_dir, "
                                "cache, fallback)")
    if target_model is None:
        raise InvalidInputError("'auto' chooses a drafter for a target: pass the loaded target model")
    if path and drafter_dir is not None:
        raise InvalidInputError(f"'auto:{path}' and drafter_dir={drafter_dir!r} both name a folder; keep one")
    fallback_validation = None
    if fallback is None:
        named = getattr(getattr(target_model, "config", None), FALLBACK_KEY, None)
        fallback = named if isinstance(named, str) and named else "lookup"
        measured = getattr(target_model.config, FALLBACK_VALIDATION_KEY, None) if named == fallback else None
        fallback_validation = measured if isinstance(measured, dict) else None
    if not isinstance(fallback, str) or fallback.split(";")[0].split(":")[0].strip() == "auto":
        raise InvalidInputError(f"fallback must be a drafter spec other than 'auto', or 'none' (got {fallback!r})")
    fallback = None if fallback == "none" else fallback
    choice = choose_drafter(target_model, path or drafter_dir, "default" if cache else None, tokenizer, fallback,
                            fallback_validation)
    drafter = None
    for c in [c for c in choice.candidates if c.reason is None]:
        try:
            drafter = make_drafter(c.spec, target_model)
            choice.chosen = c
            break
        except Exception as e:  # noqa: BLE001  a broken folder (bad weights raise safetensors' own error): say so,
            # keep the reason in the notes, try the next
            c.reason = f"failed to load: {str(e).splitlines()[0][:200] if str(e) else type(e).__name__}"
    if drafter is None:
        choice.chosen = None
        choice.candidates = [c for c in choice.candidates if c.reason is None] + \
            [c for c in choice.candidates if c.reason is not None]
        if fallback is None:
            raise InvalidInputError("'auto' found no saved drafter for this target and fallback is 'none'"
                                    + "".join(f"; {c.path}: {c.reason}" for c in choice.skipped))
        choice.fallback = fallback
        drafter = make_drafter(fallback, target_model)
        # a fallback that beat the saved heads on its measured tau is a choice, not a warning
        log = logger.info if choice.fallback_won else logger.warning
        for line in choice.notes:
            log(line)
    else:
        for line in choice.notes:
            logger.info(line)
    drafter.auto_choice = choice
    return drafter
