"""The decode loop: ``mmspec.generate``, lossless speculative decoding for any HF (V)LM.

One round, for every active row of the batch at once::

    Drafter.propose(ctx)            -> one DraftTree per row (a chain is a width-1 tree)
    TargetAdapter.score(state, ..)  -> logits for [pending] + nodes, ONE target pass
    logits processors               -> exactly those generate() would apply, per node, on the node's
                                       own history (prompt row + generated + path)
    AcceptanceRule.accept(..)       -> accepted path + one bonus/corrected token per row
    TargetAdapter.commit(..)        -> KV keeps prefix + accepted path; finished rows leave the batch

With ``do_sample=False`` the returned ``sequences`` equal ``model.generate(**inputs, do_sample=False)``
token for token (left padding, eos, pad filling and max_new_tokens included); with ``do_sample=True``
they follow the same distribution.

Example:
    >>> import mmspec                                                       # doctest: +SKIP
    >>> from mmspec.drafters import PromptLookupDrafter                     # doctest: +SKIP
    >>> out = mmspec.generate(model, inputs, drafter=PromptLookupDrafter(), max_new_tokens=64)  # doctest: +SKIP
    >>> out.sequences.shape, out.stats.tau                                  # doctest: +SKIP
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from .acceptance import AcceptanceRule, get_rule
from .budget import DepthBudget
from .checks import check_max_new_tokens, check_sampling, context_window
from .drafters.base import DraftContext, Drafter, RoundResult
from .errors import ContextLengthError, InvalidInputError, UnsupportedModelError
from .processing import TreeLogitsProcessor
from .stats import SpecStats
from .target import TargetAdapter
from .tree import DraftTree

__all__ = ["generate", "GenerateOutput", "decode_from_state", "DecodeResult"]


@dataclass
class GenerateOutput:
    """``sequences[B, P + T]`` (prompt included, like ``generate``) and the run's :class:`SpecStats`."""

    sequences: torch.Tensor
    stats: SpecStats


class DecodeResult(tuple):
    """What :func:`decode_from_state` returns: unpacks as ``(generated, stats)``, and says which rows the state holds.

    Attributes:
        generated: each original row's new tokens (a list of ints per row, in ``prompts`` order).
        stats: the :class:`~mmspec.stats.SpecStats` the rounds added to.
        state_rows: the original rows (indices into ``prompts`` / ``scores``) the state still holds, in state order:
            row ``i`` of the state afterwards is original row ``state_rows[i]``. With ``keep_state``, the rows that
            stopped in the last round (every row if all stopped at their first token); without it, none.

    Example:
        >>> from mmspec.stats import SpecStats
        >>> res = DecodeResult([[4, 2], [7, 1], [3]], SpecStats(), state_rows=[0, 2])
        >>> generated, stats = res
        >>> generated is res.generated, res.state_rows
        (True, [0, 2])
        >>> repr(res).endswith("state_rows=[0, 2])")
        True
    """

    def __new__(cls, generated: list, stats: SpecStats, state_rows=()):
        self = super().__new__(cls, (generated, stats))
        self.state_rows = [int(r) for r in state_rows]
        return self

    def __getnewargs__(self):  # pickling and copying rebuild it with its rows (tuple's default would drop them)
        return (self[0], self[1], self.state_rows)

    def __repr__(self) -> str:  # a plain tuple's repr would hide state_rows
        return f"DecodeResult(generated={self[0]!r}, stats={self[1]!r}, state_rows={self.state_rows!r})"

    @property
    def generated(self) -> list:
        return self[0]

    @property
    def stats(self) -> SpecStats:
        return self[1]


class _StopStrings:
    """Row-wise stop-string check on decoded text; a row stops at the token that completes a stop string."""

    def __init__(self, tokenizer, stop_strings: list):
        if tokenizer is None:
            raise InvalidInputError("stop_strings need the model's tokenizer: pass tokenizer=...")
        self.tokenizer = tokenizer
        self.stops = list(stop_strings)
        self.longest = max(len(s) for s in self.stops)

    def hit(self, history: list[int]) -> bool:
        """Whether the last token of ``history`` (prompt + generated) completes a stop string.

        As in ``generate``, the string may start in the prompt but must end in the last token. Decoding only
        a tail keeps this O(1) per token: a stop string of ``n`` characters spans at most ``n`` tokens that
        decode to at least one character.
        """
        tail = [int(t) for t in history[-(self.longest + 1) :]]
        prev = self.tokenizer.decode(tail[:-1])
        text = self.tokenizer.decode(tail)
        return any(s in text and s not in prev for s in self.stops)


@dataclass
class _Run:
    """Everything a call resolved before any model work: inputs, limits, special tokens, processors."""

    input_ids: torch.Tensor
    model_kwargs: dict
    gen_config: object
    processors: object
    max_new: int
    eos_ids: set
    pad_id: int
    stop_strings: list


_UNSUPPORTED_KWARGS = ("stopping_criteria", "negative_prompt_ids", "negative_prompt_attention_mask",
                       "assistant_model", "synced_gpus", "assistant_tokenizer")
_UNSUPPORTED_OUTPUTS = ("return_dict_in_generate", "output_scores", "output_logits", "output_hidden_states",
                        "output_attentions")


def _check_rope(model, total_len: int) -> None:
    """Refuse rope scalings whose frequencies depend on the longest position in a pass.

    With ``dynamic`` or ``longrope`` rope the frequencies change once a pass reaches a threshold; deep draft
    nodes reach it a round earlier than ``generate`` would, so the output could differ.
    """
    cfg = model.config.get_text_config(decoder=True)
    rope = getattr(cfg, "rope_parameters", None) or {}
    kind = rope.get("rope_type", rope.get("type")) if isinstance(rope, dict) else None
    if kind not in ("dynamic", "longrope"):
        return
    limit = rope.get("original_max_position_embeddings") or getattr(cfg, "original_max_position_embeddings", None)
    limit = limit or cfg.max_position_embeddings
    if total_len > limit:
        raise UnsupportedModelError(
            f"{kind!r} rope scaling changes its frequencies past {limit} positions; prompt + max_new_tokens = "
            f"{total_len} would cross it, where speculative verification is not exact. Lower max_new_tokens."
        )


def _prepare_run(model, inputs: dict, generation_config, logits_processor, stop_strings, kwargs: dict) -> _Run:
    """Resolve arguments the way ``generate`` does (same private hooks), and reject what mmspec cannot honour."""
    input_ids = inputs.get("input_ids")
    if input_ids is None:
        raise InvalidInputError("inputs must contain input_ids (pass what the model's processor returns)")
    if input_ids.dim() != 2 or input_ids.numel() == 0:
        raise InvalidInputError(f"input_ids must be a non-empty [batch, length] tensor (got {tuple(input_ids.shape)})")
    if kwargs.get("max_new_tokens") is not None:
        kwargs["max_new_tokens"] = check_max_new_tokens(kwargs["max_new_tokens"])  # np.int64 / 0-d tensor -> int
    unsupported = [k for k in _UNSUPPORTED_KWARGS if kwargs.get(k) is not None]
    if unsupported:
        raise InvalidInputError(f"mmspec.generate does not support {unsupported}")
    prefix_fn = kwargs.pop("prefix_allowed_tokens_fn", None)
    # generate() decides 'default length' before filling defaults in: the same flags, read the same way.
    has_default_max_length = (kwargs.get("max_length") is None
                              and (generation_config is None or generation_config.max_length is None)
                              and model.generation_config.max_length is None)
    has_default_min_length = (kwargs.get("min_length") is None
                              and (generation_config is None or generation_config.min_length is None)
                              and model.generation_config.min_length is None)
    model_kwargs = {k: v for k, v in inputs.items() if k != "input_ids"}
    try:
        gen_config, extra = model._prepare_generation_config(generation_config, **kwargs)
        model._validate_model_kwargs({**model_kwargs, **extra})
    except ValueError as e:  # GenerationConfig.validate: bad generation arguments are the caller's error
        raise InvalidInputError(f"invalid generation arguments: {e}") from e
    check_sampling(bool(gen_config.do_sample), gen_config.temperature, gen_config.top_k, gen_config.top_p)
    if (gen_config.num_return_sequences or 1) > 1:
        raise InvalidInputError("num_return_sequences > 1 is not supported: repeat the rows of the inputs instead")
    if gen_config.num_beams not in (None, 1):
        raise InvalidInputError("beam search is not speculative decoding; use num_beams=1")
    asked = [k for k in _UNSUPPORTED_OUTPUTS if getattr(gen_config, k, False)]
    if asked:
        raise InvalidInputError(f"mmspec.generate returns sequences and stats; {asked} are not supported")
    model_kwargs.update(extra)
    device = model.device
    input_ids = input_ids.to(device)
    model_kwargs = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in model_kwargs.items()}
    batch, prompt_len = input_ids.shape
    gen_config = model._prepare_generated_length(gen_config, has_default_max_length, has_default_min_length,
                                                 "input_ids", prompt_len, input_ids)
    max_new = gen_config.max_length - prompt_len
    if max_new <= 0:
        raise InvalidInputError(f"max_new_tokens must be > 0 (got {max_new})")
    window = context_window(model)
    if window is not None and prompt_len > window:
        raise ContextLengthError(
            f"the prompt has {prompt_len} tokens but the model's context window is {window}; shorten the prompt"
        )
    _check_rope(model, prompt_len + max_new)
    model._prepare_special_tokens(gen_config, model_kwargs.get("attention_mask") is not None, device=device,
                                  batch_size=batch)
    if model_kwargs.get("attention_mask") is None:  # as generate: inferred from pad tokens when it can be
        model_kwargs["attention_mask"] = model._prepare_attention_mask_for_generation(input_ids, gen_config,
                                                                                      model_kwargs)
    if batch > 1 and bool((model_kwargs["attention_mask"][:, -1] == 0).any()):
        raise InvalidInputError("batched inputs must be left-padded (tokenizer.padding_side = 'left')")
    try:
        processors = model._get_logits_processor(
            generation_config=gen_config,
            input_ids_seq_length=prompt_len,
            encoder_input_ids=input_ids,
            prefix_allowed_tokens_fn=prefix_fn,
            logits_processor=logits_processor,
            device=device,
            model_kwargs=model_kwargs,
        )
    except ValueError as e:  # a warper's own argument check (e.g. repetition_penalty <= 0)
        raise InvalidInputError(f"invalid generation arguments: {e}") from e
    eos = gen_config._eos_token_tensor
    pad = gen_config._pad_token_tensor
    stops = [stop_strings] if isinstance(stop_strings, str) else list(stop_strings or [])
    cfg_stops = gen_config.stop_strings
    stops += [cfg_stops] if isinstance(cfg_stops, str) else list(cfg_stops or [])
    return _Run(input_ids, model_kwargs, gen_config, processors, max_new,
                set() if eos is None else set(eos.flatten().tolist()), int(pad) if pad is not None else 0, stops)


@torch.no_grad()
def generate(
    model,
    inputs=None,
    drafter: Drafter | None = None,
    *,
    rule: str | AcceptanceRule | None = None,
    generation_config=None,
    logits_processor=None,
    streamer=None,
    on_tokens=None,
    generator: torch.Generator | None = None,
    seed: int | None = None,
    tokenizer=None,
    stop_strings=None,
    budget: DepthBudget | None = None,
    record_entropy: bool = False,
    guidance=None,
    lean: bool = False,
    **kwargs,
) -> GenerateOutput:
    """Speculative decoding with ``drafter`` on ``model``; same output as ``model.generate``.

    Args:
        model: a transformers causal LM or VLM (``from_pretrained``).
        inputs: exactly what the model's processor/tokenizer returns (``input_ids``, ``attention_mask``,
            ``pixel_values``, ``image_grid_thw``, ``mm_token_type_ids``, ...). Batches must be left-padded.
        drafter: a :class:`~mmspec.drafters.Drafter`, or a spec :func:`mmspec.registry.make_drafter` takes
            (``"lookup"``, ``"eagle:DIR;topk=3"``, a dict); ``None`` decodes one token per pass (plain AR
            through the same loop, useful as a control).
        rule: acceptance rule name or object; default: ``greedy`` or ``speculative_sampling`` by mode. A rule
            used in the other mode (greedy rule while sampling) works but its stats say ``lossless=False``.
        generation_config, logits_processor, **kwargs: as for ``generate`` (``max_new_tokens``,
            ``do_sample``, ``temperature``, ``top_k``, ``top_p``, ``eos_token_id``, ``repetition_penalty``,
            ``prefix_allowed_tokens_fn``, ``max_time``...). Other keyword arguments are model inputs, as in
            ``generate``. Arguments mmspec cannot honour (beams, ``num_return_sequences``, custom
            ``stopping_criteria``, score outputs) raise :class:`~mmspec.InvalidInputError`.
        streamer: a transformers streamer (``put``/``end``), batch size 1.
        on_tokens: ``callable(row, tokens)`` called with each row's newly committed tokens.
        generator, seed: random source for sampling (``seed`` builds a generator on the model's device).
        tokenizer, stop_strings: stop when a row's text completes one of ``stop_strings`` (also read from
            the generation config), as ``generate`` does.
        budget: a :class:`~mmspec.budget.DepthBudget` that cuts each tree to the depth with the best
            expected tokens per unit of measured verify time (reuse one instance across calls).
        record_entropy: keep, per row-round, the target's next-token entropy at the root beside the tokens
            committed (``stats.entropy_trace``, fitted by :meth:`SpecStats.draftability`); off by default.
        guidance: a :class:`~mmspec.target.Guidance` (classifier-free guidance: the unconditional rows run in
            the same passes, the logits every processor and rule sees are ``u + s (c - u)``).
        lean: verify passes through :class:`~mmspec.lean.LeanForward` (bit for bit the model's numbers without the
            transformers call stack; Qwen2 / Qwen2-VL / Llama layers, else the model's forward): for small targets,
            whose passes are mostly Python. The prefill stays the model's own.

    Returns:
        :class:`GenerateOutput` with ``sequences`` (prompt + generated, rows padded with the pad token after
        they finish, as ``generate`` pads) and ``stats``.

    Example:
        >>> out = generate(model, tok(["a b c a b"], return_tensors="pt"), PromptLookupDrafter(),
        ...                max_new_tokens=16)                                   # doctest: +SKIP
    """
    t_start = time.perf_counter()
    if isinstance(inputs, torch.Tensor):
        raise InvalidInputError("inputs is a bare tensor; pass what the processor returns (a mapping with input_ids, "
                                "attention_mask, ...), e.g. {'input_ids': ids}")
    if inputs is not None and not hasattr(inputs, "keys"):
        raise InvalidInputError(f"inputs must be a mapping (what the processor returns), not {type(inputs).__name__}")
    inputs = dict(inputs or {})
    if drafter is not None and not isinstance(drafter, Drafter):
        from .registry import make_drafter

        drafter = make_drafter(drafter, model)  # "lookup", "eagle:DIR;topk=3", {"kind": ...}: as the pipelines take
    run = _prepare_run(model, inputs, generation_config, logits_processor, stop_strings, kwargs)
    input_ids, gen_config, max_new, eos_ids = run.input_ids, run.gen_config, run.max_new, run.eos_ids
    device = input_ids.device
    batch = input_ids.shape[0]
    attention_mask = run.model_kwargs["attention_mask"]
    do_sample = bool(gen_config.do_sample)
    acceptance = get_rule(rule, do_sample)
    if generator is None and seed is not None:
        generator = torch.Generator(device=device).manual_seed(seed)
    stopper = _StopStrings(tokenizer, run.stop_strings) if run.stop_strings else None
    if streamer is not None and batch > 1:
        raise InvalidInputError("streamers take batch size 1; use on_tokens=callable(row, tokens) for batches")
    max_time = gen_config.max_time

    mode_ok = acceptance.mode is None or acceptance.mode == ("sample" if do_sample else "greedy")
    stats = SpecStats(rule=acceptance.name, lossless=acceptance.lossless and mode_ok,
                      drafter=getattr(drafter, "kind", ""))
    if drafter is not None:
        drafter.bind(model)
    adapter = TargetAdapter(model, hidden_layers=getattr(drafter, "hidden_layers", ()) if drafter else (),
                            guidance=guidance, lean=lean)

    # ---------------------------------------------------------------- prefill + first token
    t0 = time.perf_counter()
    state, last_logits, hidden = adapter.prefill(input_ids, run.model_kwargs)
    stats.target_forwards += 1
    stats.prefill_rows += batch
    padded_prompt = input_ids.cpu()
    tree_processor = TreeLogitsProcessor(run.processors, padded_prompt)
    scores = tree_processor.first(input_ids, last_logits)
    stats.prefill_time += time.perf_counter() - t0

    prompt_rows = [input_ids[r, attention_mask[r].bool()].tolist() for r in range(batch)]
    if streamer is not None:
        streamer.put(padded_prompt)
    generated, _ = decode_from_state(
        adapter, state, scores, drafter, prompts=prompt_rows, max_new=max_new, eos_ids=eos_ids, rule=acceptance,
        do_sample=do_sample, hidden=hidden, model_inputs={"input_ids": input_ids, **run.model_kwargs},
        processors=tree_processor, generator=generator, stats=stats, stop=stopper.hit if stopper else None,
        budget=budget, record_entropy=record_entropy, on_tokens=on_tokens, streamer=streamer, max_time=max_time,
        t_start=t_start)

    if streamer is not None:
        streamer.end()
    longest = max(len(g) for g in generated)
    tail = torch.full((batch, longest), run.pad_id, dtype=input_ids.dtype)
    for r, g in enumerate(generated):
        tail[r, : len(g)] = torch.tensor(g, dtype=input_ids.dtype)
    stats.generated = sum(len(g) for g in generated)
    if drafter is not None:
        stats.drafter_counters = dict(drafter.counters())
    stats.total_time = time.perf_counter() - t_start
    return GenerateOutput(torch.cat([padded_prompt, tail], dim=1).to(device), stats)


@torch.no_grad()
def decode_from_state(
    adapter: TargetAdapter,
    state,
    scores: torch.Tensor,
    drafter: Drafter | None = None,
    *,
    prompts: list,
    max_new: int,
    eos_ids=(),
    rule: str | AcceptanceRule | None = None,
    do_sample: bool = False,
    hidden: dict | None = None,
    model_inputs: dict | None = None,
    processors: TreeLogitsProcessor | None = None,
    generator: torch.Generator | None = None,
    stats: SpecStats | None = None,
    stop=None,
    budget: DepthBudget | None = None,
    record_entropy: bool = False,
    on_tokens=None,
    streamer=None,
    max_time: float | None = None,
    t_start: float | None = None,
    keep_state: bool = False,
) -> DecodeResult:
    """The speculative rounds of :func:`generate`, from a target state someone already prefilled.

    :func:`generate` prefills with :meth:`TargetAdapter.prefill` and calls this; a pipeline that builds its own
    cache (FlashDrive's streamed KV, moved and re-rotated across ticks) hands its state here instead and gets the
    same rounds: the first token from ``scores``, then ``drafter.propose`` -> one ``adapter.score`` pass ->
    ``rule`` accepts -> ``adapter.commit``, until every row stops (eos, ``max_new`` tokens, ``stop``, ``max_time``).

    Args:
        adapter: the :class:`~mmspec.target.TargetAdapter` over the target (``hidden_layers`` = the drafter's).
        state: a :class:`~mmspec.target.TargetState` whose cache holds each row's prompt; ``positions`` give the
            position after the prompt; ``pending`` is overwritten with the first token.
        scores: ``[B, V]`` processed scores for the token after the prompt (what the rule picks the first from).
        drafter: a bound :class:`~mmspec.drafters.Drafter`, or ``None`` (one token per pass).
        prompts: per row, its unpadded prompt tokens (what drafters see in ``DraftContext.sequences``).
        max_new: tokens each row may generate (the first one included).
        eos_ids: token ids that stop a row (kept, as ``generate`` keeps them).
        rule: acceptance rule name or object (default: greedy, or speculative sampling if ``do_sample``).
        hidden, model_inputs: the prefill's ``{layer: [B, L, H]}`` states and the call's inputs (``DraftContext``).
        processors: a :class:`~mmspec.processing.TreeLogitsProcessor` applied to every pass (``None``: raw logits).
        stop: ``callable(history) -> bool``, whether a row's history (prompt + generated) ends in a stop.
        stats: the :class:`~mmspec.stats.SpecStats` the rounds add to (a new one if ``None``).
        keep_state: rows that stop in the last round stay in ``state`` (finished earlier ones still leave), with
            every token they kept but the last in the cache (tokens past a stop inside an accepted path are
            removed) and the last one pending: what a caller that reads or extends the cache afterwards needs.
            At batch > 1 rows finish in different rounds, so which rows stayed is in the result's
            ``state_rows`` (original row indices, in state order). ``False``: they leave, as in ``generate``.
        generator, budget, record_entropy, on_tokens, streamer, max_time, t_start: as for :func:`generate`.

    Returns:
        a :class:`DecodeResult`, unpacking as ``(generated, stats)``: each row's new tokens (a list of ints per
        row) and the stats; its ``state_rows`` lists the original rows ``state`` still holds, in state order.

    Example:
        >>> adapter = TargetAdapter(model)                                                      # doctest: +SKIP
        >>> state, logits, hidden = adapter.prefill(ids, {"attention_mask": mask})              # doctest: +SKIP
        >>> res = decode_from_state(adapter, state, logits, prompts=[p.tolist() for p in rows],
        ...                         max_new=32, eos_ids={2}, keep_state=True)                   # doctest: +SKIP
        >>> tokens, stats = res                                                                 # doctest: +SKIP
        >>> res.state_rows  # state row i is original row res.state_rows[i]                     # doctest: +SKIP
        [1, 3]
    """
    t_start = time.perf_counter() if t_start is None else t_start
    acceptance = get_rule(rule, do_sample)
    if stats is None:
        mode_ok = acceptance.mode is None or acceptance.mode == ("sample" if do_sample else "greedy")
        stats = SpecStats(rule=acceptance.name, lossless=acceptance.lossless and mode_ok,
                          drafter=getattr(drafter, "kind", ""))
    eos_ids = set(eos_ids)
    # The state lives on the model's device; with device_map="auto" the logits may sit on another GPU.
    device = getattr(adapter, "device", scores.device)
    if scores.dim() != 2:
        raise InvalidInputError(f"scores must be [batch, vocab] (the token after each prompt), "
                                f"got {tuple(scores.shape)}")
    batch, vocab = scores.shape
    max_new = check_max_new_tokens(max_new)
    if len(prompts) != batch:
        raise InvalidInputError(f"{len(prompts)} prompts for {batch} rows of scores: one prompt per row")
    hidden = hidden or {}
    model_inputs = model_inputs or {}
    if processors is None:
        processors = TreeLogitsProcessor([], torch.zeros(batch, 0, dtype=torch.long))
    prompt_rows = [list(p) for p in prompts]
    generated: list[list[int]] = [[] for _ in range(batch)]
    # Each row's committed tokens in a preallocated buffer: drafters get views, O(1) per round.
    buffers = [np.empty(len(p) + max_new, dtype=np.int64) for p in prompt_rows]
    for buf, p in zip(buffers, prompt_rows):
        buf[: len(p)] = p
    active = list(range(batch))  # original row of each state row
    stayed: list[int] = []  # with keep_state: the rows that stopped last and stay in the state for the caller

    def push(r: int, new_tokens: list[int]) -> tuple[list[int], bool]:
        """Append a row's committed tokens up to the first stop; return what was kept and whether it stopped."""
        kept = []
        for tok in new_tokens:
            kept.append(tok)
            buffers[r][len(prompt_rows[r]) + len(generated[r])] = tok
            generated[r].append(tok)
            if tok in eos_ids or len(generated[r]) >= max_new or (
                stop is not None and stop(buffers[r][: len(prompt_rows[r]) + len(generated[r])])
            ):
                return kept, True
        return kept, False

    def emit(r: int, kept: list[int]) -> None:
        if on_tokens is not None:
            on_tokens(r, kept)
        if streamer is not None:
            streamer.put(torch.tensor(kept))

    firsts = acceptance.accept_batch([DraftTree.empty()] * batch, scores[:, None], generator)
    finished = []
    for r, res in enumerate(firsts):
        kept, done = push(r, [res.next_token])
        emit(r, kept)
        finished.append(done)
    state.pending = torch.tensor([res.next_token for res in firsts], dtype=torch.long, device=device)
    keep = [i for i, d in enumerate(finished) if not d]
    if len(keep) < batch and (keep or not keep_state):
        adapter.select_rows(state, keep)
        active = [active[i] for i in keep]
        hidden = {k: v[keep] for k, v in hidden.items()}
    elif not keep:  # keep_state, and every row stopped at its first token: all stay
        stayed, active = active, []

    def context(hidden_states) -> DraftContext:
        return DraftContext(
            sequences=[buffers[r][: len(prompt_rows[r]) + len(generated[r])] for r in active],
            rows=list(active),
            remaining=[max_new - len(generated[r]) for r in active],
            prompt_lengths=[len(prompt_rows[r]) for r in active],
            do_sample=do_sample,
            generator=generator,
            hidden=hidden_states,
            model_inputs=model_inputs,
        )

    ctx = context(hidden)
    if drafter is not None and active:
        drafter.begin(ctx)

    while active:
        t0 = time.perf_counter()
        pruned = [False] * len(active)
        if drafter is None:
            trees = [DraftTree.empty() for _ in active]
        else:
            proposed = drafter.propose(ctx)
            _check_trees(drafter, proposed, len(active), vocab)
            # A round commits at most depth + 1 tokens; deeper nodes could never be kept.
            trees = [t.prune(rem - 1) for t, rem in zip(proposed, ctx.remaining)]
            pruned = [a is not b for a, b in zip(trees, proposed)]
            if budget is not None:
                trees = [budget.choose(t) for t in trees]
        t1 = time.perf_counter()
        out, _ = adapter.score(state, trees)
        stats.target_forwards += 1
        stats.rounds += 1
        t2 = time.perf_counter()
        if budget is not None:
            budget.observe_pass(out.logits.shape[1], t2 - t1)
        row_scores = processors(active, generated, trees, out.logits)
        results = acceptance.accept_batch(trees, row_scores, generator)
        if record_entropy:  # the target's uncertainty at each row's root, beside what the round commits below
            t_audit = time.perf_counter()
            root = torch.stack([s[0] for s in row_scores]).float()
            logp = torch.log_softmax(root, dim=-1)
            round_entropy = (-(logp.exp() * logp.nan_to_num(neginf=0.0)).sum(-1)).tolist()
            stats.audit_time += time.perf_counter() - t_audit
        out_of_time = max_time is not None and time.perf_counter() - t_start > max_time
        paths, nexts, finished, committed = [], [], [], []
        for r, tree, res, cut in zip(active, trees, results, pruned):
            kept, done = push(r, [int(tree.tokens[j]) for j in res.path] + [res.next_token])
            _record(stats, tree, res.path, kept, cut)
            if record_entropy and not cut and not done:  # rounds a length cap or a stop cut short say nothing
                stats.entropy_trace.append([round_entropy[len(committed)], len(kept)])
            if budget is not None:
                budget.observe_row(tree, len(res.path))
            emit(r, kept)
            committed.append(kept)
            paths.append(res.path)
            nexts.append(res.next_token)
            finished.append(done or out_of_time)
        t3 = time.perf_counter()
        keep = [i for i, d in enumerate(finished) if not d]
        last = keep_state and not keep  # the last rows stop: they stay in the state for the caller
        adapter.commit(state, paths, torch.tensor(nexts, dtype=torch.long),
                       keep_rows=keep if len(keep) < len(active) and not last else None)
        if last:  # the cache holds path + next token minus the pending one; a stop may have cut the path short
            adapter.truncate(state, [len(p) + 1 - len(c) for p, c in zip(paths, committed)])
            state.pending = torch.tensor([c[-1] for c in committed], dtype=torch.long, device=state.pending.device)
        t4 = time.perf_counter()
        result = RoundResult(trees=trees, paths=paths, next_tokens=nexts, finished=finished, committed=committed,
                             scores=row_scores)
        prev_ctx = ctx
        if last:
            stayed = active
        active = [active[i] for i in keep]
        hs = out.hidden_states
        ctx = context(hs if len(keep) == len(finished) else {k: v[keep] for k, v in hs.items()})
        if drafter is not None:
            drafter.observe(prev_ctx, result)
        stats.draft_time += (t1 - t0) + (time.perf_counter() - t4)
        stats.verify_time += t2 - t1
        stats.accept_time += t3 - t2
        stats.commit_time += t4 - t3
    return DecodeResult(generated, stats, state_rows=stayed)


def _check_trees(drafter, trees: list, rows: int, vocab: int) -> None:
    """A drafter's proposals must fit the batch and the target's vocabulary (bad ids would crash a GPU)."""
    if not isinstance(trees, (list, tuple)):
        got = None if trees is None else type(trees).__name__
        raise InvalidInputError(f"drafter {drafter.kind!r} returned {got} from propose(); it must return a list of "
                                "DraftTree, one per active row (DraftTree.empty() for a row it has nothing for)")
    bad = [type(t).__name__ for t in trees if not isinstance(t, DraftTree)]
    if bad:
        raise InvalidInputError(f"drafter {drafter.kind!r} returned {bad[0]} in its list; propose() must return "
                                "DraftTree objects (DraftTree.empty() for a row it has nothing for)")
    if len(trees) != rows:
        raise InvalidInputError(f"drafter {drafter.kind!r} returned {len(trees)} trees for {rows} rows")
    for t in trees:
        if len(t) and (int(t.tokens.min()) < 0 or int(t.tokens.max()) >= vocab):
            raise InvalidInputError(f"drafter {drafter.kind!r} proposed token ids outside the target vocabulary [0, {vocab})")
        if t.draft_probs is not None and t.draft_probs.shape[-1] != vocab:
            raise InvalidInputError(
                f"drafter {drafter.kind!r} gave draft_probs over {t.draft_probs.shape[-1]} tokens; the target has {vocab}"
            )


def _record(stats: SpecStats, tree: DraftTree, path: list, kept: list, pruned: bool) -> None:
    """Record one row's round. A stop inside the accepted path ends the round there: later positions were
    not tested, and the round is neither a rejection nor a ceiling; nor is a tree cut by the length limit."""
    accepted = min(len(path), len(kept))
    stopped_early = len(kept) < len(path) + 1
    depth = accepted if stopped_early else tree.max_depth
    ceiling = not stopped_early and not pruned and depth > 0 and accepted == depth
    stats.record_row(accepted, depth, len(tree), committed=len(kept), ceiling=ceiling)


