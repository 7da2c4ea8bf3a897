"""Triton kernels for the verification path, each with a plain-torch reference that is also its test oracle.

* :func:`tree_attention`: a draft tree's nodes attend to the cached prefix and to their own ancestors,
  read from the tree's parent array (GQA, head dims 64 and 128); :func:`register_tree_attention` makes it
  transformers' ``attn_implementation="mmspec_tree"``, which ``mmspec.TargetAdapter`` accepts.

Which implementation runs is chosen once per device type (:mod:`mmspec.kernels.dispatch`): Triton on CUDA,
the reference elsewhere; ``MMSPEC_KERNELS=triton|reference`` forces either. This package imports nothing
from the rest of mmspec, and Triton only when a kernel runs (``pip install 'mmspec[kernels]'``).

Example:
    >>> import torch
    >>> from mmspec.kernels import tree_attention
    >>> q = torch.randn(1, 2, 2, 64); kv = torch.randn(1, 1, 5, 64)
    >>> tree_attention(q, kv, kv, torch.ones(1, 3, dtype=torch.bool), torch.tensor([[-1, 0]])).shape
    torch.Size([1, 2, 2, 64])
"""

from .attention import tree_attention, tree_attention_reference, tree_attention_supported, tree_visibility
from .dispatch import backend, using
from .hf import TREE_ATTENTION, TreeMetadata, use_tree_attention
from .hf import register as register_tree_attention

__all__ = [
    "tree_attention", "tree_attention_reference", "tree_attention_supported", "tree_visibility",
    "backend", "using", "TREE_ATTENTION", "TreeMetadata", "register_tree_attention", "use_tree_attention",
]
