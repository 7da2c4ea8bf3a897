"""The systems ``mmspec bench`` runs: plain AR, transformers' assisted generation, every mmspec drafter and the
ceiling (a perfect drafter), each behind one :class:`System` interface, and the rules that turn ``--systems``
names into them.

Why a module of its own: the bench loop (:mod:`mmspec.bench_timing`) treats every system alike; what differs
between them (how each generates, which batch sizes it takes, what its record must note) lives here.
"""

from __future__ import annotations

import os
from contextlib import contextmanager

import torch

from .bench_options import (BUDGET_SUFFIX, BUILTIN_SYSTEMS, CEILING_DEPTH, HF_BATCH1_ONLY, LOOKUP_WITH_HISTORY,
                            split_rule)
from .budget import DepthBudget
from .errors import InvalidInputError
from .registry import UNION_SEP

def _resolve_systems(names, draft_model, bundled=()) -> list[str]:
    """Validated system names, AR first; raises :class:`InvalidInputError` on unknown ones. ``bundled``:
    drafter specs shipped for the default target, added to the default list; a trained kind named bare
    (``eagle``, ``eagle;topk=3``, ``eagle+budget``) means the shipped head, and is refused when none ships.

    Example:
        >>> _resolve_systems(["eagle;topk=3+budget", "lookup"], None, ["eagle:/heads/e"])
        ['ar', 'eagle:/heads/e;topk=3+budget', 'lookup']
    """
    from .registry import drafter_kinds
    from .train import trainer_kinds

    if not names:
        names = (["ar", "ceiling", "hf-prompt-lookup", "lookup", LOOKUP_WITH_HISTORY] + list(bundled)
                 + [f"{b}{UNION_SEP}{LOOKUP_WITH_HISTORY}" for b in bundled]
                 + (["hf-assistant", "draft-model"] if draft_model else []))
    kinds = drafter_kinds()
    trained = set(trainer_kinds())
    shipped = {spec.partition(":")[0]: spec for spec in bundled}
    out = ["ar"]
    for name in names:
        given = name
        name, rule = split_rule(name)
        if rule is not None:
            if name.split(";")[0] == "ceiling" or name.removesuffix(BUDGET_SUFFIX) in BUILTIN_SYSTEMS:
                raise InvalidInputError(f"system {given!r} takes no acceptance rule (only mmspec drafters do)")
            from .acceptance import get_rule

            try:
                get_rule(rule.replace(":", ";"), do_sample=True)
            except ValueError as e:  # ";rule=" applies to the whole system: in a union it comes last
                raise InvalidInputError(f"system {given!r}: {e}") from e
        suffix = BUDGET_SUFFIX if name.endswith(BUDGET_SUFFIX) else ""
        parts = [p.strip() for p in name.removesuffix(suffix).split(UNION_SEP)]
        for i, part in enumerate(parts):
            head = part.split(";")[0]
            if head in trained:
                # A trained kind named without a path would be built untrained and measure nothing: it means
                # the head that ships for the default target, or it is an error.
                if head not in shipped:
                    raise InvalidInputError(f"system {name!r} names no trained {head} head; use '{head}:DIR' "
                                            "(a checkpoint from `mmspec train`)")
                parts[i] = shipped[head] + part[len(head):]
        name = UNION_SEP.join(parts) + suffix
        if rule is not None:
            name = f"{name.removesuffix(suffix)};rule={rule.replace(';', ':')}{suffix}"
        if name in out:
            continue
        if name.split(";")[0] == "ceiling":
            CeilingSystem.parse_depth(name)  # raises on bad options
            out.append(name)
            continue
        base = name.removesuffix(BUDGET_SUFFIX)
        if base != name and base in BUILTIN_SYSTEMS:
            raise InvalidInputError(f"{BUDGET_SUFFIX!r} applies to mmspec drafters, not to {base!r}")
        if base not in BUILTIN_SYSTEMS and any(p.split(";")[0].partition(":")[0] not in kinds for p in parts):
            raise InvalidInputError(
                f"unknown system {name!r}; systems: {', '.join(BUILTIN_SYSTEMS)}, or an mmspec drafter "
                f"({', '.join(kinds)}, optionally 'kind:PATH', ';key=value' options, 'A{UNION_SEP}B' for the "
                f"union of two drafters' trees, and '{BUDGET_SUFFIX}' for a cost-aware depth budget)"
            )
        if not draft_model and (base == "hf-assistant" or any(p.split(";")[0] == "draft-model" for p in parts)):
            raise InvalidInputError(
                f"system {name!r} needs a small model with the target's tokenizer: --draft-model PATH"
            )
        out.append(name)
    return out


@contextmanager
def count_forwards(model):
    """Count calls of ``model``'s forward inside the block (a forward pre-hook); yields a 1-item list.

    Example:
        >>> lin = torch.nn.Linear(2, 2)
        >>> with count_forwards(lin) as n:
        ...     _ = lin(torch.ones(2)); _ = lin(torch.ones(2))
        >>> n[0]
        2
    """
    count = [0]
    handle = model.register_forward_pre_hook(lambda *_: count.__setitem__(0, count[0] + 1))
    try:
        yield count
    finally:
        handle.remove()


class System:
    """One way of generating greedily with the target: ``run(inputs) -> (sequences, stats | None, forwards)``.

    Why: the bench loop treats AR, transformers' assisted generation and every mmspec drafter the same;
    a system only says how it generates (:meth:`_generate`), which batch sizes it takes
    (:meth:`unsupported`), and what kind it is (``"ar"``, ``"hf"``, ``"mmspec"``, for the record).

    Example:
        >>> class Echo(System):
        ...     def _generate(self, inputs):
        ...         return inputs["input_ids"], None
        >>> Echo("echo", torch.nn.Identity(), 4).run({"input_ids": torch.ones(1, 3)})[2]
        0
    """

    kind = "ar"
    note = None  # what a reader of the record must know about how this system was run

    def __init__(self, name: str, model, max_new_tokens: int):
        self.name = name
        self.model = model
        self.max_new_tokens = max_new_tokens
        self.sampling = None  # None: greedy; else generate's sampling kwargs (BenchConfig.sampling)
        self.seed = 0  # the seed of the next run when sampling (set per batch by the bench)

    def _mode_kwargs(self) -> dict:
        """``generate`` kwargs of the run's decoding mode: greedy, or sampling with its settings."""
        return {"do_sample": False} if self.sampling is None else {"do_sample": True, **self.sampling}

    @property
    def label(self) -> str:
        """The record's ``system``: the name without a drafter's path (``"eagle:DIR;topk=4"`` ->
        ``"eagle;topk=4"``), so records are keyed by kind and variant, not by where a file lies.

        Example:
            >>> System("eagle:/tmp/head;topk=4+budget", None, 1).label
            'eagle;topk=4+budget'
            >>> System("eagle:/tmp/head+budget", None, 1).label
            'eagle+budget'
            >>> System("eagle:/tmp/head & lookup;history_tokens=9", None, 1).label
            'eagle & lookup;history_tokens=9'
        """
        return getattr(self, "_label", None) or _label_of(self.name)

    def unsupported(self, batch_size: int) -> str | None:
        """``None`` when the system can run this batch size, else the record's ``"unsupported: ..."`` status."""
        return None

    def forget(self) -> None:
        """Drop what the system remembered across requests (called after the warm-up)."""

    def prepare(self, inputs) -> None:
        """Untimed work before a timed run on ``inputs`` (the ceiling computes its reference here)."""

    def use_references(self, references: list) -> None:
        """The next batch's reference answers, as token ids per row (empty where an example has none): only a
        drafter that knows them (the ``reference-lookup`` audit drafter) reads them."""

    def run(self, inputs) -> tuple:
        """Generate for ``inputs``; returns ``(sequences, SpecStats or None, target forward calls)``."""
        with count_forwards(self.model) as n:
            sequences, stats = self._generate(inputs)
        return sequences, stats, n[0]

    def _generate(self, inputs) -> tuple:
        raise NotImplementedError  # abstract: each system says how it generates


class ARSystem(System):
    """Plain greedy ``model.generate``: the reference of every ratio."""

    kind = "ar"

    def _generate(self, inputs):
        if self.sampling is not None:
            torch.manual_seed(self.seed)
        return self.model.generate(**inputs, max_new_tokens=self.max_new_tokens, **self._mode_kwargs()), None


class HFAssistedSystem(System):
    """transformers' assisted generation (``prompt_lookup_num_tokens=`` or ``assistant_model=``).

    transformers raises "assisted generate is only supported for batch_size = 1" for larger batches.
    Prompt lookup on a VLM copies the prompt's image placeholders into its drafts, which the model then
    rejects; transformers drops draft tokens its logits processors forbid, so the placeholder ids are passed
    as ``suppress_tokens`` (the model never emits them, so its greedy output is unchanged; the record says so).
    """

    kind = "hf"

    def __init__(self, name, model, max_new_tokens, **assist_kwargs):
        super().__init__(name, model, max_new_tokens)
        self.assist_kwargs = assist_kwargs
        placeholders = placeholder_token_ids(model) if "prompt_lookup_num_tokens" in assist_kwargs else []
        if placeholders:
            self.assist_kwargs["suppress_tokens"] = placeholders
            self.note = f"suppress_tokens={placeholders} (the image placeholders), else transformers' lookup fails"

    def unsupported(self, batch_size):
        return HF_BATCH1_ONLY if batch_size > 1 else None

    def _generate(self, inputs):
        if self.sampling is not None:
            torch.manual_seed(self.seed)
        out = self.model.generate(**inputs, max_new_tokens=self.max_new_tokens, **self._mode_kwargs(),
                                  **self.assist_kwargs)
        return out, None


class MMSpecSystem(System):
    """:func:`mmspec.generate` with one drafter, built once from a registry spec and reused."""

    kind = "mmspec"

    def __init__(self, name, model, max_new_tokens, drafter, budget=None, rule=None):
        super().__init__(name, model, max_new_tokens)
        self.drafter = drafter
        self.budget = budget
        self.rule = rule  # acceptance rule spec; None: the lossless rule of the mode
        stop = getattr(drafter, "stop", None)
        if stop is not None and "min_confidence=" not in name:  # a saved setting the label does not show
            self.note = f"min_confidence={stop.spec()} (saved with the drafter)"

    def forget(self):
        self.drafter.forget()

    def use_references(self, references):
        setter = getattr(self.drafter, "set_references", None)
        if setter is not None:
            setter(references)

    def _generate(self, inputs):
        from .decode import generate

        seed = None if self.sampling is None else self.seed
        out = generate(self.model, inputs, drafter=self.drafter, max_new_tokens=self.max_new_tokens,
                       budget=self.budget, record_entropy=True, rule=self.rule, seed=seed, **self._mode_kwargs())
        return out.sequences, out.stats


class CeilingSystem(MMSpecSystem):
    """mmspec's loop with a perfect drafter: the target's own greedy continuation of each row (computed by
    :meth:`prepare`, outside the clock), proposed ``depth`` tokens deep as a chain (a noise-free
    :class:`~mmspec.drafters.oracle.NoisyOracleDrafter`). Its speedup is the most any drafter of that depth
    can reach with this target on this machine; other records give their speedup as a fraction of it.

    Example:
        >>> CeilingSystem.parse_depth("ceiling;depth=16"), CeilingSystem.parse_depth("ceiling")
        (16, 8)
    """

    def __init__(self, name, model, max_new_tokens):
        super().__init__(name, model, max_new_tokens, drafter=None)
        self.depth = self.parse_depth(name)
        self.note = f"perfect drafter (the target's greedy output), chain of {self.depth}"

    @staticmethod
    def parse_depth(name: str) -> int:
        opts = dict(o.split("=", 1) for o in name.split(";")[1:] if "=" in o)
        bad = [o for o in name.split(";")[1:] if not o.startswith("depth=")]
        try:
            depth = int(opts.get("depth", CEILING_DEPTH))
        except ValueError:
            depth = 0
        if bad or depth < 1:
            raise InvalidInputError(f"system {name!r}: the ceiling takes one option, depth=N (N >= 1)")
        return depth

    def forget(self):
        pass

    def unsupported(self, batch_size):
        return "unsupported: the ceiling is a greedy oracle (sampling run)" if self.sampling is not None else None

    def prepare(self, inputs):
        from .drafters.oracle import NoisyOracleDrafter

        ref = self.model.generate(**inputs, do_sample=False, max_new_tokens=self.max_new_tokens)
        self.drafter = NoisyOracleDrafter(ref[:, inputs["input_ids"].shape[1]:].cpu(), depth=self.depth,
                                          corrupt_p=0.0)


def placeholder_token_ids(model) -> list[int]:
    """Ids of a VLM's image/video placeholder and boundary tokens, from its config (empty for text models).

    Example:
        >>> from transformers import Qwen2VLConfig
        >>> placeholder_token_ids(type("M", (), {"config": Qwen2VLConfig()})())
        [151652, 151653, 151655, 151656]
    """
    cfg = model.config
    names = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id",
             "image_token_index", "boi_token_id", "eoi_token_id")
    ids = {getattr(cfg, n, None) for n in names} | {getattr(cfg.get_text_config(), n, None) for n in names}
    return sorted(i for i in ids if isinstance(i, int) and i >= 0)


def _with_draft_model(spec: str, path: str | None) -> str:
    """``spec`` with the bench's ``--draft-model`` path filled in when it names the draft-model kind bare.

    Example:
        >>> _with_draft_model("draft-model;min_confidence=auto", "/m"), _with_draft_model("lookup", "/m")
        ('draft-model:/m;min_confidence=auto', 'lookup')
    """
    head, sep, opts = spec.partition(";")
    return f"{head}:{path}{sep}{opts}" if head == "draft-model" and path else spec


def _lookup_depth(spec: str, tokens: int) -> str:
    """``spec`` with ``num_draft_tokens=tokens`` added when it is a lookup drafter that does not set its depth.

    Example:
        >>> _lookup_depth("lookup;history_tokens=9", 10), _lookup_depth("eagle:/h", 10)
        ('lookup;history_tokens=9;num_draft_tokens=10', 'eagle:/h')
    """
    if spec.split(";")[0] != "lookup" or "num_draft_tokens=" in spec:
        return spec
    return f"{spec};num_draft_tokens={tokens}"


def build_systems(names: list[str], model, cfg, max_new_tokens: int) -> list[System]:
    """Turn validated system names into :class:`System` objects bound to ``model``, as the run's
    :class:`~mmspec.bench.BenchConfig` ``cfg`` says (its ``draft_model``, ``lookup_tokens`` and ``sampling``).

    mmspec systems come from the drafter registry (:func:`mmspec.registry.make_drafter`); the small
    model behind ``draft-model`` is loaded once and also serves as transformers' ``assistant_model``.

    Example:
        >>> from types import SimpleNamespace
        >>> cfg = SimpleNamespace(draft_model=None, lookup_tokens=8, sampling=None)
        >>> [(s.label, s.kind) for s in build_systems(["ar", "lookup+budget"], torch.nn.Identity(), cfg, 4)]
        [('ar', 'ar'), ('lookup+budget', 'mmspec')]
    """
    from .registry import make_drafter

    small = None
    if cfg.draft_model and {"hf-assistant", "draft-model"} & set(names):
        small = make_drafter({"kind": "draft-model", "path": cfg.draft_model}, model)
    systems = []
    for name in names:
        if name == "ar":
            systems.append(ARSystem(name, model, max_new_tokens))
        elif name.split(";")[0] == "ceiling":
            systems.append(CeilingSystem(name, model, max_new_tokens))
        elif name == "hf-prompt-lookup":
            systems.append(HFAssistedSystem(name, model, max_new_tokens, prompt_lookup_num_tokens=cfg.lookup_tokens))
        elif name == "hf-assistant":
            systems.append(HFAssistedSystem(name, model, max_new_tokens, assistant_model=small.model))
        else:
            spec, rule = split_rule(name)
            base = spec.removesuffix(BUDGET_SUFFIX)
            if base == "draft-model":
                drafter = small
            else:  # lookups draft as deep as transformers' prompt lookup; a bare draft-model gets --draft-model
                drafter = make_drafter(UNION_SEP.join(_with_draft_model(_lookup_depth(p.strip(), cfg.lookup_tokens),
                                                                        cfg.draft_model)
                                                      for p in base.split(UNION_SEP)), model)
            budget = DepthBudget() if base != spec else None
            systems.append(MMSpecSystem(name, model, max_new_tokens, drafter, budget, rule))
    for system in systems:
        system.sampling = None if cfg.sampling is None else dict(cfg.sampling)
    _disambiguate_labels(systems)
    return systems


def _disambiguate_labels(systems: list) -> None:
    """Systems whose labels coincide (the same kind from two folders: ``glance:A``, ``glance:B``) would share one
    record key; each of them gets its folder's name after the kind instead (``glance@A``).

    Example:
        >>> a, b = System("glance:/w/flat;branch_k=1", None, 1), System("glance:/w/decay;branch_k=1", None, 1)
        >>> _disambiguate_labels([a, b]); a.label, b.label
        ('glance@flat;branch_k=1', 'glance@decay;branch_k=1')
    """
    import collections

    counts = collections.Counter(s.label for s in systems)
    for system in systems:
        if counts[system.label] > 1:
            system._label = _label_of(system.name, folder=True)


def _label_of(name: str, folder: bool = False) -> str:
    """A system name without its drafters' paths (``folder``: each path's last folder kept as ``kind@folder``)."""
    base = name.removesuffix(BUDGET_SUFFIX)
    parts = []
    for part in base.split(UNION_SEP):
        head, *opts = part.strip().split(";")
        kind, _, path = head.partition(":")
        where = os.path.basename(os.path.normpath(path)) if path and folder else ""
        parts.append(";".join([f"{kind}@{where}" if where else kind] + opts))
    return UNION_SEP.join(parts) + name[len(base):]
