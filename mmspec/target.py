"""The target adapter: prefill, score a batch of draft trees in one pass, commit accepted paths.

It wraps a transformers ``PreTrainedModel`` as loaded (no copied modeling code, nothing patched) and owns
its KV cache. The batch is kept as one padded cache ``[B, H, L, D]`` per layer with a boolean
``valid[B, L]`` saying which slots hold committed tokens; rows are right-aligned (left padding), so
rows that accepted different lengths share one tensor. After every round :meth:`TargetAdapter.commit`
gathers each row's committed slots (old prefix, the pending token, the accepted path) and re-pads: the
cache length is the longest row's committed length, nothing rejected survives.

Scoring feeds ``[pending token] + tree nodes`` per row with an explicit 4-D mask (each node sees the
row's committed slots, the root and its own ancestors) and explicit per-node positions from the
:class:`~mmspec.positions.StreamPositions` adapter, so the model's own mask and position logic is never
asked to guess.

With :class:`Guidance` (classifier-free guidance, as image-AR models run it) the model's batch is doubled:
row ``r`` and its unconditional twin ``B + r`` share the mask, positions, drafts and accepted paths, so the
cache holds ``2B`` rows that every gather moves together, and the logits returned are ``u + s (c - u)``.

Example:
    >>> adapter = TargetAdapter(model)                          # doctest: +SKIP
    >>> state, logits, _ = adapter.prefill(processor_outputs)   # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .errors import UnsupportedModelError
from .kernels.compaction import gather_slots
from .kernels.hf import TREE_ATTENTION, TREE_KWARG, TreeMetadata
from .lean import LeanForward, why_not as lean_why_not
from .positions import StreamPositions, prefill_position_ids
from .tree import DraftTree

__all__ = ["TargetAdapter", "TargetState", "ScoreOutput", "PackedTrees", "pack_trees", "Guidance"]

# Per-token type inputs that generate keeps extending while decoding.
_TYPE_ID_KEYS = ("token_type_ids", "mm_token_type_ids")


@dataclass
class Guidance:
    """Classifier-free guidance for the target: ``logits = u + scale * (c - u)``.

    ``uncond_input_ids`` (``[B, L]``, the prompt's shape) are the unconditional rows, run in the same pass as
    the conditional ones (a doubled batch, as Janus and LlamaGen do); they share the prompt's attention mask
    and positions, and every generated token. Only ``input_ids`` / ``attention_mask`` inputs (a text prompt).

    Example:
        >>> g = Guidance(1.5, torch.zeros(2, 3, dtype=torch.long))
        >>> g.combine(torch.tensor([[2.0], [4.0], [0.0], [2.0]])).flatten().tolist()
        [3.0, 5.0]
    """

    scale: float
    uncond_input_ids: torch.Tensor

    def combine(self, logits: torch.Tensor) -> torch.Tensor:
        """``[2B, ...]`` logits (conditional rows first) -> guided ``[B, ...]``."""
        b = logits.shape[0] // 2
        cond, unc = logits[:b], logits[b:]
        return unc + self.scale * (cond - unc)


def _twice(t: torch.Tensor | None, copies: int) -> torch.Tensor | None:
    """``t`` stacked ``copies`` times along the batch (the conditional rows, then their unconditional twins)."""
    return t if t is None or copies == 1 else torch.cat([t] * copies)


@dataclass
class TargetState:
    """What the adapter keeps between rounds for the rows still generating.

    Attributes:
        cache: the transformers cache (``DynamicCache``), ``[B, H, L, D]`` per layer.
        valid: ``bool[B, L]``, true where the slot holds a committed token.
        positions: next positions per row (see :class:`~mmspec.positions.StreamPositions`).
        pending: ``int64[B]``: each row's last committed token, not yet in the cache.
        new_type_ids: per row, the ``token_type_ids`` / ``mm_token_type_ids`` value ``generate`` feeds with
            each new token (only for inputs the call had).
    """

    cache: object
    valid: torch.Tensor
    positions: StreamPositions
    pending: torch.Tensor
    new_type_ids: dict = field(default_factory=dict)

    @property
    def cache_length(self) -> int:
        """Slots per row in the cache (the longest row's committed length, minus the pending token)."""
        return int(self.valid.shape[1])

    @property
    def committed_lengths(self) -> torch.Tensor:
        """``int64[B]``: committed tokens held in the cache per row."""
        return self.valid.sum(dim=1)


@dataclass
class ScoreOutput:
    """Target outputs for ``[root] + nodes`` of every row: ``logits[B, Q, V]`` and requested hidden states."""

    logits: torch.Tensor
    hidden_states: dict


class PackedTrees:
    """A batch of trees in the one padded layout a verify pass consumes (built by :func:`pack_trees`).

    Attributes:
        tokens: ``int64[B, N]`` node tokens, rows padded to the longest tree.
        offsets: ``int64[B, 1 + N]`` depth of each query (the root, column 0, is 0; padding nodes 1).
        parents: ``int64[B, 1 + N]`` parent of each query in the same indexing: ``-1`` for the root, ``0``
            for its children, ``1 + p`` for a child of node ``p``; padding nodes hang off the root. The tree
            attention kernel reads visibility from it.
        n_nodes: ``int64[B]`` nodes per row.
        tree_mask: ``bool[B, 1 + N, 1 + N]`` ancestor-or-self (root column always visible), built on first
            use (the dense-mask path); padding nodes see only the root and themselves.

    It unpacks as ``tokens, offsets, tree_mask, n_nodes``.
    """

    def __init__(self, trees, tokens, offsets, parents, n_nodes):
        self._trees = trees
        self.tokens, self.offsets, self.parents, self.n_nodes = tokens, offsets, parents, n_nodes
        self._mask = None

    @property
    def max_depth(self) -> int:
        """The deepest node's depth (0 when every tree is empty)."""
        return max((t.max_depth for t in self._trees), default=0)

    @property
    def tree_mask(self) -> torch.Tensor:
        if self._mask is None:
            import numpy as np

            b, q = self.offsets.shape
            mask = np.zeros((b, q, q), dtype=bool)
            mask[:, :, 0] = True
            idx = np.arange(q)
            mask[:, idx, idx] = True
            for r, t in enumerate(self._trees):
                if len(t):
                    mask[r, 1 : 1 + len(t), 1 : 1 + len(t)] = t.ancestor_mask()
            self._mask = torch.from_numpy(mask)
        return self._mask

    def __iter__(self):
        return iter((self.tokens, self.offsets, self.tree_mask, self.n_nodes))


def pack_trees(trees: list[DraftTree]) -> PackedTrees:
    """Pad a batch of trees into the ragged-to-dense layout one verify pass consumes.

    Returns a :class:`PackedTrees`: ``tokens[B, N]``, ``offsets[B, 1 + N]`` (depth; the root is 0),
    ``parents[B, 1 + N]`` and ``n_nodes[B]``, plus the dense ``tree_mask[B, 1+N, 1+N]`` (ancestor-or-self,
    root column always visible) on demand. Padding nodes see only the root and themselves, and are never
    accepted.

    Example:
        >>> from mmspec.tree import DraftTree
        >>> toks, offs, mask, n = pack_trees([DraftTree.from_chain([4, 5]), DraftTree.from_chain([6])])
        >>> toks.tolist(), offs.tolist(), n.tolist()
        ([[4, 5], [6, 0]], [[0, 1, 2], [0, 1, 1]], [2, 1])
        >>> pack_trees([DraftTree.from_sequences([[4, 5], [6]])]).parents.tolist()
        [[-1, 0, 0, 1]]
    """
    import numpy as np

    b = len(trees)
    n = max((len(t) for t in trees), default=0)
    tokens = np.zeros((b, n), np.int64)
    offsets = np.zeros((b, 1 + n), np.int64)
    parents = np.zeros((b, 1 + n), np.int64)
    parents[:, 0] = -1
    counts = np.zeros(b, np.int64)
    for r, t in enumerate(trees):
        k = len(t)
        counts[r] = k
        if k:
            tokens[r, :k] = t.tokens
            offsets[r, 1 : 1 + k] = t.depth
            parents[r, 1 : 1 + k] = t.parents + 1
        offsets[r, 1 + k :] = 1
    return PackedTrees(list(trees), torch.from_numpy(tokens), torch.from_numpy(offsets), torch.from_numpy(parents),
                       torch.from_numpy(counts))


# Architectures the test-suite proves lossless (named in every "unsupported model" message).
TESTED_ARCHITECTURES = "Llama, Qwen2, Qwen2-VL, Qwen2.5-VL, Qwen3-VL, LLaVA, Idefics3/SmolVLM, PaliGemma"


class TargetAdapter:
    """Drive a Hugging Face causal (V)LM as the verifier of speculative decoding.

    Args:
        model: a transformers model with a language-modelling head (``...ForCausalLM`` or
            ``...ForConditionalGeneration``), as returned by ``from_pretrained``.
        hidden_layers: indices into the model's ``hidden_states`` output (0 = embeddings, ``-1`` = last
            layer) that drafters read; returned from the same pass that scores the tree.
        guidance: optional :class:`Guidance` (classifier-free guidance in a doubled batch); hidden states
            are then the conditional rows'.
        lean: score through :class:`~mmspec.lean.LeanForward` (bit for bit the model's numbers, without the
            transformers call stack: worth it where a pass is a few ms, as a small model's on a CPU) where
            :func:`~mmspec.lean.why_not` allows (guidance's doubled batch included); otherwise the model's own
            forward.
    """

    def __init__(self, model, hidden_layers: tuple = (), guidance: Guidance | None = None, lean: bool = False):
        if not hasattr(model, "generate") or not hasattr(model, "_prepare_position_ids_for_generation"):
            raise UnsupportedModelError(
                f"{type(model).__name__} is not a generating transformers model; mmspec drives decoder-only "
                f"causal LMs and vision-language models loaded with from_pretrained (tested: {TESTED_ARCHITECTURES})."
            )
        if model.config.is_encoder_decoder:
            raise UnsupportedModelError(
                f"{type(model).__name__} is an encoder-decoder model; mmspec supports decoder-only causal LMs and "
                f"VLMs (tested: {TESTED_ARCHITECTURES})."
            )
        self.model = model
        self.hidden_layers = tuple(hidden_layers)
        self.device = model.device
        self.guidance = guidance
        self._copies = 2 if guidance is not None else 1  # cache rows per logical row
        impl = model.config.get_text_config(decoder=True)._attn_implementation
        if impl not in ("eager", "sdpa", TREE_ATTENTION):
            raise UnsupportedModelError(
                f"attention implementation {impl!r} cannot take a tree mask; load the model with "
                f"attn_implementation='sdpa' (or {TREE_ATTENTION!r}, mmspec.kernels' tree attention)")
        self._bool_mask = impl != "eager"
        # With mmspec.kernels' tree attention, verify passes hand the parent arrays to the attention calls
        # instead of a dense [Q, L + Q] mask (Triton on CUDA, its plain-torch reference elsewhere).
        self._tree_kernel = impl == TREE_ATTENTION
        # lean: verify passes through mmspec.lean (the same numbers without transformers' call stack), where the
        # model's layers are ones it runs (guidance's doubled batch too); otherwise (the tree kernel) the model's own
        self._lean = None
        if lean and not self._tree_kernel and not lean_why_not(model):
            self._lean = LeanForward(model)

    # ------------------------------------------------------------------ prefill
    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor, model_kwargs: dict):
        """Run the prompt (with its images) through the target, as ``generate``'s first step does.

        Returns ``(state, last_logits[B, V], hidden)`` where ``hidden`` maps each requested layer to its
        ``[B, L, H]`` states over the prompt.
        """
        from transformers import DynamicCache

        model = self.model
        attention_mask = model_kwargs.get("attention_mask")
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        kwargs = dict(model_kwargs)
        kwargs["attention_mask"] = attention_mask
        position_ids = prefill_position_ids(model, input_ids, kwargs)
        if position_ids is None:
            raise UnsupportedModelError(
                f"{type(model).__name__}.forward takes no position_ids; mmspec needs explicit positions to verify trees."
            )
        kwargs["position_ids"] = position_ids
        cache = DynamicCache(config=model.config)
        if "logits_to_keep" not in kwargs and model._supports_logits_to_keep():
            kwargs["logits_to_keep"] = 1  # as generate: the prompt's other logits are never read
        run_ids = input_ids
        if self.guidance is not None:
            other = sorted(k for k, v in kwargs.items() if isinstance(v, torch.Tensor)
                           and k not in ("attention_mask", "position_ids"))
            if other or self.guidance.uncond_input_ids.shape != input_ids.shape:
                raise UnsupportedModelError(f"guidance takes a text prompt (input_ids, attention_mask) and "
                                            f"unconditional rows of its shape (got inputs {other})")
            run_ids = torch.cat([input_ids, self.guidance.uncond_input_ids.to(input_ids.device)])
            kwargs["attention_mask"] = _twice(attention_mask, 2)
            kwargs["position_ids"] = torch.cat([position_ids] * 2, dim=-2)  # [B, L] or M-RoPE [A, B, L]
        inputs = model.prepare_inputs_for_generation(
            run_ids, cache=cache, use_cache=True, is_first_iteration=True, **kwargs
        )
        out = model(**inputs, return_dict=True, output_hidden_states=bool(self.hidden_layers))
        cache = out.cache if getattr(out, "cache", None) is not None else out.past_key_values
        self._check_cache(cache)
        state = TargetState(
            cache=cache,
            valid=attention_mask.bool().to(self.device),
            # The positions the model actually received: prepare_inputs_for_generation may shift them
            # (PaliGemma's are 1-indexed), and generate applies the same shift at every step.
            positions=StreamPositions(inputs.get("position_ids", position_ids)[..., : input_ids.shape[0], :]),
            pending=torch.zeros(input_ids.shape[0], dtype=torch.long, device=self.device),
            new_type_ids=self._new_token_type_ids(kwargs),
        )
        return state, self._logits(out.logits[:, -1]), self._pick_hidden(out)

    def _logits(self, logits: torch.Tensor) -> torch.Tensor:
        logits = logits.float()
        return logits if self.guidance is None else self.guidance.combine(logits)

    def _new_token_type_ids(self, kwargs: dict) -> dict:
        """The type id ``generate`` gives each new token, per row, asked of the model's own update rule."""
        present = {k: kwargs[k] for k in _TYPE_ID_KEYS if kwargs.get(k) is not None}
        if not present:
            return {}
        updated = self.model._update_model_kwargs_for_generation({}, dict(present), num_new_tokens=1)
        return {k: updated[k][:, -1:] for k in present}

    def _check_cache(self, cache) -> None:
        from transformers.cache_utils import DynamicLayer

        layers = getattr(cache, "layers", None)
        if layers is None or any(type(layer) is not DynamicLayer for layer in layers):
            kinds = sorted({type(layer).__name__ for layer in (layers or [])}) or [type(cache).__name__]
            raise UnsupportedModelError(
                f"{type(self.model).__name__} uses cache layers {kinds}; mmspec compacts full-attention "
                "DynamicCache layers only (sliding-window and linear-attention layers are not supported yet)."
            )

    def _pick_hidden(self, out) -> dict:
        if not self.hidden_layers:
            return {}
        hs = out.hidden_states
        b = hs[0].shape[0] // self._copies  # the conditional rows under guidance
        return {layer: hs[layer][:b] for layer in self.hidden_layers}

    # ------------------------------------------------------------------ score
    @torch.no_grad()
    def score(self, state: TargetState, trees: list[DraftTree]) -> tuple[ScoreOutput, tuple]:
        """One target pass over every row's ``[pending] + tree``.

        Returns the scores and the packed layout (a :class:`PackedTrees`, from :func:`pack_trees`).
        """
        packed = pack_trees(trees)
        offsets = packed.offsets
        dev = self.device
        b = state.pending.shape[0]
        q = offsets.shape[1]
        input_ids = torch.cat([state.pending[:, None], packed.tokens.to(dev)], dim=1)
        kwargs = {k: v.expand(b, q) for k, v in state.new_type_ids.items()}
        c = self._copies
        if self._tree_kernel:
            kwargs[TREE_KWARG] = TreeMetadata(_twice(state.valid, c), _twice(packed.parents.to(dev), c),
                                              packed.max_depth)
            mask = _twice(state.valid, c)[:, None, None, :]  # 4-D: transformers passes it through, builds no mask
        else:
            full = torch.cat([state.valid[:, None, :].expand(b, q, -1), packed.tree_mask.to(dev)], dim=2)[:, None]
            if self._bool_mask:
                mask = full
            else:
                dtype = self.model.dtype
                mask = torch.zeros(full.shape, dtype=dtype, device=dev).masked_fill_(~full, torch.finfo(dtype).min)
            mask = _twice(mask, c)
        positions = state.positions.for_offsets(offsets.to(dev))
        run_ids = _twice(input_ids, c)
        run_positions = positions if c == 1 else torch.cat([positions] * c, dim=-2)
        if self._lean is not None:  # positions and mask are explicit: the per-token type ids have nothing to say
            out = self._lean(run_ids, position_ids=run_positions, attention_mask=mask, cache=state.cache,
                             output_hidden_states=bool(self.hidden_layers))
        else:
            out = self.model(
                input_ids=run_ids,
                attention_mask=mask,
                position_ids=run_positions,
                cache=state.cache,
                use_cache=True,
                return_dict=True,
                output_hidden_states=bool(self.hidden_layers),
                **{k: _twice(v, c) for k, v in kwargs.items() if k != TREE_KWARG},
                **{k: v for k, v in kwargs.items() if k == TREE_KWARG},
            )
        return ScoreOutput(self._logits(out.logits), self._pick_hidden(out)), packed

    # ------------------------------------------------------------------ commit
    @torch.no_grad()
    def commit(self, state: TargetState, paths: list[list[int]], next_tokens: torch.Tensor, keep_rows=None) -> None:
        """Keep each row's committed prefix, its pending token and its accepted ``path``; drop the rest.

        Args:
            paths: accepted node indices per row (indices into that row's tree).
            next_tokens: ``int64[B]``, the bonus/corrected token per row: the new pending token.
            keep_rows: optional batch indices of the rows that go on (finished rows leave the batch).
        """
        dev = self.device
        b = state.valid.shape[0]
        old_len = state.valid.shape[1]
        lengths = {1 + len(p) for p in paths}
        if keep_rows is None and len(lengths) == 1:
            # Every row keeps the same number of new slots (always so at batch 1): move the kept slots into
            # place right after the old ones and cut the tail, O(new tokens) instead of a copy of the cache.
            k = lengths.pop()
            tail = torch.tensor([[0] + [1 + i for i in p] for p in paths], dtype=torch.long, device=dev)
            if not torch.equal(tail, torch.arange(k, device=dev).expand(b, k)):
                if all(p == paths[0] for p in paths):  # one path for every row (always at batch 1): index_select
                    gathers, pick = _PerDevice(tail[0]), lambda t, i: t.index_select(2, i)
                else:
                    gathers = _PerDevice(_twice(tail, self._copies)[:, None, :, None])
                    pick = lambda t, i: torch.take_along_dim(t, i, dim=2)  # noqa: E731
                for layer in state.cache.layers:
                    for name in ("keys", "values"):
                        t = getattr(layer, name)
                        t[:, :, old_len : old_len + k] = pick(t[:, :, old_len:], gathers[t])
            for layer in state.cache.layers:
                layer.keys = layer.keys[:, :, : old_len + k]
                layer.values = layer.values[:, :, : old_len + k]
            state.valid = torch.cat([state.valid, torch.ones(b, k, dtype=torch.bool, device=dev)], dim=1)
        else:
            rows = range(b) if keep_rows is None else [int(r) for r in keep_rows]
            kept = []
            for r in rows:
                old = torch.nonzero(state.valid[r], as_tuple=False).flatten()
                tail = torch.tensor([0] + [1 + i for i in paths[r]], dtype=torch.long, device=dev) + old_len
                kept.append(torch.cat([old, tail]))
            row_idx = torch.as_tensor(list(rows), dtype=torch.long, device=dev) if keep_rows is not None else None
            _regather(state, kept, row_idx, self._copies)
        counts = torch.tensor([1 + len(paths[r]) for r in range(b)], dtype=torch.long, device=dev)
        state.positions.advance(counts)
        state.pending = next_tokens.to(dev)
        if keep_rows is not None:
            row_idx = torch.as_tensor(list(keep_rows), dtype=torch.long, device=dev)
            state.positions.select_rows(row_idx)
            state.pending = state.pending[row_idx]
            state.new_type_ids = {k: v[row_idx] for k, v in state.new_type_ids.items()}

    @torch.no_grad()
    def select_rows(self, state: TargetState, keep: list[int]) -> None:
        """Keep only batch rows ``keep`` (rows that finished leave the batch)."""
        rows = torch.tensor(keep, dtype=torch.long, device=state.valid.device)
        b = state.valid.shape[0]
        per_device = _PerDevice(torch.cat([rows + i * b for i in range(self._copies)]))
        for layer in state.cache.layers:
            layer.keys = layer.keys.index_select(0, per_device[layer.keys])
            layer.values = layer.values.index_select(0, per_device[layer.values])
        state.valid = state.valid[rows]
        state.pending = state.pending[rows]
        state.positions.select_rows(rows)
        state.new_type_ids = {k: v[rows] for k, v in state.new_type_ids.items()}

    @torch.no_grad()
    def truncate(self, state: TargetState, drop: list[int]) -> None:
        """Remove the last ``drop[r]`` committed slots of each row (a drafter rolling back rejected tokens)."""
        if not any(drop):
            return
        dev = self.device
        if len(set(drop)) == 1 and drop[0] < state.valid.shape[1] and bool(state.valid[:, -drop[0]:].all()):
            # rows are right-aligned: the same count off every row is the last columns, a crop, not a gather
            k = int(drop[0])
            for layer in state.cache.layers:
                layer.keys = layer.keys[:, :, :-k]
                layer.values = layer.values[:, :, :-k]
            state.valid = state.valid[:, :-k]
            state.positions.advance(-torch.full((len(drop),), k, dtype=torch.long, device=dev))
            return
        kept = []
        for r, k in enumerate(drop):
            idx = torch.nonzero(state.valid[r], as_tuple=False).flatten()
            kept.append(idx[: len(idx) - k] if k else idx)
        _regather(state, kept, copies=self._copies)
        state.positions.advance(-torch.as_tensor(drop, dtype=torch.long, device=dev))


def _regather(state: TargetState, kept: list, rows: torch.Tensor | None = None, copies: int = 1) -> None:
    """Rebuild the cache from per-row slot lists ``kept`` (right-aligned, left-padded) in one gather per layer.

    ``rows`` optionally selects the batch rows first (``kept[i]`` then refers to row ``rows[i]``); ``copies``: cache
    rows per logical row (2 under guidance: row ``r``'s twin ``B + r`` is moved the same way).
    """
    old_b = state.valid.shape[0]
    dev = state.valid.device
    new_len = max((len(k) for k in kept), default=0)
    idx = torch.zeros(len(kept), new_len, dtype=torch.long, device=dev)
    valid = torch.zeros(len(kept), new_len, dtype=torch.bool, device=dev)
    for i, k in enumerate(kept):
        idx[i, new_len - len(k):] = k
        valid[i, new_len - len(k):] = True
    if copies > 1:
        idx = _twice(idx, copies)
        if rows is not None:
            rows = torch.cat([rows + i * old_b for i in range(copies)])
    gathers, row_sel = _PerDevice(idx), _PerDevice(rows)
    for layer in state.cache.layers:
        # Keys and values of a layer in one gather (one Triton launch on CUDA, index_select + take_along_dim
        # elsewhere), rows selected inside the gather.
        layer.keys, layer.values = gather_slots(layer.keys, layer.values, gathers[layer.keys],
                                                None if rows is None else row_sel[layer.keys])
    state.valid = valid


class _PerDevice:
    """An index tensor, copied once to each device a cache layer lives on (``device_map`` spreads layers)."""

    def __init__(self, index: torch.Tensor | None):
        self.index = index
        self.copies: dict = {}

    def __getitem__(self, like: torch.Tensor) -> torch.Tensor:
        dev = like.device
        if dev not in self.copies:
            self.copies[dev] = self.index.to(dev)
        return self.copies[dev]
