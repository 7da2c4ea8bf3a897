"""A lean forward of Qwen2-style decoder stacks: the layers' own weights through the same ops, without the
transformers call stack.

On a small model the forward's Python (``Module.__call__``, the decorators, the mask and rotary set-up of every
call, the cache's bookkeeping) costs as much as its matmuls: in a FlashDrive tick's decode stage (the 4-layer VLA,
bf16, ``results/drivers/drive-sim``'s profile map) 2.7 ms of Python against 1.7 ms of matmul and attention.
:func:`run_layers` runs what ``Qwen2DecoderLayer`` / ``Qwen2VLDecoderLayer`` / ``LlamaDecoderLayer`` run (RMSNorm
with float32 statistics, the q/k/v projections, rotate-half RoPE with the cos/sin the model's own ``rotary_emb``
gives, SDPA dispatched as transformers dispatches it, the SiLU MLP, the residuals) in the same order and dtypes, so
the numbers are the model's bit for bit (tested against the modules in float32 and bfloat16). :class:`LeanForward` wraps it as a
language model pass over a ``DynamicCache`` (the target's verify pass, a streamed prefill); :func:`why_not` says
when a model's layers are not ones it runs (then the model's own forward runs).

Example:
    >>> lean = LeanForward(model)                                                       # doctest: +SKIP
    >>> out = lean(input_ids, position_ids=pos, attention_mask=mask4d, cache=cache)    # doctest: +SKIP
    >>> out.logits.shape                                                                # doctest: +SKIP
    torch.Size([1, 5, 49152])
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

try:  # transformers' own SDPA dispatch helpers: lean attends exactly as the model does
    from transformers.integrations import sdpa_attention as _sdpa

    if not all(hasattr(_sdpa, n) for n in ("use_gqa_in_sdpa", "pack_gqa", "repeat_kv")):
        _sdpa = None
except ImportError:  # pragma: no cover - transformers is a dependency
    _sdpa = None

__all__ = ["LeanForward", "LeanOutput", "run_layers", "rms_norm", "why_not", "replaced_forwards", "LEAN_LAYERS"]

# Decoder layers whose forward run_layers reproduces (checked op for op against transformers 5.25's modelling code).
LEAN_LAYERS = ("Qwen2DecoderLayer", "Qwen2VLDecoderLayer", "LlamaDecoderLayer")


def rms_norm(h: torch.Tensor, norm) -> torch.Tensor:
    """``Qwen2RMSNorm.forward`` inline: float32 statistics, the weight applied in the input's dtype.

    Example:
        >>> n = torch.nn.RMSNorm(4); n.variance_epsilon = 0.0
        >>> rms_norm(torch.full((1, 4), 3.0), n).tolist()
        [[1.0, 1.0, 1.0, 1.0]]
    """
    x = h.to(torch.float32)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    return norm.weight * x.to(h.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _text_model(model):
    """The decoder stack (``layers``, ``norm``, ``rotary_emb``, ``embed_tokens``) of a causal LM or a VLM."""
    inner = getattr(model, "model", model)
    for name in ("language_model", "text_model"):  # Qwen2-VL / LLaVA; Idefics3 / SmolVLM
        if isinstance(getattr(inner, name, None), torch.nn.Module):
            return getattr(inner, name)
    return inner


_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def why_not(model) -> str:
    """``""`` when :class:`LeanForward` (and :func:`run_layers`) can run ``model``'s decoder stack (a causal LM, a
    VLM, or the stack itself), else why not.

    Example:
        >>> why_not(torch.nn.Linear(2, 2))
        'no decoder layers'
    """
    dec = _text_model(model)
    layers = getattr(dec, "layers", None)
    if layers is None or len(layers) == 0:
        return "no decoder layers"
    kinds = {type(layer).__name__ for layer in layers}
    if not kinds <= set(LEAN_LAYERS) or any(not type(layer).__module__.startswith("transformers.models.")
                                            for layer in layers):
        return f"layers {sorted(kinds)} are not transformers' {list(LEAN_LAYERS)}"
    cfg = dec.config
    if (cfg._attn_implementation or "sdpa") != "sdpa":
        return f"attention {cfg._attn_implementation!r}, not sdpa"
    if any(t != "full_attention" for t in getattr(cfg, "layer_types", None) or ["full_attention"]):
        return "sliding-window layers"
    if cfg.hidden_act != "silu":
        return f"activation {cfg.hidden_act!r}, not silu"
    if getattr(cfg, "pretraining_tp", 1) != 1 or getattr(cfg, "mlp_bias", False):
        return "tensor-parallel or biased MLP"
    if getattr(cfg, "tie_last_hidden_states", True) is False:
        return "the last hidden state is not tied to the normed output"
    if dec.training and getattr(cfg, "attention_dropout", 0.0):
        return "training with attention dropout"
    if replaced_forwards(model):
        return "hub kernels replace the layers' forwards"
    if _sdpa is None:
        return "this transformers has no pack_gqa / use_gqa_in_sdpa (its SDPA dispatch is not the one copied here)"
    head = getattr(model, "lm_head", None)
    if head is not None and type(head) is not torch.nn.Linear:
        return "the language head is not a plain Linear"
    for layer in layers:  # the weights are read directly: a wrapped projection (an adapter) or a hook would be skipped
        mods = [getattr(layer.self_attn, n, None) for n in _PROJECTIONS[:4]] + \
               [getattr(layer.mlp, n, None) for n in _PROJECTIONS[4:]]
        if any(type(m) is not torch.nn.Linear for m in mods):
            return "a projection is not a plain Linear (an adapter or a quantised layer)"
        if any(hasattr(m, "_hf_hook") for m in mods + [layer]):  # accelerate's (transformers' own only record)
            return "accelerate hooks on the layers (device map or offloading)"
    return ""


def replaced_forwards(model, allowed=()) -> list:
    """The modules of ``model`` (and the kernel functions they hold) whose forward was replaced on the instance, other
    than those in ``allowed`` (ids): what a lean forward, which runs the layers' own ops, would skip.

    Why not ``model.use_kernels``: transformers 5.25 kernelizes every ``from_pretrained`` model where the ``kernels``
    package is installed, but a layer keeps its own forward where no hub kernel exists for the device (on CPU, all of
    them); ``kernels`` marks a replaced one with an instance ``forward`` (and ``_kernel_repo``).

    Example:
        >>> m = torch.nn.Sequential(torch.nn.Linear(2, 2)); replaced_forwards(m)
        []
        >>> m[0].forward = lambda x: x; replaced_forwards(m)
        ['0']
    """
    out = []
    for name, mod in model.named_modules():
        held = [(name, mod)] + [(f"{name}.{k}", f) for k, f in (vars(mod).get("_kernel_funcs") or {}).items()]
        out += [n for n, m in held if id(m) not in allowed and ("forward" in vars(m) or "_kernel_repo" in vars(m))]
    return out


def _attend(a, q, keys, values, mask, is_causal: bool) -> torch.Tensor:
    """SDPA as transformers' ``sdpa_attention_forward`` dispatches it (its own helpers, the same branches: key/value
    heads inside SDPA where ``use_gqa_in_sdpa`` says so, a single masked query's heads packed, K/V repeated
    otherwise), so the kernel path and its roundings are the model's. Returns ``[B, n, heads * D]``."""
    B, n = q.shape[0], q.shape[2]
    g, kw = a.num_key_value_groups, {}
    if g > 1:
        if _sdpa.use_gqa_in_sdpa(mask, keys, values):
            kw["enable_gqa"] = True
        elif n == 1:
            q, mask = _sdpa.pack_gqa(q, g), _sdpa.pack_gqa(mask, g)
        else:
            keys, values = _sdpa.repeat_kv(keys, g), _sdpa.repeat_kv(values, g)
    o = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, dropout_p=0.0, scale=a.scaling,
                                       is_causal=is_causal, **kw)
    o = o.reshape(o.shape[0], -1, n, values.shape[-1]).transpose(1, 2).contiguous()
    return o.reshape(B, n, -1).contiguous()


def run_layers(layers, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask, kv, hidden: list | None = None,
               is_causal: bool = False):
    """``h[B, n, H]`` through decoder ``layers``; returns the last layer's output (before the final norm).

    ``cos``/``sin``: ``[B, 1, n, D]`` (the model's ``rotary_emb`` at the tokens' positions, unsqueezed for the heads);
    ``mask``: ``None`` (every key visible; ``is_causal``: causal, for a pass over an empty cache, as transformers
    runs it) or a boolean / additive ``[B, 1, n, L]`` mask over all ``L`` keys;
    ``kv(i, k, v)`` takes layer ``i``'s new keys/values ``[B, Hkv, n, D]`` (rotated) and returns that layer's full
    keys/values (a cache's update, or a buffer written in place). ``hidden`` (a list) gets each layer's input,
    as ``hidden_states`` lists them.

    Example:
        >>> h = run_layers(model.model.layers, h, cos, sin, None, lambda i, k, v: cache.layers[i].update(k, v))  # doctest: +SKIP
    """
    B, n = h.shape[0], h.shape[1]
    for i, layer in enumerate(layers):
        if hidden is not None:
            hidden.append(h)
        a, mlp = layer.self_attn, layer.mlp
        D = a.head_dim
        x = rms_norm(h, layer.input_layernorm)
        q = F.linear(x, a.q_proj.weight, a.q_proj.bias).view(B, n, -1, D).transpose(1, 2)
        k = F.linear(x, a.k_proj.weight, a.k_proj.bias).view(B, n, -1, D).transpose(1, 2)
        v = F.linear(x, a.v_proj.weight, a.v_proj.bias).view(B, n, -1, D).transpose(1, 2)
        q = (q * cos) + (_rotate_half(q) * sin)
        k = (k * cos) + (_rotate_half(k) * sin)
        keys, values = kv(i, k, v)
        o = _attend(a, q, keys, values, mask, is_causal)
        h = h + F.linear(o, a.o_proj.weight, a.o_proj.bias)
        x = rms_norm(h, layer.post_attention_layernorm)
        h = h + F.linear(F.silu(F.linear(x, mlp.gate_proj.weight)) * F.linear(x, mlp.up_proj.weight),
                         mlp.down_proj.weight)
    return h


@dataclass
class LeanOutput:
    """What :class:`LeanForward` returns: ``logits`` (``None`` without ``lm_head``), ``last_hidden_state`` (after
    the final norm) and ``hidden_states`` (embeddings, each layer's output, the last one normed, as transformers
    lists them; empty unless asked)."""

    logits: torch.Tensor | None
    last_hidden_state: torch.Tensor
    hidden_states: tuple = ()


class LeanForward:
    """A causal LM's (or a VLM's language model's) forward over new tokens and a ``DynamicCache``, through
    :func:`run_layers`: the same numbers as ``model(...)`` without its call stack.

    Takes the pass's full inputs (no guessing): ``position_ids`` (``[B, n]``, or M-RoPE ``[3, B, n]`` / ``[4, B, n]``
    whose first row is dropped as transformers does) and a 4-D ``attention_mask`` ``[B, 1, n, L + n]`` over the
    cache and the new tokens (``None``: the new tokens see the whole cache and each other causally). The cache's
    layers get the new keys/values appended, as the model's own forward would.

    Example:
        >>> lean = LeanForward(model)                                                         # doctest: +SKIP
        >>> lean(ids, position_ids=pos, attention_mask=None, cache=cache).logits.shape        # doctest: +SKIP
        torch.Size([1, 3, 49152])
    """

    def __init__(self, model):
        why = why_not(model)
        if why:
            from .errors import UnsupportedModelError

            raise UnsupportedModelError(f"the lean forward cannot run {type(model).__name__}: {why}")
        self.dec = _text_model(model)
        self.lm_head = getattr(model, "lm_head", None)

    def __call__(self, input_ids=None, *, position_ids, attention_mask, cache, inputs_embeds=None,
                 output_hidden_states: bool = False, logits: bool = True) -> LeanOutput:
        dec = self.dec
        h = dec.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        B, n = h.shape[0], h.shape[1]
        pos = position_ids
        if pos.ndim == 3 and pos.shape[0] == 4:  # packed text positions first (transformers drops them here too)
            pos = pos[1:]
        cos, sin = dec.rotary_emb(h, pos)
        mask = attention_mask
        past = cache.get_seq_length()
        causal = mask is None and n > 1 and past == 0  # transformers drops the mask there: SDPA's is_causal
        if mask is None and n > 1 and past:  # causal among the new tokens, everything cached visible
            i = torch.arange(n, device=h.device)
            mask = torch.cat([torch.ones(n, past, dtype=torch.bool, device=h.device), i[None, :] <= i[:, None]],
                             dim=1)[None, None]
        hidden = [] if output_hidden_states else None

        def kv(i, k, v):
            return cache.update(k, v, i)

        h = run_layers(dec.layers, h, cos.unsqueeze(1), sin.unsqueeze(1), mask, kv, hidden, is_causal=causal)
        if hidden is not None:
            hidden.append(h)
        last = rms_norm(h, dec.norm)
        if hidden is not None:
            hidden[-1] = last  # transformers ties the last entry to the normed output
        out = F.linear(last, self.lm_head.weight, self.lm_head.bias) if logits and self.lm_head is not None else None
        return LeanOutput(out, last, tuple(hidden) if hidden is not None else ())
