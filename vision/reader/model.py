"""The reader as a transformers model: ``Idefics3ForConditionalGeneration`` (SmolVLM's architecture).

Why this class: SmolVLM is exactly SmolLM2 plus a SigLIP-style vision transformer and a pixel-shuffle
connector, so users' and drafters' code paths are those of a real hub VLM. Here the vision transformer reads
one 64 x 64 one-channel tile per token box (16 patches of 16 px), the connector's pixel shuffle (scale 4)
turns the 16 patch states into one vector, and its projection maps that vector into the LM's embedding
space (``image_seq_len`` = 1: one image token per box). Embeddings are tied, as in SmolLM2.

A shipped reader folder (``vision/assets/reader``) holds the vision tower and connector weights, the LM
adapter (:mod:`.lora`), the processor config and ``reader.json``; :func:`assemble_reader` joins them with the
LM converted from the GGUF (:mod:`.lm`) into a complete checkpoint in mmspec's cache, keyed by the digests
of all its parts, which ``from_pretrained`` then loads like any folder.

Example:
    >>> cfg = reader_config({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    ...                      "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
    ...                      "vocab_size": 100}, hidden=32, layers=1, heads=2)
    >>> cfg.model_type, cfg.scale_factor, cfg.vision_config.image_size
    ('idefics3', 4, 64)
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil

__all__ = ["reader_config", "VISION_DEFAULTS", "assemble_reader", "READER_MANIFEST", "vision_modules",
           "IMAGE_TOKEN", "IMAGE_TOKEN_ID"]

IMAGE_TOKEN = "<empty_output>"
IMAGE_TOKEN_ID = 16
"""An existing special token of SmolLM2's vocabulary that no text uses: the image placeholder (the vocabulary,
and so the GGUF's embedding matrix, stays as shipped)."""
VISION_DEFAULTS = {"hidden": 256, "layers": 6, "heads": 4}
READER_MANIFEST = "reader.json"


def reader_config(text_config: dict, *, hidden: int = 256, layers: int = 6, heads: int = 4):
    """An ``Idefics3Config`` for the reader over ``text_config`` (the LM's config as a dict).

    Example:
        >>> reader_config({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 2,
        ...                "num_key_value_heads": 1, "vocab_size": 100}, hidden=32, layers=1, heads=2).image_token_id
        16
    """
    from transformers import Idefics3Config

    text = dict(text_config)
    text["tie_word_embeddings"] = True
    for k in ("architectures", "_name_or_path", "transformers_version", "dtype", "torch_dtype"):
        text.pop(k, None)
    vision = dict(hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
                  num_attention_heads=heads, num_channels=1, image_size=64, patch_size=16)
    return Idefics3Config(vision_config=vision, text_config=text, scale_factor=4, image_token_id=IMAGE_TOKEN_ID,
                          tie_word_embeddings=True)


def vision_modules(config):
    """The vision transformer and connector of a reader config, as the stand-alone modules stage 1 trains
    (their state dicts, prefixed ``model.vision_model.`` / ``model.connector.``, load into the full model).

    Example:
        >>> vis, con = vision_modules(reader_config({"model_type": "llama", "hidden_size": 64,
        ...     "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 100}, hidden=32, layers=1, heads=2))
        >>> type(vis).__name__, type(con).__name__
        ('Idefics3VisionTransformer', 'Idefics3Connector')
    """
    from transformers.models.idefics3.modeling_idefics3 import Idefics3Connector, Idefics3VisionTransformer

    return Idefics3VisionTransformer(config.vision_config), Idefics3Connector(config)


def _digest(paths: list) -> str:
    from mmspec.checkpoints import file_sha256

    h = hashlib.sha256()
    for p in paths:
        h.update(os.path.basename(p).encode())
        h.update(file_sha256(p).encode())
    return h.hexdigest()


def assemble_reader(asset_dir: str, out_root: str | None = None, print_fn=None, dtype: str = "bfloat16") -> str:
    """Join a shipped reader folder with the converted LM into a full checkpoint folder; returns its path.

    The checkpoint (``config.json``, ``model.safetensors`` in ``dtype``, tokenizer, processor config) is written
    once under ``out_root`` (default: mmspec's cache), in a folder named by the digest of every input file, and
    reused after. Drafters shipped in ``asset_dir/drafters`` are not copied (they are found by their target's
    fingerprint).

    Example:
        >>> assemble_reader("vision/assets/reader")      # doctest: +SKIP
        '/root/.cache/mmspec/reader-3f2a...'
    """
    import torch
    from safetensors.torch import load_file, save_file

    from .lm import cache_root, smollm2_path
    from .lora import merge_lora_state
    from .processor import PageReaderProcessor

    with open(os.path.join(asset_dir, READER_MANIFEST)) as f:
        manifest = json.load(f)
    lm_dir = smollm2_path(print_fn=print_fn)
    # the manifest too: it carries settings the config is built from (the fallback drafter's measured tau)
    parts = [os.path.join(asset_dir, READER_MANIFEST), os.path.join(asset_dir, manifest["vision_weights"])]
    if manifest.get("lora"):
        parts.append(os.path.join(asset_dir, manifest["lora"]))
    parts.append(os.path.join(lm_dir, "model.safetensors"))
    key = _digest(parts)[:16]
    out = os.path.join(out_root or cache_root(), f"reader-{key}")
    if os.path.isfile(os.path.join(out, "model.safetensors")) and os.path.isfile(os.path.join(out, "config.json")):
        return out
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    text_cfg = AutoConfig.from_pretrained(lm_dir).to_dict()
    cfg = reader_config(text_cfg, **manifest["vision"])
    cfg.dtype = dtype
    from mmspec.drafters.auto import FALLBACK_KEY, FALLBACK_VALIDATION_KEY
    from mmspec.workloads import ASSEMBLED_FROM

    setattr(cfg, ASSEMBLED_FROM, os.path.abspath(asset_dir))  # its bundled drafters are this checkpoint's
    setattr(cfg, FALLBACK_KEY, "page-lookup")
    if isinstance(manifest.get("fallback_validation"), dict):  # a shipped head is chosen only if it beats this
        setattr(cfg, FALLBACK_VALIDATION_KEY, manifest["fallback_validation"])
    lm = load_file(os.path.join(lm_dir, "model.safetensors"))
    state = {}
    for k, v in lm.items():
        if k.startswith("model."):
            state["model.text_model." + k[len("model."):]] = v
        elif k == "lm_head.weight":
            continue  # tied to the embeddings
    if manifest.get("lora"):
        # the adapter was trained on the causal LM (``model.layers.*``); here its layers are ``model.text_model.*``
        lora = {k.removeprefix("model."): v for k, v in load_file(os.path.join(asset_dir, manifest["lora"])).items()}
        state = merge_lora_state(state, lora, prefix="model.text_model.")
    state.update(load_file(os.path.join(asset_dir, manifest["vision_weights"])))
    target = getattr(torch, dtype)
    state = {k: v.to(target) if v.is_floating_point() else v for k, v in state.items()}
    tmp = out + f".tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    save_file(state, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
    cfg.save_pretrained(tmp)
    tok = AutoTokenizer.from_pretrained(lm_dir)
    PageReaderProcessor(tok).save_pretrained(tmp)
    GenerationConfig(eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"), pad_token_id=tok.pad_token_id,
                     bos_token_id=tok.bos_token_id).save_pretrained(tmp)
    for name in ("README.md",):
        if os.path.isfile(os.path.join(asset_dir, name)):
            shutil.copy(os.path.join(asset_dir, name), tmp)
    with open(os.path.join(tmp, READER_MANIFEST), "w") as f:
        json.dump({**manifest, "assembled_from": os.path.abspath(asset_dir), "key": key}, f, indent=2)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return out
