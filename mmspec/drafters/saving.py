"""Trained drafters are saved like Hugging Face models, and refuse to load against another target.

``save_pretrained(path)`` writes ``config.json`` (the drafter ``kind``, its hyper-parameters and the
*fingerprint* of the target it was trained for) and ``model.safetensors`` (weights only: never a
pickle). ``from_pretrained(path, target=model)`` rebuilds the drafter through the drafter registry and
compares fingerprints first, so a head trained on one model cannot silently propose garbage for another.

The fingerprint holds what a feature drafter depends on: the target's model type, hidden size,
vocabulary size, number of layers, the layer ids the drafter reads, and a hash of the tokenizer's
vocabulary when a tokenizer is known.

A drafter whose weights include the target's own (EAGLE's and the block heads' embeddings and LM head: frozen
copies, 100+ MB on a 49k vocabulary) names them in :attr:`TrainableDrafter.target_tensors`; ``save_pretrained``
leaves them out (a few sample rows stay, as a probe) and ``from_pretrained`` takes them from the target, refusing
a target whose rows differ from the probe. A head then ships in a few MB. Training keeps whole copies
(``with_target_tensors=True``) so its checkpoints load without a target.

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

__all__ = ["target_fingerprint", "check_fingerprint", "TrainableDrafter", "saved_state", "CONFIG_NAME",
           "WEIGHTS_NAME"]

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
PROBE_PREFIX = "target_probe."
"""Key prefix of the sample rows kept of each tensor left out for the target to supply."""
PROBE_ROWS = 16


def _probe_rows(n: int) -> torch.Tensor:
    return torch.linspace(0, n - 1, min(PROBE_ROWS, n)).round().long()


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
    target_tensors: dict = {}
    """State-dict entries that are copies of the target's weights: name -> ``"input"`` (its input embeddings) or
    ``"output"`` (its LM head). Saved drafters leave them out; loading takes them from the target."""

    def __init__(self, fingerprint: dict | None = None):
        torch.nn.Module.__init__(self)
        self.fingerprint = dict(fingerprint or {})

    def tensors_from_target(self, target) -> dict:
        """The :attr:`target_tensors` as ``target`` holds them, float32 on the CPU, shaped as this drafter's
        (embedding rows past the target's are zero: a vocabulary padded for the LM head).

        Example:
            >>> from mmspec.drafters.eagle import EagleDrafter
            >>> from transformers import LlamaConfig, LlamaForCausalLM
            >>> t = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
            ...                      num_hidden_layers=2, num_attention_heads=2))
            >>> sorted(EagleDrafter.from_target(t).tensors_from_target(t))
            ['embed_tokens.weight', 'lm_head.weight']
        """
        mine = self.state_dict()
        out = {}
        for name, which in self.target_tensors.items():
            w = (target.get_input_embeddings() if which == "input" else target.get_output_embeddings()).weight
            t = torch.zeros(mine[name].shape)
            rows = min(w.shape[0], t.shape[0])
            t[:rows] = w[:rows].detach().float().cpu()
            out[name] = t
        return out

    def held_target_tensors(self) -> dict:
        """This drafter's own copies of :attr:`target_tensors` (to load a saved state of the same head)."""
        return {n: t for n, t in self.state_dict().items() if n in self.target_tensors}

    def load_target_tensors(self, target) -> None:
        """Copy :attr:`target_tensors` in from ``target`` (a fresh head's embeddings and LM head)."""
        with torch.no_grad():
            self.load_state_dict(self.tensors_from_target(target), strict=False)

    def config_dict(self) -> dict:
        """Constructor keywords that rebuild this drafter (JSON-serialisable)."""
        return {}

    def bind(self, model) -> None:
        if self.fingerprint:
            check_fingerprint(self.fingerprint, model)

    def save_pretrained(self, path, dtype=None, with_target_tensors: bool = False) -> None:
        """Write ``config.json`` and ``model.safetensors`` under ``path`` (created if missing); ``dtype``
        (e.g. ``torch.bfloat16``) stores floating-point weights in that type (loading casts them back).
        :attr:`target_tensors` are left out (``from_pretrained`` takes them from the target) unless
        ``with_target_tensors``: then the folder loads without a target (training's checkpoints)."""
        from safetensors.torch import save_file

        os.makedirs(path, exist_ok=True)
        omitted = [] if with_target_tensors else sorted(self.target_tensors)
        config = {"drafter_kind": self.kind, "config": self.config_dict(), "target_fingerprint": self.fingerprint,
                  "format_version": 1}
        if omitted:
            config["target_tensors"] = {n: self.target_tensors[n] for n in omitted}
        with open(os.path.join(path, CONFIG_NAME), "w") as f:
            json.dump(config, f, indent=2, sort_keys=True)
        full = self.state_dict()
        state = {k: (v.to(dtype) if dtype is not None and v.is_floating_point() else v).detach().contiguous().cpu()
                 for k, v in full.items() if k not in omitted}
        for n in omitted:  # a few rows, so loading can tell the target's weights from another model's
            state[PROBE_PREFIX + n] = full[n][_probe_rows(full[n].shape[0])].detach().float().contiguous().cpu()
        save_file(state, os.path.join(path, WEIGHTS_NAME), metadata={"drafter_kind": self.kind})
        from ..checkpoints import user_file_mode

        user_file_mode(os.path.join(path, WEIGHTS_NAME))

    @classmethod
    def from_pretrained(cls, path, target=None, tokenizer=None, device=None, dtype=None, shared=None):
        """Load a drafter saved by :meth:`save_pretrained`; with ``target``, check it was trained for it.

        ``dtype`` (e.g. ``torch.bfloat16``) casts the floating-point weights after loading (``None``: float32,
        whatever they were stored in); the factories pass the target's dtype. Tensors the folder leaves out
        (:attr:`target_tensors`) come from ``shared`` (a dict, e.g. another head's :meth:`tensors_from_target`)
        or else from ``target``.

        Raises:
            InvalidInputError: no saved drafter at ``path``, one of another kind, or one that needs the target's
                embeddings and got neither ``target`` nor ``shared``.
            DrafterMismatchError: ``target`` (or ``tokenizer``) differs from the one it was trained for, or its
                embeddings / LM head are not the ones the drafter was trained with.
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
        drafter.load_state_dict(saved_state(path, drafter, config, target=target, shared=shared))
        if device is not None or dtype is not None:
            drafter.to(device=device, dtype=dtype)
        return drafter.eval()


def saved_state(path, drafter: "TrainableDrafter", config: dict | None = None, target=None, shared=None) -> dict:
    """The full state dict of the drafter saved at ``path``: its file's tensors, and the target tensors it left
    out taken from ``shared`` (a dict) or else ``target``, each checked against the probe rows saved with it.

    Example:
        >>> state = saved_state(ckpt, drafter, shared=drafter.held_target_tensors())   # doctest: +SKIP
    """
    from safetensors.torch import load_file

    if config is None:
        with open(os.path.join(path, CONFIG_NAME)) as f:
            config = json.load(f)
    state = load_file(os.path.join(path, WEIGHTS_NAME))
    probes = {k[len(PROBE_PREFIX):]: state.pop(k) for k in list(state) if k.startswith(PROBE_PREFIX)}
    missing = [n for n in config.get("target_tensors", {}) if n not in state]
    if not missing:
        return state
    if shared is None and target is None:
        raise InvalidInputError(f"{path} leaves the target's own weights out ({', '.join(missing)}): pass "
                                "target= (the model it was trained for)")
    given = shared if shared is not None else drafter.tensors_from_target(target)
    for n in missing:
        t = given[n].detach().float().cpu()
        probe = probes.get(n)
        if probe is not None:
            got = t[_probe_rows(t.shape[0])]
            # bf16 storage of the target moves a row by ~0.4%: anything far past that is another model
            if got.shape != probe.shape or (got - probe).norm() > 0.02 * probe.norm() + 1e-6:
                raise DrafterMismatchError(f"the target's {n} differs from the one {path} was trained with "
                                           "(another model, or another checkpoint of it)")
        state[n] = t
    return state
