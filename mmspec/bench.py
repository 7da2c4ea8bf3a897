"""``mmspec bench``: plain AR, transformers' assisted generation and mmspec drafters, measured in one run.

Why: a speedup is only worth quoting as a ratio measured in one run, plain autoregressive decoding and
the speculative systems interleaved on the same inputs after a warm-up (DESIGN.md, conventions). This
module is that measurement, once, for every system: ``ar`` (``model.generate``), transformers' own
assisted generation (``hf-prompt-lookup``, ``hf-assistant``) and every mmspec drafter the registry
knows (``lookup``, ``draft-model``, and kinds later issues register: ``eagle:PATH``, ``glance:PATH``...).

How it measures, per (workload, batch size):

* each example goes through the target pipeline's own preprocessing (:meth:`VLMPipeline.prepare`: chat
  template, images; batches are left-padded by the processor);
* one untimed warm-up pass of every system over the first batch (then drafters forget what they
  remembered across requests: a timed request is never drafted from its own earlier output);
* then, batch by batch, every system runs back to back on the same inputs, in an order rotated per
  batch to spread drift, each timed with ``time.perf_counter`` (CUDA synchronised on GPU);
* ``speedup_vs_ar`` = (sum of AR times) / (sum of the system's times) over the same batches
  (``speedup_median``: the median of the per-batch ratios, robust to a disturbed run);
  ``identical_to_ar`` says whether every output equalled AR's token for token (greedy), ``identical_rate``
  the share of rows that did (up to each row's first eos); for a row that differs, ``divergences`` gives
  the first differing position, both tokens and the target's logit margin between them there (one
  teacher-forced pass over AR's output): in bf16 a pass over several tokens may round differently from a
  one-token step, so a near-tie can flip (margin of a rounding step) where fp32 is exact;
* τ, per-position acceptance and the accepted-length histogram are pooled over all rounds with
  :meth:`SpecStats.merge`; transformers does not expose its rounds, so τ is ``null`` there, but its
  target forward passes are counted with a forward pre-hook (``forwards_per_token``).

transformers' assisted generation is batch-1 only, so its batch>1 records say ``"unsupported: ..."``. A
system that raises is recorded as ``"error: ..."`` and the run goes on (transformers 5.24's prompt lookup
copies a chat prompt's image placeholder tokens into its drafts, which Qwen2-VL then rejects).

Example:
    >>> cfg = BenchConfig(workloads=["docs"], quick=True)                       # doctest: +SKIP
    >>> report = run_bench(cfg)                                                 # doctest: +SKIP
    >>> print(report.table()); report.save_json("b.json"); report.save_png("b.png")  # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone

import torch

from .budget import DepthBudget
from .checkpoints import dtype_note, resolve_dtype
from .errors import InvalidInputError
from .inputs import load_requests, text_quality
from .registry import UNION_SEP
from .stats import SpecStats

__all__ = ["BenchConfig", "BenchReport", "System", "run_bench", "default_model_path", "parse_csv", "plain_record",
           "model_for", "model_pairs",
           "check_outputs", "count_forwards", "BUILTIN_SYSTEMS", "DEFAULT_WORKLOADS", "HF_BATCH1_ONLY"]

BUILTIN_SYSTEMS = ("ar", "hf-prompt-lookup", "hf-assistant", "ceiling")
LOOKUP_WITH_HISTORY = "lookup;history_tokens=20000"
"""Default bench system: prompt lookup that also searches the outputs of the requests benched before (a batch
job's memory; forgotten after the warm-up, so a request never meets its own output)."""
BUDGET_SUFFIX = "+budget"  # "lookup+budget": the same drafter with a DepthBudget learned over the run
"""Systems that are not mmspec drafters; every other system name is a drafter spec for the registry.
``ceiling`` (``ceiling;depth=N``, default 8) is mmspec's decode loop with a perfect drafter: the target's own
greedy output for the batch (computed untimed), proposed ``depth`` deep, so it measures what prefill and
verify costs leave reachable."""
CEILING_DEPTH = 8

DEFAULT_WORKLOADS = ("docs", "charts")
"""Workloads benchmarked when none are named (those of them that are registered)."""

HF_BATCH1_ONLY = "unsupported: transformers assisted generation is batch-1 only"

_QUICK = {"n": 4, "max_new_tokens": 16}
_FULL = {"n": 8, "max_new_tokens": 64}
# --quality full (images): FID's covariances over the classifier's 512-d features need more images than dimensions;
# 1000 per system is the floor of a quality run, generated in batches of 16 unless batch sizes are given.
QUALITY_FULL_N = 1000
QUALITY_FULL_BATCH = 16


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


# ---------------------------------------------------------------------------- configuration
@dataclass
class BenchConfig:
    """What to benchmark; ``None`` fields take defaults (``quick`` picks smaller ones).

    Attributes:
        model: target folder (default :func:`default_model_path`).
        workloads: workload names (default: those of ``docs``, ``charts`` that are registered).
        systems: system names: ``ar``, ``hf-prompt-lookup``, ``hf-assistant``, or an mmspec drafter spec
            (``lookup``, ``draft-model``, ``kind:PATH``, ``kind:PATH;key=value``), or ``ceiling`` (a perfect
            drafter, ``ceiling;depth=N``). Default: AR, the ceiling, HF prompt lookup and mmspec lookup, the drafters bundled for the default target (``eagle``) when no model
            is named, plus ``hf-assistant`` and ``draft-model`` when ``draft_model`` is given. AR always runs: it is
            the reference every ratio is taken against.
        draft_model: folder of a small model with the target's tokenizer (mmspec ``draft-model`` and the
            HF assistant share it).
        n: examples per workload; max_new_tokens: tokens generated per example.
        batch_sizes: batch sizes to measure (the processor left-pads a batch).
        lookup_tokens: draft depth of both prompt-lookup systems (HF ``prompt_lookup_num_tokens`` and
            mmspec lookup's ``num_draft_tokens``), so they compare like for like.
        device: ``"cpu"``, ``"cuda"``...; default CUDA when available.
        threads: ``torch.set_num_threads`` for the run (default: torch's choice). On a small, busy CPU one
            thread is often faster and steadier for tiny models.
        dtype: the dtype every model runs in: ``"auto"`` (default, the checkpoint's stored dtype: bf16 for
            the bundled models), ``"bfloat16"``, ``"float16"``, ``"float32"``.
        inputs: a JSONL file of the user's own requests (:mod:`mmspec.inputs`), measured instead of
            ``workloads`` as one workload named ``inputs:<file name>``; ``n`` (default: every line) takes
            the first ``n``. Quality fields come from the lines' ``reference``.
        sampling: ``None`` (greedy, the default) or the sampling settings every system runs with
            (``{"temperature": 1.0, "top_k": 50, "top_p": 0.9}``, see :func:`parse_sampling`): AR samples
            with ``generate(do_sample=True)``, mmspec systems with their acceptance rule (the lossless
            ``speculative_sampling`` unless a system names another, ``eagle;rule=sample_then_match``). Each
            batch gets the same seed in every system; outputs are not compared token for token (a lossless
            sampler keeps AR's distribution, not its draws), so identity fields are ``None`` and ``lossless``
            is the rule's own declaration. The ceiling, a greedy oracle, does not run.
        resume: a checkpoint file for workloads that support one (:attr:`~mmspec.workloads.Workload.resumable`:
            ``images``): each finished batch is appended to it, and a run with the same settings and path continues
            after the last finished batch (a checkpoint from other settings is refused).
        quality: ``"quick"`` (default) or ``"full"``, the quality run of workloads that have one
            (:attr:`~mmspec.workloads.Workload.quality_full`: ``images``): at least :data:`QUALITY_FULL_N` items
            (the default ``n``; fewer is refused), the AR-vs-AR noise floor always, records marked
            ``quality["mode"] = "full"``. Its speed fields are those of its batch sizes (the CLI's default there is
            :data:`QUALITY_FULL_BATCH`), not of the batch-1 latency table.

    Example:
        >>> BenchConfig(quick=True).resolved_sizes()
        (4, 16)
        >>> BenchConfig(quality="full").resolved_sizes()[0]
        1000
    """

    model: str | None = None
    workloads: list | None = None
    systems: list | None = None
    draft_model: str | None = None
    n: int | None = None
    max_new_tokens: int | None = None
    batch_sizes: list = field(default_factory=lambda: [1, 4])
    split: str = "test"
    seed: int = 0
    quick: bool = False
    lookup_tokens: int = 8
    device: str | None = None
    threads: int | None = None
    dtype: str | None = "auto"
    inputs: str | None = None
    sampling: dict | None = None
    resume: str | None = None
    quality: str = "quick"

    def resolved_device(self) -> torch.device:
        """``device``, or CUDA when available, else the CPU: where every system and plain pipeline runs.

        Example:
            >>> BenchConfig(device="cpu").resolved_device()
            device(type='cpu')
        """
        return torch.device(self.device or ("cuda" if torch.cuda.is_available() else "cpu"))

    def resolved_sizes(self) -> tuple[int, int]:
        """``(n, max_new_tokens)`` after defaults; raises on non-positive values."""
        if self.quality not in ("quick", "full"):
            raise InvalidInputError(f"quality must be 'quick' or 'full' (got {self.quality!r})")
        base = _QUICK if self.quick else _FULL
        full = self.quality == "full"
        n = (QUALITY_FULL_N if full else base["n"]) if self.n is None else self.n
        new = base["max_new_tokens"] if self.max_new_tokens is None else self.max_new_tokens
        for name, v in (("n", n), ("max_new_tokens", new)):
            if not isinstance(v, int) or v < 1:
                raise InvalidInputError(f"{name} must be a positive integer (got {v!r})")
        if full and (n < QUALITY_FULL_N or self.quick):
            raise InvalidInputError(f"--quality full measures at least {QUALITY_FULL_N} images per system (FID over "
                                    f"512-d features); got {'--quick' if self.quick else f'--n {n}'}")
        return n, new


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


# ---------------------------------------------------------------------------- systems
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


def build_systems(names: list[str], model, cfg: BenchConfig, max_new_tokens: int) -> list[System]:
    """Turn validated system names into :class:`System` objects bound to ``model``.

    mmspec systems come from the drafter registry (:func:`mmspec.registry.make_drafter`); the small
    model behind ``draft-model`` is loaded once and also serves as transformers' ``assistant_model``.
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


# ---------------------------------------------------------------------------- measuring
@dataclass
class _Tally:
    """What one system accumulated over the timed batches of one (workload, batch size)."""

    system: System
    status: str = "ok"
    time: float = 0.0
    batch_times: list = field(default_factory=list)
    forwards: int = 0
    new_tokens: int = 0
    identical: bool = True
    rows: int = 0
    identical_rows: int = 0
    divergences: list = field(default_factory=list)
    texts: list = field(default_factory=list)  # decoded outputs, in example order (quality fields)
    stats: SpecStats | None = None


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(system: System, inputs, device) -> tuple:
    """``(sequences, stats, forwards, seconds)`` of one run, the clock read after the device is idle; the
    seconds the run spent measuring itself (``stats.audit_time``: the entropy of the draftability fit) are
    taken out, so a system is not charged for the bench's own bookkeeping."""
    _sync(device)
    t0 = time.perf_counter()
    sequences, stats, forwards = system.run(inputs)
    _sync(device)
    seconds = time.perf_counter() - t0
    return sequences, stats, forwards, seconds - (stats.audit_time if stats is not None else 0.0)


def _count_new_tokens(sequences, prompt_len: int, eos_ids: set) -> int:
    """Generated tokens over the rows: up to and including each row's first eos (padding excluded).

    Example:
        >>> _count_new_tokens(torch.tensor([[9, 1, 2, 7, 0], [9, 1, 7, 0, 0]]), 1, {7})
        5
    """
    total = 0
    for row in sequences[:, prompt_len:].tolist():
        stop = next((i for i, t in enumerate(row) if t in eos_ids), None)
        total += len(row) if stop is None else stop + 1
    return total


def _row_tokens(sequences, prompt_len: int, eos_ids: set) -> list:
    """Each row's generated tokens up to and including its first eos (what identity is judged on: trailing
    padding after a finished row depends on when the batch stopped, not on what the row said).

    Example:
        >>> _row_tokens(torch.tensor([[9, 1, 7, 0], [9, 1, 2, 3]]), 1, {7})
        [[1, 7], [1, 2, 3]]
    """
    out = []
    for row in sequences[:, prompt_len:].tolist():
        stop = next((i for i, t in enumerate(row) if t in eos_ids), None)
        out.append(row if stop is None else row[: stop + 1])
    return out


def _divergences(model, inputs, ar_seq, rows: list, other: list, ar: list, where: str) -> list:
    """For each row in ``rows`` (where ``other`` differs from ``ar``), the first differing position, both
    tokens and the target's logits for them there, from one teacher-forced pass over AR's own output.

    The margin ``logit(ar_token) - logit(other_token)`` tells a near-tie (a fraction of a rounding step
    of the dtype: bf16 keeps 8 bits of mantissa) from a bug (a clear winner replaced).
    """
    import torch.nn.functional as F

    prompt_len = inputs["input_ids"].shape[1]
    first = {}
    for r in rows:
        a, b = ar[r], other[r]
        first[r] = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    upto = prompt_len + max(first.values())  # logits at position p - 1 predict token p
    seq = ar_seq[:, :upto].to(inputs["input_ids"].device)
    extra = upto - prompt_len
    fwd = {}
    for k, v in inputs.items():
        if torch.is_tensor(v) and v.dim() == 2 and v.shape == inputs["input_ids"].shape and k != "input_ids":
            fill = 1 if k == "attention_mask" else 0  # new tokens are text: attended, not multimodal
            v = torch.cat([v, torch.full((v.shape[0], extra), fill, dtype=v.dtype, device=v.device)], dim=1)
        fwd[k] = v
    fwd["input_ids"] = seq
    with torch.no_grad():
        logits = model(**fwd).logits.float()
    out = []
    for r in rows:
        p = first[r]
        a = ar[r][p] if p < len(ar[r]) else None
        b = other[r][p] if p < len(other[r]) else None
        row = {"batch": where, "row": r, "position": p, "ar_token": a, "token": b}
        if a is not None and b is not None:
            lg = logits[r, prompt_len + p - 1]
            top2 = lg.topk(2)
            row.update(margin=float(lg[a] - lg[b]), top2_gap=float(top2.values[0] - top2.values[1]),
                       ar_prob=float(F.softmax(lg, -1)[a]))
        out.append(row)
    return out


def _eos_ids(model) -> set:
    eos = model.generation_config.eos_token_id
    return set() if eos is None else set(eos if isinstance(eos, (list, tuple)) else [eos])


def _error_status(exc: Exception, where: str) -> str:
    msg = " ".join(str(exc).split())
    return f"error: {where}: {type(exc).__name__}: {msg}"


def _attempt(tally: _Tally, inputs, where: str, device):
    """One timed run of ``tally``'s system, or ``None`` after marking it ``error`` (AR errors propagate)."""
    try:
        with torch.no_grad():
            tally.system.prepare(inputs)  # untimed
        return _timed(tally.system, inputs, device)
    except Exception as e:  # noqa: BLE001 - a failing competitor is a result, not a crash
        if tally.system.kind == "ar":
            raise
        tally.status = _error_status(e, where)
        return None


def _bench_cell(batches: list, ids: list, batch_size: int, systems: list[System], device, eos_ids: set,
                bar, decode=None, references=None, seed: int = 0) -> list[_Tally]:
    """Measure every system on ``batches`` (one workload, one batch size), interleaved; one tally each.

    The first batch is run once untimed by every system (warm-up); then each batch is run by every
    system back to back, the order rotated by one per batch. AR failing is a real failure and raises;
    any other system that raises is marked ``error`` and skipped for the rest of the cell. ``decode``
    (sequences, prompt length -> texts) keeps each system's texts for the quality fields; ``references``
    (per batch, each row's reference answer as token ids) go to each system before it runs that batch.
    When the systems sample, batch ``i`` runs with seed ``seed + i`` in every system and identity with AR is
    not judged (a lossless sampler matches AR's distribution, not its draws).
    """
    tallies = [_Tally(s) for s in systems]
    for t in tallies:
        t.status = t.system.unsupported(batch_size) or "ok"
    live = [t for t in tallies if t.status == "ok"]
    for t in live:
        if references is not None:
            t.system.use_references(references[0])
        _attempt(t, batches[0], f"warm-up on {ids[0]}", device)
        t.system.forget()  # a drafter with cross-request memory must not meet the warm-up's outputs again
        bar.update(1)
    for i, (inputs, where) in enumerate(zip(batches, ids)):
        outputs = {}
        for t in live[i % len(live):] + live[: i % len(live)]:
            if references is not None:
                t.system.use_references(references[i])
            t.system.seed = seed + i
            run = _attempt(t, inputs, where, device) if t.status == "ok" else None
            bar.update(1)
            if run is None:
                continue
            seq, stats, forwards, seconds = run
            outputs[t.system.name] = seq.cpu()
            if decode is not None:
                t.texts += decode(seq, inputs["input_ids"].shape[1])
            t.time += seconds
            t.batch_times.append(seconds)
            t.forwards += forwards
            t.new_tokens += _count_new_tokens(seq, inputs["input_ids"].shape[1], eos_ids)
            if stats is not None:
                t.stats = (t.stats or SpecStats()).merge(stats)
        plen = inputs["input_ids"].shape[1]
        sampling = any(t.system.sampling is not None for t in live)
        ar_rows = _row_tokens(outputs["ar"], plen, eos_ids) if "ar" in outputs and not sampling else None
        for t in live:
            if t.system.name in outputs and ar_rows is not None:
                rows = _row_tokens(outputs[t.system.name], plen, eos_ids)
                differ = [r for r, (a, b) in enumerate(zip(ar_rows, rows)) if a != b]
                t.rows += len(rows)
                t.identical_rows += len(rows) - len(differ)
                t.identical = t.identical and not differ
                if differ:
                    try:
                        t.divergences += _divergences(t.system.model, inputs, outputs["ar"], differ, rows, ar_rows,
                                                      where)
                    except Exception as e:  # noqa: BLE001 - a failed diagnosis must not end the whole run
                        t.divergences += [{"batch": where, "row": r, "error": _error_status(e, "margin")}
                                          for r in differ]
    return tallies


# A record's measured fields: ``None`` in a record whose system did not run to the end.
MEASURED_FIELDS = ("tau", "accept_rate", "accepted_hist", "ceiling_rounds", "speedup_vs_ar", "speedup_median",
                   "forwards_per_token", "target_forwards", "tokens_per_s", "tokens_per_s_vs_ar", "time_s",
                   "identical_to_ar", "identical_rate", "divergences", "new_tokens", "lossless", "quality",
                   "draftability", "drafter_counters")


def _record(workload: str, batch_size: int, n_examples: int, tally: _Tally, ar: _Tally, references=None) -> dict:
    """One result row; measured fields are ``None`` when the system did not run to the end.

    ``speedup_vs_ar`` is the pooled ratio (sum of AR times / sum of the system's); ``speedup_median``, the
    median over batches of the per-batch ratio, is its robust companion: when they disagree, a few runs
    were disturbed (on a small shared CPU, a stalled thread can inflate one run many times over).
    ``quality`` (character error rate and exact match of the system's texts against ``references``, the
    examples' reference answers, ``None`` where an example has none) is ``None`` when no example has one.
    """
    s, kind, ok = tally.stats, tally.system.kind, tally.status == "ok"
    rec = {"workload": workload, "system": tally.system.label, "spec": tally.system.name, "kind": kind,
           "batch_size": batch_size, "status": tally.status, "n_examples": n_examples, "note": tally.system.note,
           "dtype": dtype_name(getattr(tally.system.model, "dtype", None)), "sampling": tally.system.sampling}
    if not ok:
        return {**rec, **dict.fromkeys(MEASURED_FIELDS)}
    if kind == "mmspec":
        fpt, tau, lossless = s.forwards_per_token, s.tau, s.lossless
    elif kind == "ar":
        fpt, tau, lossless = 1.0, 1.0, True
    else:  # transformers hides its rounds; batch 1, so forward calls per token are per row
        fpt, tau, lossless = tally.forwards / max(tally.new_tokens, 1), None, True
    rec.update(
        tau=tau,
        accept_rate=s.accept_rate if s else None,
        accepted_hist=list(s.accepted_hist) if s else None,
        ceiling_rounds=s.ceiling_rounds if s else None,
        draftability=s.draftability() if s else None,
        drafter_counters=dict(s.drafter_counters) if s and s.drafter_counters else None,
        speedup_vs_ar=ar.time / tally.time if tally.time else None,
        speedup_median=statistics.median(a / b for a, b in zip(ar.batch_times, tally.batch_times)),
        forwards_per_token=fpt,
        target_forwards=tally.forwards,
        tokens_per_s=tally.new_tokens / tally.time if tally.time else None,
        # Under sampling the systems emit different texts (lengths differ), so the time ratio compares unequal
        # work; the throughput ratio does not. Under greedy lossless systems both ratios agree.
        tokens_per_s_vs_ar=(tally.new_tokens / tally.time) / (ar.new_tokens / ar.time)
        if tally.time and ar.time and ar.new_tokens else None,
        time_s=tally.time,
        identical_to_ar=tally.identical if tally.rows else None,
        identical_rate=tally.identical_rows / tally.rows if tally.rows else None,
        divergences=tally.divergences,
        new_tokens=tally.new_tokens,
        quality=text_quality(tally.texts, references) if references and len(tally.texts) == len(references)
        else None,
        lossless=lossless,
    )
    if kind == "ar":
        rec["speedup_vs_ar"] = rec["speedup_median"] = rec["tokens_per_s_vs_ar"] = 1.0  # exactly, by definition
    return rec


def dtype_name(dtype) -> str | None:
    """``torch.bfloat16`` -> ``"bfloat16"`` (how records name a dtype); ``None`` stays ``None``.

    Example:
        >>> dtype_name(torch.bfloat16), dtype_name(None)
        ('bfloat16', None)
    """
    return None if dtype is None else str(dtype).removeprefix("torch.")


def _of_ceiling(records: list) -> list:
    """Give every record of one (workload, batch size) its speedup as a fraction of the ceiling's in the same
    run (``of_ceiling``; ``None`` without a ceiling record). Returns ``records``.

    Example:
        >>> _of_ceiling([{"system": "ceiling", "speedup_vs_ar": 2.0}, {"system": "eagle", "speedup_vs_ar": 1.5}])[1]
        {'system': 'eagle', 'speedup_vs_ar': 1.5, 'of_ceiling': 0.75}
    """
    top = next((r.get("speedup_vs_ar") for r in records if r["system"].split(";")[0] == "ceiling"), None)
    for r in records:
        r["of_ceiling"] = r["speedup_vs_ar"] / top if top and r.get("speedup_vs_ar") is not None else None
    return records


def plain_record(workload: str, batch_size: int, n_examples: int, batch_times: list, new_tokens: int,
                 latency_ms: dict, quality: dict, note: str = "", dtype=None) -> dict:
    """The ``ar`` record of a workload served by its own plain pipeline (a driving VLA, an image generator):
    the fields every record has (AR against itself: ``speedup_vs_ar`` 1, ``tau`` 1, identical, lossless),
    plus ``latency_ms`` (mean per stage over the timed calls, with ``p50`` / ``p90`` of ``total``) and
    ``quality`` (the workload's own measures), so later speculative systems add records beside it.

    Example:
        >>> r = plain_record("driving", 1, 2, [0.5, 0.7], 24, {"total": [500.0, 700.0]}, {"reasoning_exact": 1.0})
        >>> r["tokens_per_s"], r["latency_ms"]["total"], r["latency_ms"]["p90"], r["quality"]["reasoning_exact"]
        (20.0, 600.0, 680.0, 1.0)
    """
    total = sum(batch_times)
    lat = {k: float(statistics.fmean(v)) for k, v in latency_ms.items() if v}
    if latency_ms.get("total"):
        qs = torch.tensor(latency_ms["total"], dtype=torch.float64)
        lat["p50"], lat["p90"] = float(qs.quantile(0.5)), float(qs.quantile(0.9))
    return {"workload": workload, "system": "ar", "spec": "ar", "kind": "ar", "batch_size": batch_size,
            "status": "ok", "n_examples": n_examples, "note": note, "tau": 1.0, "accept_rate": None,
            "accepted_hist": None, "ceiling_rounds": None, "speedup_vs_ar": 1.0, "speedup_median": 1.0,
            "forwards_per_token": 1.0, "target_forwards": None, "tokens_per_s": new_tokens / total if total else None,
            "time_s": total, "identical_to_ar": True, "identical_rate": 1.0, "divergences": [],
            "new_tokens": new_tokens, "lossless": True, "latency_ms": lat, "quality": quality,
            "draftability": None, "of_ceiling": None,
            "dtype": dtype_name(dtype)}


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


def _plain_lines(results: list) -> list[str]:
    """The latency and quality of plain-pipeline records (driving, images), one line each, for the table: their
    speed columns would only show ``ar`` against itself."""
    lines = []
    for r in results:
        lat, q = r.get("latency_ms"), r.get("quality")
        if not lat:  # a text system's record (its quality, e.g. on --inputs, has columns of its own)
            continue
        stages = ", ".join(f"{k} {v:.1f}" for k, v in lat.items() if k not in ("total", "p50", "p90"))
        text = f"{r['workload']}  {r['system']}  bs {r['batch_size']}:"
        if "total" in lat:
            text += f" total {lat['total']:.1f} ms (p50 {lat.get('p50', lat['total']):.1f}, p90 " \
                    f"{lat.get('p90', lat['total']):.1f})"
        text += f"; {stages}" if stages else ""
        quality = []
        for k, v in (q or {}).items():
            if k in ("fid_n", "note") or v is None:
                continue
            if isinstance(v, dict):
                quality += [f"{kk} {vv:.3g}" for kk, vv in v.items() if isinstance(vv, (int, float))]
            elif isinstance(v, (int, float)) and not isinstance(v, bool):
                quality.append(f"{k} {v:.3g}" + (f" (n {q['fid_n']})" if k == "fid" and "fid_n" in q else ""))
        lines.append(text + (f" | quality: {', '.join(quality)}" if quality else ""))
    return ["", "latency (ms per call) and quality of the plain pipelines:"] + lines if lines else []


# ---------------------------------------------------------------------------- report
@dataclass
class BenchReport:
    """The records (one per workload x system x batch size) and the run's metadata.

    Example:
        >>> r = BenchReport([], {"model": "m"})
        >>> json.loads(r.to_json())["meta"]["model"]
        'm'
    """

    results: list
    meta: dict

    def _dtype_label(self) -> str:
        """The run's dtype: the meta's, else the dtypes its records ran in (plain pipelines load their own)."""
        if self.meta.get("dtype"):
            return str(self.meta["dtype"])
        seen = sorted({str(r.get("dtype")) for r in self.results if r.get("dtype")})
        return ", ".join(seen) or "not recorded"

    def to_json(self) -> str:
        return json.dumps({"results": self.results, "meta": self.meta}, indent=2)

    def save_json(self, path) -> None:
        with open(path, "w") as f:
            f.write(self.to_json() + "\n")

    def table(self) -> str:
        """The records as a text table (column widths fit the content); full non-ok statuses follow it."""
        cols = [("workload", "workload", "{}"), ("system", "system", "{}"), ("bs", "batch_size", "{}"),
                ("tau", "tau", "{:.2f}"), ("fwd/tok", "forwards_per_token", "{:.3f}"),
                ("tok/s", "tokens_per_s", "{:.1f}"), ("speedup", "speedup_vs_ar", "{:.2f}x"),
                ("median", "speedup_median", "{:.2f}x"), ("of ceil", "of_ceiling", "{:.0%}"),
                ("same", "identical_rate", "{:.0%}"), ("status", "status", "{}")]
        if self.meta.get("sampling") is not None:  # texts differ in length: throughput is the fair ratio
            cols.insert(7, ("tok/s x", "tokens_per_s_vs_ar", "{:.2f}x"))
        rows = [[_fmt(r[key], fmt) if key != "status" else r[key].split(":")[0] for _, key, fmt in cols]
                for r in self.results]
        widths = [max([len(head)] + [len(row[i]) for row in rows]) for i, (head, _, _) in enumerate(cols)]

        def line(cells):
            return "  ".join(c.ljust(w) if fmt == "{}" else c.rjust(w)
                             for c, w, (_, _, fmt) in zip(cells, widths, cols)).rstrip()

        out = [line([c[0] for c in cols]), "-" * (sum(widths) + 2 * (len(widths) - 1))] + [line(r) for r in rows]
        notes = [f"  {r['workload']} / {r['system']} / batch {r['batch_size']}: {r['status']}"
                 for r in self.results if r["status"] != "ok"]
        if notes:
            out += ["", "not run:"] + notes
        out += _plain_lines(self.results)
        out += ["", "speedup: sum of AR times / sum of the system's times, interleaved on the same inputs after a "
                    "warm-up; median: median of the per-batch ratios; of ceil: speedup as a share of the ceiling's (a "
                    "perfect drafter, same run); same: share of rows identical to AR token for "
                    f"token (dtype {self._dtype_label()})"]
        if self.meta.get("sampling") is not None:
            out += [f"sampling run ({self.meta['sampling'] or 'the model generation config'}, seed per batch shared by "
                    "the systems): outputs are not compared token for token, so texts differ in length and tok/s x (the "
                    "throughput ratio) is the fair speedup; a system is lossless when its "
                    "acceptance rule keeps the target's distribution (records: lossless, the rule in the system name)"]
        return "\n".join(out)

    def save_png(self, path) -> None:
        """One PNG: (a) accepted-length histograms of the mmspec systems, (b) speedups vs AR.

        Bars in (b) are the pooled ratios (``speedup_vs_ar``), black diamonds the per-batch medians.

        The histograms are those of the smallest batch size measured, as fractions of row-rounds; the
        legend gives each one's τ and ceiling share (rounds whose whole draft was accepted).
        """
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        fig = Figure(figsize=(13, 4.8), layout="constrained")
        FigureCanvasAgg(fig)
        ax_hist, ax_speed = fig.subplots(1, 2, width_ratios=[1, 1.3])
        colors = {name: f"C{i}" for i, name in enumerate(dict.fromkeys(r["system"] for r in self.results
                                                                       if r["system"] != "ar"))}
        _plot_histograms(ax_hist, self.results, colors)
        _plot_speedups(ax_speed, self.results, colors)
        fig.suptitle(f"mmspec bench: {os.path.basename(str(self.meta.get('model', '')).rstrip('/'))} "
                     f"({self.meta.get('device', '')}, {self.meta.get('date', '')[:10]})")
        fig.savefig(path, dpi=110)


def _fmt(value, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def _plot_histograms(ax, results: list, colors: dict) -> None:
    ok = [r for r in results if r["kind"] == "mmspec" and r["status"] == "ok" and r["accepted_hist"]]
    if not ok:
        ax.text(0.5, 0.5, "no mmspec system ran", ha="center", va="center", transform=ax.transAxes)
        return
    smallest = min(r["batch_size"] for r in ok)
    series = [r for r in ok if r["batch_size"] == smallest]
    width = 0.8 / len(series)
    for i, r in enumerate(series):
        hist = r["accepted_hist"]
        total = sum(hist) or 1
        xs = [a + 1 + (i - (len(series) - 1) / 2) * width for a in range(len(hist))]
        label = (f"{r['system']} / {r['workload']}: tau {r['tau']:.2f}, "
                 f"ceiling {r['ceiling_rounds'] / total:.0%}")
        workloads = sorted({q["workload"] for q in series})
        hatch = "//" if workloads.index(r["workload"]) % 2 else None
        ax.bar(xs, [h / total for h in hist], width=width, label=label, color=colors[r["system"]], hatch=hatch)
    ax.set_xticks(range(1, max(len(r["accepted_hist"]) for r in series) + 1))
    ax.set_xlabel("tokens committed per round (accepted + bonus)")
    ax.set_ylabel("fraction of row-rounds")
    ax.set_title(f"(a) accepted-length histogram, batch {smallest}")
    ax.legend(fontsize=7)


def _plot_speedups(ax, results: list, colors: dict) -> None:
    cells = list(dict.fromkeys((r["workload"], r["batch_size"]) for r in results))
    systems = [s for s in dict.fromkeys(r["system"] for r in results) if s != "ar"]
    by_key = {(r["workload"], r["batch_size"], r["system"]): r for r in results}
    width = 0.8 / max(len(systems), 1)
    for j, system in enumerate(systems):
        xs, ys, medians = [], [], []
        for i, (wl, bs) in enumerate(cells):
            r = by_key.get((wl, bs, system))
            x = i + (j - (len(systems) - 1) / 2) * width
            if r is None or r["speedup_vs_ar"] is None:
                status = "n/a" if r is None else r["status"].split(":")[0]
                ax.text(x, 0.02, status, rotation=90, ha="center", va="bottom", fontsize=7, color="gray")
                continue
            xs.append(x)
            ys.append(r["speedup_vs_ar"])
            medians.append(r["speedup_median"])
        bars = ax.bar(xs, ys, width=width, label=system, color=colors[system])
        ax.bar_label(bars, fmt="%.2f", fontsize=7, padding=6)
        ax.scatter(xs, medians, marker="D", s=12, color="black", zorder=3,
                   label="median of per-batch ratios" if j == 0 else None)
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--", label="AR = 1")
    ax.set_xticks(range(len(cells)), [f"{wl}\nbatch {bs}" for wl, bs in cells])
    ax.set_ylabel("wall-clock speedup vs AR (same run)")
    ax.set_title("(b) speedup over plain greedy generate")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.3)  # room for the legend above the bars
    ax.legend(fontsize=7, loc="upper right", ncols=2)


# ---------------------------------------------------------------------------- entry point
def _meta(cfg: BenchConfig, model_path: str, model, n: int, max_new: int) -> dict:
    import transformers

    from . import __version__

    cuda = torch.cuda.get_device_name(model.device) if model is not None and model.device.type == "cuda" else None
    return {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"node": platform.node(), "platform": platform.platform(), "processor": platform.processor(),
                    "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(), "cuda_device": cuda},
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "mmspec": __version__,
        "model": model_path,
        "model_type": model.config.model_type if model is not None else None,
        "dtype": dtype_name(model.dtype) if model is not None else None,
        "device": str(model.device if model is not None else cfg.resolved_device()),
        "draft_model": cfg.draft_model,
        "sampling": cfg.sampling,
        "args": {**asdict(cfg), "n": n, "max_new_tokens": max_new},
        "speedup": "sum of AR times / sum of system times, interleaved per batch after a warm-up, one run",
    }


@contextmanager
def _quiet_transformers():
    """Silence transformers' advisory warnings for the run (restoring the verbosity after)."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


def run_bench(cfg: BenchConfig, progress: bool = True) -> BenchReport:
    """Run the benchmark ``cfg`` describes and return its :class:`BenchReport`.

    Why: the one measurement every speedup claim of the project comes from (see the module docstring
    for the protocol). Everything a user can get wrong (unknown workload or system, a missing draft
    model, bad sizes) raises :class:`~mmspec.InvalidInputError` before the model is loaded; output paths
    are checked by :func:`check_outputs`.

    Example:
        >>> report = run_bench(BenchConfig(workloads=["docs"], systems=["lookup"], quick=True))  # doctest: +SKIP
        >>> [(r["system"], r["batch_size"], r["speedup_vs_ar"]) for r in report.results]     # doctest: +SKIP
    """
    from tqdm.auto import tqdm

    from .pipelines import MMSpecPipeline

    n, max_new = cfg.resolved_sizes()
    if not cfg.batch_sizes or any(not isinstance(b, int) or b < 1 for b in cfg.batch_sizes):
        raise InvalidInputError(f"batch sizes must be positive integers (got {cfg.batch_sizes!r})")
    requests = None
    if cfg.inputs is not None:
        if cfg.workloads:
            raise InvalidInputError("--inputs replaces --workload: give one or the other")
        requests = load_requests(cfg.inputs)
        n = len(requests) if cfg.n is None else min(n, len(requests))
    every = _resolve_workloads(cfg.workloads)
    plain = [w for w in every if w.plain_pipeline]
    workloads = [w for w in every if not w.plain_pipeline]
    if plain and cfg.sampling is not None:
        raise InvalidInputError(f"--sample applies to the VLM workloads; {', '.join(w.name for w in plain)} run "
                                "their own pipelines' decoding (measure them in a run without --sample)")
    if cfg.quality == "full" and (workloads or requests is not None or any(not w.quality_full for w in plain)):
        others = [w.name for w in every if not w.quality_full] or ["--inputs"]
        raise InvalidInputError(f"--quality full has no quality run for {', '.join(others)}; it is the images "
                                "workload's (--workload images)")
    if cfg.resume and (workloads or requests is not None or any(not w.resumable for w in plain)):
        others = [w.name for w in every if not w.resumable] or ["--inputs"]
        raise InvalidInputError(f"--resume is not supported for {', '.join(others)}: run without it")
    plain_models = {w.name: model_for(w.name, cfg.model) or w.bundled_model() for w in plain}
    for name, path in plain_models.items():
        if not path:
            raise InvalidInputError(f"no model for workload {name!r}: none is bundled; pass --model "
                                    f"{name}=PATH (or one --model for every workload)")
    for w in plain:
        if w.plain_systems:
            w.check_plain_systems(cfg.systems)  # an unknown system is said before any model loads
    fixed = [w for w in plain if not w.plain_systems]  # the others measure cfg.systems themselves
    if fixed and not workloads and any(s != "ar" for s in cfg.systems or []):
        raise InvalidInputError(f"workloads {', '.join(w.name for w in fixed)} have no speculative systems yet; "
                                "their plain pipeline is measured as 'ar'")
    vlm_models = {model_for(w.name, cfg.model) for w in workloads} if cfg.model else {None}
    if len(vlm_models) > 1:
        raise InvalidInputError(f"one run measures one target: --model names {sorted(map(str, vlm_models))} for "
                                f"{', '.join(w.name for w in workloads)}; run them separately")
    vlm_model = next(iter(vlm_models)) if workloads else None
    # The shipped drafters, when the target is the bundled one (named or by default): "eagle" means its head.
    bundled = next((w.bundled_drafters() for w in workloads
                    if w.bundled_model() and (not vlm_model or _same_folder(vlm_model, w.bundled_model()))), [])
    # Systems a workload measures itself (the docs workload's "hierarchical") go to its bench_own, not to the loop.
    own = {w.name: [s for s in cfg.systems or [] if s.split(";")[0].strip() in w.own_systems] for w in workloads}
    if any(own.values()) and requests is not None:
        raise InvalidInputError("systems a workload measures itself (e.g. 'hierarchical') run on its pages, not on "
                                "--inputs")
    for w in workloads:
        if own[w.name]:
            w.check_own(own[w.name], bundled)
    owned = {s for names_ in own.values() for s in names_}
    rest = None if cfg.systems is None else [s for s in cfg.systems if s not in owned]
    names = _resolve_systems(rest or (["ar"] if owned else rest), cfg.draft_model, bundled) if workloads else []
    _check_models(cfg.model, every)  # after the checks of the request itself, before anything loads
    torch.manual_seed(cfg.seed)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    results = []
    for w in plain:
        with _quiet_transformers():
            results += w.bench_plain(plain_models[w.name], w.examples(cfg.split, n), cfg, progress)
    if not workloads:
        return BenchReport(results, {**_meta(cfg, None, None, n, max_new), "models": plain_models})
    examples = {w.name: w.examples(cfg.split, n) for w in workloads} if requests is None else {}
    model_path = vlm_model or default_model_path(workloads)
    if requests is not None:  # the user's own requests, in place of the workloads (the default target stays)
        name = f"inputs:{os.path.basename(cfg.inputs)}"
        workloads, examples = [_Named(name)], {name: requests[:n]}
    with _quiet_transformers():
        device = cfg.resolved_device()
        pipe = MMSpecPipeline.from_pretrained(model_path, dtype=resolve_dtype(cfg.dtype, model_path, device))
        pipe.model.to(device)
        systems = build_systems(names, pipe.model, cfg, max_new)
        eos_ids = _eos_ids(pipe.model)
        total = sum((-(-n // bs) + 1) * len(systems) for bs in cfg.batch_sizes) * len(workloads)
        with tqdm(total=total, desc="mmspec bench", file=sys.stderr, disable=not progress, leave=False) as bar:
            for wl in workloads:
                for bs in cfg.batch_sizes:
                    chunks = [examples[wl.name][i:i + bs] for i in range(0, n, bs)]
                    batches = [pipe.prepare(images=[e.images for e in c], prompt=[e.prompt for e in c]).to(device)
                               for c in chunks]
                    ids = [",".join(e.id for e in c) for c in chunks]
                    bar.set_postfix_str(f"{wl.name} bs={bs}")
                    tok = pipe.tokenizer  # each answer as the target would emit it, end of turn included
                    references = [[tok(e.target + (tok.eos_token or ""), add_special_tokens=False)["input_ids"]
                                   if e.target else [] for e in c] for c in chunks]
                    tallies = _bench_cell(batches, ids, bs, systems, device, eos_ids, bar, decode=pipe.decode_new,
                                          references=references, seed=cfg.seed)
                    ar = tallies[0]
                    refs = [e.target if e.target or e.meta.get("has_reference") else None
                            for c in chunks for e in c]
                    results += _of_ceiling([_record(wl.name, bs, n, t, ar, refs) for t in tallies])
                if own.get(wl.name):
                    results += wl.bench_own(pipe, own[wl.name], cfg, progress, bundled)
    meta = _meta(cfg, model_path, pipe.model, n, max_new)
    meta["dtype_note"] = dtype_note(cfg.dtype, model_path, device)
    if plain_models:
        meta["models"] = {**plain_models, **{w.name: model_path for w in workloads}}
    return BenchReport(results, meta)


def check_outputs(json_path=None, png_path=None) -> None:
    """Fail before a long run, not after it: output folders must exist and ``--png`` needs matplotlib.

    Example:
        >>> check_outputs(json_path="/no/such/dir/b.json")
        Traceback (most recent call last):
        ...
        mmspec.errors.InvalidInputError: cannot write /no/such/dir/b.json: folder /no/such/dir does not exist
    """
    for path in (json_path, png_path):
        folder = os.path.dirname(os.path.abspath(path)) if path else None
        if folder and not os.path.isdir(folder):
            raise InvalidInputError(f"cannot write {path}: folder {folder} does not exist")
    if png_path:
        try:
            import matplotlib  # noqa: F401
        except ImportError as e:
            raise InvalidInputError("--png needs matplotlib: pip install 'mmspec[bench]'") from e
