"""Workloads: deterministic, seeded task generators the testbed trains on and ``mmspec bench`` measures.

A workload produces :class:`Example` items (images, a prompt, the reference answer) for a split. Items are
generated on the fly from ``(split, index)`` alone, so the same call gives the same item on any machine,
the train and test splits never overlap, and nothing is downloaded or stored. Modality packages register
their workloads (``mmspec.vision`` registers ``docs`` and ``charts``; driving and image-generation worlds
slot in beside them) and the core finds them by name through :func:`get_workload`.

Example:
    >>> class Echo(Workload):
    ...     name = "echo"
    ...     def example(self, split, index):
    ...         return Example(id=f"{split}-{index}", prompt="say " + str(index), target=str(index))
    >>> _ = register_workload(Echo)
    >>> [e.target for e in get_workload("echo").examples("test", 3)]
    ['0', '1', '2']
"""

from __future__ import annotations

import hashlib
import random
import os
from dataclasses import dataclass, field

import numpy as np

from .errors import InvalidInputError

__all__ = ["Example", "Workload", "SeededWorkload", "ChatWorkload", "register_workload", "get_workload",
           "workload_names", "seed_for", "rngs_for", "check_item", "SPLITS"]

SPLITS = ("train", "test")


@dataclass
class Example:
    """One item of a workload.

    Attributes:
        id: stable identifier, ``"<workload>/<split>/<index>"`` by convention.
        prompt: the user text (the pipeline wraps it in the model's chat template).
        target: the reference answer (Markdown transcription, a copied value, a caption...).
        images: PIL images the prompt refers to, in order.
        meta: workload-specific facts (regime: ``"copy"``, ``"grounded"``, ``"caption"``; source fields...).
    """

    id: str
    prompt: str
    target: str
    images: list = field(default_factory=list)
    meta: dict = field(default_factory=dict)


class Workload:
    """Base class: subclasses set ``name`` and implement :meth:`example`.

    ``example(split, index)`` must be a pure function of its arguments (seed everything from them), so that
    items are reproducible and the splits disjoint.
    """

    name = "base"

    def example(self, split: str, index: int) -> Example:
        """The ``index``-th item of ``split``."""
        raise NotImplementedError  # abstract: every concrete workload overrides it

    def bundled_model(self) -> str | None:
        """Folder of the trained target shipped for this workload (``None``: none ships); what ``mmspec
        bench`` and ``mmspec demo`` run when no model is named."""
        return None

    def bundled_drafters(self) -> list[str]:
        """Drafter specs trained for :meth:`bundled_model` that ship with it (e.g. ``["eagle:DIR"]``)."""
        return []

    model_task = "vlm"
    """The pipeline task of the models this workload measures (``"vlm"``; ``"driving"``, ``"images"`` for the
    plain-pipeline worlds), checked by :meth:`check_model`."""

    model_marker = None
    """A file only this workload's kind of model folder holds (e.g. ``"action_expert.json"``): accepted as the
    kind's mark in folders saved before their config named the task."""

    def check_model(self, path) -> None:
        """Raise :class:`~mmspec.InvalidInputError` if ``path`` cannot be this workload's model: a missing local
        folder, or a checkpoint of another task (its ``config.json`` names ``mmspec_task``). ``mmspec bench``
        calls it for every ``--model`` before anything loads. Hub ids pass (nothing is downloaded to check).

        Example:
            >>> Workload().check_model("/no/such/model")
            Traceback (most recent call last):
            ...
            mmspec.errors.InvalidInputError: model folder for workload 'base' not found: /no/such/model
        """
        from .checks import check_local_folder, looks_local

        path = check_local_folder(path, f"model folder for workload {self.name!r}")
        if not looks_local(path):
            return
        task = None
        if os.path.isfile(os.path.join(path, "config.json")):
            import json

            with open(os.path.join(path, "config.json")) as f:
                task = json.load(f).get("mmspec_task")
        if task is None and self.model_marker and os.path.isfile(os.path.join(path, self.model_marker)):
            task = self.model_task
        if task == self.model_task or (task is None and self.model_task == "vlm"):
            return
        what = f"a {task} model" if task else f"not a {self.model_task} model (its config names no mmspec_task)"
        raise InvalidInputError(f"{path} is {what}; workload {self.name!r} measures a {self.model_task} model")

    plain_pipeline = False
    """``True`` for workloads served by their own pipeline (a driving VLA's step, an image generator) rather
    than a text-generating target: ``mmspec bench`` then calls :meth:`bench_plain` for them."""

    plain_systems = False
    """``True`` when :meth:`bench_plain` measures the systems of ``cfg.systems`` itself (speculative ones beside
    ``ar``); otherwise ``mmspec bench`` refuses systems other than ``ar`` for the workload."""

    def bench_plain(self, model: str | None, examples: list, cfg, progress: bool = True) -> list[dict]:
        """Measure this workload's own plain (non-speculative) pipeline on ``examples``: the ``ar`` records of
        ``mmspec bench`` (:func:`mmspec.bench.plain_record`), with latency per stage and quality fields.

        ``model``: the folder to load (``None``: :meth:`bundled_model`); ``cfg``: the
        :class:`~mmspec.bench.BenchConfig` of the run. Only workloads with :attr:`plain_pipeline` implement it.
        """
        # Not a stub: workloads served by a text-generating target go through the bench's VLM systems instead.
        raise NotImplementedError(f"workload {self.name!r} is benchmarked through a target's generate")

    def check_plain_systems(self, systems) -> None:
        """Raise :class:`~mmspec.InvalidInputError` for a system :meth:`bench_plain` cannot measure (called by ``mmspec
        bench`` before any model loads, for workloads with :attr:`plain_systems`). Nothing to check by default."""

    resumable = False
    """``True`` when :meth:`bench_plain` honours ``cfg.resume`` (a checkpoint a killed bench run continues from)."""

    quality_full = False
    """``True`` when :meth:`bench_plain` has a quality run (``mmspec bench --quality full``, ``cfg.quality``)."""

    own_systems: tuple = ()
    """Bench system names (the part before the first ``;``) this VLM workload measures itself, beside the bench's
    systems (the docs workload's ``hierarchical``): ``mmspec bench`` hands them to :meth:`bench_own`."""

    def check_own(self, systems: list, bundled=()) -> None:
        """Raise :class:`~mmspec.InvalidInputError` for a malformed system of :attr:`own_systems` (called by
        ``mmspec bench`` before any model loads). Nothing to check by default."""

    def bench_own(self, pipe, systems: list, cfg, progress: bool = True, bundled=()) -> list[dict]:
        """Measure the systems of :attr:`own_systems` named in the run (``systems``, as given) with the run's loaded
        target pipeline ``pipe``; returns their records. ``bundled``: the drafter specs shipped for the target.
        Only workloads with :attr:`own_systems` implement it."""
        # Not a stub: a workload that names no systems of its own is never asked to measure any.
        raise NotImplementedError(f"workload {self.name!r} measures no systems of its own")

    def examples(self, split: str, n: int, start: int = 0) -> list[Example]:
        """Items ``start .. start + n - 1`` of ``split``."""
        check_item(split, start)
        return [self.example(split, i) for i in range(start, start + n)]


# ---------------------------------------------------------------------------- seeded worlds
# An item must be a pure function of (workload name, seed, split, index), identical on every machine and
# in every process, with train and test drawn from different random streams. Python's hash() is salted
# per process, so seeds come from SHA-256.


def seed_for(name: str, split: str, index: int, seed: int = 0) -> int:
    """A 64-bit seed from SHA-256 of the workload name, the global ``seed``, the split and the index.

    Example:
        >>> seed_for("charts", "test", 7) < 2 ** 64
        True
    """
    key = f"mmspec-workload\x00{name}\x00{seed}\x00{split}\x00{index}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "big")


def rngs_for(name: str, split: str, index: int, seed: int = 0) -> tuple[random.Random, np.random.Generator]:
    """A ``random.Random`` (content) and a ``numpy`` generator (pixel noise) for one item.

    Example:
        >>> a, _ = rngs_for("docs", "train", 1)
        >>> b, _ = rngs_for("docs", "train", 1)
        >>> a.random() == b.random()
        True
    """
    s = seed_for(name, split, index, seed)
    return random.Random(s), np.random.default_rng(s)


def check_item(split, index) -> int:
    """Validate ``split`` and ``index``; raise :class:`~mmspec.errors.InvalidInputError` otherwise.

    Example:
        >>> check_item("train", 3)
        3
    """
    if split not in SPLITS:
        raise InvalidInputError(f"unknown split {split!r}; use one of {SPLITS}")
    if isinstance(index, bool) or not isinstance(index, (int, np.integer)) or index < 0:
        raise InvalidInputError(f"index must be a non-negative integer, got {index!r}")
    return int(index)


class SeededWorkload(Workload):
    """A :class:`~mmspec.workloads.Workload` whose items are drawn from per-item seeded generators.

    Subclasses implement ``generate(rng, nrng, split, index, draw=True) -> Example`` and may set ``seed``
    (an int mixed into every item's seed: a different ``seed`` gives a different, equally valid world).
    With ``draw=False`` a subclass skips the pixels (``images == []``) but must return the same prompt,
    target and content, which :meth:`text_example` exposes (fast text for tokenizers); so the pixel work
    must come after every draw that decides content.
    """

    name = "seeded"
    seed = 0
    seed_key: str | None = None
    """The name items are seeded by (default: :attr:`name`); a renamed world keeps its items by keeping it."""

    def example(self, split: str, index: int) -> Example:
        return self._make(split, index, True)

    def text_example(self, split: str, index: int) -> Example:
        """The item without pixels (``images == []``): same id, prompt, target and content; much faster."""
        return self._make(split, index, False)

    def _make(self, split, index, draw: bool) -> Example:
        index = check_item(split, index)
        rng, nrng = rngs_for(self.seed_key or self.name, split, index, self.seed)
        ex = self.generate(rng, nrng, split, index, draw=draw)
        ex.id = f"{self.name}/{split}/{index}"
        ex.meta.setdefault("split", split)
        ex.meta.setdefault("index", index)
        return ex

    def generate(self, rng: random.Random, nrng: np.random.Generator, split: str, index: int,
                 draw: bool = True) -> Example:
        raise NotImplementedError  # abstract: every concrete workload overrides it


_WORKLOADS: dict[str, type] = {}


def register_workload(cls: type) -> type:
    """Make a :class:`Workload` subclass available by its ``name`` (usable as a class decorator)."""
    _WORKLOADS[cls.name] = cls
    return cls


def workload_names() -> list[str]:
    """Names of every registered workload (modality packages are imported first so they can register)."""
    from .registry import load_modalities

    load_modalities()
    return sorted(_WORKLOADS)


def get_workload(name: str, **kwargs) -> Workload:
    """An instance of the workload called ``name``.

    Raises:
        InvalidInputError: no workload has that name (the message lists those that do).
    """
    if name not in _WORKLOADS:
        from .registry import load_modalities

        load_modalities()
    if name not in _WORKLOADS:
        raise InvalidInputError(f"unknown workload {name!r}; known: {', '.join(sorted(_WORKLOADS)) or 'none'}")
    return _WORKLOADS[name](**kwargs)



# ---------------------------------------------------------------------------- chat (text-only)
CHAT_TEMPLATES = (
    "Explain how {s} works.", "Write a short story about {s}.", "Give three tips about {s}.",
    "What is {s}? Answer in two sentences.", "Describe {s} to a child.", "Write a short poem about {s}.",
    "List five facts about {s}.", "Why do people like {s}?", "Write a short email to a friend about {s}.",
    "Compare {s} with something similar.", "What are the main parts of {s}?", "Give a brief history of {s}.",
    "Write a product description for {s}.", "What problems can {s} cause, and how can they be solved?",
    "Summarize what you know about {s} in one paragraph.", "Write a dialogue between two people about {s}.",
)
CHAT_SUBJECTS = (
    "a bicycle", "the moon", "a rainbow", "coffee", "the ocean", "a volcano", "bees", "a library", "chess",
    "the internet", "a garden", "rain", "a computer", "football", "bread", "a train", "music", "the sun",
    "a forest", "a cat", "a dog", "the weather", "a camera", "electricity", "a bridge", "money", "a city",
    "the brain", "sleep", "a mountain", "a river", "birds", "a school", "a hospital", "a robot", "the desert",
    "snow", "a phone", "a museum", "a map", "the alphabet", "a clock", "a kitchen", "recycling", "the stars",
    "a farm", "a piano", "a boat", "an airplane", "vegetables", "exercise", "a birthday party", "a castle",
    "a newspaper", "friendship", "the wind", "a candle", "a puzzle", "honey", "a telescope",
)
CHAT_STYLES = ("", " Keep it short.", " Use simple words.", " Be friendly.", " Answer in a few sentences.")
CHAT_TEST_SHARE = 8
"""One (template, subject) pair in ``CHAT_TEST_SHARE`` is a test pair (by hash); the rest are training pairs."""


def _chat_is_test(template: int, subject: int) -> bool:
    h = hashlib.sha256(f"chat\x00{template}\x00{subject}".encode()).digest()
    return h[0] % CHAT_TEST_SHARE == 0


class ChatWorkload(SeededWorkload):
    """``chat``: text-only instruction prompts for a chat language model, made offline from templates.

    Why: a text target (SmolLM2-135M-Instruct, the reader's language model) needs prompts to train a head on and to
    measure it with, and none may be downloaded. Each item is an instruction built from a template, a subject and a
    style (``"Explain how a bicycle works. Keep it short."``); the target answers it in its own words, and its own
    answers are the training data (the reference ``target`` is empty: there is no gold text). The (template,
    subject) pairs are split by a hash, so no test instruction is a training one. ``images`` is empty.

    Example:
        >>> w = ChatWorkload()
        >>> w.example("test", 0).prompt == w.example("test", 0).prompt
        True
        >>> {e.prompt for e in w.examples("train", 200)} & {e.prompt for e in w.examples("test", 200)}
        set()
    """

    name = "chat"
    _pairs: dict = {}

    @classmethod
    def pairs(cls, split: str) -> list:
        if split not in cls._pairs:
            want = split == "test"
            cls._pairs[split] = [(t, s) for t in range(len(CHAT_TEMPLATES)) for s in range(len(CHAT_SUBJECTS))
                                 if _chat_is_test(t, s) == want]
        return cls._pairs[split]

    def generate(self, rng, nrng, split: str, index: int, draw: bool = True) -> Example:
        pairs = self.pairs(split)
        t, s = pairs[rng.randrange(len(pairs))]
        style = CHAT_STYLES[rng.randrange(len(CHAT_STYLES))]
        return Example(id="", prompt=CHAT_TEMPLATES[t].format(s=CHAT_SUBJECTS[s]) + style, target="",
                       meta={"template": t, "subject": s})


register_workload(ChatWorkload)


ASSEMBLED_FROM = "mmspec_assembled_from"
"""Config key of a checkpoint built from a shipped folder: that folder (its bundled drafters are the checkpoint's)."""


def bundled_drafter_path(kind: str, target_model) -> str | None:
    """The folder of the trained ``kind`` drafter that ships for ``target_model`` (``None``: none does).

    Why: a trained kind named without a path (``"eagle"``) must mean one thing everywhere (``--drafter``,
    ``from_pretrained(..., drafter=)``, ``make_drafter``, ``mmspec bench --systems``): the head trained for this
    target, never a random one. A head ships for a target when a workload bundles both
    (:meth:`Workload.bundled_model`, :meth:`Workload.bundled_drafters`) and the target was loaded from that
    bundled folder.

    Example:
        >>> bundled_drafter_path("eagle", None) is None
        True
    """
    for spec in bundled_drafter_specs(target_model):
        spec_kind, _, path = spec.split(";")[0].partition(":")
        if spec_kind == kind and path:
            return path
    return None


def bundled_drafter_specs(target_model) -> list[str]:
    """Every drafter spec that ships for ``target_model`` (``"kind:DIR;options"``, each once, in workload order):
    those of the workloads whose :meth:`Workload.bundled_model` is the folder the target was loaded from.

    Example:
        >>> bundled_drafter_specs(None)
        []
    """
    loaded_from = getattr(target_model, "name_or_path", None) if target_model is not None else None
    if not loaded_from or not os.path.isdir(loaded_from):
        return []
    # a checkpoint assembled from a bundled folder (the reader: its LM joined from a GGUF) stands for that folder
    sources = {os.path.realpath(loaded_from)}
    assembled = getattr(getattr(target_model, "config", None), ASSEMBLED_FROM, None)
    if isinstance(assembled, str) and assembled:
        sources.add(os.path.realpath(assembled))
    specs = []
    for name in workload_names():
        wl = _WORKLOADS[name]()
        model = wl.bundled_model()
        if model and os.path.realpath(model) in sources:
            specs += [s for s in wl.bundled_drafters() if s not in specs]
    return specs
