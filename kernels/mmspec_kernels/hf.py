"""Tree attention as a transformers attention implementation, ``attn_implementation="mmspec_tree"``.

:func:`register` adds ``"mmspec_tree"`` to transformers' attention-function registry
(``AttentionInterface``) and its mask registry (with SDPA's mask), so a model loaded or switched to it
runs unchanged modeling code. Every call without tree metadata (prefill, plain ``generate``, a vision
tower) is exactly SDPA. A verification pass passes a :class:`TreeMetadata` as the keyword argument
``mmspec_tree`` to the model's forward; transformers hands keyword arguments down to each attention call,
where :func:`~mmspec.kernels.attention.tree_attention` then reads the tree from its parent array. The
``attention_mask`` of such a pass may be anything 4-D (transformers passes 4-D masks through untouched):
the metadata, not the mask, says what each query sees.

Example:
    >>> name = register()                                                  # doctest: +SKIP
    >>> model = AutoModelForCausalLM.from_pretrained(path, attn_implementation=name)  # doctest: +SKIP
    >>> use_tree_attention(model)  # or switch a loaded model's text layers   # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .attention import tree_attention

__all__ = ["TREE_ATTENTION", "TREE_KWARG", "TreeMetadata", "register", "use_tree_attention",
           "tree_attention_forward"]

TREE_ATTENTION = "mmspec_tree"  # the attention implementation's name
TREE_KWARG = "mmspec_tree"  # the forward keyword that carries TreeMetadata down to the attention calls


@dataclass
class TreeMetadata:
    """What a verification pass's attention needs besides q, k, v.

    Attributes:
        prefix_valid: ``bool[B, L]``: cached slots holding committed tokens.
        parents: ``int[B, Q]``: each query's parent in query indexing (root ``-1``), as packed by
            ``mmspec.target.pack_trees``.
        max_depth: the deepest node's depth (bounds the ancestor walk without a device sync).
    """

    prefix_valid: torch.Tensor
    parents: torch.Tensor
    max_depth: int

    def __post_init__(self):
        # The kernel's dtypes, converted once per pass rather than once per layer.
        self.prefix_valid = self.prefix_valid.to(torch.int8).contiguous()
        self.parents = self.parents.to(torch.int32).contiguous()


def tree_attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0,
                           scaling: float | None = None, **kwargs):
    """The registered attention function: tree attention when ``mmspec_tree`` metadata came down, else SDPA."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    meta = kwargs.pop(TREE_KWARG, None)
    if meta is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    for name in ("sliding_window", "softcap", "s_aux"):
        if kwargs.get(name) is not None:
            raise ValueError(f"{TREE_ATTENTION} attention does not support {name} (layer of {type(module).__name__})")
    out = tree_attention(query, key, value, meta.prefix_valid, meta.parents, scale=scaling, max_depth=meta.max_depth)
    return out.transpose(1, 2), None  # [B, Q, H, D], as transformers' attention functions return


def register() -> str:
    """Register ``"mmspec_tree"`` with transformers (idempotent) and return the name.

    Example:
        >>> register()
        'mmspec_tree'
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(TREE_ATTENTION, tree_attention_forward)
    AttentionMaskInterface.register(TREE_ATTENTION, sdpa_mask)
    return TREE_ATTENTION


def use_tree_attention(model) -> None:
    """Switch a loaded model's text decoder to ``"mmspec_tree"`` (vision towers keep their implementation).

    Example:
        >>> use_tree_attention(model)                                      # doctest: +SKIP
        >>> model.config.get_text_config(decoder=True)._attn_implementation  # doctest: +SKIP
        'mmspec_tree'
    """
    register()
    text = model.config.get_text_config(decoder=True)
    if text is model.config:
        model.set_attn_implementation(TREE_ATTENTION)
        return
    key = next((k for k in ("text_config", "language_config") if getattr(model.config, k, None) is text), None)
    if key is None:
        raise ValueError(f"cannot find the text decoder's config of {type(model).__name__}")
    model.set_attn_implementation({key: TREE_ATTENTION})
