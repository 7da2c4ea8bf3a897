"""What ``mmspec bench`` is asked to measure, checked before anything loads: its system and workload names,
the command-line values it parses (``--systems``, ``--sample``, ``--model NAME=PATH``) and the default target.

Why a module of its own: these are plain string rules with no torch in them, shared by the CLI, the systems
(:mod:`mmspec.bench_systems`) and the entry point (:mod:`mmspec.bench`), which re-exports every public name.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .errors import InvalidInputError

BUILTIN_SYSTEMS = ("ar", "hf-prompt-lookup", "hf-assistant", "ceiling")
"""Systems that are not mmspec drafters; every other system name is a drafter spec for the registry.
``ceiling`` (``ceiling;depth=N``, default 8) is mmspec's decode loop with a perfect drafter: the target's own
greedy output for the batch (computed untimed), proposed ``depth`` deep, so it measures what prefill and
verify costs leave reachable."""
LOOKUP_WITH_HISTORY = "lookup;history_tokens=20000"
"""Default bench system: prompt lookup that also searches the outputs of the requests benched before (a batch
job's memory; forgotten after the warm-up, so a request never meets its own output)."""
BUDGET_SUFFIX = "+budget"  # "lookup+budget": the same drafter with a DepthBudget learned over the run
CEILING_DEPTH = 8

DEFAULT_WORKLOADS = ("docs", "charts")
"""Workloads benchmarked when none are named (those of them that are registered)."""

HF_BATCH1_ONLY = "unsupported: transformers assisted generation is batch-1 only"


def default_model_path(workloads=()) -> str:
    """The target benchmarked when no ``--model`` is given: THE one place where that default is chosen.

    The trained target bundled with the first of ``workloads`` that ships one
    (:meth:`~mmspec.workloads.Workload.bundled_model`: the testbed VLM for ``docs`` and ``charts``); the
    tiny random demo VLM (built locally on first use) when none does.

    Example:
        >>> from mmspec.workloads import get_workload
        >>> default_model_path([get_workload("docs")]).endswith("testbed-vlm")      # doctest: +SKIP
        True
    """
    for wl in workloads:
        path = wl.bundled_model()
        if path:
            return path
    from .demo import tiny_vlm_path

    return tiny_vlm_path()


def parse_csv(text, cast=str, what: str = "value") -> list:
    """Split a comma-separated command-line value into a list (``None`` stays ``None``).

    Example:
        >>> parse_csv("docs, charts")
        ['docs', 'charts']
        >>> parse_csv("1,4", int, "batch size")
        [1, 4]
    """
    if text is None:
        return None
    items = [t.strip() for t in str(text).split(",") if t.strip()]
    try:
        return [cast(t) for t in items]
    except ValueError as e:
        raise InvalidInputError(f"bad {what} list {text!r}: {e}") from e


SAMPLING_KEYS = {"temperature": float, "top_k": int, "top_p": float}


def parse_sampling(text) -> dict | None:
    """``--sample`` on the command line: ``"temperature=0.7,top_k=50"`` -> a ``sampling`` dict (``None`` and
    ``""`` stay greedy; ``"default"`` samples with the model's generation config). Raises on unknown keys and
    values out of range.

    Example:
        >>> parse_sampling("temperature=0.7,top_k=50"), parse_sampling("default"), parse_sampling(None)
        ({'temperature': 0.7, 'top_k': 50}, {}, None)
    """
    if text is None or not str(text).strip():
        return None
    if str(text).strip() == "default":
        return {}
    out = {}
    for pair in parse_csv(text):
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or key not in SAMPLING_KEYS:
            raise InvalidInputError(f"bad --sample item {pair!r}: use key=value with keys {', '.join(SAMPLING_KEYS)}")
        try:
            out[key] = SAMPLING_KEYS[key](value)
        except ValueError as e:
            raise InvalidInputError(f"bad --sample value {pair!r}: {e}") from e
    from .checks import check_sampling

    try:  # the checks mmspec.generate makes (nan and inf temperatures included), before any model loads
        check_sampling(True, **out)
    except InvalidInputError as e:
        raise InvalidInputError(f"--sample {text!r}: {e}") from e
    return out


def split_rule(spec: str) -> tuple:
    """A system spec's acceptance rule, apart: ``"eagle:/h;topk=3;rule=sample_then_match"`` -> ``("eagle:/h;topk=3",
    "sample_then_match")``. Rule options follow the name after colons (``rule=NAME:key=value``; ``;`` and ``,``
    already separate drafter options and systems) and come back in the rule registry's ``"NAME;key=value"``.

    Example:
        >>> split_rule("eagle:/h;rule=lantern++:lambda=2+budget")
        ('eagle:/h+budget', 'lantern++;lambda=2')
        >>> split_rule("lookup")
        ('lookup', None)
    """
    suffix = BUDGET_SUFFIX if spec.endswith(BUDGET_SUFFIX) else ""
    parts = spec.removesuffix(suffix).split(";")
    rules = [p.strip()[len("rule="):] for p in parts if p.strip().startswith("rule=")]
    if len(rules) > 1:
        raise InvalidInputError(f"system {spec!r} names more than one acceptance rule")
    kept = ";".join(p for p in parts if not p.strip().startswith("rule="))
    return kept + suffix, (rules[0].replace(":", ";") if rules else None)


@dataclass
class _Named:
    """A workload stand-in for a run over the user's own requests (``--inputs``): a name, nothing else."""

    name: str


def _resolve_workloads(names) -> list:
    """Workload instances for ``names`` (default: the registered ones of :data:`DEFAULT_WORKLOADS`)."""
    from .workloads import get_workload, workload_names

    if not names:
        known = workload_names()
        names = [w for w in DEFAULT_WORKLOADS if w in known]
        if not names:
            raise InvalidInputError(
                f"the default workloads ({', '.join(DEFAULT_WORKLOADS)}) are not registered; pass --workload NAME "
                f"(known: {', '.join(known) or 'none'})"
            )
    return [get_workload(n) for n in names]


def model_for(workload: str, model: str | None) -> str | None:
    """The model folder for ``workload`` from ``--model``: a plain path (every workload), or
    ``name=PATH,name=PATH`` per workload (``None`` where it names none: the workload's bundled model).

    Example:
        >>> model_for("images", "driving=/m/vla,images=/m/gen"), model_for("docs", "driving=/m/vla")
        ('/m/gen', None)
        >>> model_for("docs", "/m/vlm")
        '/m/vlm'
    """
    pairs = model_pairs(model)
    return model if pairs is None else pairs.get(workload)


def model_pairs(model: str | None) -> dict | None:
    """``--model``'s ``NAME=PATH`` pairs as a dict, or ``None`` when it is one path (or absent).

    Example:
        >>> model_pairs("driving=/m/vla,images=/m/gen"), model_pairs("/runs/lr=1e-3/vla")
        ({'driving': '/m/vla', 'images': '/m/gen'}, None)
    """
    if not model or "=" not in model:
        return None
    parts = [p for p in model.split(",") if p]
    if not all("=" in p and "/" not in p.split("=", 1)[0] for p in parts):
        if len(parts) > 1:
            raise InvalidInputError(f"--model {model!r}: give one path, or NAME=PATH pairs separated by commas")
        return None  # a path that happens to contain "="
    from .workloads import workload_names

    pairs = dict(p.split("=", 1) for p in parts)
    unknown = sorted(set(pairs) - set(workload_names()))
    if unknown:
        raise InvalidInputError(f"--model names unknown workloads {unknown}; known: {', '.join(workload_names())}")
    return pairs


def _check_models(model: str | None, workloads: list) -> None:
    """Every model ``--model`` names, checked before anything loads: a pair for a workload the run does not
    measure is an error (it was once ignored silently), and each path must be a folder of its workload's kind
    (:meth:`~mmspec.workloads.Workload.check_model`)."""
    names = [w.name for w in workloads]
    extra = sorted(set(model_pairs(model) or {}) - set(names))
    if extra:
        raise InvalidInputError(f"--model names {', '.join(extra)}, which this run does not measure (workloads: "
                                f"{', '.join(names)}); drop it or add it to --workload")
    for w in workloads:
        path = model_for(w.name, model)
        if path:
            w.check_model(path)


def _same_folder(a, b) -> bool:
    return bool(a and b) and os.path.isdir(a) and os.path.isdir(b) and os.path.realpath(a) == os.path.realpath(b)
