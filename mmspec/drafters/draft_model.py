"""Draft-model drafting: a smaller Hugging Face model with the target's tokenizer proposes a chain.

The draft model runs through the same :class:`~mmspec.target.TargetAdapter` as the target, so it gets
the same prefill path, positions adapter and KV compaction: a VLM drafter with M-RoPE (a small Qwen2-VL
for a large one) drafts at the right positions, which serving engines do not support yet. A text-only
drafter for a VLM target reads the prompt's token ids only.

Per round the drafter (1) feeds the tokens the target committed since its last step, (2) drafts
``num_draft_tokens`` tokens autoregressively (greedy, or sampled with ``draft_probs`` attached when the
target samples, which keeps speculative sampling exact), and (3) after verification drops what the
target rejected from its own cache.

Example:
    >>> drafter = DraftModelDrafter(small_model, num_draft_tokens=4)      # doctest: +SKIP
    >>> mmspec.generate(big_model, inputs, drafter=drafter, max_new_tokens=64)  # doctest: +SKIP
"""

from __future__ import annotations

import torch

from ..budget import ConfidenceStop
from ..errors import DrafterMismatchError
from ..target import TargetAdapter
from ..tree import DraftTree
from .base import DraftContext, Drafter, RoundResult

__all__ = ["DraftModelDrafter"]

_VISION_KEYS = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw", "mm_token_type_ids",
                "token_type_ids", "pixel_attention_mask", "image_sizes", "second_per_grid_ts")


def _vocab_size(model) -> int:
    return int(model.get_output_embeddings().weight.shape[0])


class DraftModelDrafter(Drafter):
    """Chain drafts from a smaller model sharing the target's vocabulary.

    Args:
        model: the draft model (``from_pretrained``), same tokenizer as the target.
        num_draft_tokens: chain depth per round (at least 1).
        temperature: draft temperature when the target samples (the draft distribution ``q``).
        vocab_size: the number of real tokens both models share (``len(tokenizer)``). When given, the two
            embedding tables may differ in padding rows (Qwen2.5-0.5B has 151936, Qwen2.5-7B 152064); the
            drafter never proposes ids past it. When omitted, the embedding sizes must be equal.
        min_confidence: stop drafting at the first draft whose cumulative draft-model probability falls
            below this (``"auto"``: from measured costs); see :class:`~mmspec.budget.ConfidenceStop`
            (transformers' ``assistant_confidence_threshold`` differs: it tests the drawn token's own
            probability, which biases sampled drafts; this tests the top probability of the distribution).
    """

    kind = "draft-model"

    def __init__(self, model, num_draft_tokens: int = 4, temperature: float = 1.0, vocab_size: int | None = None,
                 min_confidence: float | str | None = None):
        if num_draft_tokens < 1:
            raise ValueError(f"num_draft_tokens must be >= 1 (got {num_draft_tokens})")
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0 (got {temperature})")
        self.model = model
        self.num_draft_tokens = num_draft_tokens
        self.temperature = temperature
        self.vocab_size = vocab_size
        self.stop = ConfidenceStop.parse(min_confidence)
        self.adapter = TargetAdapter(model)
        self.state = None
        self.target_vocab = None

    def bind(self, model) -> None:
        mine, theirs = _vocab_size(self.model), _vocab_size(model)
        shared = self.vocab_size
        if shared is None and mine != theirs:
            raise DrafterMismatchError(
                f"draft model vocabulary ({mine}) differs from the target's ({theirs}); a draft model must share "
                "the target's tokenizer (pass vocab_size=len(tokenizer) if only the embedding padding differs)"
            )
        if shared is not None and (mine < shared or theirs < shared):
            raise DrafterMismatchError(
                f"vocab_size={shared} but the draft model has {mine} and the target {theirs} embedding rows"
            )
        self.target_vocab = theirs

    def _model_inputs(self, ctx: DraftContext) -> tuple[torch.Tensor, dict]:
        inputs = dict(ctx.model_inputs)
        ids = inputs.pop("input_ids").to(self.model.device)
        accepts = set(__import__("inspect").signature(self.model.forward).parameters)
        kwargs = {k: v.to(self.model.device) if isinstance(v, torch.Tensor) else v
                  for k, v in inputs.items() if k in accepts or k == "attention_mask"}
        return ids, kwargs

    def begin(self, ctx: DraftContext) -> None:
        if self.stop is not None:
            self.stop.new_run()
        ids, kwargs = self._model_inputs(ctx)
        self.state, _, _ = self.adapter.prefill(ids, kwargs)
        self.rows = list(range(ids.shape[0]))
        # Tokens committed by the target but not yet in the draft cache, per original row.
        self.uncached = {r: [seq[-1]] for r, seq in zip(ctx.rows, ctx.sequences)}
        self._sync_rows(ctx.rows)

    def _sync_rows(self, rows: list[int]) -> None:
        if rows != self.rows:
            keep = [self.rows.index(r) for r in rows]
            self.adapter.select_rows(self.state, keep)
            self.rows = list(rows)

    def _pick(self, logits: torch.Tensor, ctx: DraftContext):
        """``(tokens, q or None, log-confidence or None)``: the confidence is the top probability of the
        distribution drafted from (never the drawn token's own, which would bias sampled drafts)."""
        if self.vocab_size is not None:
            logits = logits[..., : self.vocab_size]
        if not ctx.do_sample:
            conf = None if self.stop is None else torch.log_softmax(logits.float(), -1).max(-1).values
            return logits.argmax(-1), None, conf
        probs = torch.softmax(logits / self.temperature, dim=-1)
        conf = None if self.stop is None else probs.max(-1).values.log()
        gen = ctx.generator
        dev = gen.device if gen is not None else probs.device
        tok = torch.multinomial(probs.to(dev), 1, generator=gen).squeeze(-1).to(logits.device)
        if probs.shape[-1] < self.target_vocab:  # q over the target's vocabulary: zero on padding rows
            probs = torch.nn.functional.pad(probs, (0, self.target_vocab - probs.shape[-1]))
        return tok, probs, conf

    @torch.no_grad()
    def propose(self, ctx: DraftContext) -> list[DraftTree]:
        self._sync_rows(ctx.rows)
        if self.stop is not None:
            self.stop.draft_started()
        log_thr = None if self.stop is None else self.stop.log_threshold()
        st = self.state
        # (1) catch up: the first uncached token is the pending one, the rest go in as a chain.
        pend = [self.uncached[r] for r in ctx.rows]
        st.pending = torch.tensor([p[0] for p in pend], dtype=torch.long, device=self.model.device)
        chains = [DraftTree.from_chain(p[1:]) for p in pend]
        out, _ = self.adapter.score(st, chains)
        last = torch.stack([out.logits[i, len(p) - 1] for i, p in enumerate(pend)])
        tok, probs, conf = self._pick(last, ctx)
        self.adapter.commit(st, [list(range(len(p) - 1)) for p in pend], tok)
        drafted, qs, confs = [tok], [probs], [conf]
        # (2) draft autoregressively; each step caches the previous draft token. No row can keep more
        # than remaining - 1 drafts, so deeper steps would be wasted.
        depth = max(1, min(self.num_draft_tokens, max(ctx.remaining) - 1))
        cum = None if log_thr is None else conf
        while len(drafted) < depth:
            if cum is not None and bool((cum < log_thr).all()):
                break  # no row is sure enough of its next draft to pay for it
            out, _ = self.adapter.score(st, [DraftTree.empty()] * len(ctx.rows))
            tok, probs, conf = self._pick(out.logits[:, 0], ctx)
            self.adapter.commit(st, [[] for _ in ctx.rows], tok)
            drafted.append(tok)
            qs.append(probs)
            confs.append(conf)
            cum = None if cum is None else cum + conf
        self.depth = len(drafted)  # the cache holds drafts 1..depth-1 (observe rolls it back)
        toks = torch.stack(drafted, dim=1).tolist()
        q = None if qs[0] is None else torch.stack(qs, dim=1)  # [B, depth, V], on the model's device
        keep = [self.depth] * len(ctx.rows)
        if log_thr is not None:  # each row's chain up to its first draft below the threshold
            keep = (torch.stack(confs, dim=1).cumsum(1) >= log_thr).long().cumprod(1).sum(1).tolist()
        trees = [DraftTree.from_chain(toks[i][:keep[i]], None if q is None else q[i, :keep[i]])
                 for i in range(len(ctx.rows))]
        self._drafted = toks
        if self.stop is not None:
            self.stop.draft_done(self.depth)
        return trees

    def observe(self, ctx: DraftContext, result: RoundResult) -> None:
        if self.stop is not None and result.committed:
            self.stop.committed(sum(map(len, result.committed)) / len(result.committed),
                                1 + max(len(t) for t in result.trees))
        k = self.depth
        drop = []
        for i, (r, toks, path, nxt) in enumerate(zip(ctx.rows, self._drafted, result.paths, result.next_tokens)):
            # What the target kept from the scored tree: in a union it need not be a prefix of this chain.
            kept = [int(result.trees[i].tokens[j]) for j in path]
            a = next((j for j, (x, y) in enumerate(zip(kept, toks)) if x != y), min(len(kept), len(toks)))
            # The cache holds drafts 1..k-1; keep those that were kept, feed the rest of the kept tokens later.
            cached = min(a, k - 1)
            drop.append((k - 1) - cached)
            self.uncached[r] = kept[cached:] + [int(nxt)]
        self.adapter.truncate(self.state, drop)
