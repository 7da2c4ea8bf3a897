"""Compact checkpoints: weights stored in a half-width dtype, loaded back as float32.

Why: the project ships its small trained models inside the repository (a fresh clone must run the demo and
the benchmarks with nothing downloaded), so every byte on disk counts; bfloat16 halves them. What ships is
the *rounded* model: drafters and measurements use the loaded weights, never the float32 originals.

* :func:`save_hf_compact`: ``save_pretrained`` of a transformers model with its floating-point weights in
  ``dtype`` and ``config.json`` saying float32, so ``from_pretrained`` upcasts on load.
* :func:`save_state_compact`: the same for a plain ``state_dict`` written as safetensors (``load_state_dict``
  into float32 parameters casts back).
* :func:`copy_training_files`: the training log and config beside the shipped weights.

Example:
    >>> import tempfile, torch
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> m = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
    ...                                  num_attention_heads=2, num_key_value_heads=1))
    >>> path = tempfile.mkdtemp()
    >>> save_hf_compact(m, path)
    >>> LlamaForCausalLM.from_pretrained(path).dtype
    torch.float32
"""

from __future__ import annotations

import json
import os
import shutil

import torch

__all__ = ["save_hf_compact", "save_state_compact", "copy_training_files"]


def save_hf_compact(model, path: str, dtype=torch.bfloat16) -> None:
    """``model.save_pretrained(path)`` with floating weights in ``dtype`` and a float32 config; ``model`` is
    left as it was."""
    import copy

    copy.deepcopy(model).to(dtype).save_pretrained(path)  # a round trip through dtype would round ``model``
    config_path = os.path.join(path, "config.json")
    with open(config_path) as f:
        config = json.load(f)
    for sub in [config] + [v for v in config.values() if isinstance(v, dict)]:
        if "dtype" in sub:
            sub["dtype"] = "float32"
        if "torch_dtype" in sub:
            sub["torch_dtype"] = "float32"
    with open(config_path, "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)


def save_state_compact(state_dict: dict, file: str, dtype=None) -> None:
    """Write ``state_dict`` as safetensors at ``file``, floating tensors in ``dtype`` (``None``: as they are).

    Example:
        >>> import tempfile
        >>> from safetensors.torch import load_file
        >>> f = os.path.join(tempfile.mkdtemp(), "w.safetensors")
        >>> save_state_compact({"w": torch.ones(2), "i": torch.arange(2)}, f, torch.bfloat16)
        >>> {k: v.dtype for k, v in sorted(load_file(f).items())}
        {'i': torch.int64, 'w': torch.bfloat16}
    """
    from safetensors.torch import save_file

    save_file({k: (v.to(dtype) if dtype is not None and v.is_floating_point() else v).detach().contiguous().cpu()
               for k, v in state_dict.items()}, file)


def copy_training_files(src: str, out: str, names=("train_log.jsonl", "train_config.json")) -> None:
    """Copy the training records that exist in ``src`` to ``out`` (what shipped weights are documented by)."""
    for name in names:
        if os.path.isfile(os.path.join(src, name)):
            shutil.copy(os.path.join(src, name), os.path.join(out, name))
