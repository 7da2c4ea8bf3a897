"""Trained drafters are saved like Hugging Face models, and refuse to load against another target.

``save_pretrained(path)`` writes ``config.json`` (the drafter ``kind``, its hyper-parameters and the
*fingerprint* of the target it was trained for) and ``model.safetensors`` (weights only: never a
pickle). ``from_pretrained(path, target=model)`` rebuilds the drafter through the drafter registry and
compares fingerprints first, so a head trained on one model cannot silently propose garbage for another.

The fingerprint holds what a feature drafter depends on: the target's model type, hidden size,
vocabulary size, number of layers, the layer ids the drafter reads, and a hash of the tokenizer's
vocabulary when a tokenizer is known.

Example:
    >>> import torch
    >>> class Bias(TrainableDrafter):
    ...     kind = "bias-test"
    ...     def __init__(self, vocab_size=8, **kw):
    ...         super().__init__(**kw)
    ...         self.vocab_size = vocab_size
    ...         self.bias = torch.nn.Parameter(torch.zeros(vocab_size))
    ...     def config_dict(self):
    ...         return {"vocab_size": self.vocab_size}
    ...     def propose(self, ctx):
    ...         return []
    >>> import tempfile
    >>> d = Bias(fingerprint={"model_type": "toy", "vocab_size": 8})
    >>> path = tempfile.mkdtemp()
    >>> d.save_pretrained(path)
    >>> Bias.from_pretrained(path).fingerprint["model_type"]
    'toy'
"""

from __future__ import annotations

import hashlib
import json
import os

import torch

from ..errors import DrafterMismatchError, InvalidInputError
from .base import Drafter

__all__ = ["target_fingerprint", "check_fingerprint", "TrainableDrafter", "CONFIG_NAME", "WEIGHTS_NAME"]

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"


def tokenizer_hash(tokenizer) -> str:
    """sha256 of the tokenizer's vocabulary (token -> id), stable across processes and machines."""
    vocab = tokenizer.get_vocab()
    blob = json.dumps(sorted(vocab.items()), ensure_ascii=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def target_fingerprint(model, tokenizer=None, layer_ids=()) -> dict:
    """What a drafter trained on ``model`` depends on (see the module docstring).

    Example:
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> m = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
        ...                      num_hidden_layers=2, num_attention_heads=2))
        >>> target_fingerprint(m, layer_ids=(1,))["vocab_size"]
        32
    """
    text = model.config.get_text_config(decoder=True)
    fp = {
        "model_type": model.config.model_type,
        "hidden_size": int(text.hidden_size),
        "vocab_size": int(model.get_output_embeddings().weight.shape[0]),
        "num_hidden_layers": int(text.num_hidden_layers),
        "layer_ids": [int(i) for i in layer_ids],
    }
    if tokenizer is not None:
        fp["tokenizer_hash"] = tokenizer_hash(tokenizer)
    return fp


def check_fingerprint(saved: dict, model, tokenizer=None, what: str = "drafter") -> None:
    """Raise :class:`~mmspec.DrafterMismatchError` naming every field where ``model`` differs from ``saved``."""
    actual = target_fingerprint(model, tokenizer, saved.get("layer_ids", ()))
    diffs = [f"{k}: trained for {saved[k]!r}, got {actual[k]!r}" for k in saved
             if k in actual and saved[k] != actual[k]]
    if diffs:
        raise DrafterMismatchError(f"this {what} was trained for another target ({'; '.join(diffs)})")


class TrainableDrafter(torch.nn.Module, Drafter):
    """Base of drafters with weights: an ``nn.Module`` that saves and loads like a HF model.

    Subclasses set ``kind``, take their hyper-parameters as constructor keywords, return them from
    :meth:`config_dict`, and register themselves with :func:`mmspec.registry.register_drafter` (or are
    passed as ``cls`` to :meth:`from_pretrained`).
    """

    kind = "trainable"

    def __init__(self, fingerprint: dict | None = None):
        torch.nn.Module.__init__(self)
        self.fingerprint = dict(fingerprint or {})

    def config_dict(self) -> dict:
        """Constructor keywords that rebuild this drafter (JSON-serialisable)."""
        return {}

    def bind(self, model) -> None:
        if self.fingerprint:
            check_fingerprint(self.fingerprint, model)

    def save_pretrained(self, path, dtype=None) -> None:
        """Write ``config.json`` and ``model.safetensors`` under ``path`` (created if missing); ``dtype``
        (e.g. ``torch.bfloat16``) stores floating-point weights in that type (loading casts them back)."""
        from safetensors.torch import save_file

        os.makedirs(path, exist_ok=True)
        config = {"drafter_kind": self.kind, "config": self.config_dict(), "target_fingerprint": self.fingerprint,
                  "format_version": 1}
        with open(os.path.join(path, CONFIG_NAME), "w") as f:
            json.dump(config, f, indent=2, sort_keys=True)
        state = {k: (v.to(dtype) if dtype is not None and v.is_floating_point() else v).detach().contiguous().cpu()
                 for k, v in self.state_dict().items()}
        save_file(state, os.path.join(path, WEIGHTS_NAME), metadata={"drafter_kind": self.kind})
        from ..checkpoints import user_file_mode

        user_file_mode(os.path.join(path, WEIGHTS_NAME))

    @classmethod
    def from_pretrained(cls, path, target=None, tokenizer=None, device=None, dtype=None):
        """Load a drafter saved by :meth:`save_pretrained`; with ``target``, check it was trained for it.

        ``dtype`` (e.g. ``torch.bfloat16``) casts the floating-point weights after loading (``None``: float32,
        whatever they were stored in); the factories pass the target's dtype.

        Raises:
            InvalidInputError: no saved drafter at ``path``, or one of another kind.
            DrafterMismatchError: ``target`` (or ``tokenizer``) differs from the one it was trained for.
        """
        from safetensors.torch import load_file

        cfg_path = os.path.join(path, CONFIG_NAME)
        if not os.path.isdir(path):
            raise InvalidInputError(f"drafter folder not found: {path}")
        if not os.path.isfile(cfg_path) or not os.path.isfile(os.path.join(path, WEIGHTS_NAME)):
            raise InvalidInputError(f"no saved drafter at {path} (expected {CONFIG_NAME} and {WEIGHTS_NAME})")
        with open(cfg_path) as f:
            config = json.load(f)
        if config.get("drafter_kind") != cls.kind:
            raise InvalidInputError(f"{path} holds a {config.get('drafter_kind')!r} drafter, not {cls.kind!r}")
        fingerprint = config.get("target_fingerprint", {})
        if target is not None:
            check_fingerprint(fingerprint, target, tokenizer)
        drafter = cls(fingerprint=fingerprint, **config.get("config", {}))
        drafter.load_state_dict(load_file(os.path.join(path, WEIGHTS_NAME)))
        if device is not None or dtype is not None:
            drafter.to(device=device, dtype=dtype)
        return drafter.eval()
