"""FastMTP: one multi-token-prediction block, shared recursively across ``K`` draft steps (``K = 3`` by default).

FastMTP (Cai et al., arXiv 2509.18362; reference code ``Tencent-BAC/FastMTP``, re-implemented in
``vllm-project/speculators``, ``models/fast_mtp``; Jina-OCR-v1 drafts with it at ``K = 3``) is DeepSeek-V3's MTP
module made recursive. ONE block::

    u  = Linear_2H->H( [RMSNorm_h(h), RMSNorm_e(embed(x))] )
    h' = RMSNorm_final( DecoderLayer(u) )          logits = lm_head(h')

is applied ``K`` times with the same weights: step 1 reads the target's last hidden state ``h_t`` (the state that
produced ``x_{t+1}``) and the embedding of ``x_{t+1}``, and predicts ``x_{t+2}``; step ``k`` reads the block's own
``h'`` of step ``k - 1`` and the previous draft token. ``embed`` and ``lm_head`` are frozen copies of the target's.

What it shares with the EAGLE head (:class:`~mmspec.drafters.eagle.EagleDrafter`, of which it is a subclass):
the input indexing (input ``i`` is token ``x_i`` with the state of position ``i - 1``, so EAGLE's run-time state,
per-row KV cache, chain / EAGLE-2 tree drafting, sampled chains with ``q``, confidence stop, saving with the
target's fingerprint and the factory's options all apply unchanged). What differs, and why:

* it reads ONE target layer, the last (``hidden_states[L]``), with no ``Linear(3H -> H)`` fusion: an MTP module
  continues the target's final representation, which is what its next-token head was trained on;
* the state and the token embedding each get their own RMSNorm before the ``2H -> H`` projection (MTP's input;
  EAGLE feeds the raw embedding beside its fused feature), so the target's state and the block's own output,
  which the same input reads at different steps, arrive on one scale;
* the state carried to the next step is the block's output AFTER its final norm, the very vector the LM head
  reads (FastMTP's ``MTPBlock`` returns it); EAGLE carries the pre-norm layer output;
* training weights the steps with FastMTP's ``beta``-decay (:mod:`mmspec.drafters.fastmtp.train`), where EAGLE
  sums its unrolled steps.

Left out: FastMTP's frequency-restricted draft vocabulary (FR-Spec), which pays at 150k tokens, not at the
testbed's 1,024.

Example:
    >>> d = FastMTPDrafter.from_target(model)                                      # doctest: +SKIP
    >>> mmspec.generate(model, inputs, drafter=d, max_new_tokens=64)               # doctest: +SKIP
    >>> d.save_pretrained("fastmtp-head"); make_drafter("fastmtp:fastmtp-head", model)  # doctest: +SKIP
"""

from __future__ import annotations

import torch
from torch import nn

from ..eagle import EagleDrafter, _eagle_spec_factory, _RMSNorm

__all__ = ["FastMTPDrafter", "fastmtp_factory"]


class FastMTPDrafter(EagleDrafter):
    """The FastMTP head (see the module docstring). Arguments as :class:`~mmspec.drafters.eagle.EagleDrafter`,
    except that ``layer_ids`` names one layer (the target's last, from :meth:`from_target`) and the draft depth
    ``num_draft_tokens`` (FastMTP's ``K``) defaults to 3.

    Example:
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> t = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
        ...                      num_hidden_layers=2, num_attention_heads=2))
        >>> d = FastMTPDrafter.from_target(t)
        >>> d.kind, d.hidden_layers, d.num_draft_tokens, d.fingerprint["layer_ids"]
        ('fastmtp', (2,), 3, [2])
    """

    kind = "fastmtp"
    num_read_layers = 1

    def __init__(self, hidden_size: int, vocab_size: int, layer_ids=(1,), num_draft_tokens: int = 3, **kw):
        super().__init__(hidden_size, vocab_size, layer_ids=layer_ids, num_draft_tokens=num_draft_tokens, **kw)

    def _build_input(self) -> None:
        H = self.hidden_size
        self.hidden_norm = _RMSNorm(H, self.rms_eps)
        self.token_norm = _RMSNorm(H, self.rms_eps)
        self.fc = nn.Linear(2 * H, H, bias=False)

    @classmethod
    def from_target(cls, target, tokenizer=None, layer_ids=None, seed: int | None = None, **kw) -> "FastMTPDrafter":
        """A fresh head for ``target`` reading its last hidden state (``layer_ids=(L,)``), embeddings and LM head
        copied in (see :meth:`EagleDrafter.from_target <mmspec.drafters.eagle.EagleDrafter.from_target>`)."""
        if layer_ids is None:
            layer_ids = (int(target.config.get_text_config(decoder=True).num_hidden_layers),)
        return super().from_target(target, tokenizer, layer_ids=layer_ids, seed=seed, **kw)

    def fuse_features(self, per_layer: list) -> torch.Tensor:
        """The target's last-layer state itself (no fusion; it is normalised inside :meth:`forward`)."""
        (h,) = per_layer
        return h.to(self.fc.weight.dtype)

    def forward(self, tokens, features, positions, allowed, past_k=None, past_v=None, start=None, logits_at=None):
        """One pass of the shared block: as :meth:`EagleDrafter.forward <mmspec.drafters.eagle.EagleDrafter.forward>`,
        but ``features`` is a state (the target's last layer, or the block's own output of the step before) and
        the returned hidden state is the post-norm output the LM head reads, which the next step takes in."""
        x = self.fc(torch.cat([self.hidden_norm(features), self.token_norm(self.embed_tokens(tokens))], dim=-1))
        h, k, v = self.layer(x, positions, allowed, past_k, past_v, start)
        out = self.norm(h)
        return self.lm_head(out if logits_at is None else out[logits_at]).float(), out, k, v


def fastmtp_factory(target_model, path=None, untrained=False, **options):
    """What the registry calls for ``"fastmtp..."``: ``"fastmtp:DIR"`` loads a saved head (fingerprint checked, the
    target's dtype); ``"fastmtp"`` alone the one that ships for the target, if any; ``"fastmtp;untrained=true"`` a
    random head (tests). Run options as EAGLE's: ``num_draft_tokens`` (K), ``topk`` / ``tree_nodes`` (an
    EAGLE-2-style tree instead of the chain), ``min_confidence``, ``dtype``.

    Example:
        >>> fastmtp_factory(None)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        mmspec.errors.InvalidInputError: 'fastmtp' names no trained head: none ships for this target; ...
    """
    return _eagle_spec_factory(target_model, path=path, untrained=untrained, cls=FastMTPDrafter, **options)
