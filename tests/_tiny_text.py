"""A tiny Llama with a word-level tokenizer built on the spot (no downloads)."""

from __future__ import annotations

import torch

WORDS = ("the a of and to in is it that on was for with as by at from this be or an are not have but "
         "stop end chart value total page table row column figure text line done ok yes no red blue").split()


def tokenizer(vocab_size: int = 200):
    """A byte-level BPE trained on the word list (subword tokens, so stop strings can overhang tokens)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<pad>", "</s>", "<s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    text = [" ".join(WORDS[i:] + WORDS[:i]) for i in range(len(WORDS))]
    tok.train_from_iterator(text, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", bos_token="<s>",
                                  padding_side="left")


def model(vocab_size: int, hidden: int = 48, layers: int = 2, seed: int = 0, std: float = 0.08):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=256, pad_token_id=0, eos_token_id=1, bos_token_id=2,
                      initializer_range=std)
    m = LlamaForCausalLM(cfg).eval()
    m.generation_config.pad_token_id = 0
    return m
