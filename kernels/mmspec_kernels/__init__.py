"""Triton kernels for the verification path, each with a plain-torch reference that is also its test oracle.

* :func:`tree_attention`: a draft tree's nodes attend to the cached prefix and to their own ancestors,
  read from the tree's parent array (GQA, head dims 64 and 128); :func:`register_tree_attention` makes it
  transformers' ``attn_implementation="mmspec_tree"``, which ``mmspec.TargetAdapter`` accepts.
* :func:`greedy_accept` and :func:`sampling_accept`: the acceptance walk of a whole ragged batch in one
  launch (greedy tree walk; speculative sampling on chains and multi-draft trees, with pre-drawn uniforms).
* :func:`gather_slots`: KV compaction, one layer's keys and values gathered into place in one launch
  (``TargetAdapter.commit`` uses it).

``python -m mmspec.kernels.bench`` checks every kernel against its reference and, on a GPU, times them
(attention also against dense SDPA with the same mask); ``kernels/gpu_check.sh`` runs the tests and the
bench on a lent GPU in one call.

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

from .acceptance import (AcceptOutput, draw_randomness, greedy_accept, greedy_accept_reference, sampling_accept,
                         sampling_accept_reference)
from .attention import tree_attention, tree_attention_reference, tree_attention_supported, tree_visibility
from .compaction import gather_slots, gather_slots_reference
from .dispatch import backend, using
from .hf import TREE_ATTENTION, TreeMetadata, use_tree_attention
from .hf import register as register_tree_attention

__all__ = [
    "tree_attention", "tree_attention_reference", "tree_attention_supported", "tree_visibility",
    "AcceptOutput", "greedy_accept", "greedy_accept_reference", "sampling_accept", "sampling_accept_reference",
    "draw_randomness", "gather_slots", "gather_slots_reference", "backend", "using", "TREE_ATTENTION", "TreeMetadata", "register_tree_attention", "use_tree_attention",
]
