"""transformers' Janus in image mode as a plain causal LM over ``[text tokens | image codes]``, so its image
generation goes through the same speculative loop (:func:`mmspec.generate`, SJD, the relaxed rules) as the llama
generator.

Janus generates images with parts its text ``forward`` does not use: image codes enter through
``generation_embeddings`` and ``generation_aligner`` and leave through ``generation_head``, on the same language
model. :class:`JanusImageLM` wraps a loaded ``JanusForConditionalGeneration`` (no copied modeling code, the same
weights): token ``t < V`` (the text vocabulary) is embedded as text, ``V + c`` as image code ``c``, and its logits
are ``generation_head`` over the codes behind ``V`` text slots that are never chosen (``-inf``), which is what
``generation_config.image_code_offset = V`` tells the image pipeline. Guidance is the pipeline's doubled batch with
Janus's own unconditional rows (every prompt token but ``<bos>`` / ``<boi>`` padded) and its
``ClassifierFreeGuidanceLogitsProcessor`` formula ``u + s (c - u)`` on the raw scores, before temperature and top-k.

Example:
    >>> lm = JanusImageLM(janus_model)                                             # doctest: +SKIP
    >>> codes, stats = speculative_codes(lm, ids, mask, tok, 576, "sjd", cfg_scale=5.0, seed=0)  # doctest: +SKIP
"""

from __future__ import annotations

import copy

import torch
from transformers import GenerationConfig, GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

__all__ = ["JanusImageLM"]


class JanusImageLM(PreTrainedModel, GenerationMixin):
    """A Janus model's image mode as a causal LM (module docstring). ``janus``: a loaded
    ``JanusForConditionalGeneration``; the wrapper shares its modules and adds no weights.

    Example:
        >>> JanusImageLM(janus_model).generation_config.image_code_offset               # doctest: +SKIP
        102400
    """

    _supports_sdpa = True
    _supports_attention_backend = True

    def __init__(self, janus):
        text = copy.deepcopy(janus.config.text_config)
        self.text_vocab = int(text.vocab_size)
        self.n_codes = int(janus.config.vq_config.num_embeddings)
        text.vocab_size = self.text_vocab + self.n_codes
        super().__init__(text)
        self.config._attn_implementation = janus.config.text_config._attn_implementation
        self.janus = janus
        gc = janus.generation_config
        self.generation_config = GenerationConfig(bos_token_id=gc.bos_token_id, pad_token_id=gc.pad_token_id,
                                                  eos_token_id=None)
        self.generation_config.image_code_offset = self.text_vocab

    @property
    def device(self):
        return self.janus.device

    @property
    def dtype(self):
        return self.janus.dtype

    def get_input_embeddings(self):
        return self.janus.get_input_embeddings()

    def get_output_embeddings(self):
        return None

    def _embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        codes = input_ids >= self.text_vocab
        text = self.janus.get_input_embeddings()(input_ids.clamp(max=self.text_vocab - 1))
        if not bool(codes.any()):
            return text
        image = self.janus.prepare_embeddings_for_image_generation((input_ids - self.text_vocab).clamp(min=0))
        return torch.where(codes[..., None], image.to(text.dtype), text)

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None, use_cache=None,
                logits_to_keep: int = 0, output_hidden_states=None, return_dict=True, **kwargs):
        out = self.janus.model.language_model(inputs_embeds=self._embed(input_ids), attention_mask=attention_mask,
                                              position_ids=position_ids, cache=cache, use_cache=use_cache,
                                              output_hidden_states=output_hidden_states, **kwargs)
        hidden = out.last_hidden_state
        if logits_to_keep:
            hidden = hidden[:, -logits_to_keep:]
        scores = self.janus.model.generation_head(hidden).float()
        text = torch.full((*scores.shape[:-1], self.text_vocab), float("-inf"), dtype=scores.dtype,
                          device=scores.device)
        return CausalLMOutputWithPast(logits=torch.cat([text, scores], dim=-1), cache=out.cache,
                                      hidden_states=out.hidden_states)
