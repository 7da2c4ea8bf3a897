"""EAGLE-3-style feature drafter: one small decoder layer over the target's own fused hidden states.

The head reads the target's hidden states at three layers (low / mid / high, ``layer_ids``), concatenates
them and projects them to one *fused feature* per position (``Linear(3H -> H)``). Its input at sequence
position ``i`` is ``Linear(2H -> H)([embed(x_i), feature_{i-1}])``: the token at ``i`` with the target's
feature of the position before (the feature that *produced* ``x_i``); one Llama-style causal block (RMSNorm,
RoPE attention over its own 1-D positions, SwiGLU MLP) and the target's LM head then predict ``x_{i+1}``.
Position 0 has no previous feature and gets a zero feature, in training and at run time alike.

Drafting a chain of ``num_draft_tokens``: step 1 feeds the pending token with the feature of the last
committed position; step ``k > 1`` feeds draft ``k - 1`` with the head's *own* output hidden state of the
previous step in place of the (not yet computed) target feature: EAGLE's trick, which training reproduces
with the training-time-test unroll (:func:`train_eagle`). The head never sees pixels: an image reaches it
through the target's fused states at the image positions, so the same head serves text and VLM targets.

The input embedding and the LM head are copies of the target's (frozen); a saved head leaves them out and takes
them from the target when it loads (:attr:`~mmspec.drafters.saving.TrainableDrafter.target_tensors`), and the
fingerprint check guarantees it is only loaded against the same target.

Run-time state, per original batch row: the head's keys/values of every committed position (its KV cache)
and the target features that arrived but have not been run through the head yet. Input ``i`` needs the
feature ``f_{i-1}``, so after prefill positions ``0..P`` (the pending token included) are computable; after a
round the root and the accepted nodes of that verify pass arrive in the *next* ``ctx.hidden`` (index 0 is
the root, node ``i`` is index ``1 + i``): :meth:`EagleDrafter.observe` records the accepted paths and
:meth:`EagleDrafter.propose` ingests them, runs the head once over the new positions (appending to the
cache) and then drafts against the cache: a chain, or EAGLE-2's dynamic tree (``topk > 1``).

Example:
    >>> drafter = EagleDrafter.from_target(model)                                  # doctest: +SKIP
    >>> train_eagle(model, None, prompts, steps=300, drafter=drafter)              # doctest: +SKIP
    >>> mmspec.generate(model, inputs, drafter=drafter, max_new_tokens=64)         # doctest: +SKIP
    >>> drafter.save_pretrained("eagle-head")                                      # doctest: +SKIP
    >>> make_drafter("eagle:eagle-head", model)                                    # doctest: +SKIP
"""

from __future__ import annotations

import math
import random

import torch
import torch.nn.functional as F
from torch import nn

from ..budget import ConfidenceStop
from ..errors import InvalidInputError
from ..tree import DraftTree
from .base import DraftContext, RoundResult
from .saving import TrainableDrafter, target_fingerprint

__all__ = ["EagleDrafter", "train_eagle", "default_layer_ids", "collect_eagle_data", "target_record",
           "draft_vocab_from_records", "collate_eagle", "eagle_unroll_loss", "EagleLoss", "warmup_cosine"]


def default_layer_ids(num_layers: int) -> tuple[int, int, int]:
    """Low / mid / high indices into the text model's ``hidden_states`` tuple (0 is the embeddings).

    Example:
        >>> default_layer_ids(32), default_layer_ids(3), default_layer_ids(2)
        ((2, 16, 31), (1, 2, 2), (1, 1, 1))
    """
    L = int(num_layers)
    low, mid, high = max(1, min(2, L - 1)), max(1, L // 2), max(1, L - 1)
    return tuple(sorted((low, mid, high)))


class _RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        if x.dtype == torch.float32:  # one fused op instead of six: a drafted token's cost is mostly op overhead
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


def _rope(x, cos, sin):
    """Rotate-half RoPE on ``x[B, h, T, d]`` with ``cos/sin[B, 1, T, d]``."""
    d = x.shape[-1]
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class _Block(nn.Module):
    """One Llama-style pre-norm decoder layer; attention over optional cached keys/values (RoPE applied).

    ``two_inputs`` makes it EAGLE-3's first layer (vLLM's ``llama_eagle3.LlamaDecoderLayer``, layer 0, with
    ``norm_before_residual``): it takes the token embedding and the feature apart, normalises each
    (``input_layernorm``, ``hidden_norm``), and its q/k/v read both, ``[2H]``; the residual stream starts at the
    normalised feature."""

    def __init__(self, hidden: int, heads: int, intermediate: int, eps: float, theta: float,
                 two_inputs: bool = False):
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden size {hidden} is not divisible by {heads} heads")
        self.heads, self.theta = heads, theta
        self.input_layernorm = _RMSNorm(hidden, eps)
        width = 2 * hidden if two_inputs else hidden
        if two_inputs:
            self.hidden_norm = _RMSNorm(hidden, eps)
        self.q_proj = nn.Linear(width, hidden, bias=False)
        self.k_proj = nn.Linear(width, hidden, bias=False)
        self.v_proj = nn.Linear(width, hidden, bias=False)
        self.o_proj = nn.Linear(hidden, hidden, bias=False)
        self.post_attention_layernorm = _RMSNorm(hidden, eps)
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def _cos_sin(self, pos, d: int, dtype):
        """``cos, sin[B, 1, T, d]`` for integer positions, from a table grown on demand (fewer ops per step)."""
        need = int(pos.max()) + 1
        table = getattr(self, "_rope_table", None)
        if table is None or table[0].shape[0] < need or table[0].device != pos.device or table[0].dtype != dtype:
            n = max(need, 2 * (0 if table is None else table[0].shape[0]), 256)
            inv = 1.0 / (self.theta ** (torch.arange(0, d, 2, device=pos.device, dtype=torch.float32) / d))
            ang = torch.arange(n, device=pos.device, dtype=torch.float32)[:, None] * inv
            emb = torch.cat([ang, ang], -1)
            table = (emb.cos().to(dtype), emb.sin().to(dtype))
            self._rope_table = table
        return table[0][pos][:, None], table[1][pos][:, None]

    def _fused(self, names: tuple) -> torch.Tensor:
        """The weights of several projections stacked, cached until any of them changes (inference only)."""
        ws = [getattr(self, n).weight for n in names]
        key = tuple((w.data_ptr(), w._version) for w in ws)
        cache = self.__dict__.setdefault("_fused_cache", {})
        hit = cache.get(names)
        if hit is None or hit[0] != key:
            hit = (key, torch.cat([w.detach() for w in ws], 0))
            cache[names] = hit
        return hit[1]

    def forward(self, x, pos, allowed, past_k=None, past_v=None, start=None, embeds=None):
        """``x[B, T, H]`` at ``pos[B, T]``; ``allowed[B, T, P + T]`` over ``P`` cached keys then the ``T`` new
        ones (``None``: every key). Returns ``(out[B, T, H], k[B, h, T, d], v[B, h, T, d])`` (the new
        keys/values, RoPE applied). With ``start``, ``past_k/v[B, h, capacity, d]`` are buffers whose first
        ``P = start`` slots are the cache: the new keys/values are written at ``start`` and attention reads
        the buffer up to ``start + T`` (no copy of the whole cache per drafted token). A ``two_inputs`` layer
        takes the feature as ``x`` and the token embeddings as ``embeds[B, T, H]``."""
        B, T, H = x.shape
        if embeds is None:
            h = self.input_layernorm(x)
        else:  # EAGLE-3: q/k/v read [norm(embedding); norm(feature)], the residual is the normalised feature
            x = self.hidden_norm(x)
            h = torch.cat([self.input_layernorm(embeds), x], dim=-1)
        split = lambda t: t.view(B, T, self.heads, H // self.heads).transpose(1, 2)  # noqa: E731
        if torch.is_grad_enabled():
            q, k, v = self.q_proj(h), self.k_proj(h), self.v_proj(h)
        else:  # one matmul instead of three: at one token per step the call overhead dominates
            q, k, v = F.linear(h, self._fused(("q_proj", "k_proj", "v_proj"))).split(H, dim=-1)
        cos, sin = self._cos_sin(pos, H // self.heads, x.dtype)
        q, k, v = _rope(split(q), cos, sin), _rope(split(k), cos, sin), split(v)
        if start is not None:
            past_k[:, :, start:start + T], past_v[:, :, start:start + T] = k, v
            keys, vals = past_k[:, :, :start + T], past_v[:, :, :start + T]
        else:
            keys = k if past_k is None else torch.cat([past_k, k], dim=2)
            vals = v if past_v is None else torch.cat([past_v, v], dim=2)
        att = F.scaled_dot_product_attention(q, keys, vals, attn_mask=None if allowed is None else allowed[:, None])
        x = x + self.o_proj(att.transpose(1, 2).reshape(B, T, H))
        h = self.post_attention_layernorm(x)
        if torch.is_grad_enabled():
            gate, up = self.gate_proj(h), self.up_proj(h)
        else:
            gate, up = F.linear(h, self._fused(("gate_proj", "up_proj"))).chunk(2, dim=-1)
        return x + self.down_proj(F.silu(gate) * up), k, v


class EagleDrafter(TrainableDrafter):
    """EAGLE-3-style head (see the module docstring). Build one for a target with :meth:`from_target`.

    Args:
        hidden_size, vocab_size: the target's text hidden size and output vocabulary.
        layer_ids: three indices into the target's ``hidden_states`` tuple (low, mid, high).
        num_draft_tokens: draft depth per round.
        topk: branching of the dynamic tree (1: a chain).
        tree_nodes: nodes kept in the final tree (``None``: ``num_draft_tokens * topk``).
        num_heads, intermediate_size, rms_eps, rope_theta: the decoder layer's shape.
        min_confidence: stop drafting at the first draft whose cumulative head probability falls below
            this (``"auto"``: derived from measured costs; ``None``: always full depth); see
            :class:`~mmspec.budget.ConfidenceStop`. Lossless either way.
        fingerprint: the target's fingerprint (set by :meth:`from_target` / ``from_pretrained``).
        layout: ``"mmspec"`` (``Linear(2H -> H)`` over ``[embedding; feature]``, then a standard layer) or
            ``"eagle3"``: EAGLE-3's layer as vLLM and speculators build it (``Eagle3LlamaForCausalLM``), so that
            ``mmspec export --format vllm-eagle3`` can ship it: the fused three-layer feature (``norm_before_fc``)
            and the token embedding, each normalised, enter q/k/v side by side (``[2H]``), the residual stream
            starts at the normalised feature (``norm_before_residual``), and the head's slot ``j`` holds token
            ``j + 1`` with the feature of position ``j`` at RoPE position ``j`` (vLLM's alignment: no slot for
            position 0, which has no feature before it).
        draft_vocab_size: draft only among this many target tokens (``draft_ids``, the most frequent in the
            training responses, set with :meth:`set_draft_vocab`): EAGLE-3's reduced vocabulary (``d2t`` /
            ``t2d``). The LM head stays the target's, read at those rows; other tokens get ``-inf``. ``None``: the
            whole vocabulary.
    """

    kind = "eagle"
    LAYOUTS = ("mmspec", "eagle3")
    target_tensors = {"embed_tokens.weight": "input", "lm_head.weight": "output"}

    num_read_layers = 3
    """How many target layers the head reads (a subclass that reads another number overrides this and
    :meth:`_build_input`; FastMTP reads one)."""

    def __init__(self, hidden_size: int, vocab_size: int, layer_ids=(1, 1, 1), num_draft_tokens: int = 4,
                 topk: int = 1, tree_nodes: int | None = None, num_heads: int | None = None,
                 intermediate_size: int | None = None, rms_eps: float = 1e-6, rope_theta: float = 10000.0,
                 min_confidence: float | str | None = None, fingerprint: dict | None = None,
                 layout: str = "mmspec", draft_vocab_size: int | None = None):
        super().__init__(fingerprint=fingerprint)
        if layout not in self.LAYOUTS:
            raise ValueError(f"layout must be one of {self.LAYOUTS} (got {layout!r})")
        if layout != "mmspec" and self.num_read_layers != 3:
            raise ValueError(f"the {layout!r} layout is EAGLE's three-layer head; {self.kind} has its own")
        if num_draft_tokens < 1:
            raise ValueError(f"num_draft_tokens must be >= 1 (got {num_draft_tokens})")
        if topk < 1:
            raise ValueError(f"topk must be >= 1 (got {topk})")
        if tree_nodes is not None and tree_nodes < 1:
            raise ValueError(f"tree_nodes must be >= 1 (got {tree_nodes})")
        if len(layer_ids) != self.num_read_layers:
            raise ValueError(f"layer_ids must name {self.num_read_layers} target layer(s) (got {layer_ids!r})")
        H = int(hidden_size)
        if num_heads is None:
            num_heads = next(h for h in (8, 4, 2, 1) if H % h == 0 and H // h >= 8 or h == 1)
        self.hidden_size, self.vocab_size = H, int(vocab_size)
        self.layer_ids = tuple(int(i) for i in layer_ids)
        self.num_draft_tokens, self.topk = int(num_draft_tokens), int(topk)
        self.tree_nodes = None if tree_nodes is None else int(tree_nodes)
        self.num_heads = int(num_heads)
        self.intermediate_size = int(intermediate_size or 2 * H)
        self.rms_eps, self.rope_theta = float(rms_eps), float(rope_theta)
        self.stop = ConfidenceStop.parse(min_confidence)
        self.layout = layout
        self.skip_first = int(layout == "eagle3")  # head slot j holds sequence position j + skip_first
        if draft_vocab_size is not None and not 1 <= int(draft_vocab_size) <= self.vocab_size:
            raise ValueError(f"draft_vocab_size must be in 1..{self.vocab_size} (got {draft_vocab_size})")
        self.draft_vocab_size = None if draft_vocab_size is None else int(draft_vocab_size)
        if self.draft_vocab_size is not None:
            self.register_buffer("draft_ids", torch.arange(self.draft_vocab_size))
        else:
            self.draft_ids = None
        self.embed_tokens = nn.Embedding(self.vocab_size, H)
        self.lm_head = nn.Linear(H, self.vocab_size, bias=False)
        self.embed_tokens.weight.requires_grad_(False)
        self.lm_head.weight.requires_grad_(False)
        self._build_input()
        self.layer = _Block(H, self.num_heads, self.intermediate_size, self.rms_eps, self.rope_theta,
                            two_inputs=layout == "eagle3")
        self.norm = _RMSNorm(H, self.rms_eps)
        self._reset_run()

    def _build_input(self) -> None:
        """The modules before the decoder layer: EAGLE fuses the three layers' states (``fuse_norm``, ``fuse``)
        and projects ``[token embedding, feature]`` to the layer's width (``fc``)."""
        H = self.hidden_size
        self.fuse = nn.Linear(3 * H, H, bias=False)
        self.fuse_norm = _RMSNorm(3 * H, self.rms_eps)
        if self.layout == "mmspec":  # EAGLE-3's layer reads [embedding; feature] in q/k/v itself
            self.fc = nn.Linear(2 * H, H, bias=False)

    def set_draft_vocab(self, token_ids) -> None:
        """The target tokens this head drafts among (``draft_vocab_size`` of them, distinct; stored sorted).

        Example:
            >>> # head = EagleDrafter.from_target(lm, layout="eagle3", draft_vocab_size=3)
            >>> # head.set_draft_vocab([42, 7, 9]); head.draft_ids.tolist() == [7, 9, 42]
        """
        ids = torch.as_tensor(list(token_ids), dtype=torch.long).unique()
        if self.draft_ids is None or len(ids) != self.draft_vocab_size:
            raise ValueError(f"expected {self.draft_vocab_size} distinct token ids (got {len(ids)})")
        if int(ids.min()) < 0 or int(ids.max()) >= self.vocab_size:
            raise ValueError(f"draft token ids must lie in 0..{self.vocab_size - 1}")
        self.draft_ids.copy_(ids.to(self.draft_ids.device))

    def draft_index(self, tokens: torch.Tensor) -> torch.Tensor:
        """Each target token's index in the draft vocabulary (``-1``: not in it).

        Example:
            >>> # with draft_ids [7, 9, 42]: head.draft_index(torch.tensor([9, 8, 42])).tolist() == [1, -1, 2]
        """
        where = torch.full((self.vocab_size,), -1, dtype=torch.long, device=tokens.device)
        where[self.draft_ids.to(tokens.device)] = torch.arange(self.draft_vocab_size, device=tokens.device)
        return where[tokens]

    def _logits(self, out: torch.Tensor, draft_space: bool = False) -> torch.Tensor:
        """Float logits over the target's vocabulary from the head's normalised output; with a draft vocabulary,
        the LM head's rows at ``draft_ids`` only, ``-inf`` elsewhere (what vLLM's ``compute_logits`` gives), or with
        ``draft_space`` over the draft vocabulary alone (``[..., draft_vocab_size]``: training's loss)."""
        if self.draft_ids is None:
            return self.lm_head(out).float()
        if torch.is_grad_enabled():
            w = self.lm_head.weight[self.draft_ids]
        else:  # the gathered rows, cached until the LM head or the vocabulary changes
            key = tuple((t.data_ptr(), t._version) for t in (self.lm_head.weight, self.draft_ids))
            hit = self.__dict__.get("_draft_rows")
            if hit is None or hit[0] != key:
                hit = (key, self.lm_head.weight.detach()[self.draft_ids])
                self.__dict__["_draft_rows"] = hit
            w = hit[1]
        small = F.linear(out, w).float()
        if draft_space:
            return small
        full = small.new_full((*small.shape[:-1], self.vocab_size), float("-inf"))
        full[..., self.draft_ids] = small
        return full

    # ------------------------------------------------------------------ construction / saving
    @property
    def hidden_layers(self) -> tuple:
        return tuple(dict.fromkeys(self.layer_ids))

    def config_dict(self) -> dict:
        return {"hidden_size": self.hidden_size, "vocab_size": self.vocab_size, "layer_ids": list(self.layer_ids),
                "num_draft_tokens": self.num_draft_tokens, "topk": self.topk, "tree_nodes": self.tree_nodes,
                "num_heads": self.num_heads, "intermediate_size": self.intermediate_size, "rms_eps": self.rms_eps,
                "rope_theta": self.rope_theta, "min_confidence": None if self.stop is None else self.stop.spec(),
                "layout": self.layout, "draft_vocab_size": self.draft_vocab_size}

    @classmethod
    def from_target(cls, target, tokenizer=None, layer_ids=None, seed: int | None = None, **kw) -> "EagleDrafter":
        """A fresh (randomly initialised) head for ``target``, with its embeddings and LM head copied in.

        Example:
            >>> from transformers import LlamaConfig, LlamaForCausalLM
            >>> t = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
            ...                      num_hidden_layers=2, num_attention_heads=2))
            >>> d = EagleDrafter.from_target(t)
            >>> d.hidden_layers, d.fingerprint["hidden_size"]
            ((1,), 16)
        """
        text = target.config.get_text_config(decoder=True)
        layer_ids = tuple(layer_ids) if layer_ids is not None else default_layer_ids(text.num_hidden_layers)
        n = int(text.num_hidden_layers)
        if any(not 0 <= i <= n for i in layer_ids):
            raise InvalidInputError(f"layer_ids {layer_ids} out of range for a target with {n} layers (0..{n})")
        head = target.get_output_embeddings().weight
        kw.setdefault("rms_eps", float(getattr(text, "rms_norm_eps", 1e-6)))
        if kw.get("layout") == "eagle3" and getattr(text, "num_attention_heads", None):
            # the target's head width: one a serving engine's attention kernels take (vLLM's CPU backend takes
            # 32, 64, 80, ...: SmolLM2's 576 / 8 = 72 fails there, its own 9 heads of 64 do not)
            kw.setdefault("num_heads", int(text.num_attention_heads))
        if seed is not None:
            torch.manual_seed(seed)
        drafter = cls(hidden_size=int(text.hidden_size), vocab_size=int(head.shape[0]), layer_ids=layer_ids,
                      fingerprint=target_fingerprint(target, tokenizer, layer_ids), **kw)
        drafter.load_target_tensors(target)
        dev = target.device if target.device.type != "meta" else torch.device("cpu")
        return drafter.to(dev).eval()

    # ------------------------------------------------------------------ the head
    def fuse_features(self, per_layer: list) -> torch.Tensor:
        """``[..., H]`` fused feature from the three layers' ``[..., H]`` target hidden states."""
        x = torch.cat([h.to(self.fuse.weight.dtype) for h in per_layer], dim=-1)
        return self.fuse(self.fuse_norm(x))

    def forward(self, tokens, features, positions, allowed, past_k=None, past_v=None, start=None, logits_at=None,
                draft_space=False):
        """Head pass: ``tokens[B, T]``, ``features[B, T, H]`` (feature of the previous position),
        ``positions[B, T]``, ``allowed[B, T, P + T]`` over ``P`` cached keys ``past_k/v[B, h, P, d]`` and the
        new ones -> ``(logits[B, T, V], hidden[B, T, H], k, v)`` (``k, v``: the new positions' keys/values).
        ``start``: ``past_k/v`` are buffers written in place (see ``_Block.forward``). ``logits_at[B, T]``
        (bool): logits only there, as ``[N, V]`` (training: a VLM prompt's hundreds of unlabelled positions
        would otherwise dominate the cost of a large vocabulary's head). ``draft_space``: logits over the draft
        vocabulary only (see :meth:`_logits`)."""
        if self.layout == "eagle3":
            h, k, v = self.layer(features, positions, allowed, past_k, past_v, start, embeds=self.embed_tokens(tokens))
        else:
            x = self.fc(torch.cat([self.embed_tokens(tokens), features], dim=-1))
            h, k, v = self.layer(x, positions, allowed, past_k, past_v, start)
        out = self.norm(h if logits_at is None else h[logits_at])
        return self._logits(out, draft_space), h, k, v

    # ------------------------------------------------------------------ run-time state
    def _reset_run(self):
        # row -> buffers [heads, capacity, d] whose first _n[row] slots hold the keys/values of the committed
        # positions 0..c-1; the slots after them are scratch for the round's drafts.
        self._k, self._v, self._n = {}, {}, {}
        self._todo = {}  # row -> target features f_{c-1}..f_{n-1} not yet run through the head, [m, H]
        self._paths = None  # row -> accepted path of the last verify pass, ingested at the next propose

    def _ctx_layers(self, ctx: DraftContext) -> list:
        missing = [i for i in self.layer_ids if i not in ctx.hidden]
        if missing:
            raise InvalidInputError(f"the eagle drafter needs target hidden states of layers {missing}; "
                                    "run it through mmspec.generate (which requests its hidden_layers)")
        return [ctx.hidden[i] for i in self.layer_ids]

    @torch.no_grad()
    def begin(self, ctx: DraftContext) -> None:
        self._reset_run()
        if self.stop is not None:
            self.stop.new_run()
        fused = self.fuse_features(self._ctx_layers(ctx))  # [B, P_padded, H], prompts right-aligned
        H, hd = self.hidden_size, self.hidden_size // self.num_heads
        for b, (r, plen) in enumerate(zip(ctx.rows, ctx.prompt_lengths)):
            mine = fused[b, fused.shape[1] - plen:]
            if self.skip_first:  # EAGLE-3: slot j = (token j + 1, feature j)
                self._todo[r] = mine
            else:
                zero = torch.zeros(1, H, device=fused.device, dtype=fused.dtype)  # f_{-1}: position 0 has none
                self._todo[r] = torch.cat([zero, mine], dim=0)
            self._k[r] = fused.new_zeros(self.num_heads, plen + 64, hd)
            self._v[r] = torch.zeros_like(self._k[r])
            self._n[r] = 0

    @torch.no_grad()
    def _ingest(self, ctx: DraftContext) -> None:
        if self._paths is None:
            return
        fused = self.fuse_features(self._ctx_layers(ctx))  # [B, 1 + nodes, H]: root, then tree nodes
        for b, r in enumerate(ctx.rows):
            idx = torch.tensor([0] + [1 + int(i) for i in self._paths[r]], device=fused.device)
            self._todo[r] = torch.cat([self._todo[r], fused[b, idx]], dim=0)
        self._paths = None
        for r in [r for r in self._k if r not in set(ctx.rows)]:  # rows that left the batch
            del self._k[r], self._v[r], self._n[r], self._todo[r]

    def _reserve(self, r, size: int) -> None:
        """Grow row ``r``'s key/value buffers (doubling) to hold at least ``size`` slots."""
        cap = self._k[r].shape[1]
        if cap >= size:
            return
        n, new = self._n[r], max(size, 2 * cap)
        for buf in (self._k, self._v):
            grown = buf[r].new_zeros(buf[r].shape[0], new, buf[r].shape[2])
            grown[:, :n] = buf[r][:, :n]
            buf[r] = grown

    @torch.no_grad()
    def _extend_cache(self, ctx: DraftContext, room: int = 0):
        """Run the head over each row's committed positions not yet cached (``c..n``, the pending token
        last), append their keys/values, and return the cache ``(k, v, valid, length)``: buffers
        ``[B, h, >= length + room, d]`` whose first ``length`` slots are the (left-padded) keys/values and the
        next ``room`` free for the drafts (``valid[B, length]``, ``None`` when every key is real: one row),
        plus the pending position's logits ``[B, V]``, hidden state ``[B, H]`` and position ``[B]``."""
        dev, dtype = self.norm.weight.device, self.norm.weight.dtype
        B, H, hd = len(ctx.rows), self.hidden_size, self.hidden_size // self.num_heads
        news = []
        for r, seq in zip(ctx.rows, ctx.sequences):
            seq = seq[self.skip_first:]  # head slots (see ``layout``)
            n, c = len(seq) - 1, self._n[r]
            if self._todo[r].shape[0] != n - c + 1:
                raise RuntimeError(f"eagle drafter lost track of row {r}: {self._todo[r].shape[0]} features for "
                                   f"{n - c + 1} uncached positions")
            news.append((torch.as_tensor(seq[c:].copy(), device=dev), c))
        if B == 1:  # no padding: the row's own buffers are the cache, and one new position needs no mask
            (r,), ((tok, c),) = ctx.rows, news
            u = len(tok)
            self._reserve(r, c + u + room)
            kb, vb = self._k[r][None], self._v[r][None]  # views: the head writes into the row's buffers
            pos = torch.arange(c, c + u, device=dev)[None]
            allowed = None if u == 1 else torch.ones(u, c + u, dtype=torch.bool, device=dev).tril(c)[None]
            logits, hid, _, _ = self(tok[None], self._todo[r][None], pos, allowed, kb, vb, start=c)
            self._n[r] = c + u
            self._todo[r] = self._todo[r][:0]
            return (kb, vb, None, c + u), logits[:, -1], hid[:, -1], pos[:, -1]
        U = max(len(t) for t, _ in news)
        P = max(self._n[r] for r in ctx.rows)
        tok = torch.zeros(B, U, dtype=torch.long, device=dev)
        feat = torch.zeros(B, U, H, dtype=dtype, device=dev)
        pos = torch.zeros(B, U, dtype=torch.long, device=dev)
        new_valid = torch.zeros(B, U, dtype=torch.bool, device=dev)
        pk = torch.zeros(B, self.num_heads, P + U + room, hd, dtype=dtype, device=dev)
        pv = torch.zeros_like(pk)
        past_valid = torch.zeros(B, P, dtype=torch.bool, device=dev)
        for b, (r, (t, c)) in enumerate(zip(ctx.rows, news)):  # right-align: the pending token is last
            u = len(t)
            tok[b, U - u:], feat[b, U - u:], new_valid[b, U - u:] = t, self._todo[r], True
            pos[b] = torch.arange(c + u - U, c + u, device=dev).clamp(min=0)
            if c:
                pk[b, :, P - c:P], pv[b, :, P - c:P], past_valid[b, P - c:] = self._k[r][:, :c], self._v[r][:, :c], True
        eye = torch.eye(U, dtype=torch.bool, device=dev)[None]
        allowed = torch.cat([past_valid[:, None, :].expand(B, U, P),
                             torch.ones(U, U, dtype=torch.bool, device=dev).tril()[None] & new_valid[:, None, :] | eye],
                            dim=2)
        logits, hid, k, v = self(tok, feat, pos, allowed, pk, pv, start=P)
        for b, (r, (t, c)) in enumerate(zip(ctx.rows, news)):
            u = len(t)
            self._reserve(r, c + u)
            self._k[r][:, c:c + u], self._v[r][:, c:c + u] = k[b, :, U - u:], v[b, :, U - u:]
            self._n[r] = c + u
            self._todo[r] = self._todo[r][:0]
        return (pk, pv, torch.cat([past_valid, new_valid], dim=1), P + U), logits[:, -1], hid[:, -1], pos[:, -1]

    def _sample(self, logits: torch.Tensor, ctx: DraftContext):
        probs = torch.softmax(logits, dim=-1)
        gen = ctx.generator
        dev = gen.device if gen is not None else probs.device
        shape = probs.shape
        tok = torch.multinomial(probs.reshape(-1, shape[-1]).to(dev), 1, generator=gen).view(shape[:-1])
        return tok.to(logits.device), probs

    def _children(self, logits: torch.Tensor, ctx: DraftContext, scored: bool):
        """The candidates under each of ``logits[..., V]``: ``(tokens[..., k], log-probabilities[..., k] or None,
        q or None)``. A sampled chain draws one token from the head's softmax (``q`` returned) and scores it
        with the top probability of that softmax, never the drawn token's own: keeping a draft because of
        which token came out would bias it away from ``q``. A greedy chain takes the argmax (scored only when a
        confidence stop needs it: argmax is cheaper than log-softmax); a tree the ``topk`` best."""
        if ctx.do_sample and self.topk == 1:
            tok, q = self._sample(logits, ctx)
            return tok[..., None], (q.max(-1, keepdim=True).values.log() if scored else None), q
        if self.topk == 1 and not scored:
            return logits.argmax(-1, keepdim=True), None, None
        logp = torch.log_softmax(logits, -1)
        top = logp.max(-1, keepdim=True) if self.topk == 1 else logp.topk(self.topk, dim=-1)
        return top.indices, top.values, None

    @torch.no_grad()
    def propose(self, ctx: DraftContext) -> list[DraftTree]:
        """Cache the newly committed positions, then grow a tree of depth ``num_draft_tokens``: at each depth
        the ``topk`` best nodes by cumulative log-probability are run through the head and each gets its
        ``topk`` best children; the ``tree_nodes`` best nodes overall form the tree (EAGLE-2's dynamic tree).
        With ``topk == 1`` it is a chain, sampled from the head's softmax (``q`` attached) when the target
        samples; wider trees are deterministic proposals under both modes. With ``min_confidence`` set,
        drafting stops at the first depth where every row's best candidate falls below the threshold and
        such candidates are left out (:class:`~mmspec.budget.ConfidenceStop`)."""
        self._ingest(ctx)
        if self.stop is not None:
            self.stop.draft_started()
        K = self.topk
        depth = max(1, min(self.num_draft_tokens, max(ctx.remaining) - 1))
        (ck, cv, cvalid, filled), root_logits, root_hid, root_pos = self._extend_cache(ctx, room=(depth - 1) * K)
        B, dev = len(ctx.rows), root_logits.device
        log_thr = None if self.stop is None else self.stop.log_threshold()
        # Candidates, per row: token, cumulative log-probability, parent candidate (-1: the root), depth.
        tok, logp, q = self._children(root_logits, ctx, scored=log_thr is not None)
        toks, qs = [tok], ([] if q is None else [q[:, None]])
        scores = [torch.zeros(B, 1, device=dev) if logp is None else logp]
        parents = [torch.full((B, toks[0].shape[1]), -1, dtype=torch.long, device=dev)]
        depths = [torch.zeros_like(parents[0])]
        fwd = torch.arange(toks[0].shape[1], device=dev)[None].expand(B, -1)  # candidates run at this depth
        fwd_feat = root_hid[:, None].expand(-1, fwd.shape[1], -1)
        fwd_score = scores[0]
        anc = torch.zeros(B, fwd.shape[1], 0, dtype=torch.bool, device=dev)
        n_cand = toks[0].shape[1]
        all_tok = toks[0]
        if cvalid is None:
            cvalid = torch.ones(B, filled, dtype=torch.bool, device=dev)
        steps = 1
        for d in range(1, depth):
            if log_thr is not None and bool((fwd_score < log_thr).all()):
                break  # no row's best candidate is worth another step
            steps += 1
            W = fwd.shape[1]
            allowed = None if (B == 1 and K == 1) else torch.cat(  # one chain row sees every key
                [cvalid[:, None, :].expand(B, W, -1), anc, torch.eye(W, dtype=torch.bool, device=dev)[None].expand(B, W, W)],
                dim=2)
            logits, hid, _, _ = self(all_tok.gather(1, fwd), fwd_feat, (root_pos + d)[:, None].expand(B, W), allowed,
                                     ck, cv, start=filled)
            filled += W
            child_tok, logp, q = self._children(logits, ctx, scored=log_thr is not None)  # [B, W, k]
            child_score = fwd_score[:, :, None] if logp is None else fwd_score[:, :, None] + logp
            if q is not None:
                qs.append(q)
            child_parent = fwd[:, :, None].expand_as(child_tok)
            flat_score = child_score.reshape(B, -1)
            toks.append(child_tok.reshape(B, -1))
            scores.append(flat_score)
            parents.append(child_parent.reshape(B, -1))
            depths.append(torch.full_like(parents[-1], d))
            all_tok = torch.cat(toks, dim=1)
            if d + 1 < depth:  # choose what runs next: the best K children (their parent slot is sel // K)
                sel = flat_score.topk(min(K, flat_score.shape[1]), dim=-1).indices
                slot = sel // child_tok.shape[2]
                prev = torch.cat([anc, torch.eye(W, dtype=torch.bool, device=dev)[None].expand(B, W, W)], dim=2)
                anc = prev.gather(1, slot[:, :, None].expand(-1, -1, prev.shape[2]))
                fwd_feat = hid.gather(1, slot[:, :, None].expand(-1, -1, hid.shape[2]))
                fwd_score = flat_score.gather(1, sel)
                fwd = n_cand + sel
            n_cand = all_tok.shape[1]
        score = torch.cat(scores, dim=1)
        parent = torch.cat(parents, dim=1)
        dep = torch.cat(depths, dim=1)
        q_all = torch.cat(qs, dim=1) if qs else None
        n_keep = depth if K == 1 else min(self.tree_nodes or depth * K, n_cand)
        # Best nodes first; a parent's cumulative score is never below its child's, and ties go to the shallower.
        order = torch.argsort(score - dep.float() * 1e-6, dim=1, descending=True)[:, :n_keep]
        chosen = [order[b] for b in range(B)]
        if log_thr is not None:  # ancestors of a kept node score at least as high: still closed under ancestors
            chosen = [o[score[b, o] >= log_thr] for b, o in enumerate(chosen)]
        trees = [self._tree(all_tok[b], parent[b], dep[b], chosen[b], None if q_all is None else q_all[b])
                 for b in range(B)]
        if self.stop is not None:
            self.stop.draft_done(steps)
        return trees

    @staticmethod
    def _tree(tok, parent, dep, chosen, q) -> DraftTree:
        """The chosen candidates (closed under ancestors) packed parents-first."""
        if not len(chosen):
            return DraftTree.empty()
        parent_l, dep_l = parent.tolist(), dep.tolist()
        keep = set(chosen.tolist())
        for i in list(keep):
            while parent_l[i] >= 0 and parent_l[i] not in keep:
                keep.add(parent_l[i])
                i = parent_l[i]
        nodes = sorted(keep, key=lambda i: (dep_l[i], i))
        where = {c: j for j, c in enumerate(nodes)}
        idx = torch.tensor(nodes, device=tok.device)
        return DraftTree(tok[idx].cpu().numpy(), [where.get(parent_l[c], -1) for c in nodes],
                         None if q is None else q[idx])

    def observe(self, ctx: DraftContext, result: RoundResult) -> None:
        self._paths = {r: list(p) for r, p in zip(ctx.rows, result.paths)}
        if self.stop is not None and result.committed:
            self.stop.committed(sum(map(len, result.committed)) / len(result.committed),
                                1 + max(len(t) for t in result.trees))


# ---------------------------------------------------------------------- training
def _text_model_inputs(target, ids: torch.Tensor):
    return {"input_ids": ids[None].to(target.device), "attention_mask": torch.ones(1, len(ids), dtype=torch.long,
                                                                                  device=target.device)}


def _extend_inputs(inputs: dict, full: torch.Tensor, device) -> dict:
    """The processor outputs of one prompt (batch 1) re-targeted at ``full`` = prompt + response: per-token
    tensors (``attention_mask``, ``mm_token_type_ids``, ...) are extended (ones for the mask, zeros otherwise);
    image tensors (``pixel_values``, ``image_grid_thw``) are kept, so the forward sees the same pixels."""
    P = inputs["input_ids"].shape[-1]
    extra = full.shape[-1] - P
    out = {}
    for k, v in inputs.items():
        if not torch.is_tensor(v):
            out[k] = v
        elif k == "input_ids":
            out[k] = full[None].to(device)
        elif v.dim() == 2 and v.shape[0] == 1 and v.shape[1] == P:  # a per-token row
            fill = torch.ones if k == "attention_mask" else torch.zeros
            out[k] = torch.cat([v, fill(1, extra, dtype=v.dtype)], dim=1).to(device)
        else:
            out[k] = v.to(device)
    return out


def plain_text_request(inputs: dict) -> bool:
    """Whether one request's processor outputs are token ids alone (no image, no padding), the rows
    :func:`text_target_records` batches.

    Example:
        >>> plain_text_request({"input_ids": torch.tensor([[1, 2]]), "attention_mask": torch.ones(1, 2)})
        True
        >>> plain_text_request({"input_ids": torch.tensor([[1, 2]]), "pixel_values": torch.zeros(1, 3)})
        False
    """
    return (set(inputs) <= {"input_ids", "attention_mask"} and inputs["input_ids"].shape[0] == 1
            and bool(inputs.get("attention_mask", torch.ones(1)).all()))


@torch.no_grad()
def target_record(target, prompt, layer_ids, max_new_tokens: int = 32, keep_top: int = 0, reference=None) -> dict:
    """One training record from the target: regenerate the response greedily, then run the target once over
    prompt + response with ``output_hidden_states=True``.

    ``prompt`` is a 1-D tensor of token ids (text targets) or the processor outputs of *one* request
    (``VLMPipeline.prepare``: ``input_ids[1, P]``, ``pixel_values``, ``image_grid_thw``, ...), so a VLM's
    image reaches the record only through the target's hidden states. Returns ``tokens[n]``, ``labels[n]``
    (the target's argmax next token at every position; it equals the response token there) and
    ``features[n, len(layer_ids) * H]`` (the requested layers concatenated in order: the fusion input),
    all on the CPU, plus ``prompt_len`` (a 0-d tensor). With ``keep_top = K > 0`` also the target's K most
    likely next tokens and their log-probabilities at every position (``top_ids[n, K]``, ``top_logp[n, K]``
    in float32): what a distilling drafter matches, at a fraction of a full vocabulary's disk.

    ``reference`` (token ids of the item's reference answer): regenerate with :func:`mmspec.generate` and a
    drafter that proposes the reference's continuation instead of ``target.generate``. Greedy decoding is
    lossless, so the response is the target's own, at a fraction of the passes when the target follows its
    reference (a reader transcribing its page: ~7 tokens a pass instead of one).
    """
    if torch.is_tensor(prompt):
        ids = torch.as_tensor(prompt, dtype=torch.long).flatten()
        inputs = _text_model_inputs(target, ids)
    else:
        inputs = {k: (v.to(target.device) if torch.is_tensor(v) else v) for k, v in dict(prompt).items()}
        if inputs["input_ids"].shape[0] != 1:
            raise InvalidInputError("target_record takes one request at a time (input_ids of batch 1)")
    if reference is None and plain_text_request(inputs):
        return text_target_records(target, [inputs["input_ids"][0]], layer_ids, max_new_tokens, keep_top)[0]
    P = inputs["input_ids"].shape[-1]
    if reference is not None:
        from ..decode import generate
        from .reference import ReferenceLookupDrafter

        drafter = ReferenceLookupDrafter([list(reference)], depth=8)
        full = generate(target, inputs, drafter=drafter, max_new_tokens=max_new_tokens, do_sample=False).sequences[0]
        full = full.cpu()
    else:
        full = target.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)[0].cpu()
    cpu_inputs = {k: (v.cpu() if torch.is_tensor(v) else v) for k, v in inputs.items()}
    out = target(**_extend_inputs(cpu_inputs, full, target.device), output_hidden_states=True, return_dict=True)
    return _record_from_pass(out, 0, full, P, layer_ids, keep_top)


def _record_from_pass(out, row: int, full: torch.Tensor, P: int, layer_ids, keep_top: int) -> dict:
    """Row ``row`` of a forward pass over prompt + response (its first ``len(full)`` positions) as a record."""
    n = len(full)
    feats = torch.cat([out.hidden_states[i][row, :n].float().cpu() for i in layer_ids], dim=-1)
    logits = out.logits[row, :n]
    rec = {"tokens": full, "labels": logits.argmax(-1).cpu(), "features": feats, "prompt_len": torch.tensor(P)}
    if keep_top:
        top = torch.log_softmax(logits.float(), dim=-1).topk(int(keep_top), dim=-1)
        rec["top_ids"], rec["top_logp"] = top.indices.cpu(), top.values.cpu()
    return rec


@torch.no_grad()
def text_target_records(target, prompts: list, layer_ids, max_new_tokens: int = 32, keep_top: int = 0) -> list[dict]:
    """:func:`target_record` for several text prompts (1-D token ids each) in one batch: one left-padded greedy
    ``generate`` for all, then a forward over each prompt + response.

    Why: a text target's data stage is its generation, one token a step; a batch of prompts costs little more per
    step than one on a CPU (16 prompts: 26 s instead of ~99 s for SmolLM2-135M, one thread), so the data for
    thousands of prompts takes minutes instead of hours. Each response stops at the target's first end-of-turn
    token, as ``generate`` at batch 1 does (left padding is masked and the positions follow the mask); in float32
    the tokens equal batch-1 ``generate``'s (tested), in bf16 a near-tie may round the other way (still the
    target's own greedy answer). The forward that records the states runs one prompt at a time: it is one pass
    per prompt, and a batch of full-vocabulary logits and every layer's states could outgrow a large target's
    memory.

    Example:
        >>> # recs = text_target_records(lm, [tok("Hi")["input_ids"], tok("Tell me")["input_ids"]], (1, 2, 3), 16)
        >>> # [int(r["prompt_len"]) for r in recs] == [len(tok("Hi")["input_ids"]), len(tok("Tell me")["input_ids"])]
    """
    if not prompts:
        return []
    dev = target.device
    ids = [torch.as_tensor(p, dtype=torch.long).flatten().cpu() for p in prompts]
    eos = target.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, (list, tuple)) else ([] if eos is None else [eos]))
    pad = min(eos) if eos else 0
    B, Pm = len(ids), max(len(p) for p in ids)
    inp = torch.full((B, Pm), pad, dtype=torch.long)
    mask = torch.zeros(B, Pm, dtype=torch.long)
    for b, p in enumerate(ids):
        inp[b, Pm - len(p):], mask[b, Pm - len(p):] = p, 1
    seqs = target.generate(input_ids=inp.to(dev), attention_mask=mask.to(dev), max_new_tokens=max_new_tokens,
                           do_sample=False, pad_token_id=pad, return_dict_in_generate=False)[:, Pm:].cpu()
    recs = []
    for b, p in enumerate(ids):
        resp = seqs[b].tolist()
        stop = next((i + 1 for i, t in enumerate(resp) if t in eos), len(resp))
        full = torch.cat([p, seqs[b, :stop]])
        out = target(input_ids=full[None].to(dev), attention_mask=torch.ones(1, len(full), dtype=torch.long,
                                                                             device=dev),
                     output_hidden_states=True, return_dict=True)
        recs.append(_record_from_pass(out, 0, full, len(p), layer_ids, keep_top))
    return recs


@torch.no_grad()
def collect_eagle_data(target, sequences, layer_ids, max_new_tokens: int = 32) -> list[dict]:
    """:func:`target_record` for each prompt (1-D token ids, or one request's processor outputs)."""
    return [target_record(target, p, layer_ids, max_new_tokens) for p in sequences]


def draft_vocab_from_records(records: list[dict], size: int, vocab_size: int) -> list[int]:
    """EAGLE-3's reduced draft vocabulary: the ``size`` target tokens most often predicted next in the records'
    responses (their ``labels`` from the last prompt position on; ties to the lower id), topped up with the
    lowest unused ids when the records hold fewer distinct tokens. Sorted.

    Example:
        >>> rec = {"tokens": torch.tensor([1, 5, 5, 7]), "labels": torch.tensor([5, 5, 7, 7]), "prompt_len": torch.tensor(1)}
        >>> draft_vocab_from_records([rec], 3, 10)
        [0, 5, 7]
    """
    counts = torch.zeros(int(vocab_size), dtype=torch.long)
    for r in records:
        lab = torch.as_tensor(r["labels"]).long()
        lab = lab[max(0, int(r.get("prompt_len", 1)) - 1):]
        counts += torch.bincount(lab[(lab >= 0) & (lab < vocab_size)], minlength=int(vocab_size))
    order = sorted(range(int(vocab_size)), key=lambda i: (-int(counts[i]), i))
    return sorted(order[: int(size)])


def collate_eagle(records: list[dict], response_only: bool = True) -> dict:
    """Right-pad records to ``tokens[B, T]``, ``labels[B, T]`` (-100 on padding), ``features[B, T, D]``,
    ``valid[B, T]``. Accepts the older record form with ``layers`` (a list of ``[n, H]`` tensors) too.

    With ``response_only`` (and a ``prompt_len`` in the record) the loss keeps only positions from the last
    prompt token on: the head is never asked to draft inside a prompt (for a VLM mostly image placeholders),
    and the prompt still reaches it as attention context."""
    B, T = len(records), max(len(r["tokens"]) for r in records)
    feats = [r["features"] if "features" in r else torch.cat(list(r["layers"]), dim=-1) for r in records]
    D = feats[0].shape[-1]
    tok = torch.zeros(B, T, dtype=torch.long)
    lab = torch.full((B, T), -100, dtype=torch.long)
    fea = torch.zeros(B, T, D, dtype=torch.float32)
    valid = torch.zeros(B, T, dtype=torch.bool)
    starts = []
    for b, (r, f) in enumerate(zip(records, feats)):
        n = len(r["tokens"])
        tok[b, :n], lab[b, :n], fea[b, :n], valid[b, :n] = r["tokens"], r["labels"], f.float(), True
        if response_only and "prompt_len" in r:
            lab[b, : max(0, int(r["prompt_len"]) - 1)] = -100
            starts.append(max(0, int(r["prompt_len"]) - 1))
        else:
            starts.append(0)
    return {"tokens": tok, "labels": lab, "features": fea, "valid": valid, "start": min(starts)}


def _unroll_mask(valid: torch.Tensor, s: int, start: int = 0) -> torch.Tensor:
    """Attention mask over ``s`` stacked unroll steps: block 1 holds positions ``0..T-1``, blocks ``2..s``
    positions ``start..T-1`` (drafts are only trained where answers are, so the prompt is not unrolled).

    Block 1 is ordinary causal attention over target features. Block ``a >= 2`` at position ``j`` stands for
    the ``(a-1)``-th draft after the committed prefix ``<= j-a+1``: it sees block 1 up to ``j-a+1``, block
    ``b`` (``2 <= b < a``) at ``j-a+b`` (the earlier drafts of the same chain) and itself: exactly what the
    head sees at draft step ``a`` at run time (EAGLE's training-time test)."""
    B, T = valid.shape
    dev = valid.device
    pos = [torch.arange(T, device=dev)] + [torch.arange(start, T, device=dev)] * (s - 1)
    rows = []
    for a in range(1, s + 1):
        q = pos[a - 1][:, None]
        cols = []
        for b in range(1, s + 1):
            k = pos[b - 1][None, :]
            if b == 1:
                m = (k <= q - (a - 1))[None] & valid[:, None, :]
                if a == 1:
                    m = m | (k == q)[None]
            elif b < a:
                m = (k == q - a + b)[None].expand(B, -1, -1)
            elif b == a:
                m = (k == q)[None].expand(B, -1, -1)
            else:
                m = torch.zeros(B, q.shape[0], k.shape[1], dtype=torch.bool, device=dev)
            cols.append(m)
        rows.append(torch.cat(cols, dim=2))
    return torch.cat(rows, dim=1)


def eagle_unroll_loss(drafter: "EagleDrafter", batch: dict, unroll: int = 2):
    """Per-unroll-step cross-entropy and top-1 accuracy of the head on a :func:`collate_eagle` batch.

    Step 1 feeds each token with the target's fused feature of the position before; step ``s >= 2`` feeds it
    with the head's own output hidden state of step ``s - 1`` at the position before (training-time test),
    under the mask of :func:`_unroll_mask`. Steps ``>= 2`` run only from ``batch["start"]`` (the first
    position any row has a label at) on. Returns ``(losses[unroll], accuracies[unroll])`` (tensors; the
    losses carry gradients). With a draft vocabulary, labels outside it count as misses in the accuracy and
    are left out of the loss (the head cannot draft them)."""
    dev, dtype = drafter.norm.weight.device, drafter.norm.weight.dtype
    tok, lab = batch["tokens"].to(dev), batch["labels"].to(dev)
    valid, feats = batch["valid"].to(dev), batch["features"].to(dev)
    start = int(batch.get("start", 0))
    fused = drafter.fuse_features(list(feats.to(dtype).chunk(len(drafter.layer_ids), dim=-1)))
    B, H = tok.shape[0], drafter.hidden_size
    zero = torch.zeros(B, 1, H, device=dev, dtype=dtype)
    if drafter.skip_first:  # EAGLE-3's slots: slot j holds token j + 1 with the feature of position j
        tok, lab, valid, feat = tok[:, 1:], lab[:, 1:], valid[:, 1:], fused[:, :-1]
        start -= 1
    else:
        feat = torch.cat([zero, fused[:, :-1]], dim=1)  # f_{i-1}
    T = tok.shape[1]
    start = max(0, min(start, T - 1))
    pos = torch.arange(T, device=dev)[None].expand(B, T)
    small = drafter.draft_ids is not None
    losses, accs = [], []
    hid_prev, past_k, past_v = None, None, None
    for s in range(1, unroll + 1):
        n = T if s == 1 else T - start
        if s == 1:
            tok_s, pos_s = tok, pos
        else:  # the draft of step s at j reads step s-1's hidden state at j-1
            prev = hid_prev if s > 2 else hid_prev[:, max(start - 1, 0):]
            if s > 2 or start == 0:
                prev = torch.cat([zero, prev[:, :-1]], dim=1)
            tok_s, feat, pos_s = tok[:, start:], prev[:, :n], pos[:, start:]
        # One layer: earlier steps' keys/values never change, so step s runs only its own block against them.
        allowed = _unroll_mask(valid, s, start)[:, -n:]
        lab_s = lab[:, T - n:].clone()
        # Positions with no committed prefix for this draft depth, or whose earlier drafts were not unrolled.
        lab_s[:, : max(s - 1 - (T - n), s - 2 if s > 2 else 0)] = -100
        keep = lab_s != -100
        # logits only where a label is: the same loss, without the head over the prompt's positions
        # (with a draft vocabulary: logits over it alone, the labels as indices into it)
        lg, hid_prev, k, v = drafter(tok_s, feat, pos_s, allowed, past_k, past_v, logits_at=keep,
                                     **({"draft_space": True} if small else {}))
        past_k = k if past_k is None else torch.cat([past_k, k], dim=2)
        past_v = v if past_v is None else torch.cat([past_v, v], dim=2)
        target = lab_s[keep]
        idx = drafter.draft_index(target) if small else target
        ok = idx >= 0
        losses.append(F.cross_entropy(lg[ok], idx[ok]) if bool(ok.any()) else lg[:0].sum() * 0.0)
        pred = lg.argmax(-1)
        accs.append(((drafter.draft_ids[pred] if small else pred) == target).sum().float() / keep.sum().clamp(min=1))
    return torch.stack(losses), torch.stack(accs).detach()


class EagleLoss(nn.Module):
    """The head plus its training objective as one module, so ``forward(batch)`` is the whole training step's
    graph (what DDP / ``accelerate`` wrap: gradient sync needs the loss computed inside ``forward``)."""

    def __init__(self, drafter: "EagleDrafter", unroll: int = 2):
        super().__init__()
        self.drafter, self.unroll = drafter, int(unroll)

    def forward(self, batch: dict):
        return eagle_unroll_loss(self.drafter, batch, self.unroll)


def warmup_cosine(warmup: int, steps: int):
    """LR multiplier: linear warm-up over ``warmup`` steps, then cosine decay to 0 at ``steps``."""
    def f(s):
        return min(1.0, (s + 1) / max(1, warmup)) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / max(1, steps)))
    return f


def train_eagle(target, tokenizer=None, sequences=(), steps: int = 300, *, drafter: EagleDrafter | None = None,
                max_new_tokens: int = 32, batch_size: int = 8, lr: float = 3e-3, weight_decay: float = 0.0,
                ttt: bool = True, unroll: int | None = None, warmup: int = 20, seed: int = 0,
                data: list | None = None, log=None, **drafter_kw) -> EagleDrafter:
    """Train an EAGLE head on ``target``'s own greedy responses to ``sequences`` (1-D prompt token ids, or
    one request's processor outputs each, for a VLM), in memory, in this process.

    Loss: the sum over unroll steps of :func:`eagle_unroll_loss` (``unroll`` steps; default 2 with ``ttt``,
    1 without). AdamW with warm-up and cosine decay; the embeddings and LM head stay frozen. Returns the head
    in eval mode. ``data`` reuses :func:`collect_eagle_data` output (the layer ids must match the drafter's).
    For data on disk, several processes, checkpoints and resume, use :mod:`mmspec.train` (``mmspec train``),
    which shares this loss.
    """
    fresh = drafter is None
    if fresh:
        drafter = EagleDrafter.from_target(target, tokenizer, seed=seed, **drafter_kw)
    if data is None:
        if not len(sequences):
            raise InvalidInputError("train_eagle needs prompts (a list of 1-D token id tensors or processor outputs)")
        data = collect_eagle_data(target, sequences, drafter.layer_ids, max_new_tokens)
    if fresh and drafter.draft_vocab_size is not None:  # a head built here drafts among its data's tokens
        drafter.set_draft_vocab(draft_vocab_from_records(data, drafter.draft_vocab_size, drafter.vocab_size))
    unroll = int(unroll if unroll is not None else (2 if ttt else 1))
    rng = random.Random(seed)
    params = [p for p in drafter.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(warmup, steps))
    module = EagleLoss(drafter, unroll).train()
    for step in range(steps):
        batch = collate_eagle(rng.sample(data, min(batch_size, len(data))))
        losses, accs = module(batch)
        opt.zero_grad()
        losses.sum().backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        if log is not None and (step % 50 == 0 or step == steps - 1):
            log(f"step {step}: loss " + " ".join(f"{x:.3f}" for x in losses.tolist())
                + " acc " + " ".join(f"{x:.3f}" for x in accs.tolist()))
    return drafter.eval()


def _eagle_factory(target_model, path=None, tokenizer=None, cls=None, **options):
    """``"eagle:PATH"`` loads a saved head (checked against the target); without a path it builds an
    untrained one for the target (the registry reaches that only through :func:`_eagle_spec_factory`, with
    ``untrained=true``). ``num_draft_tokens`` / ``topk`` / ``tree_nodes``
    override the saved run-time shape (``{"kind": "eagle", "path": PATH, "topk": 4, "tree_nodes": 12}``);
    ``min_confidence`` (a number, ``auto`` or ``none``) overrides the saved early stop. The head runs in the
    target's dtype unless ``dtype`` says otherwise (``"eagle:PATH;dtype=float32"``). ``cls``: a subclass to build
    instead (FastMTP's factory passes its own)."""
    from ..checkpoints import resolve_dtype

    cls = cls or EagleDrafter
    kind = cls.kind

    run_opts = {k: options.pop(k) for k in ("num_draft_tokens", "topk", "tree_nodes") if k in options}
    stop = options.pop("min_confidence", False)
    dtype = options.pop("dtype", None)
    if dtype is not None and str(dtype).lower() != "auto":
        dtype = resolve_dtype(dtype)
    elif target_model is not None:
        dtype = target_model.dtype
    else:
        dtype = None
    if path:
        device = None
        if target_model is not None and target_model.device.type != "meta":
            device = target_model.device
        drafter = cls.from_pretrained(path, target=target_model, tokenizer=tokenizer, device=device, dtype=dtype)
        if options:
            raise InvalidInputError(f"unknown options for a saved {kind} drafter: {sorted(options)}")
    else:
        if target_model is None:
            raise InvalidInputError(f"the {kind} drafter needs a path ('{kind}:PATH') or a target to build one for")
        try:
            drafter = cls.from_target(target_model, tokenizer, **options)
        except (TypeError, ValueError) as e:
            raise InvalidInputError(f"bad {kind} drafter options {options!r}: {e}") from e
        drafter.to(dtype=dtype)
    for k, v in run_opts.items():
        if int(v) < 1:
            raise InvalidInputError(f"{k} must be >= 1 (got {v})")
        setattr(drafter, k, int(v))
    if stop is not False:
        drafter.stop = ConfidenceStop.parse(stop)
    return drafter


def _eagle_spec_factory(target_model, path=None, untrained=False, cls=None, **options):
    """What the registry calls for ``"eagle..."``: a path loads that head; ``"eagle"`` alone loads the head that
    ships for the target (:func:`mmspec.workloads.bundled_drafter_path`) or raises naming what to pass;
    ``"eagle;untrained=true"`` builds a random head for the target (tests and ablations only).

    ``cls``: a subclass of :class:`EagleDrafter` to build instead (``"fastmtp..."`` reaches here with its own).

    Why: a bare ``eagle`` once built a random head that accepted nothing (tau 1.00) while ``mmspec bench`` read
    the same name as the shipped head; now it has that one meaning everywhere.

    Example:
        >>> _eagle_spec_factory(None)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        mmspec.errors.InvalidInputError: 'eagle' names no trained head: none ships for this target; pass 'eagle:DIR' ...
    """
    kind = (cls or EagleDrafter).kind
    if not path and not untrained:
        from ..workloads import bundled_drafter_path

        path = bundled_drafter_path(kind, target_model)
        if path is None:
            raise InvalidInputError(f"'{kind}' names no trained head: none ships for this target; pass '{kind}:DIR' "
                                    f"(a head trained with `mmspec train --kind {kind} --target ...`), or "
                                    f"'{kind};untrained=true' for a random head (tests only)")
    elif path and untrained:
        raise InvalidInputError(f"'{kind}:{path};untrained=true' asks for a saved head and a random one; drop one")
    return _eagle_factory(target_model, path=path, cls=cls, **options)
