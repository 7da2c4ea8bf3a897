"""Low-rank adapters for the reader's language model: trained here, shipped as a small file, merged on load.

Why: the pretrained LM copies from its context but, asked to transcribe, it paraphrases, unwraps lines and
adds lead-ins ("Here is the text:"). A rank-16 adapter on every projection of its 30 layers (5 MB in bf16)
teaches it verbatim transcription; the shipped model folder holds only the adapter, and the assembled
checkpoint has it merged (``W + B A * alpha / r``), so the target that users and drafters run is a plain
``Idefics3ForConditionalGeneration`` with no adapter code in its forward.

Example:
    >>> import torch
    >>> lin = torch.nn.Linear(8, 4)
    >>> lora = LoRALinear(lin, rank=2, alpha=4.0)
    >>> torch.allclose(lora(torch.ones(1, 8)), lin(torch.ones(1, 8)))   # B starts at zero
    True
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["LoRALinear", "add_lora", "lora_state_dict", "merge_lora_state", "TARGET_MODULES"]

TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoRALinear(nn.Module):
    """``base(x) + (x A^T) B^T * alpha / rank`` with ``base`` frozen; ``B`` starts at zero (no change at step 0)."""

    def __init__(self, base: nn.Linear, rank: int = 16, alpha: float = 32.0):
        super().__init__()
        self.base = base
        for p in self.base.parameters():
            p.requires_grad_(False)
        self.rank, self.scale = rank, alpha / rank
        self.lora_A = nn.Parameter(torch.randn(rank, base.in_features) / base.in_features ** 0.5)
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank))

    def forward(self, x):
        return self.base(x) + (x.to(self.lora_A.dtype) @ self.lora_A.T @ self.lora_B.T * self.scale).to(x.dtype)


def add_lora(model: nn.Module, rank: int = 16, alpha: float = 32.0, targets=TARGET_MODULES) -> list:
    """Wrap every ``nn.Linear`` named in ``targets`` inside ``model`` (in place); returns the wrapped names.

    Example:
        >>> m = torch.nn.Sequential(torch.nn.Linear(3, 3)); m[0].q_proj = torch.nn.Linear(3, 3)
        >>> add_lora(m, rank=1)
        ['0.q_proj']
    """
    names = []
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if child_name in targets and isinstance(child, nn.Linear):
                setattr(module, child_name, LoRALinear(child, rank, alpha))
                names.append(f"{name}.{child_name}" if name else child_name)
    return names


def lora_state_dict(model: nn.Module) -> dict:
    """The adapters' weights (``<module path>.lora_A`` / ``.lora_B``) and their scale, for saving.

    Example:
        >>> m = torch.nn.Module(); m.q_proj = torch.nn.Linear(3, 3); _ = add_lora(m, rank=1)
        >>> sorted(lora_state_dict(m))
        ['q_proj.lora_A', 'q_proj.lora_B', 'q_proj.scale']
    """
    out = {}
    for name, module in model.named_modules():
        if isinstance(module, LoRALinear):
            out[f"{name}.lora_A"] = module.lora_A.detach().clone()
            out[f"{name}.lora_B"] = module.lora_B.detach().clone()
            out[f"{name}.scale"] = torch.tensor(module.scale)
    return out


def merge_lora_state(state: dict, lora: dict, prefix: str = "") -> dict:
    """``state`` (a plain model's state dict) with the adapters of ``lora`` merged into their base weights:
    ``W += B @ A * scale`` for each ``<path>.lora_A`` found at ``prefix + <path>.weight``.

    Raises:
        KeyError: an adapter whose base weight is not in ``state``.

    Example:
        >>> s = {"q_proj.weight": torch.zeros(2, 2)}
        >>> l = {"q_proj.lora_A": torch.ones(1, 2), "q_proj.lora_B": torch.ones(2, 1), "q_proj.scale": torch.tensor(0.5)}
        >>> merge_lora_state(s, l)["q_proj.weight"].tolist()
        [[0.5, 0.5], [0.5, 0.5]]
    """
    out = dict(state)
    for key in lora:
        if not key.endswith(".lora_A"):
            continue
        path = key[: -len(".lora_A")]
        w = prefix + path + ".weight"
        if w not in out:
            raise KeyError(f"adapter {path} has no base weight {w}")
        a, b = lora[key].float(), lora[path + ".lora_B"].float()
        scale = float(lora[path + ".scale"])
        out[w] = (out[w].float() + b @ a * scale).to(out[w].dtype)
    return out
