"""Tiny, randomly initialised fp32 models of real Hugging Face architectures, and processor-shaped inputs.

Everything is built locally from configs (no download). Each builder returns an ``Arch`` holding the
target, a smaller draft model of the same architecture and vocabulary, and a function that makes the
inputs the model's processor would give (left padding, ``attention_mask`` zeros on the left, the right
number of image tokens, ``pixel_values`` from the model's real image-processor class).

Weights are drawn with ``initializer_range=0.2`` (not the HF default 0.02) so the tiny models' logits
are far from uniform: greedy decisions are then decided by clear margins, not by float noise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

VOCAB = 128
PAD, BOS, EOS = 0, 1, 2
IMAGE = VOCAB - 1  # image placeholder token id, inside the vocabulary
FAKE_AROUND_IMAGE = VOCAB - 2  # Idefics3 "<fake_token_around_image>"
GLOBAL_IMG = VOCAB - 3  # Idefics3 "<global-img>"
TEXT_LOW, TEXT_HIGH = 3, 48  # prompt text tokens are drawn from a small range so n-grams repeat
INIT = 0.2

# Unequal text lengths of the batch-4 prompts (row 1 is the longest, so rows 0, 2, 3 are left-padded).
TEXT_LENGTHS_B4 = (7, 13, 4, 10)
TEXT_LENGTHS_B1 = (9,)


@dataclass
class Arch:
    name: str
    model: torch.nn.Module
    draft: torch.nn.Module
    make_inputs: Callable[[int], dict]  # batch size -> processor-shaped inputs
    vocab_size: int = VOCAB


def _seeded(seed: int, build):
    torch.manual_seed(seed)
    return build().eval()


def _truncated_draft(target: torch.nn.Module, build_small) -> torch.nn.Module:
    """A smaller model of the target's architecture (fewer text layers, same vocab) that shares the target's
    embeddings, first layers, vision tower and head, so it agrees with the target often enough for drafts to be
    accepted (an independent random draft model would almost never be)."""
    torch.manual_seed(12345)
    small = build_small().eval()
    missing, _unexpected = small.load_state_dict(target.state_dict(), strict=False)
    assert not missing, f"draft model weights not covered by the target: {missing}"
    return small


def _llama_text(hidden: int, layers: int, heads: int = 4, kv: int = 2, **extra):
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                       num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=1024,
                       pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS, initializer_range=INIT, **extra)


def _text_rows(batch: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    lengths = TEXT_LENGTHS_B1 if batch == 1 else TEXT_LENGTHS_B4[:batch]
    return [rng.integers(TEXT_LOW, TEXT_HIGH, n).tolist() for n in lengths]


def left_pad(rows: list[list[int]], extra: dict | None = None) -> dict:
    """``input_ids``/``attention_mask`` as a tokenizer with ``padding_side='left'`` gives them.

    ``extra`` maps a key to per-row lists aligned with ``rows`` (e.g. ``token_type_ids``), padded with 0.
    """
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), PAD, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    out = {"input_ids": ids, "attention_mask": mask}
    for k in extra or {}:
        out[k] = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(r)
        mask[i, width - len(r):] = 1
        for k, vals in (extra or {}).items():
            out[k][i, width - len(r):] = torch.tensor(vals[i])
    return out


def _images(n: int, seed: int):
    from PIL import Image

    rng = np.random.default_rng(seed)
    sizes = [(40, 30), (28, 50), (64, 64), (33, 29), (50, 41)]
    return [Image.fromarray(rng.integers(0, 256, (sizes[i % 5][1], sizes[i % 5][0], 3), dtype=np.uint8))
            for i in range(n)]


# ---------------------------------------------------------------- Qwen2 (text)
def qwen2_text(attn_implementation: str = "sdpa", seed: int = 0) -> Arch:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    def cfg(hidden, layers):
        return Qwen2Config(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                           pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS, initializer_range=INIT,
                           tie_word_embeddings=False, attn_implementation=attn_implementation)

    model = _seeded(seed, lambda: Qwen2ForCausalLM(cfg(64, 2)))
    draft = _truncated_draft(model, lambda: Qwen2ForCausalLM(cfg(64, 1)))

    def make_inputs(batch: int, seed: int = 0) -> dict:
        return left_pad([[BOS] + r for r in _text_rows(batch, seed)])

    return Arch(f"qwen2-{attn_implementation}", model, draft, make_inputs)


# ---------------------------------------------------------------- LLaVA (CLIP vision + Llama)
LLAVA_IMAGE_SIZE, LLAVA_PATCH = 28, 7  # 16 patches; the "default" strategy drops CLS: 16 image tokens


def llava(seed: int = 0) -> Arch:
    from transformers import CLIPImageProcessor, CLIPVisionConfig, LlavaConfig, LlavaForConditionalGeneration

    def cfg(hidden, layers, vhidden):
        vision = CLIPVisionConfig(hidden_size=vhidden, intermediate_size=2 * vhidden, num_hidden_layers=2,
                                  num_attention_heads=4, image_size=LLAVA_IMAGE_SIZE, patch_size=LLAVA_PATCH,
                                  projection_dim=vhidden, initializer_range=INIT)
        return LlavaConfig(vision_config=vision, text_config=_llama_text(hidden, layers), image_token_id=IMAGE,
                           image_seq_length=(LLAVA_IMAGE_SIZE // LLAVA_PATCH) ** 2, vision_feature_layer=-2,
                           vision_feature_select_strategy="default", projector_hidden_act="gelu")

    model = _seeded(seed, lambda: LlavaForConditionalGeneration(cfg(64, 2, 32)))
    draft = _truncated_draft(model, lambda: LlavaForConditionalGeneration(cfg(64, 1, 32)))
    n_img = model.config.image_seq_length
    processor = CLIPImageProcessor(size={"shortest_edge": LLAVA_IMAGE_SIZE},
                                   crop_size={"height": LLAVA_IMAGE_SIZE, "width": LLAVA_IMAGE_SIZE})

    def make_inputs(batch: int, seed: int = 0) -> dict:
        # LlavaProcessor: "<image>" expands to image_seq_length tokens; bos first.
        rows = [[BOS] + [IMAGE] * n_img + r for r in _text_rows(batch, seed)]
        out = left_pad(rows)
        out["pixel_values"] = processor(_images(batch, seed), return_tensors="pt")["pixel_values"]
        return out

    return Arch("llava", model, draft, make_inputs)


# ---------------------------------------------------------------- Idefics3 / SmolVLM
IDEFICS_IMAGE_SIZE, IDEFICS_PATCH, IDEFICS_SCALE = 32, 4, 2  # 64 patches / scale^2 = 16 image tokens per image


def idefics3(seed: int = 0) -> Arch:
    from transformers import (Idefics3Config, Idefics3ForConditionalGeneration, Idefics3ImageProcessor,
                              Idefics3VisionConfig)

    def cfg(hidden, layers, vhidden):
        vision = Idefics3VisionConfig(hidden_size=vhidden, intermediate_size=2 * vhidden, num_hidden_layers=2,
                                      num_attention_heads=4, image_size=IDEFICS_IMAGE_SIZE, patch_size=IDEFICS_PATCH,
                                      initializer_range=INIT)
        return Idefics3Config(vision_config=vision, text_config=_llama_text(hidden, layers), image_token_id=IMAGE,
                              scale_factor=IDEFICS_SCALE, pad_token_id=PAD)

    model = _seeded(seed, lambda: Idefics3ForConditionalGeneration(cfg(64, 2, 32)))
    draft = _truncated_draft(model, lambda: Idefics3ForConditionalGeneration(cfg(64, 1, 32)))
    seq = (IDEFICS_IMAGE_SIZE // IDEFICS_PATCH) ** 2 // IDEFICS_SCALE**2
    processor = Idefics3ImageProcessor(do_image_splitting=False, size={"longest_edge": IDEFICS_IMAGE_SIZE},
                                       max_image_size={"longest_edge": IDEFICS_IMAGE_SIZE})

    def image_block() -> list[int]:
        # Idefics3Processor without splitting: <fake><global-img><image>*seq<fake>
        return [FAKE_AROUND_IMAGE, GLOBAL_IMG] + [IMAGE] * seq + [FAKE_AROUND_IMAGE]

    def make_inputs(batch: int, seed: int = 0) -> dict:
        # At batch 4 the first row holds two images (the processor pads the others with an all-zero image).
        n_images = [2] + [1] * (batch - 1) if batch > 1 else [1]
        texts = _text_rows(batch, seed)
        rows = [[BOS] + image_block() * k + t for k, t in zip(n_images, texts)]
        out = left_pad(rows)
        imgs = _images(sum(n_images), seed)
        nested, i = [], 0
        for k in n_images:
            nested.append(imgs[i: i + k])
            i += k
        proc = processor(nested, return_tensors="pt")
        out["pixel_values"] = proc["pixel_values"]
        out["pixel_attention_mask"] = proc["pixel_attention_mask"]
        return out

    return Arch("idefics3", model, draft, make_inputs)


# ---------------------------------------------------------------- PaliGemma (SigLIP + Gemma)
PALI_IMAGE_SIZE, PALI_PATCH = 28, 7  # 16 image tokens
NEWLINE = 3  # PaliGemmaProcessor appends "\n" after the prompt
# Gemma scales embeddings by sqrt(hidden); a random tiny Gemma at smaller init repeats one token forever, which
# would leave every drafter trivially right. 0.3 gives varied text with clear greedy margins.
GEMMA_INIT = 0.3


def paligemma(seed: int = 0) -> Arch:
    from transformers import (GemmaConfig, PaliGemmaConfig, PaliGemmaForConditionalGeneration, SiglipImageProcessor,
                              SiglipVisionConfig)

    def cfg(hidden, layers, vhidden):
        vision = SiglipVisionConfig(hidden_size=vhidden, intermediate_size=2 * vhidden, num_hidden_layers=2,
                                    num_attention_heads=4, image_size=PALI_IMAGE_SIZE, patch_size=PALI_PATCH,
                                    vision_use_head=False)
        text = GemmaConfig(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                           num_attention_heads=4, num_key_value_heads=1, head_dim=hidden // 4,
                           max_position_embeddings=1024, pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS,
                           initializer_range=GEMMA_INIT)
        return PaliGemmaConfig(vision_config=vision, text_config=text, image_token_id=IMAGE, vocab_size=VOCAB,
                               projection_dim=hidden, hidden_size=hidden, pad_token_id=PAD)

    model = _seeded(seed, lambda: PaliGemmaForConditionalGeneration(cfg(64, 2, 32)))
    draft = _truncated_draft(model, lambda: PaliGemmaForConditionalGeneration(cfg(64, 1, 32)))
    n_img = model.config.text_config.num_image_tokens
    processor = SiglipImageProcessor(size={"height": PALI_IMAGE_SIZE, "width": PALI_IMAGE_SIZE})

    def make_inputs(batch: int, seed: int = 0) -> dict:
        # PaliGemmaProcessor (no suffix): <image>*n + <bos> + prompt + "\n"; token_type_ids 0 over the prefix.
        rows = [[IMAGE] * n_img + [BOS] + [t if t != NEWLINE else NEWLINE + 1 for t in r] + [NEWLINE]
                for r in _text_rows(batch, seed)]
        out = left_pad(rows, extra={"token_type_ids": [[0] * len(r) for r in rows]})
        out["pixel_values"] = processor(_images(batch, seed), return_tensors="pt")["pixel_values"]
        return out

    return Arch("paligemma", model, draft, make_inputs)


BUILDERS = {
    "qwen2": lambda: qwen2_text("sdpa"),
    "qwen2-eager": lambda: qwen2_text("eager"),
    "llava": llava,
    "idefics3": idefics3,
    "paligemma": paligemma,
}
