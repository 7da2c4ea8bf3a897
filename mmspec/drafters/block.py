"""The DFlash-style block draft body: one head forward drafts a whole block of tokens (modality-free).

Why a block head: a feature head (EAGLE) drafts one token per head pass and feeds its own guesses back, so
its cost grows with the draft depth and its errors compound. A block head (DFlash; GLANCE reads a VLM's
states with one) takes ``[last committed token, MASK x (B - 1)]``, attends bidirectionally inside the
block and to the target's own hidden states over the whole committed context, and predicts every
position of the block in one pass; a best-first tree over the per-position distributions then feeds the
verifier (:meth:`~mmspec.tree.DraftTree.best_first`).

The pieces, shared by every block-head kind (GLANCE in ``vision/glance``; TIGER, FlashDrive's drafter and
the spatial heads later):

- :class:`BlockHead`: the ``nn.Module``. The target's input embeddings and LM head (frozen copies) embed the
  committed token and read out every position; a learnt ``mask_embedding`` stands for the unknown ones.
  The target's hidden states at a few kept layers are concatenated and projected to one *context* vector
  per committed position (``fc`` then RMSNorm, as DFlash); each layer turns those into keys/values with its
  own ``k_proj`` / ``v_proj`` (the block's keys/values come from the block itself through the same
  projections), so the block attends to ``[context ; block]``. Rotary positions are the target's own: a
  :class:`AxisRotary` takes one position per axis (1-D RoPE: one axis; Qwen-VL M-RoPE: time, height and
  width, so an image token's key says where on the page it sits). ``rope="flat"`` (FlatRoPE, the two-reasoner
  driving VLA's routine reasoner) gives the head 1-D RoPE over each token's sequence index instead
  (:func:`flat_positions`): breaking the target's rotational layout moves the draft's attention off the image
  tokens onto the text and history ones.
- The pointer (``pointer=True``, a copy path for transcription-like outputs): one soft match per block against
  the context's *slots* (one per context token: a prompt's ids, image positions as the target's input reads there,
  see :meth:`BlockDrafter.prompt_tokens`), scored by learnt n-gram weights plus a learnt content score, then offset
  ``m`` of the block reads the value ``m`` slots after the match (:meth:`BlockHead.pointer_read`).
- :class:`ContextCache`: the run-time cache of projected context keys/values, one ``[B, h, capacity, d]``
  buffer per layer with per-row lengths. It grows by the committed tokens only (the prompt after prefill,
  then each round's root and accepted path): rejected drafts never enter it.
- :class:`BlockDrafter`: the :class:`~mmspec.drafters.Drafter` built on them: after each verify pass it
  caches the committed tokens' states, runs one head pass per round and returns a best-first tree
  (``branch_k`` wide, ``tree_budget`` nodes; ``branch_k=1`` is the chain). Subclasses (GLANCE) override
  :meth:`BlockDrafter.prompt_features` to change what the prompt's states say (the shuffled-image ablation).
- Training: :func:`collate_blocks` (random anchors per sequence), :func:`block_training_mask` (context strictly
  before the anchor, bidirectional inside a block, blocks blind to each other) and :class:`BlockLoss`
  (cross-entropy per block offset, weighted with a position decay).

Positions: a drafter does not get the target's positions from the loop, so :func:`context_positions` asks
the model for its prefill positions the way :class:`~mmspec.target.TargetAdapter` does (the same
``_prepare_position_ids_for_generation`` hook) and :class:`~mmspec.positions.StreamPositions` advances them
over committed tokens exactly as the adapter does.

Example:
    >>> head = BlockHead(hidden_size=16, vocab_size=32, num_context_layers=2, block_size=4, num_heads=2)
    >>> feats = torch.randn(1, 5, 32)                      # 5 committed positions, 2 kept layers of 16
    >>> pos = torch.arange(5)[None, :, None]               # [B, C, axes]: 1-D RoPE
    >>> ctx = head.context_kv(head.project_context(feats), pos)
    >>> block = torch.tensor([[7, 0, 0, 0]])               # the pending token, then three masks
    >>> logits, _ = head(block, torch.tensor([[False, True, True, True]]), 5 + torch.arange(4)[None, :, None], ctx)
    >>> logits.shape
    torch.Size([1, 4, 32])
"""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..budget import DepthBudget
from ..errors import InvalidInputError
from ..tree import DraftTree
from .base import DraftContext, RoundResult
from .eagle import _RMSNorm, _rope
from .saving import TrainableDrafter, target_fingerprint

__all__ = ["AxisRotary", "BlockLayer", "BlockHead", "ContextCache", "BlockDrafter", "kept_layer_ids",
           "context_positions", "flat_positions", "rope_settings", "ROPE_MODES", "collate_blocks",
           "block_training_mask", "block_forward", "block_loss", "BlockLoss",
           "position_weights"]


ROPE_MODES = ("target", "flat")
"""Values of a block head's ``rope`` option: the target's own positions (M-RoPE axes included), or ``flat``: one
axis, each token's sequence index (FlatRoPE)."""


def kept_layer_ids(num_layers: int, n: int = 3) -> tuple:
    """DFlash's choice of target layers to read, as indices into ``hidden_states`` (0 = embeddings): ``n``
    layers spread evenly from layer 1 to layer ``L - 3`` (1-based: the outputs of decoder layers 2..L-2),
    the middle one when ``n == 1``. The last layers are specialised to the very next token; the block needs
    what the middle of the network knows about the next several.

    Example:
        >>> kept_layer_ids(36, 5), kept_layer_ids(6, 3), kept_layer_ids(2, 3)
        ((2, 10, 18, 26, 34), (2, 3, 4), (1, 2))
    """
    L, n = int(num_layers), int(n)
    if n == 1 or L < 4:
        ids = [L // 2] if n == 1 else list(range(1, L + 1))[:n]
        return tuple(sorted({max(1, min(L, i)) for i in ids}))
    start, end = 1, L - 3
    return tuple(sorted({int(round(start + i * (end - start) / (n - 1))) + 1 for i in range(n)}))


def rope_settings(target) -> dict:
    """The target's rotary settings the head copies: ``rope_theta``, ``mrope_section`` (M-RoPE targets) and
    ``mrope_interleaved`` (Qwen3-VL), ``head_dim``.

    Example:
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> m = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
        ...                      num_hidden_layers=2, num_attention_heads=2))
        >>> rope_settings(m)
        {'rope_theta': 10000.0, 'mrope_section': None, 'mrope_interleaved': False, 'head_dim': 8}
    """
    text = target.config.get_text_config(decoder=True)
    rope = getattr(text, "rope_parameters", None) or {}
    theta = rope.get("rope_theta", getattr(text, "rope_theta", 10000.0)) if isinstance(rope, dict) else 10000.0
    section = rope.get("mrope_section") if isinstance(rope, dict) else None
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    return {"rope_theta": float(theta), "mrope_section": None if section is None else [int(s) for s in section],
            "mrope_interleaved": bool(isinstance(rope, dict) and rope.get("mrope_interleaved", False)),
            "head_dim": int(head_dim)}


class AxisRotary(nn.Module):
    """Rotary embedding over one position per axis: each frequency reads the axis its section names.

    With ``sections`` (Qwen2-VL's ``mrope_section``: frequency counts for time, height, width) positions are
    ``[..., 3]``; without, ``[..., 1]`` (plain RoPE). ``interleaved`` assigns the axes round-robin (Qwen3-VL).
    The head only needs to be consistent between training and drafting; it follows the target's layout so
    that its keys place an image token in two dimensions the way the target's do.

    Example:
        >>> rot = AxisRotary(8, sections=[2, 1, 1])
        >>> rot.axis.tolist()
        [0, 0, 1, 2]
        >>> cos, sin = rot(torch.zeros(1, 3, 3, dtype=torch.long), torch.float32)
        >>> cos.shape
        torch.Size([1, 1, 3, 8])
    """

    def __init__(self, head_dim: int, theta: float = 10000.0, sections=None, interleaved: bool = False):
        super().__init__()
        half = head_dim // 2
        if head_dim % 2:
            raise ValueError(f"rotary head_dim must be even (got {head_dim})")
        axis = torch.zeros(half, dtype=torch.long)
        if sections is not None:
            sections = [int(s) for s in sections]
            if sum(sections) != half:
                raise ValueError(f"mrope sections {sections} must sum to head_dim / 2 = {half}")
            if interleaved:
                for a in (1, 2):
                    axis[a: 3 * sections[a]: 3] = a
            else:
                axis = torch.repeat_interleave(torch.arange(len(sections)), torch.tensor(sections))
        self.register_buffer("axis", axis, persistent=False)
        # Not a buffer: ``Module.to(dtype=bfloat16)`` would round the frequencies; angles are computed in float32.
        self.inv_freq = 1.0 / (float(theta) ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        self.n_axes = 1 if sections is None else len(sections)

    def forward(self, pos: torch.Tensor, dtype) -> tuple:
        """``pos[B, T, A]`` (int) -> ``cos, sin[B, 1, T, head_dim]`` in ``dtype``."""
        if pos.shape[-1] != self.n_axes:
            raise ValueError(f"positions have {pos.shape[-1]} axes, the rotary embedding {self.n_axes}")
        p = pos if self.n_axes == 1 else pos.gather(-1, self.axis.expand(*pos.shape[:-1], -1))
        if self.inv_freq.device != pos.device:
            self.inv_freq = self.inv_freq.to(pos.device)
        ang = p.float() * self.inv_freq  # [B, T, half]: frequency i at its own axis's position
        emb = torch.cat([ang, ang], dim=-1)[:, None]
        return emb.cos().to(dtype), emb.sin().to(dtype)


class BlockLayer(nn.Module):
    """One pre-norm decoder layer whose queries come from the block and whose keys/values are the context's
    (projected once, cached) followed by the block's own."""

    def __init__(self, hidden: int, heads: int, head_dim: int, intermediate: int, eps: float):
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        inner = heads * head_dim
        self.input_layernorm = _RMSNorm(hidden, eps)
        self.q_proj = nn.Linear(hidden, inner, bias=False)
        self.k_proj = nn.Linear(hidden, inner, bias=False)
        self.v_proj = nn.Linear(hidden, inner, bias=False)
        self.o_proj = nn.Linear(inner, hidden, bias=False)
        self.post_attention_layernorm = _RMSNorm(hidden, eps)
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def _split(self, t):
        B, T, _ = t.shape
        return t.view(B, T, self.heads, self.head_dim).transpose(1, 2)

    def context_kv(self, c, cos, sin) -> tuple:
        """Keys (rotated) and values ``[B, h, C, d]`` of projected context ``c[B, C, H]``."""
        return _rope(self._split(self.k_proj(c)), cos, sin), self._split(self.v_proj(c))

    def forward(self, x, cos, sin, ctx_k, ctx_v, allowed):
        """``x[B, T, H]``; ``ctx_k/v[B, h, C, d]``; ``allowed[B, T, C + T]`` (``None``: every key)."""
        B, T, _ = x.shape
        h = self.input_layernorm(x)
        q = _rope(self._split(self.q_proj(h)), cos, sin)
        k = _rope(self._split(self.k_proj(h)), cos, sin)
        v = self._split(self.v_proj(h))
        keys, vals = torch.cat([ctx_k, k], dim=2), torch.cat([ctx_v, v], dim=2)
        att = F.scaled_dot_product_attention(q, keys, vals, attn_mask=None if allowed is None else allowed[:, None])
        x = x + self.o_proj(att.transpose(1, 2).reshape(B, T, -1))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class BlockHead(nn.Module):
    """The block draft head (see the module docstring).

    Args:
        hidden_size, vocab_size: the target's text hidden size and output vocabulary (the head shares both).
        num_context_layers: how many target layers are concatenated into a context vector.
        block_size: tokens per block, the committed one included (``block_size - 1`` drafted).
        num_layers, num_heads, head_dim, intermediate_size, rms_eps: the decoder layers' shape.
        rope_theta, mrope_section, mrope_interleaved: the rotary layout (the target's, see :func:`rope_settings`).
        rope: ``"target"`` (positions in that layout) or ``"flat"`` (1-D RoPE over sequence indices; the M-RoPE
            sections are then unused).
    """

    def __init__(self, hidden_size: int, vocab_size: int, num_context_layers: int, block_size: int = 8,
                 num_layers: int = 2, num_heads: int | None = None, head_dim: int | None = None,
                 intermediate_size: int | None = None, rms_eps: float = 1e-6, rope_theta: float = 10000.0,
                 mrope_section=None, mrope_interleaved: bool = False, anchor_feature=False, refine: int = 0,
                 rope: str = "target", pointer: bool = False):
        super().__init__()
        H = int(hidden_size)
        if not isinstance(pointer, bool):
            raise ValueError(f"pointer must be true or false (got {pointer!r})")
        if pointer and not anchor_feature:
            raise ValueError("pointer reads from the state before each block: it needs anchor_feature")
        if rope not in ROPE_MODES:
            raise ValueError(f"rope must be one of {ROPE_MODES} (got {rope!r})")
        self.rope = rope
        if refine not in (0, 1) or isinstance(refine, bool):
            raise ValueError(f"refine must be 0 or 1 (got {refine!r})")
        if anchor_feature not in (False, True, "all"):
            raise ValueError(f"anchor_feature must be false, true or 'all' (got {anchor_feature!r})")
        if block_size < 2:
            raise ValueError(f"block_size must be >= 2 (one committed token and at least one draft; got {block_size})")
        if num_layers < 1 or num_context_layers < 1:
            raise ValueError("num_layers and num_context_layers must be >= 1")
        if head_dim is None:
            head_dim = H // num_heads if num_heads else next(d for d in (64, 32, 16, 8, H) if H % d == 0)
        if num_heads is None:
            num_heads = max(1, H // head_dim)
        self.hidden_size, self.vocab_size, self.block_size = H, int(vocab_size), int(block_size)
        self.embed_tokens = nn.Embedding(self.vocab_size, H)
        self.lm_head = nn.Linear(H, self.vocab_size, bias=False)
        self.embed_tokens.weight.requires_grad_(False)
        self.lm_head.weight.requires_grad_(False)
        # A learnt vector for the unknown positions: the target's vocabulary need not have a mask token.
        self.mask_embedding = nn.Parameter(torch.randn(H) * 0.02)
        self.fc = nn.Linear(int(num_context_layers) * H, H, bias=False)
        self.context_norm = _RMSNorm(H, rms_eps)
        self.layers = nn.ModuleList(BlockLayer(H, int(num_heads), int(head_dim), int(intermediate_size or 2 * H),
                                               rms_eps) for _ in range(int(num_layers)))
        self.norm = _RMSNorm(H, rms_eps)
        flat = rope == "flat"
        self.rotary = AxisRotary(int(head_dim), rope_theta, None if flat else mrope_section, mrope_interleaved)
        # EAGLE's shortcut inside the block: the committed token's input also carries the context vector of the
        # position just before it (the state that predicted it). Without it the head must first learn to find
        # that one key among hundreds by attention, which on this scale of data costs most of its training.
        # ``"all"`` broadcasts that state and the committed token to every position of the block, each mask told
        # its offset by a learnt vector: every drafted position then starts from EAGLE's whole input and attention
        # only has to refine it (what a few thousand training items can teach; DFlash learns it from ~10^6).
        self.anchor_proj = nn.Linear(H, H, bias=False) if anchor_feature else None
        self.anchor_mode = "all" if anchor_feature == "all" else ("first" if anchor_feature else None)
        self.offset_embedding = nn.Parameter(torch.randn(self.block_size, H) * 0.02) if anchor_feature == "all" \
            else None
        # ``refine=1``: a second pass in which every drafted position reads the first pass's argmax tokens (its own
        # and its neighbours', marked as guesses by ``draft_embedding``) instead of masks. The first pass predicts
        # each position independently, so offset j rarely agrees with what offset j - 1 drafted (measured on the
        # testbed: top-1 0.20 at offset 2, acceptance 0.01-0.09 at depth 2); the second conditions every position
        # on a concrete draft of the others, a recurrence inside the block for one more head pass.
        self.refine = int(refine)
        self.draft_embedding = nn.Parameter(torch.randn(H) * 0.02) if self.refine else None
        # ``pointer``: a copy path. Transcription, quoting and table filling write what the context already holds,
        # token after token; attention with rotary keys can learn "the token after the one I matched" only as a
        # two-hop circuit, which a small head does not learn from a few thousand items (measured on the reader:
        # with another page's image states swapped in, the plain head's tau moved 1.77 -> 1.74). The pointer makes
        # the hop explicit: one match per block, then offset m of the block reads the value m positions after the
        # matched one (``pointer_read``). The match adds a learnt content score (query: the committed token and the
        # state before it; keys: the context vectors, no rotation) to learnt weights on exact matches of the
        # committed token and the two before it against each position's *context token* (its id; at an image
        # position what the target's input there reads as, see ``BlockDrafter.prompt_tokens``): prompt lookup's
        # n-gram match, soft, from the first step. The pointer's context is a sequence of *slots*, one per context
        # token, each with the context vector of its position (a position may read as two tokens: the reader's
        # "space, digit" boxes), so that "m slots after the match" is "m tokens further". Values carry the slot's
        # context vector and its token's embedding. Slots past the committed context are invisible, so nothing is
        # read from the future.
        self.pointer = bool(pointer)
        if self.pointer:
            first = self.layers[0]
            inner = first.heads * first.head_dim
            self.pointer_q = nn.Linear(2 * H, inner, bias=False)
            self.pointer_k = nn.Linear(H, inner, bias=False)
            self.pointer_v = nn.Linear(H, inner, bias=False)
            self.pointer_e = nn.Linear(H, inner, bias=False)
            self.pointer_o = nn.Linear(inner, H, bias=False)
            # per head, the score of a match of 1, 2 and 3 tokens: strong enough at the start that the n-gram
            # matches take the softmax over a page's hundreds of positions
            self.pointer_match = nn.Parameter(torch.tensor([[6.0, 3.0, 1.5]]).repeat(first.heads, 1))

    @property
    def anchor_feature(self):
        return {"all": "all", "first": True, None: False}[self.anchor_mode]

    def anchor_inputs(self, tokens: torch.Tensor, before: torch.Tensor | None) -> tuple:
        """Block inputs for ``N`` blocks: ``tokens[B, N, Bs]`` (committed token first) and the projected
        context before each block ``before[B, N, H]`` -> ``(tokens, anchor_context[B, N, Bs, H] | None, offsets[Bs])``
        as :meth:`forward` reads them in this head's ``anchor_feature`` mode."""
        Bs = tokens.shape[-1]
        offsets = torch.arange(Bs, device=tokens.device)
        if self.anchor_mode is None:
            return tokens, None, offsets
        ctx = torch.zeros(*tokens.shape, before.shape[-1], dtype=before.dtype, device=before.device)
        if self.anchor_mode == "all":
            tokens = tokens[..., :1].expand_as(tokens).contiguous()
            ctx[:] = before[..., None, :]
        else:
            ctx[..., 0, :] = before
        return tokens, ctx, offsets

    @staticmethod
    def shifted_drafts(tokens: torch.Tensor, logits: torch.Tensor, block_size: int) -> torch.Tensor:
        """What the refinement pass reads at each position of blocks laid out along the last axis (``tokens``
        and ``logits[..., V]`` of ``N * block_size`` positions): the draft of the position *before* it, the
        committed token for offset 1 (the first pass's argmax ``y_j`` sits at offset ``j``). Shifted, so each
        position conditions on a concrete previous token, as an autoregressive step would, never on its own guess.

        Example:
            >>> lg = torch.nn.functional.one_hot(torch.tensor([[0, 5, 6, 7]]), 9).float()
            >>> BlockHead.shifted_drafts(torch.tensor([[3, 0, 0, 0]]), lg, 4).tolist()
            [[3, 3, 5, 6]]
        """
        y = logits.argmax(-1).detach()
        shape = y.shape
        y = y.reshape(*shape[:-1], -1, block_size)
        t = tokens.reshape(*shape[:-1], -1, block_size)
        prev = torch.cat([t[..., :1], t[..., :1], y[..., 1:-1]], dim=-1)
        return prev.reshape(shape)

    @property
    def n_axes(self) -> int:
        return self.rotary.n_axes

    def project_context(self, features: torch.Tensor) -> torch.Tensor:
        """``[..., n * H]`` concatenated target states -> ``[..., H]`` context vectors."""
        return self.context_norm(self.fc(features.to(self.fc.weight.dtype)))

    def context_kv(self, c: torch.Tensor, positions: torch.Tensor) -> list:
        """Per layer ``(k, v)[B, h, C, d]`` of context ``c[B, C, H]`` at ``positions[B, C, A]``."""
        cos, sin = self.rotary(positions, c.dtype)
        return [layer.context_kv(c, cos, sin) for layer in self.layers]

    def pointer_kv(self, c: torch.Tensor, tokens: torch.Tensor) -> tuple:
        """The pointer's ``(keys, values)[B, h, S, d]`` of ``S`` slots: ``c[B, S, H]`` the context vector of each
        slot's position, ``tokens[B, S]`` its context token. Keys are unrotated (the pointer matches content, not
        places); values add the token's embedding to the context vector's projection."""
        split = self.layers[0]._split
        v = self.pointer_v(c) + self.pointer_e(self.embed_tokens(tokens).to(c.dtype))
        return split(self.pointer_k(c)), split(v)

    def pointer_read(self, query_in: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                     visible: torch.Tensor | None, match: torch.Tensor | None = None) -> torch.Tensor:
        """The copy path's read for ``N`` blocks: ``query_in[B, N, 2H]`` (each block's committed-token embedding
        and the context vector before it), the pointer's ``keys`` / ``values[B, h, S, d]`` over ``S`` slots
        (:meth:`pointer_kv`), ``visible[B, N, S]`` (``None``: all), ``match[B, h, N, S]`` (optional scores added to the content scores) -> ``[B, N, Bs, H]``:
        per block offset ``m`` the attention-weighted value ``m`` positions after each matched key, counting only
        values the block may see (the rest of the weight is dropped, not renormalised: what lies past the
        committed context is unknown, at run time as in training).

        Example:
            >>> head = BlockHead(16, 32, 1, block_size=3, num_heads=2, anchor_feature="all", pointer=True)
            >>> kv = head.pointer_kv(torch.randn(1, 5, 16), torch.arange(5)[None])
            >>> head.pointer_read(torch.randn(1, 2, 32), *kv, None).shape
            torch.Size([1, 2, 3, 16])
        """
        B, N, _ = query_in.shape
        first = self.layers[0]
        h, d = first.heads, first.head_dim
        C, Bs = keys.shape[2], self.block_size
        q = self.pointer_q(query_in.to(keys.dtype)).view(B, N, h, d).transpose(1, 2)  # [B, h, N, d]
        scores = (q @ keys.transpose(-1, -2)) * d ** -0.5  # [B, h, N, C]
        if match is not None:
            scores = scores + match.to(scores.dtype)
        if visible is not None:
            scores = scores.masked_fill(~visible[:, None], float("-inf"))
        alpha = torch.softmax(scores.float(), dim=-1).nan_to_num(0.0).to(values.dtype)  # a block seeing nothing: 0
        # offset m reads value j + m for a match at j: shift the weights m slots to the right
        padded = F.pad(alpha, (Bs, 0))
        shifted = torch.stack([padded[..., Bs - m: Bs - m + C] for m in range(Bs)], dim=3)  # [B, h, N, Bs, C]
        if visible is not None:
            shifted = shifted * visible[:, None, :, None, :].to(shifted.dtype)
        read = torch.einsum("bhnmc,bhcd->bnmhd", shifted, values).reshape(B, N, Bs, h * d)
        return self.pointer_o(read)

    def forward(self, tokens, is_mask, positions, context, allowed=None, anchor_context=None, offsets=None,
                drafts=None, pointer=None):
        """Block pass: ``tokens[B, T]`` (read where ``is_mask[B, T]`` is false), ``positions[B, T, A]``,
        ``context`` per layer ``(k, v)[B, h, C, d]``, ``allowed[B, T, C + T]`` -> ``(logits[B, T, V] float32,
        hidden[B, T, H])``; the logits at a mask position are the head's distribution of the token there.
        ``anchor_context[B, T, H]`` (heads with ``anchor_feature``): per query the projected context vector added
        to its input (the state before the block at each block's committed token, zeros elsewhere; at every
        position in ``"all"`` mode, where ``tokens`` also repeat the committed token at the masks and ``offsets[T]``
        give each query's offset in its block: see :meth:`anchor_inputs`). ``drafts[B, T]`` (heads with ``refine``:
        the refinement pass): the tokens a previous pass drafted, read at the mask positions on top of the mask.
        ``pointer`` (heads with a pointer): ``(keys, values, tokens[B, S], visible[B, N, S] | None)`` of the pointer's
        slots (:meth:`pointer_kv`), what each of the ``N = T / block_size`` blocks may read."""
        emb = self.embed_tokens(tokens)
        if self.anchor_mode == "all":
            if offsets is None:
                raise ValueError("this head broadcasts the committed token over its block: pass offsets")
            extra = self.mask_embedding.to(emb.dtype) + self.offset_embedding.to(emb.dtype)[offsets]
            x = emb + torch.where(is_mask[..., None], extra, torch.zeros_like(extra))
        else:
            x = torch.where(is_mask[..., None], self.mask_embedding.to(emb.dtype), emb)
        if drafts is not None:
            if self.draft_embedding is None:
                raise ValueError("this head has no refinement pass (refine=0): drafts cannot be read")
            # added to the first pass's input, not in its place: a position keeps what it knew (the committed token,
            # its offset) and learns the guesses on top
            guess = self.embed_tokens(drafts) + self.draft_embedding.to(emb.dtype)
            x = x + torch.where(is_mask[..., None], guess, torch.zeros_like(guess))
        if self.anchor_proj is not None:
            if anchor_context is None:
                raise ValueError("this head reads the state before each block (anchor_feature): pass anchor_context")
            x = x + self.anchor_proj(anchor_context.to(x.dtype))
        if self.pointer:
            if pointer is None:
                raise ValueError("this head has a pointer: pass its slots (pointer=)")
            x = x + self._pointer_input(tokens, is_mask, anchor_context, pointer)
        cos, sin = self.rotary(positions, x.dtype)
        for layer, (ck, cv) in zip(self.layers, context):
            x = layer(x, cos, sin, ck, cv, allowed)
        return self.lm_head(self.norm(x)).float(), x

    def _pointer_input(self, tokens, is_mask, anchor_context, pointer) -> torch.Tensor:
        """The pointer's read (:meth:`pointer_read`) laid out as the block's input ``[B, T, H]``: queries are blocks
        of ``block_size`` consecutive positions (the layout of both :func:`block_forward` and the drafter), each
        block's query from its first position; added at the mask positions only."""
        B, T = tokens.shape
        Bs = self.block_size
        if T % Bs:
            raise ValueError(f"a pointer head reads whole blocks of {Bs} (got {T} queries)")
        first = torch.arange(T // Bs, device=tokens.device) * Bs
        keys, values, ctx_tokens, visible = pointer
        committed = tokens[:, first]  # [B, N]
        query_in = torch.cat([self.embed_tokens(committed).to(keys.dtype), anchor_context[:, first].to(keys.dtype)],
                             dim=-1)
        read = self.pointer_read(query_in, keys, values, visible,
                                 self.pointer_scores(committed, ctx_tokens, visible))
        read = read.reshape(B, T, -1)
        return torch.where(is_mask[..., None], read, torch.zeros_like(read))

    def pointer_scores(self, committed: torch.Tensor, ctx_tokens: torch.Tensor,
                       visible: torch.Tensor | None) -> torch.Tensor:
        """The n-gram part of the pointer's match, ``[B, h, N, C]``: for block ``n`` (committed token
        ``committed[B, N]``) and context position ``j``, head ``h``'s learnt weight of a 1-token match
        (``ctx_tokens[j]`` is the committed token), plus that of a 2-token match (also ``ctx_tokens[j - 1]`` is the
        block's last visible context token), plus a 3-token one. A block's visible context is a prefix
        (``visible[B, N, C]``, ``None``: all ``C``), so its last tokens are the ones before its committed token.

        Example:
            >>> head = BlockHead(8, 16, 1, block_size=2, num_heads=1, anchor_feature="all", pointer=True)
            >>> head.pointer_scores(torch.tensor([[5]]), torch.tensor([[7, 5, 3, 4, 5, 9, 4]]), None)[0, 0, 0].tolist()
            [0.0, 6.0, 0.0, 0.0, 9.0, 0.0, 0.0]
        """
        B, N = committed.shape
        C = ctx_tokens.shape[1]
        n_vis = torch.full((B, N), C, device=committed.device) if visible is None else visible.sum(-1)
        tok = ctx_tokens[:, None, :].expand(B, N, C)

        def last(k):  # the block's k-th last visible context token (-1 where there is none)
            at = n_vis - k
            got = tok.gather(2, at.clamp(min=0)[..., None])[..., 0]
            return torch.where(at >= 0, got, torch.full_like(got, -1))

        def before(k):  # ctx_tokens[j - k] at every j (-2 where j < k: never equal to a token or to "none")
            return F.pad(tok, (k, 0), value=-2)[..., :C]

        one = tok == committed[..., None]
        two = one & (before(1) == last(1)[..., None]) & (last(1)[..., None] >= 0)
        three = two & (before(2) == last(2)[..., None]) & (last(2)[..., None] >= 0)
        grams = torch.stack([one, two, three], dim=-1).to(self.pointer_match.dtype)  # [B, N, C, 3]
        return torch.einsum("bncg,hg->bhnc", grams, self.pointer_match)


# ---------------------------------------------------------------------------- run time
def context_positions(model, model_inputs: dict, n_axes: int) -> torch.Tensor:
    """The target's prefill positions ``[B, L, n_axes]`` for ``model_inputs`` (a processor's outputs), computed
    by the model's own hook as :class:`~mmspec.target.TargetAdapter` computes them. A 1-D target gives one
    axis; an M-RoPE target gives its three rotary axes (transformers' leading text-index axis dropped).

    Example:
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> m = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
        ...                      num_hidden_layers=2, num_attention_heads=2))
        >>> ids = torch.tensor([[0, 5, 6]]); mask = torch.tensor([[0, 1, 1]])
        >>> context_positions(m, {"input_ids": ids, "attention_mask": mask}, 1)[..., 0].tolist()
        [[0, 0, 1]]
    """
    from ..positions import prefill_position_ids

    ids = model_inputs["input_ids"]
    kwargs = {k: v for k, v in model_inputs.items() if k != "input_ids"}
    if kwargs.get("attention_mask") is None:
        kwargs["attention_mask"] = torch.ones_like(ids)
    pos = prefill_position_ids(model, ids, kwargs)
    if pos is None:
        raise InvalidInputError(f"{type(model).__name__} takes no position_ids; a block head needs its positions")
    pos = pos[None] if pos.dim() == 2 else pos  # [A, B, L]
    return pos[-n_axes:].permute(1, 2, 0).contiguous()


def flat_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """FlatRoPE positions ``[B, L, 1]``: each token's sequence index, the count of real tokens before it (padding
    excluded, so a left-padded row starts at 0 like an unpadded one; padding slots get 0 and are never read).
    Image tokens count one each, whatever their M-RoPE grid.

    Example:
        >>> flat_positions(torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]]))[..., 0].tolist()
        [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]]
    """
    m = attention_mask.long()
    return ((m.cumsum(-1) - 1).clamp(min=0) * m)[..., None]


class ContextCache:
    """Projected context keys/values of the rows being decoded: per layer ``k, v[B, h, capacity, d]`` where row
    ``b`` holds ``lengths[b]`` committed positions in its first slots (rows grow unevenly; the attention mask
    hides the unused slots, and every key carries its own rotary position, so slots need no alignment).

    Example:
        >>> cache = ContextCache(num_layers=1, heads=2, head_dim=4, rows=2, dtype=torch.float32, device="cpu")
        >>> k = torch.ones(1, 2, 3, 4)
        >>> cache.append(1, [(k, k)]); cache.lengths.tolist(), cache.valid().shape
        ([0, 3], torch.Size([2, 3]))
    """

    def __init__(self, num_layers: int, heads: int, head_dim: int, rows: int, dtype, device, capacity: int = 256):
        self.k = [torch.zeros(rows, heads, capacity, head_dim, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros_like(t) for t in self.k]
        self.lengths = torch.zeros(rows, dtype=torch.long)
        self.tokens = None  # [rows, capacity] context tokens, for the entry that carries them (a pointer's)
        self._token_entry = None

    def append(self, row: int, kv: list) -> None:
        """Append one row's new positions: per layer ``(k, v)[1, h, m, d]``; an entry ``(k, v, tokens[1, m])``
        (a pointer's) also keeps its context tokens, given back by :meth:`view`."""
        m = kv[0][0].shape[2]
        n = int(self.lengths[row])
        cap = self.k[0].shape[2]
        if n + m > cap:  # grow by doubling (amortised O(1) per committed token)
            new = max(n + m, 2 * cap)
            for bufs in (self.k, self.v):
                for i, t in enumerate(bufs):
                    grown = t.new_zeros(t.shape[0], t.shape[1], new, t.shape[3])
                    grown[:, :, :cap] = t
                    bufs[i] = grown
            if self.tokens is not None:
                self.tokens = F.pad(self.tokens, (0, new - cap))
        for i, entry in enumerate(kv):
            self.k[i][row, :, n:n + m] = entry[0][0]
            self.v[i][row, :, n:n + m] = entry[1][0]
            if len(entry) == 3:
                if self.tokens is None:
                    self.tokens = torch.zeros(self.k[i].shape[0], self.k[i].shape[2], dtype=torch.long,
                                              device=entry[2].device)
                    self._token_entry = i
                self.tokens[row, n:n + m] = entry[2][0]
        self.lengths[row] = n + m

    def select_rows(self, rows: list) -> None:
        idx = torch.as_tensor(rows, dtype=torch.long)
        dev_idx = idx.to(self.k[0].device)
        self.k = [t.index_select(0, dev_idx) for t in self.k]
        self.v = [t.index_select(0, dev_idx) for t in self.v]
        if self.tokens is not None:
            self.tokens = self.tokens.index_select(0, idx.to(self.tokens.device))
        self.lengths = self.lengths[idx]

    def valid(self) -> torch.Tensor:
        """``bool[B, C]`` over the first ``C = max(lengths)`` slots."""
        C = int(self.lengths.max()) if len(self.lengths) else 0
        return torch.arange(C)[None] < self.lengths[:, None]

    def view(self) -> list:
        """Per layer ``(k, v)`` cut to ``max(lengths)`` slots (views, no copy)."""
        C = int(self.lengths.max()) if len(self.lengths) else 0
        out = [(k[:, :, :C], v[:, :, :C]) for k, v in zip(self.k, self.v)]
        if self._token_entry is not None:
            out[self._token_entry] = (*out[self._token_entry], self.tokens[:, :C])
        return out


class BlockDrafter(TrainableDrafter):
    """A drafter around a :class:`BlockHead` (see the module docstring). Build one with :meth:`from_target`.

    Args:
        hidden_size, vocab_size, layer_ids, block_size, num_layers, num_heads, head_dim, intermediate_size,
        rms_eps, rope_theta, mrope_section, mrope_interleaved, rope: the head (saved with it; ``rope="flat"``: 1-D
            positions over sequence indices, :func:`flat_positions`, in place of the target's).
        num_draft_tokens: block positions used per round (``None``: all ``block_size - 1``).
        branch_k: candidates per position in the tree (1: a chain, the head's argmax at each position, or its
            sample when the target samples).
        tree_budget: nodes per tree (``None``: ``num_draft_tokens * branch_k``, capped at 4x the depth).
        depth_budget: ``"auto"`` cuts each tree at the depth with the best expected tokens per unit of measured
            verify time (:class:`~mmspec.budget.DepthBudget`, fed from this drafter's own timing of the rounds);
            ``None`` drafts the full depth.
        fingerprint: the target's fingerprint.
    """

    kind = "block"
    target_tensors = {"head.embed_tokens.weight": "input", "head.lm_head.weight": "output"}

    def __init__(self, hidden_size: int, vocab_size: int, layer_ids=(1,), block_size: int = 8, num_layers: int = 2,
                 num_heads: int | None = None, head_dim: int | None = None, intermediate_size: int | None = None,
                 rms_eps: float = 1e-6, rope_theta: float = 10000.0, mrope_section=None,
                 mrope_interleaved: bool = False, anchor_feature=False, refine: int = 0, rope: str = "target",
                 pointer: bool = False, num_draft_tokens: int | None = None,
                 branch_k: int = 1, tree_budget: int | None = None, depth_budget: str | None = None,
                 fingerprint: dict | None = None):
        super().__init__(fingerprint=fingerprint)
        self.layer_ids = tuple(int(i) for i in layer_ids)
        if not self.layer_ids:
            raise ValueError("layer_ids must name at least one target layer")
        self.head = BlockHead(hidden_size, vocab_size, len(self.layer_ids), block_size, num_layers, num_heads,
                              head_dim, intermediate_size, rms_eps, rope_theta, mrope_section, mrope_interleaved,
                              anchor_feature, refine, rope, pointer)
        first = self.head.layers[0]
        self._shape = {"hidden_size": int(hidden_size), "vocab_size": int(vocab_size), "block_size": int(block_size),
                       "num_layers": int(num_layers), "num_heads": first.heads, "head_dim": first.head_dim,
                       "intermediate_size": first.gate_proj.out_features, "rms_eps": float(rms_eps),
                       "rope_theta": float(rope_theta),
                       "mrope_section": None if mrope_section is None else [int(s) for s in mrope_section],
                       "mrope_interleaved": bool(mrope_interleaved), "anchor_feature": self.head.anchor_feature,
                       "refine": self.head.refine, "rope": rope, "pointer": self.head.pointer}
        self.num_draft_tokens = int(num_draft_tokens or block_size - 1)
        self.branch_k = int(branch_k)
        self.tree_budget = None if tree_budget is None else int(tree_budget)
        self.depth_budget = depth_budget
        self._check_run_options()
        self._budget = DepthBudget() if depth_budget == "auto" else None
        self._target_ref: list = []  # the bound target, kept out of the module tree (not a submodule)
        self._reset_run()

    def _check_run_options(self) -> None:
        if not 1 <= self.num_draft_tokens:
            raise ValueError(f"num_draft_tokens must be >= 1 (got {self.num_draft_tokens})")
        if self.branch_k < 1:
            raise ValueError(f"branch_k must be >= 1 (got {self.branch_k})")
        if self.tree_budget is not None and self.tree_budget < 1:
            raise ValueError(f"tree_budget must be >= 1 (got {self.tree_budget})")
        if self.depth_budget not in (None, "auto"):
            raise ValueError(f"depth_budget must be 'auto' or None (got {self.depth_budget!r})")

    # ------------------------------------------------------------------ construction / saving
    @property
    def hidden_layers(self) -> tuple:
        return tuple(dict.fromkeys(self.layer_ids))

    @property
    def block_size(self) -> int:
        return self.head.block_size

    def config_dict(self) -> dict:
        return {**self._shape, "layer_ids": list(self.layer_ids), "num_draft_tokens": self.num_draft_tokens,
                "branch_k": self.branch_k, "tree_budget": self.tree_budget, "depth_budget": self.depth_budget}

    @classmethod
    def from_target(cls, target, tokenizer=None, layer_ids=None, num_kept_layers: int = 3, seed: int | None = None,
                    **kw) -> "BlockDrafter":
        """A fresh head for ``target``: its embeddings and LM head copied in, its rotary layout and
        (by default) DFlash's kept layers (:func:`kept_layer_ids`).

        Example:
            >>> from transformers import LlamaConfig, LlamaForCausalLM
            >>> t = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
            ...                      num_hidden_layers=2, num_attention_heads=2))
            >>> d = BlockDrafter.from_target(t, block_size=4)
            >>> d.hidden_layers, d.block_size, d.num_draft_tokens
            ((1, 2), 4, 3)
        """
        text = target.config.get_text_config(decoder=True)
        n = int(text.num_hidden_layers)
        layer_ids = tuple(layer_ids) if layer_ids is not None else kept_layer_ids(n, num_kept_layers)
        if any(not 0 <= int(i) <= n for i in layer_ids):
            raise InvalidInputError(f"layer_ids {list(layer_ids)} out of range for a target with {n} layers (0..{n})")
        rope = rope_settings(target)
        kw.setdefault("rms_eps", float(getattr(text, "rms_norm_eps", 1e-6)))
        kw.setdefault("rope_theta", rope["rope_theta"])
        kw.setdefault("mrope_section", rope["mrope_section"])
        kw.setdefault("mrope_interleaved", rope["mrope_interleaved"])
        if kw.get("num_heads") is None and kw.get("head_dim") is None:
            kw["head_dim"] = rope["head_dim"]  # the target's head width: its mrope sections fit as they are
        out = target.get_output_embeddings().weight
        if seed is not None:
            torch.manual_seed(seed)
        drafter = cls(hidden_size=int(text.hidden_size), vocab_size=int(out.shape[0]), layer_ids=layer_ids,
                      fingerprint=target_fingerprint(target, tokenizer, layer_ids), **kw)
        drafter.load_target_tensors(target)
        dev = target.device if target.device.type != "meta" else torch.device("cpu")
        return drafter.to(dev).eval()

    @property
    def rope(self) -> str:
        return self.head.rope

    def prompt_positions(self, model, model_inputs: dict) -> torch.Tensor:
        """The head's positions ``[B, L, n_axes]`` of a batch of prompts (a processor's outputs): the target's own
        (:func:`context_positions`), or with ``rope="flat"`` each token's sequence index (:func:`flat_positions`).

        Example:
            >>> from transformers import LlamaConfig, LlamaForCausalLM
            >>> t = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
            ...                      num_hidden_layers=2, num_attention_heads=2))
            >>> d = BlockDrafter.from_target(t, block_size=4, rope="flat")
            >>> inputs = {"input_ids": torch.tensor([[0, 5, 6]]), "attention_mask": torch.tensor([[0, 1, 1]])}
            >>> d.prompt_positions(t, inputs)[..., 0].tolist()
            [[0, 0, 1]]
        """
        if self.rope == "flat":
            mask = model_inputs.get("attention_mask")
            return flat_positions(torch.ones_like(model_inputs["input_ids"]) if mask is None else mask)
        return context_positions(model, model_inputs, self.head.n_axes)

    def bind(self, model) -> None:
        super().bind(model)
        self._target_ref[:] = [model]

    # ------------------------------------------------------------------ run-time state
    def _reset_run(self) -> None:
        self._cache = None
        self._pcache = None  # the pointer's slots (a pointer head): keys, values and context tokens
        self._slot: dict = {}  # original row -> its row in the cache
        self._stream = None  # StreamPositions of the rows in cache order (next position of the pending token)
        self._paths = None  # original row -> accepted path of the last verify pass, ingested at the next propose
        self._round_t = None
        self._last_c = None  # per cache row, the projected context vector of its last committed position

    def _ctx_features(self, ctx: DraftContext) -> torch.Tensor:
        missing = [i for i in self.layer_ids if i not in ctx.hidden]
        if missing:
            raise InvalidInputError(f"the {self.kind} drafter needs target hidden states of layers {missing}; "
                                    "run it through mmspec.generate (which requests its hidden_layers)")
        dt = self.head.fc.weight.dtype
        return torch.cat([ctx.hidden[i].to(dt) for i in self.layer_ids], dim=-1)

    def prompt_features(self, ctx: DraftContext, rows: list, features: list, positions: list) -> list:
        """Hook: the concatenated kept-layer states of each row's prompt (``features[i][plen, n * H]`` for
        original row ``rows[i]``, ``positions[i][plen, A]``) before they are projected and cached. The base
        head reads them as they are; GLANCE swaps image positions for the shuffled-features ablation."""
        return features

    def prompt_tokens(self, ctx: DraftContext, rows: list, prompts: list) -> list:
        """Hook: the pointer's slots of each row's prompt (``prompts[i]``: original row ``rows[i]``'s unpadded ids,
        a ``LongTensor[plen]``) as ``(tokens[S], positions[S])``: the context tokens a pointer head matches and
        reads, and the prompt position each belongs to (non-decreasing). The base head takes the ids as they are,
        one slot a position; GLANCE reads its image positions as the tokens their input vectors are nearest to."""
        return [(p, torch.arange(len(p))) for p in prompts]

    def prompt_visible(self, ctx: DraftContext, rows: list, lengths: list) -> list | None:
        """Hook: per original row ``rows[i]``, ``bool[lengths[i]]``: which of its prompt positions the head may
        attend to (the others never enter the context cache), or ``None``: all of them. The training side is the
        batch's ``context_visible`` (:func:`block_forward`). GLANCE's ``context="text"`` hides the image positions."""
        return None

    def prompt_context(self, slot: int, row: int, context: torch.Tensor, ctx: DraftContext) -> None:
        """Hook: cache row ``slot`` (original row ``row``) got its prompt's projected context ``context[plen, H]``.
        The base head keeps nothing more; TIGER keeps routing keys of the image positions."""

    def context_mask(self, allowed, rows: list, slots: torch.Tensor, block_size: int):
        """Hook: the attention mask of this round's block pass over ``[cached context ; block]`` (``allowed``:
        ``bool[B, Bs, C + Bs]``, or ``None`` when every key is visible) for original rows ``rows`` in cache rows
        ``slots``; may return a
        float mask (an additive bias, ``-inf`` hides a key). The base head uses ``allowed`` as it is; TIGER
        hides the visual keys its router did not pick and gates the ones it did."""
        return allowed

    @torch.no_grad()
    def begin(self, ctx: DraftContext) -> None:
        from ..positions import StreamPositions

        self._reset_run()
        if not self._target_ref:
            raise InvalidInputError(f"the {self.kind} drafter was not bound to a target; run it through "
                                    "mmspec.generate (which binds it)")
        model = self._target_ref[0]
        feats = self._ctx_features(ctx)  # [B_active, L, nH], prompts right-aligned
        inputs = ctx.model_inputs
        pos_all = self.prompt_positions(model, inputs).to(feats.device)  # [B_orig, L, A]
        mask_all = inputs.get("attention_mask")
        if mask_all is None:
            mask_all = torch.ones_like(inputs["input_ids"])
        L = feats.shape[1]
        rows = list(ctx.rows)
        prompt_feats, prompt_pos = [], []
        for b, (r, plen) in enumerate(zip(rows, ctx.prompt_lengths)):
            keep = mask_all[r].bool().to(pos_all.device)
            prompt_pos.append(pos_all[r][keep])
            prompt_feats.append(feats[b, L - plen:])
        prompt_feats = self.prompt_features(ctx, rows, prompt_feats, prompt_pos)
        visible = self.prompt_visible(ctx, rows, [len(p) for p in prompt_pos])
        first = self.head.layers[0]
        dt, dev = self.head.fc.weight.dtype, self.head.fc.weight.device
        self._cache = ContextCache(len(self.head.layers), first.heads, first.head_dim, len(rows), dt, dev,
                                   capacity=max(ctx.prompt_lengths) + 64)
        slots = [None] * len(rows)
        if self.head.pointer:
            prompts = [torch.as_tensor(np.asarray(seq[:plen]), dtype=torch.long)
                       for seq, plen in zip(ctx.sequences, ctx.prompt_lengths)]
            slots = self.prompt_tokens(ctx, rows, prompts)
            self._pcache = ContextCache(1, first.heads, first.head_dim, len(rows), dt, dev,
                                        capacity=max(len(t) for t, _ in slots) + 64)
        last = []
        for b, (f, p) in enumerate(zip(prompt_feats, prompt_pos)):
            c = self.head.project_context(f[None])
            last.append(c[0, -1])  # the anchor feature reads the state before the block, hidden from attention or not
            if visible is not None:
                keep = visible[b].to(c.device)
                c, p = c[:, keep], p[keep.to(p.device)]
            if self.head.pointer:
                tok, at = (t.to(dev) for t in slots[b])
                self._pcache.append(b, [(*self.head.pointer_kv(c[:, at], tok[None]), tok[None])])
            self._cache.append(b, self.head.context_kv(c, p[None].to(dev)))
            self.prompt_context(b, rows[b], c[0], ctx)
        self._last_c = torch.stack(last)
        self._slot = {r: b for b, r in enumerate(rows)}
        # Next position per cache row (the pending token's), [A, B]; advanced over committed tokens as the adapter does.
        start = torch.stack([p[-1] for p in prompt_pos], dim=1) + 1  # [A, B]
        self._stream = StreamPositions(start[:, :, None] - 1)

    @torch.no_grad()
    def _ingest(self, ctx: DraftContext) -> None:
        """Cache the states of last round's committed tokens (root and accepted path) at their positions."""
        if self._paths is None:
            return
        if set(ctx.rows) != set(self._slot):  # rows that finished leave the cache
            keep = [self._slot[r] for r in ctx.rows]
            self._cache.select_rows(keep)
            if self._pcache is not None:
                self._pcache.select_rows(keep)
            self._stream.select_rows(torch.as_tensor(keep, dtype=torch.long))
            self._last_c = self._last_c[torch.as_tensor(keep, dtype=torch.long, device=self._last_c.device)]
            self._slot = {r: b for b, r in enumerate(ctx.rows)}
        feats = self._ctx_features(ctx)  # [B, 1 + nodes, nH]: root, then tree nodes
        c = self.head.project_context(feats)
        dev = c.device
        counts = []  # cache rows are always in ctx.rows order (rows only ever leave)
        for b, r in enumerate(ctx.rows):
            slot = self._slot[r]
            path = self._paths[r]
            idx = torch.tensor([0] + [1 + int(i) for i in path], device=dev)
            steps = torch.arange(len(idx), device=dev)
            pos = (self._stream.next_pos[:, slot].to(dev)[None, :] + steps[:, None])[None]  # [1, m, A]
            if self.head.pointer:  # a pointer head sees every position, so cache slot i holds the sequence's token i
                n = int(self._cache.lengths[slot])
                tok = torch.as_tensor(np.asarray(ctx.sequences[b][n:n + len(idx)]), dtype=torch.long, device=dev)[None]
                self._pcache.append(slot, [(*self.head.pointer_kv(c[b:b + 1, idx], tok), tok)])
            self._cache.append(slot, self.head.context_kv(c[b:b + 1, idx], pos))
            self._last_c[slot] = c[b, idx[-1]]
            counts.append(len(idx))
        self._stream.advance(torch.as_tensor(counts, dtype=torch.long))
        self._paths = None

    def _block_logits(self, ctx: DraftContext) -> torch.Tensor:
        """One head pass over every row's block -> logits ``[B, block_size - 1, V]`` of the drafted positions
        (rows in ``ctx.rows`` order)."""
        dev = self.head.fc.weight.device
        Bs = self.block_size
        B = len(ctx.rows)
        slots = torch.as_tensor([self._slot[r] for r in ctx.rows], dtype=torch.long)
        pending = torch.as_tensor([int(seq[-1]) for seq in ctx.sequences], device=dev)
        tokens = torch.zeros(B, Bs, dtype=torch.long, device=dev)
        tokens[:, 0] = pending
        is_mask = torch.ones(B, Bs, dtype=torch.bool, device=dev)
        is_mask[:, 0] = False
        start = self._stream.next_pos[:, slots].to(dev).T  # [B, A]
        pos = start[:, None, :] + torch.arange(Bs, device=dev)[None, :, None]
        kv = self._cache.view()
        if slots.tolist() != list(range(len(self._cache.lengths))):
            kv = [tuple(t[slots.to(t.device)] for t in entry) for entry in kv]
        if B == 1:
            allowed = None  # one row: every cached slot is real and the block sees itself whole
        else:
            valid = self._cache.valid()[slots].to(dev)
            allowed = torch.cat([valid[:, None, :].expand(B, Bs, -1),
                                 torch.ones(B, Bs, Bs, dtype=torch.bool, device=dev)], dim=2)
        allowed = self.context_mask(allowed, list(ctx.rows), slots, Bs)
        before = self._last_c[slots.to(self._last_c.device)].to(dev)[:, None]  # [B, 1, H]
        tokens, anchor_ctx, offsets = self.head.anchor_inputs(tokens[:, None], before)
        tokens = tokens[:, 0]
        anchor_ctx = None if anchor_ctx is None else anchor_ctx[:, 0]
        pointer = None
        if self.head.pointer:
            (pk, pv, ptok), = self._pcache.view()
            if slots.tolist() != list(range(len(self._pcache.lengths))):
                pk, pv, ptok = (t[slots.to(t.device)] for t in (pk, pv, ptok))
            pvis = None if B == 1 else self._pcache.valid()[slots].to(dev)[:, None]
            pointer = (pk, pv, ptok, pvis)
        logits, _ = self.head(tokens, is_mask, pos, kv, allowed, anchor_ctx, offsets, pointer=pointer)
        if self.head.refine:  # the refinement pass reads the first pass's argmax drafts (deterministic: lossless)
            drafts = self.head.shifted_drafts(tokens, logits, Bs)
            logits, _ = self.head(tokens, is_mask, pos, kv, allowed, anchor_ctx, offsets, drafts=drafts, pointer=pointer)
        return logits[:, 1:]

    def _sample(self, probs: torch.Tensor, ctx: DraftContext) -> torch.Tensor:
        gen = ctx.generator
        dev = gen.device if gen is not None else probs.device
        return torch.multinomial(probs.to(dev), 1, generator=gen).view(-1).to(probs.device)

    @torch.no_grad()
    def propose(self, ctx: DraftContext) -> list[DraftTree]:
        """Cache last round's committed states, run the head once over each row's block, and return per row a
        best-first tree over the block's per-position distributions (``branch_k`` candidates per position,
        ``tree_budget`` nodes; a chain when ``branch_k == 1``: the argmax, or a sample from the head's softmax
        with ``draft_probs`` attached when the target samples; wider trees are deterministic proposals)."""
        self._ingest(ctx)
        depth = max(1, min(self.num_draft_tokens, self.block_size - 1, max(ctx.remaining) - 1))
        logits = self._block_logits(ctx)[:, :depth].float()
        trees = []
        if self.branch_k == 1:
            if ctx.do_sample:
                probs = torch.softmax(logits, dim=-1)
                toks = self._sample(probs.reshape(-1, probs.shape[-1]), ctx).view(len(ctx.rows), depth)
                trees = [DraftTree.from_chain(toks[b].tolist(), probs[b]) for b in range(len(ctx.rows))]
            else:
                toks = logits.argmax(-1).cpu()
                trees = [DraftTree.from_chain(toks[b].tolist()) for b in range(len(ctx.rows))]
        else:
            k = min(self.branch_k, logits.shape[-1])
            top = torch.log_softmax(logits, dim=-1).topk(k, dim=-1)
            ids, lps = top.indices.cpu().numpy(), top.values.double().cpu().numpy()
            budget = self.tree_budget or min(depth * k, 4 * depth)
            trees = [DraftTree.best_first(ids[b], lps[b], budget=budget, branch_k=k) for b in range(len(ctx.rows))]
        if self._budget is not None:
            trees = [self._budget.choose(t) for t in trees]
        self._round_t = (time.perf_counter(), 1 + max(len(t) for t in trees)) if trees else None
        return trees

    def observe(self, ctx: DraftContext, result: RoundResult) -> None:
        self._paths = {r: list(p) for r, p in zip(ctx.rows, result.paths)}
        if self._budget is not None:
            for tree, path in zip(result.trees, result.paths):
                self._budget.observe_row(tree, len(path))
            if self._round_t is not None:  # verify + accept + commit of this round, against its width
                t, width = self._round_t
                self._budget.observe_pass(width, time.perf_counter() - t)
        self._round_t = None

    def forget(self) -> None:
        """Nothing crosses requests but the depth budget's measurements, which describe costs, not outputs."""


# ---------------------------------------------------------------------------- training
def position_weights(block_size: int, decay: float | None) -> torch.Tensor:
    """Loss weight of each drafted offset ``j = 1..block_size-1``: ``exp(-(j - 1) / decay)`` (DFlash's position
    decay: a late position only counts if every earlier one was accepted), ``1`` everywhere without decay.

    Example:
        >>> [round(w, 3) for w in position_weights(4, 2.0).tolist()]
        [1.0, 0.607, 0.368]
    """
    j = torch.arange(block_size - 1, dtype=torch.float32)
    return torch.ones_like(j) if not decay else torch.exp(-j / float(decay))


def collate_blocks(records: list[dict], block_size: int, num_anchors: int, generator: torch.Generator | None = None,
                   n_axes: int = 1, rope: str = "target") -> dict:
    """Right-pad records (``tokens[n]``, ``labels[n]``: the target's argmax next token at each position,
    ``features[n, D]``, optional ``positions[n, A]``, ``prompt_len``) and draw up to ``num_anchors`` distinct
    anchors per record among the generated positions (``prompt_len .. n - 1``: at run time a block starts at
    the pending token, which is always a generated one, with the whole prompt in its context).

    Returns ``tokens[B, T]``, ``labels[B, T]`` (-100 on padding), ``features[B, T, D]``, ``positions[B, T, A]``
    (a record without them gets ``0..n-1`` on every axis; ``rope="flat"`` gives every record ``0..n-1`` on one axis,
    its recorded positions unread: a record holds real tokens only, so these are :func:`flat_positions`),
    ``valid[B, T]`` and ``anchors[B, N]`` (-1: none);
    records with ``routable[n]`` (positions a router may pick among, e.g. TIGER's image tokens) or the target's
    ``top_ids`` / ``top_logp[n, K]`` (:func:`~mmspec.drafters.eagle.target_record` with ``keep_top``) pass them
    on, padded (``False`` / id 0 and log-probability ``-inf``).

    Example:
        >>> rec = {"tokens": torch.arange(6), "labels": torch.arange(1, 7), "features": torch.zeros(6, 4),
        ...        "prompt_len": torch.tensor(3)}
        >>> b = collate_blocks([rec], block_size=3, num_anchors=8)
        >>> b["anchors"][0].tolist()   # three generated positions; the other slots are empty
        [3, 4, 5, -1, -1, -1, -1, -1]
        >>> rec["positions"] = torch.tensor([[0, 0, 0], [1, 1, 1], [1, 1, 2], [3, 3, 3], [4, 4, 4], [5, 5, 5]])
        >>> collate_blocks([rec], 3, 8, rope="flat")["positions"][0, :, 0].tolist()
        [0, 1, 2, 3, 4, 5]
    """
    if rope not in ROPE_MODES:
        raise ValueError(f"rope must be one of {ROPE_MODES} (got {rope!r})")
    if rope == "flat":
        n_axes = 1
    B, T = len(records), max(len(r["tokens"]) for r in records)
    D = records[0]["features"].shape[-1]
    tok = torch.zeros(B, T, dtype=torch.long)
    lab = torch.full((B, T), -100, dtype=torch.long)
    fea = torch.zeros(B, T, D, dtype=torch.float32)
    pos = torch.zeros(B, T, n_axes, dtype=torch.long)
    valid = torch.zeros(B, T, dtype=torch.bool)
    anchors = torch.full((B, num_anchors), -1, dtype=torch.long)
    for b, r in enumerate(records):
        n = len(r["tokens"])
        tok[b, :n], lab[b, :n], fea[b, :n], valid[b, :n] = r["tokens"], r["labels"], r["features"].float(), True
        p = r.get("positions")
        pos[b, :n] = torch.arange(n)[:, None] if p is None or rope == "flat" else p.reshape(n, -1)[:, -n_axes:]
        lo = min(int(r.get("prompt_len", 1)), n - 1)
        cand = torch.arange(max(lo, 1), n)
        pick = cand[torch.randperm(len(cand), generator=generator)[:num_anchors]]
        anchors[b, :len(pick)] = pick.sort().values
    out = {"tokens": tok, "labels": lab, "features": fea, "positions": pos, "valid": valid, "anchors": anchors,
           "block_size": block_size}
    # a pointer head's slots (``pointer_tokens`` / ``pointer_pos``: the context tokens and the position each reads
    # at; a record without them: its own tokens, one slot a position), padded with position T (never visible)
    slot = [(r["pointer_tokens"], r["pointer_pos"]) if "pointer_tokens" in r else
            (r["tokens"], torch.arange(len(r["tokens"]))) for r in records]
    S = max(len(t) for t, _ in slot)
    out["pointer_tokens"] = torch.zeros(B, S, dtype=torch.long)
    out["pointer_pos"] = torch.full((B, S), T, dtype=torch.long)
    for b, (t, at) in enumerate(slot):
        out["pointer_tokens"][b, :len(t)], out["pointer_pos"][b, :len(t)] = t, at
    if "routable" in records[0]:
        out["routable"] = torch.zeros(B, T, dtype=torch.bool)
        for b, r in enumerate(records):
            out["routable"][b, :len(r["tokens"])] = r["routable"].bool()
    if "top_ids" in records[0]:
        K = records[0]["top_ids"].shape[-1]
        out["top_ids"] = torch.zeros(B, T, K, dtype=torch.long)
        out["top_logp"] = torch.full((B, T, K), float("-inf"))
        for b, r in enumerate(records):
            n = len(r["tokens"])
            out["top_ids"][b, :n], out["top_logp"][b, :n] = r["top_ids"], r["top_logp"].float()
    return out


def block_training_mask(anchors: torch.Tensor, valid: torch.Tensor, block_size: int) -> torch.Tensor:
    """``allowed[B, N * Bs, T + N * Bs]`` for ``N`` blocks of ``Bs`` queries per row over ``[context (T) ;
    blocks]``: a query of the block anchored at ``a`` sees the valid context positions strictly before ``a``
    and every position of its own block (bidirectional), never another block. An absent anchor (-1) sees
    only its own block (its outputs are not scored).

    Example:
        >>> m = block_training_mask(torch.tensor([[2]]), torch.ones(1, 4, dtype=torch.bool), 2)
        >>> m[0].int().tolist()
        [[1, 1, 0, 0, 1, 1], [1, 1, 0, 0, 1, 1]]
    """
    B, N = anchors.shape
    T = valid.shape[1]
    dev = anchors.device
    q_anchor = anchors.repeat_interleave(block_size, dim=1)  # [B, N*Bs]
    ctx = (torch.arange(T, device=dev)[None, None, :] < q_anchor[:, :, None]) & valid[:, None, :]
    blk = torch.arange(N, device=dev).repeat_interleave(block_size)
    same = (blk[:, None] == blk[None, :])[None].expand(B, -1, -1)
    return torch.cat([ctx, same], dim=2)


def block_forward(head: BlockHead, batch: dict, context_mask=None, all_passes: bool = False) -> tuple:
    """The training forward on a :func:`collate_blocks` batch: each anchor ``a`` makes a block ``[tokens[a],
    MASK x (Bs - 1)]`` at positions ``positions[a] + j`` (every axis), attending to the projected target
    states before ``a`` (:func:`block_training_mask`). Returns ``(logits[B, N, Bs - 1, V], targets[B, N, Bs - 1])``:
    the head's distribution at each drafted offset ``j`` and what it is scored against, ``labels[a + j - 1]``
    (the target's own next token there; -100 where there is none).

    ``batch["context_visible"]`` (optional, ``bool[B, T]``): the positions a block may attend to (default
    ``valid``; the training side of :meth:`BlockDrafter.prompt_visible`). ``context_mask(allowed, c, anchors,
    batch)`` (optional) turns the boolean mask of
    :func:`block_training_mask` into the one the head attends with, given the projected context ``c[B, T, H]``
    (the training side of :meth:`BlockDrafter.context_mask`). A head with ``refine`` runs its refinement pass on the
    first pass's argmax drafts; the logits returned are the last pass's, or every pass's (a list, first pass
    first) with ``all_passes``."""
    dev = head.fc.weight.device
    Bs = int(batch.get("block_size", head.block_size))
    if Bs != head.block_size:
        raise InvalidInputError(f"batch made for blocks of {Bs}, the head drafts blocks of {head.block_size}")
    tok, lab = batch["tokens"].to(dev), batch["labels"].to(dev)
    valid, anchors = batch["valid"].to(dev), batch["anchors"].to(dev)
    pos = batch["positions"].to(dev)
    B, T = tok.shape
    N = anchors.shape[1]
    c = head.project_context(batch["features"].to(dev))
    context = head.context_kv(c, pos)
    a = anchors.clamp(min=0)  # [B, N]
    offs = torch.arange(Bs, device=dev)
    block_tok = torch.zeros(B, N, Bs, dtype=torch.long, device=dev)
    block_tok[:, :, 0] = tok.gather(1, a)
    is_mask = (offs > 0)[None, None].expand(B, N, Bs)
    base = pos.gather(1, a[:, :, None].expand(-1, -1, pos.shape[-1]))  # [B, N, A]
    block_pos = base[:, :, None, :] + offs[None, None, :, None]
    visible = batch["context_visible"].to(dev) & valid if "context_visible" in batch else valid
    allowed = block_training_mask(anchors, visible, Bs)
    if context_mask is not None:
        allowed = context_mask(allowed, c, anchors, batch)
    before = None
    if head.anchor_feature:  # the state just before each block (anchors are >= 1)
        before = c.gather(1, (a - 1).clamp(min=0)[:, :, None].expand(-1, -1, c.shape[-1]))  # [B, N, H]
    block_tok, anchor_ctx, offsets = head.anchor_inputs(block_tok, before)
    if anchor_ctx is not None:
        anchor_ctx = anchor_ctx.view(B, N * Bs, -1)
    args = (block_tok.reshape(B, N * Bs), is_mask.reshape(B, N * Bs), block_pos.view(B, N * Bs, -1), context,
            allowed, anchor_ctx, offsets.repeat(N))
    pointer = None
    if head.pointer:  # a slot is visible to the block anchored at a when its position is (before a, and real)
        ptok, at = batch["pointer_tokens"].to(dev), batch["pointer_pos"].to(dev)
        seen = visible.gather(1, at.clamp(max=T - 1)) & (at < T)  # [B, S]
        pvis = (at[:, None, :] < anchors[:, :, None]) & seen[:, None, :]  # [B, N, S]
        c_slots = c.gather(1, at.clamp(max=T - 1)[..., None].expand(-1, -1, c.shape[-1]))
        pointer = (*head.pointer_kv(c_slots, ptok), ptok, pvis)
    logits, _ = head(*args, pointer=pointer)
    passes = [logits]
    if head.refine:  # trained on its own first pass's drafts, as it runs (argmax, no gradient through the choice)
        logits, _ = head(*args, drafts=head.shifted_drafts(args[0], logits, Bs), pointer=pointer)
        passes.append(logits)
    logits = logits.view(B, N, Bs, -1)[:, :, 1:]  # drafted offsets 1..Bs-1
    tgt_idx = a[:, :, None] + offs[None, None, 1:] - 1  # labels[a + j - 1]
    ok = (anchors[:, :, None] >= 0) & (tgt_idx < T)
    target = lab.gather(1, tgt_idx.clamp(max=T - 1).view(B, -1)).view(B, N, Bs - 1)
    target = torch.where(ok, target, torch.full_like(target, -100))
    if all_passes:
        return [p.view(B, N, Bs, -1)[:, :, 1:] for p in passes], target
    return logits, target


def block_loss(head: BlockHead, batch: dict, decay: float | None = None):
    """Per-offset training loss of ``head`` on a :func:`collate_blocks` batch (:func:`block_forward`).

    Returns ``(losses[Bs - 1], accuracies[Bs - 1])``: ``losses[j - 1]`` is the mean cross-entropy at offset
    ``j`` times its :func:`position_weights` weight (so their sum is the objective, and offset 1, of weight 1,
    reads as a plain cross-entropy; with ``refine``, the mean of both passes' cross-entropies), ``accuracies`` the
    unweighted top-1 per offset of the last pass (the one that drafts)."""
    passes, target = block_forward(head, batch, all_passes=True)
    w = position_weights(head.block_size, decay).to(target.device)
    losses, accs = [], []
    for j in range(head.block_size - 1):
        tg = target[:, :, j].reshape(-1)
        keep = tg != -100
        loss = 0.0
        for logits in passes:  # every pass learns; the last one is what drafts, and what accuracy reports
            lg = logits[:, :, j].reshape(-1, logits.shape[-1])
            # nothing to score at this offset in this batch: a zero that keeps the graph
            loss = loss + (F.cross_entropy(lg, tg, ignore_index=-100) if bool(keep.any()) else lg.sum() * 0.0)
        losses.append(loss * w[j] / len(passes))  # the mean over passes: logs read alike with and without refine
        hit = (lg.argmax(-1) == tg) & keep
        accs.append(hit.sum().float() / keep.sum().clamp(min=1))
    return torch.stack(losses), torch.stack(accs).detach()


class BlockLoss(nn.Module):
    """A block drafter plus its objective as one module (``forward(batch)`` is the whole step's graph, what
    ``accelerate`` wraps)."""

    def __init__(self, drafter: BlockDrafter, decay: float | None = None):
        super().__init__()
        self.drafter, self.decay = drafter, decay

    def forward(self, batch: dict):
        return block_loss(self.drafter.head, batch, self.decay)

