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

from dataclasses import dataclass, field

from .errors import InvalidInputError

__all__ = ["Example", "Workload", "register_workload", "get_workload", "workload_names", "SPLITS"]

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

    def examples(self, split: str, n: int, start: int = 0) -> list[Example]:
        """Items ``start .. start + n - 1`` of ``split``."""
        if split not in SPLITS:
            raise InvalidInputError(f"unknown split {split!r}; use one of {SPLITS}")
        return [self.example(split, i) for i in range(start, start + n)]


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
