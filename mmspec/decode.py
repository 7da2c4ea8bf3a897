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

import torch

from .acceptance import AcceptanceRule, get_rule
from .drafters.base import DraftContext, Drafter, RoundResult
from .errors import ContextLengthError, InvalidInputError
from .stats import SpecStats
from .target import TargetAdapter
from .tree import DraftTree

__all__ = ["generate", "GenerateOutput"]


@dataclass
class GenerateOutput:
    """``sequences[B, P + T]`` (prompt included, like ``generate``) and the run's :class:`SpecStats`."""

    sequences: torch.Tensor
    stats: SpecStats


class _StopStrings:
    """Row-wise stop-string check on decoded text; a row stops at the token that completes a stop string."""

    def __init__(self, tokenizer, stop_strings):
        if tokenizer is None:
            raise InvalidInputError("stop_strings need the model's tokenizer: pass tokenizer=...")
        self.tokenizer = tokenizer
        self.stops = [stop_strings] if isinstance(stop_strings, str) else list(stop_strings)
        self.longest = max(len(s) for s in self.stops)

    def hit(self, history: list[int]) -> bool:
        """Whether the last token of ``history`` (prompt + generated) completes a stop string.

        As in ``generate``, the string may start in the prompt but must end in the last token. Decoding only
        a tail keeps this O(1) per token: a stop string of ``n`` characters spans at most ``n`` tokens that
        decode to at least one character.
        """
        tail = history[-(self.longest + 1) :]
        prev = self.tokenizer.decode(tail[:-1])
        text = self.tokenizer.decode(tail)
        return any(s in text and s not in prev for s in self.stops)


def _max_context(model) -> int | None:
    cfg = model.config
    for c in (getattr(cfg, "text_config", None), cfg):
        if c is not None and getattr(c, "max_position_embeddings", None):
            return int(c.max_position_embeddings)
    return None


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
    **kwargs,
) -> GenerateOutput:
    """Speculative decoding with ``drafter`` on ``model``; same output as ``model.generate``.

    Args:
        model: a transformers causal LM or VLM (``from_pretrained``).
        inputs: exactly what the model's processor/tokenizer returns (``input_ids``, ``attention_mask``,
            ``pixel_values``, ``image_grid_thw``, ``mm_token_type_ids``, ...). Batches must be left-padded.
        drafter: a :class:`~mmspec.drafters.Drafter`; ``None`` decodes one token per pass (plain AR
            through the same loop, useful as a control).
        rule: acceptance rule name or object; default: ``greedy`` or ``speculative_sampling`` by mode.
        generation_config, logits_processor, **kwargs: as for ``generate`` (``max_new_tokens``,
            ``do_sample``, ``temperature``, ``top_k``, ``top_p``, ``eos_token_id``, ``repetition_penalty``...).
            Other keyword arguments are treated as model inputs, like ``generate`` does.
        streamer: a transformers streamer (``put``/``end``), batch size 1.
        on_tokens: ``callable(row, tokens)`` called with each row's newly committed tokens.
        generator, seed: random source for sampling (``seed`` builds a generator).
        tokenizer, stop_strings: stop when the decoded text of a row contains one of ``stop_strings``.

    Returns:
        :class:`GenerateOutput` with ``sequences`` (prompt + generated, rows padded with the pad token after
        they finish, as ``generate`` pads) and ``stats``.

    Example:
        >>> out = generate(model, tok(["a b c a b"], return_tensors="pt"), PromptLookupDrafter(),
        ...                max_new_tokens=16)                                   # doctest: +SKIP
    """
    t_start = time.perf_counter()
    inputs = dict(inputs or {})
    model_kwargs = {k: v for k, v in inputs.items() if k != "input_ids"}
    input_ids = inputs.get("input_ids")
    if input_ids is None:
        raise InvalidInputError("inputs must contain input_ids (pass what the model's processor returns)")
    requested = kwargs.get("max_new_tokens")
    if requested is not None and (isinstance(requested, bool) or not isinstance(requested, int) or requested <= 0):
        raise InvalidInputError(f"max_new_tokens must be a positive integer (got {requested!r})")
    try:
        gen_config, extra_model_kwargs = model._prepare_generation_config(generation_config, **kwargs)
    except ValueError as e:  # GenerationConfig.validate: bad generation arguments are the caller's error
        raise InvalidInputError(f"invalid generation arguments: {e}") from e
    model_kwargs.update(extra_model_kwargs)
    if getattr(gen_config, "num_beams", 1) not in (None, 1):
        raise InvalidInputError("beam search is not speculative decoding; use num_beams=1")
    device = model.device
    input_ids = input_ids.to(device)
    model_kwargs = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in model_kwargs.items()}
    batch, prompt_len = input_ids.shape
    if input_ids.numel() == 0:
        raise InvalidInputError("input_ids is empty")
    max_new = gen_config.max_new_tokens
    if max_new is None:
        max_new = gen_config.max_length - prompt_len
    if max_new <= 0:
        raise InvalidInputError(f"max_new_tokens must be > 0 (got {max_new})")
    window = _max_context(model)
    if window is not None and prompt_len > window:
        raise ContextLengthError(
            f"the prompt has {prompt_len} tokens but the model's context window is {window}; shorten the prompt"
        )
    attention_mask = model_kwargs.get("attention_mask")
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
        model_kwargs["attention_mask"] = attention_mask
    if batch > 1 and bool((attention_mask[:, -1] == 0).any()):
        raise InvalidInputError("batched inputs must be left-padded (tokenizer.padding_side = 'left')")

    model._prepare_special_tokens(gen_config, True, device=device, batch_size=batch)
    eos = gen_config._eos_token_tensor
    eos_ids = set() if eos is None else set(eos.flatten().tolist())
    pad = gen_config._pad_token_tensor
    pad_id = int(pad) if pad is not None else 0
    processors = model._get_logits_processor(
        generation_config=gen_config,
        input_ids_seq_length=prompt_len,
        encoder_input_ids=input_ids,
        logits_processor=logits_processor,
        device=device,
        model_kwargs=model_kwargs,
    )
    row_free = _row_free(processors)
    row_views: dict = {}  # row -> processors specialised to that row (then row-free), or None
    do_sample = bool(gen_config.do_sample)
    acceptance = get_rule(rule, do_sample)
    if generator is None and seed is not None:
        generator = torch.Generator(device="cpu").manual_seed(seed)
    stopper = _StopStrings(tokenizer, stop_strings) if stop_strings else None

    stats = SpecStats(rule=acceptance.name, lossless=acceptance.lossless, drafter=getattr(drafter, "kind", ""))
    if drafter is not None:
        drafter.bind(model)
    adapter = TargetAdapter(model, hidden_layers=getattr(drafter, "hidden_layers", ()) if drafter else ())

    # ---------------------------------------------------------------- prefill + first token
    t0 = time.perf_counter()
    state, last_logits, hidden = adapter.prefill(input_ids, model_kwargs)
    stats.target_forwards += 1
    stats.prefill_rows += batch
    scores = processors(input_ids, last_logits)
    stats.prefill_time += time.perf_counter() - t0

    prompt_rows = [input_ids[r, attention_mask[r].bool()].tolist() for r in range(batch)]
    padded_prompt = input_ids.cpu()
    generated: list[list[int]] = [[] for _ in range(batch)]
    active = list(range(batch))  # original row of each state row

    def push(r: int, new_tokens: list[int]) -> tuple[list[int], bool]:
        """Append a row's committed tokens up to the first stop; return what was kept and whether it stopped."""
        kept = []
        for tok in new_tokens:
            kept.append(tok)
            generated[r].append(tok)
            if tok in eos_ids or len(generated[r]) >= max_new or (
                stopper is not None and stopper.hit(prompt_rows[r][-stopper.longest - 1 :] + generated[r])
            ):
                return kept, True
        return kept, False

    def emit(r: int, kept: list[int]) -> None:
        if on_tokens is not None:
            on_tokens(r, kept)
        if streamer is not None:
            streamer.put(torch.tensor(kept))

    if streamer is not None:
        if batch > 1:
            raise InvalidInputError("streamers take batch size 1; use on_tokens=callable(row, tokens) for batches")
        streamer.put(padded_prompt)

    firsts = []
    finished_now = []
    for r in range(batch):
        res = acceptance.accept(DraftTree.empty(), scores[r : r + 1], generator)
        kept, done = push(r, [res.next_token])
        emit(r, kept)
        firsts.append(res.next_token)
        finished_now.append(done)
    state.pending = torch.tensor(firsts, dtype=torch.long, device=device)
    keep = [i for i, d in enumerate(finished_now) if not d]
    if len(keep) < batch:
        adapter.select_rows(state, keep)
        active = [active[i] for i in keep]

    def context(hidden_states) -> DraftContext:
        return DraftContext(
            sequences=[prompt_rows[r] + generated[r] for r in active],
            rows=list(active),
            remaining=[max_new - len(generated[r]) for r in active],
            prompt_lengths=[len(prompt_rows[r]) for r in active],
            do_sample=do_sample,
            generator=generator,
            hidden=hidden_states,
            model_inputs=inputs,
        )

    ctx = context(hidden)
    if drafter is not None and active:
        drafter.begin(ctx)

    # ---------------------------------------------------------------- rounds
    while active:
        t0 = time.perf_counter()
        if drafter is None:
            trees = [DraftTree.empty() for _ in active]
        else:
            trees = drafter.propose(ctx)
            if len(trees) != len(active):
                raise InvalidInputError(f"drafter {drafter.kind!r} returned {len(trees)} trees for {len(active)} rows")
            # A round commits at most depth + 1 tokens; deeper nodes could never be kept.
            trees = [t.prune(rem - 1) for t, rem in zip(trees, ctx.remaining)]
        t1 = time.perf_counter()
        out, _ = adapter.score(state, trees)
        stats.target_forwards += 1
        stats.rounds += 1
        t2 = time.perf_counter()
        paths, nexts, finished = [], [], []
        for i, (r, tree) in enumerate(zip(active, trees)):
            procs = processors if row_free else row_views.setdefault(r, _row_view(processors, r))
            row_scores = _process_row(procs or processors, procs is not None, r, batch, padded_prompt[r],
                                      generated[r], tree, out.logits[i, : len(tree) + 1])
            res = acceptance.accept(tree, row_scores, generator)
            paths.append(res.path)
            nexts.append(res.next_token)
            kept, done = push(r, [int(tree.tokens[j]) for j in res.path] + [res.next_token])
            # Tokens after a stop (eos inside the accepted path) are not committed: tau counts what was kept.
            stats.record_row(len(kept) - 1, tree.max_depth, len(tree))
            emit(r, kept)
            finished.append(done)
        t3 = time.perf_counter()
        keep = [i for i, d in enumerate(finished) if not d]
        adapter.commit(state, paths, torch.tensor(nexts, dtype=torch.long), keep_rows=keep if len(keep) < len(active) else None)
        t4 = time.perf_counter()
        result = RoundResult(trees=trees, paths=paths, next_tokens=nexts, finished=finished)
        prev_ctx = ctx
        active = [active[i] for i in keep]
        ctx = context(out.hidden_states)
        if drafter is not None:
            drafter.observe(prev_ctx, result)
        stats.draft_time += (t1 - t0) + (time.perf_counter() - t4)
        stats.verify_time += t2 - t1
        stats.accept_time += t3 - t2
        stats.commit_time += t4 - t3

    if streamer is not None:
        streamer.end()
    longest = max(len(g) for g in generated)
    tail = torch.full((batch, longest), pad_id, dtype=input_ids.dtype)
    for r, g in enumerate(generated):
        tail[r, : len(g)] = torch.tensor(g, dtype=input_ids.dtype)
    stats.generated = sum(len(g) for g in generated)
    stats.total_time = time.perf_counter() - t_start
    return GenerateOutput(torch.cat([padded_prompt, tail], dim=1).to(device), stats)


# Processors whose output for a row depends only on that row's input_ids and scores: they can score tree
# nodes of several rows in one call. Any other processor may hold per-row state (a batch-shaped tensor, a
# batch id), so each node is scored in its own row's slot of a full-batch call.
_ROW_FREE = {
    "MinLengthLogitsProcessor", "MinNewTokensLengthLogitsProcessor", "TemperatureLogitsWarper", "TopPLogitsWarper",
    "TopKLogitsWarper", "TopHLogitsWarper", "MinPLogitsWarper", "TypicalLogitsWarper", "EpsilonLogitsWarper",
    "EtaLogitsWarper", "NoRepeatNGramLogitsProcessor", "SequenceBiasLogitsProcessor", "NoBadWordsLogitsProcessor",
    "ForcedBOSTokenLogitsProcessor", "ForcedEOSTokenLogitsProcessor", "InfNanRemoveLogitsProcessor",
    "ExponentialDecayLengthPenalty", "LogitNormalization", "SuppressTokensLogitsProcessor",
    "SuppressTokensAtBeginLogitsProcessor",
}


def _row_free(processors) -> bool:
    for p in processors:
        name = type(p).__name__
        if name == "RepetitionPenaltyLogitsProcessor" and not isinstance(p.prompt_ignore_length, torch.Tensor):
            continue
        if name not in _ROW_FREE:
            return False
    return True


def _row_view(processors, row: int):
    """``processors`` specialised to batch row ``row`` so that one call can score many nodes, or ``None``."""
    import copy

    from transformers import LogitsProcessorList

    out = LogitsProcessorList()
    for p in processors:
        name = type(p).__name__
        if name == "RepetitionPenaltyLogitsProcessor" and isinstance(p.prompt_ignore_length, torch.Tensor):
            p = copy.copy(p)
            p.prompt_ignore_length = int(p.prompt_ignore_length[row])
        elif name not in _ROW_FREE and name != "RepetitionPenaltyLogitsProcessor":
            return None
        out.append(p)
    return out


def _process_row(processors, row_free: bool, row: int, batch: int, prompt_row: torch.Tensor, generated: list[int],
                 tree: DraftTree, logits: torch.Tensor):
    """Apply ``generate``'s logits processors to the root and every node, each on its own history.

    A node's history is what ``generate``'s ``input_ids`` would hold when scoring it: the padded prompt
    row, the row's generated tokens (pending included) and the path down to the node.
    """
    if len(processors) == 0:
        return logits
    dev = logits.device
    base = torch.cat([prompt_row, torch.tensor(generated, dtype=prompt_row.dtype)]).to(dev)
    n = len(tree)
    hists = [base] + [torch.cat([base, torch.as_tensor(tree.tokens[tree.path_to(i)], device=dev)]) for i in range(n)]
    out = torch.empty_like(logits)
    if row_free:
        # Histories of one depth share a length: one call per depth.
        depth = [0] + tree.depth.tolist()
        for d in sorted(set(depth)):
            idx = [i for i, x in enumerate(depth) if x == d]
            out[idx] = processors(torch.stack([hists[i] for i in idx]), logits[idx])
        return out
    for i, h in enumerate(hists):
        res = processors(h[None].expand(batch, -1).contiguous(), logits[i : i + 1].expand(batch, -1).clone())
        out[i] = res[row]
    return out
