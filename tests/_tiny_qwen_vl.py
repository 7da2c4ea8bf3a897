"""Tiny randomly initialised Qwen2-VL / Qwen2.5-VL / Qwen3-VL models and processor-shaped inputs.

Inputs are built the way the Qwen processors build them: the real image processor gives
``pixel_values`` and ``image_grid_thw``; ``input_ids`` hold ``<vision_start> <image_pad> * n <vision_end>``
with ``n = t * h * w / merge**2``; ``mm_token_type_ids`` marks image tokens with 1; batches are left-padded.
"""

from __future__ import annotations

import numpy as np
import torch

VOCAB = 160
PAD, EOS, BOS = 0, 1, 2
VISION_START, VISION_END, IMAGE, VIDEO = 150, 151, 152, 153
FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")


def _text(hidden=64, layers=2, heads=4, kv=2, vocab=VOCAB, family="qwen2_vl"):
    cfg = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
               num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=1024,
               pad_token_id=PAD, eos_token_id=EOS, bos_token_id=BOS, initializer_range=0.05)
    half = hidden // heads // 2
    sec = [half - 2 * (half // 3), half // 3, half // 3]
    cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": sec}
    if family == "qwen3_vl":
        cfg["head_dim"] = hidden // heads
        cfg["rope_parameters"]["mrope_interleaved"] = True
    return cfg


def build(family: str, hidden: int = 64, layers: int = 2, seed: int = 0):
    """A tiny fp32 model of ``family`` in eval mode."""
    torch.manual_seed(seed)
    ids = dict(image_token_id=IMAGE, video_token_id=VIDEO, vision_start_token_id=VISION_START,
               vision_end_token_id=VISION_END)
    if family == "qwen2_vl":
        from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration as M
        vis = dict(depth=1, embed_dim=32, hidden_size=hidden, num_heads=2, patch_size=14, spatial_merge_size=2,
                   temporal_patch_size=2, mlp_ratio=2)
        cfg = Qwen2VLConfig(text_config=_text(hidden, layers, family=family), vision_config=vis, **ids)
    elif family == "qwen2_5_vl":
        from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration as M
        vis = dict(depth=1, hidden_size=32, out_hidden_size=hidden, intermediate_size=64, num_heads=2,
                   patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=56,
                   fullatt_block_indexes=[0])
        cfg = Qwen2_5_VLConfig(text_config=_text(hidden, layers, family=family), vision_config=vis, **ids)
    elif family == "qwen3_vl":
        from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration as M
        vis = dict(depth=2, hidden_size=32, out_hidden_size=hidden, intermediate_size=64, num_heads=2,
                   patch_size=16, spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=64,
                   deepstack_visual_indexes=[0])
        cfg = Qwen3VLConfig(text_config=_text(hidden, layers, family=family), vision_config=vis, **ids)
    else:
        raise ValueError(family)
    model = M(cfg).eval()
    model.generation_config.pad_token_id = PAD
    model.generation_config.eos_token_id = EOS
    return model


def image_processor(family: str):
    if family == "qwen3_vl":
        from transformers import Qwen2VLImageProcessor
        return Qwen2VLImageProcessor(patch_size=16, merge_size=2, temporal_patch_size=2,
                                     min_pixels=32 * 32, max_pixels=64 * 64)
    from transformers import Qwen2VLImageProcessor
    return Qwen2VLImageProcessor(patch_size=14, merge_size=2, temporal_patch_size=2,
                                 min_pixels=28 * 28, max_pixels=56 * 56)


def make_inputs(family: str, prompts: list[dict], seed: int = 0) -> dict:
    """Left-padded batch; each prompt is ``{"pre": n, "images": [(h, w), ...], "post": m}``.

    Text tokens are random ids; a prompt can repeat a span of itself (``"repeat": True``) so lookup has
    something to find.
    """
    from PIL import Image

    rng = np.random.default_rng(seed)
    proc = image_processor(family)
    rows, types, pixels, grids = [], [], [], []
    for p in prompts:
        ids, tt = [BOS], [0]
        ids += rng.integers(3, 140, p.get("pre", 4)).tolist(); tt += [0] * p.get("pre", 4)
        for (h, w) in p.get("images", []):
            img = Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8))
            out = proc(images=[img], return_tensors="pt")
            grid = out["image_grid_thw"][0]
            n = int(grid.prod()) // 4
            pixels.append(out["pixel_values"]); grids.append(out["image_grid_thw"])
            ids += [VISION_START] + [IMAGE] * n + [VISION_END]; tt += [0] + [1] * n + [0]
        post = rng.integers(3, 140, p.get("post", 4)).tolist()
        if p.get("repeat"):
            post = post + post[:3]
        ids += post; tt += [0] * len(post)
        rows.append(ids); types.append(tt)
    length = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), length), PAD, dtype=torch.long)
    mask = torch.zeros((len(rows), length), dtype=torch.long)
    mm = torch.zeros((len(rows), length), dtype=torch.long)
    for i, (r, t) in enumerate(zip(rows, types)):
        input_ids[i, length - len(r):] = torch.tensor(r)
        mask[i, length - len(r):] = 1
        mm[i, length - len(r):] = torch.tensor(t)
    inputs = dict(input_ids=input_ids, attention_mask=mask, mm_token_type_ids=mm)
    if pixels:
        inputs["pixel_values"] = torch.cat(pixels)
        inputs["image_grid_thw"] = torch.cat(grids)
    return inputs
