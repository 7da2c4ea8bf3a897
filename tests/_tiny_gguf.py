"""A tiny Llama GGUF written with the ``gguf`` package: the reader's LM path without the 98 MB SmolLM2 file.

The file has SmolLM2's layout (``llama`` architecture, a ``gpt2`` byte-level BPE tokenizer with ChatML
specials, ``<empty_output>`` at id 16 as in SmolLM2), random weights, the embedding quantised to Q8_0 (so
the dequantising path runs) and the rest in F32.
"""

from __future__ import annotations

import numpy as np

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + [f"<special_{i}>" for i in range(3, 16)] + ["<empty_output>"]
MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "o n", "Ġ s", "Ġ w", "r e"]


def _byte_chars() -> list[str]:
    # GPT-2's byte -> printable character map
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]


def write_tiny_llama_gguf(path: str, hidden: int = 64, layers: int = 2, heads: int = 4, kv_heads: int = 2,
                          ffn: int = 128, seed: int = 0) -> list[str]:
    """Write the GGUF to ``path``; returns its token list."""
    import gguf

    tokens = SPECIALS + _byte_chars() + ["".join(m.split()) for m in MERGES]
    types = [gguf.TokenType.CONTROL] * len(SPECIALS) + [gguf.TokenType.NORMAL] * (len(tokens) - len(SPECIALS))
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("tiny-llama")
    w.add_block_count(layers)
    w.add_context_length(512)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))
    w.add_rope_dimension_count(hidden // heads)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(MERGES)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_pad_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template("{% for m in messages %}{{'<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n'}}"
                        "{% endfor %}{% if add_generation_prompt %}{{'<|im_start|>assistant\n'}}{% endif %}")

    def t(*shape):
        return (rng.standard_normal(shape) * 0.1).astype(np.float32)

    emb = t(len(tokens), hidden)
    w.add_tensor("token_embd.weight", gguf.quants.quantize(emb, gguf.GGMLQuantizationType.Q8_0),
                 raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    hd = hidden // heads
    for i in range(layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(hidden, np.float32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(hidden, np.float32))
        w.add_tensor(f"blk.{i}.attn_q.weight", t(hidden, hidden))
        w.add_tensor(f"blk.{i}.attn_k.weight", t(kv_heads * hd, hidden))
        w.add_tensor(f"blk.{i}.attn_v.weight", t(kv_heads * hd, hidden))
        w.add_tensor(f"blk.{i}.attn_output.weight", t(hidden, hidden))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", t(ffn, hidden))
        w.add_tensor(f"blk.{i}.ffn_up.weight", t(ffn, hidden))
        w.add_tensor(f"blk.{i}.ffn_down.weight", t(hidden, ffn))
    w.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tokens
