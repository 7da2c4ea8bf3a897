"""A lean forward of Qwen2-VL's vision tower: the tower's own weights through the same ops, without the transformers
call stack, with the set-up that does not depend on the pixels done once per image grid.

``model.get_image_features(pixel_values, grid_thw)`` on a small tower spends as much time in Python as in arithmetic:
in a FlashDrive tick's encode stage (the bundled driving VLA, fp32) about 1.5 of 4.75 ms go to ``Module.__call__``,
the decorators, and the rotary angles and ``cu_seqlens`` the tower rebuilds from ``grid_thw`` on every call.
:class:`LeanVision` runs what ``Qwen2VisionTransformerPretrainedModel`` runs (the Conv3d patch embedding, each
``Qwen2VLVisionBlock``'s LayerNorms, fused q/k/v, the axial rotary embedding in float32, SDPA per image dispatched
as transformers dispatches it, the MLP, then the ``PatchMerger``) in the same order and dtypes, so the features are
the model's bit for bit (tested in float32 and bfloat16); the rotary cos/sin, the per-frame attention lengths and
the per-image split sizes are cached per ``grid_thw`` (a FlashDrive clip encodes frames of one grid every tick).
:func:`why_not` says when a tower is not one it runs (another class, such as Qwen2.5-VL's windowed tower, or an
attention other than sdpa): then the model's own ``get_image_features`` runs.

``patch_matmul=True`` (off by default) is the one inexact option: the Conv3d patch embedding as one matmul over the
already-flattened patches. A stride-equals-kernel Conv3d is that matmul mathematically, but its kernel sums in
another order, so the features differ from the model's in the last bits (close, not equal; tested).

Example:
    >>> lean = LeanVision(model)                                          # doctest: +SKIP
    >>> feats = lean(pixel_values, image_grid_thw)                        # doctest: +SKIP
    >>> [f.shape for f in feats]                                          # doctest: +SKIP
    [torch.Size([64, 256]), torch.Size([16, 256])]
"""

from __future__ import annotations

from collections import OrderedDict

import torch
import torch.nn.functional as F

from .lean import _attend, _rotate_half, replaced_forwards

__all__ = ["LeanVision", "why_not", "LEAN_TOWERS"]

# Vision towers whose forward LeanVision reproduces (checked op for op against transformers 5.25's modelling code).
LEAN_TOWERS = ("Qwen2VisionTransformerPretrainedModel",)


def _tower(model):
    """The vision tower of a Qwen2-VL model (``ForConditionalGeneration``, the base model, or the tower itself)."""
    inner = getattr(model, "model", model)
    return getattr(inner, "visual", inner)


def why_not(model) -> str:
    """``""`` when :class:`LeanVision` can run ``model``'s vision tower (a Qwen2-VL model or its tower), else why not.

    Example:
        >>> why_not(torch.nn.Linear(2, 2))
        "the vision tower is Linear, not transformers' ['Qwen2VisionTransformerPretrainedModel']"
    """
    try:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
        from transformers.models.qwen2_vl import modeling_qwen2_vl as M
    except ImportError:  # pragma: no cover - transformers is a dependency
        return "this transformers has no Qwen2-VL vision tower"
    t = _tower(model)
    if type(t) is not M.Qwen2VisionTransformerPretrainedModel:  # exact class: a subclass may change the forward
        return f"the vision tower is {type(t).__name__}, not transformers' {list(LEAN_TOWERS)}"
    impl = t.config._attn_implementation
    if impl != "sdpa":  # flash attention runs varlen kernels over cu_seqlens; eager another softmax
        return f"vision attention {impl!r}, not sdpa"
    if ALL_ATTENTION_FUNCTIONS.get("sdpa") is not sdpa_attention_forward:
        return "a registered replacement of transformers' sdpa attention"
    pe, m = t.patch_embed, t.merger
    kinds = [(pe, M.PatchEmbed), (t.rotary_pos_emb, M.Qwen2VLVisionRotaryEmbedding), (m, M.PatchMerger),
             (pe.proj, torch.nn.Conv3d), (m.ln_q, torch.nn.LayerNorm), (m.mlp, torch.nn.Sequential)]
    for b in t.blocks:
        kinds += [(b, M.Qwen2VLVisionBlock), (b.attn, M.VisionAttention), (b.mlp, M.VisionMlp),
                  (b.norm1, torch.nn.LayerNorm), (b.norm2, torch.nn.LayerNorm)]
    for mod, cls in kinds:
        if type(mod) is not cls:
            return f"{type(mod).__name__} where the tower has {cls.__name__} (a wrapped or replaced module)"
    if pe.proj.padding_mode != "zeros" or len(m.mlp) != 3:
        return "a patch embedding or merger laid out otherwise"
    # the weights are read directly: a wrapped projection (an adapter, a quantised layer) or a hook would be skipped
    linears = [m.mlp[0], m.mlp[2]] + [x for b in t.blocks for x in (b.attn.qkv, b.attn.proj, b.mlp.fc1, b.mlp.fc2)]
    if any(type(x) is not torch.nn.Linear for x in linears):
        return "a projection is not a plain Linear (an adapter or a quantised layer)"
    if any(hasattr(x, "_hf_hook") for x in t.modules()):  # accelerate's (transformers' own only record)
        return "accelerate hooks on the tower (device map or offloading)"
    # Hub kernels (from_pretrained kernelizes by default where the kernels package is installed) replace a layer's
    # forward on the instance, where a kernel exists for the device. The activations' forwards are called as they
    # are (a kernel's included); any other replaced forward, or kernelised function, would be skipped.
    acts = {id(b.mlp.act) for b in t.blocks} | {id(m.mlp[1])}
    if replaced_forwards(t, allowed=acts):
        return "a hub kernel (or another replaced forward) in the tower"
    return ""


def _grid_key(grid_thw) -> tuple:
    """``((t, h, w), ...)`` of a ``[n, 3]`` tensor (on any device) or a sequence of triples."""
    rows = grid_thw.tolist() if isinstance(grid_thw, torch.Tensor) else grid_thw
    return tuple(tuple(int(x) for x in r) for r in rows)


def _layer_norm(x: torch.Tensor, norm) -> torch.Tensor:
    return F.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, norm.eps)


class LeanVision:
    """``model.get_image_features(pixel_values, grid_thw).pooler_output`` (the per-image features, a tuple) of a
    Qwen2-VL model or its vision tower, bit for bit, without the transformers call stack.

    What does not depend on the pixels (the rotary cos/sin of every patch, the per-frame attention lengths, the
    per-image split sizes) is cached per ``grid_thw``, on the tower's device, for the last ``cache_grids`` grids.
    ``patch_matmul``: the patch embedding as one matmul instead of the Conv3d (faster on a small tower, **not**
    bit-identical: another summation order; off by default).

    Example:
        >>> lean = LeanVision(model)                                          # doctest: +SKIP
        >>> feats = lean(pixel_values, image_grid_thw)                        # doctest: +SKIP
        >>> all(torch.equal(a, b) for a, b in zip(feats, model.get_image_features(
        ...     pixel_values, image_grid_thw).pooler_output))                 # doctest: +SKIP
        True
    """

    def __init__(self, model, patch_matmul: bool = False, cache_grids: int = 16):
        why = why_not(model)
        if why:
            from .errors import UnsupportedModelError

            raise UnsupportedModelError(f"the lean vision tower cannot run {type(model).__name__}: {why}")
        self.tower = _tower(model)
        self.patch_matmul = bool(patch_matmul)
        self.cache_grids = cache_grids
        self._setup: OrderedDict = OrderedDict()  # (grid key, device) -> (cos, sin, lengths, splits)

    def setup(self, grid_thw) -> tuple:
        """``(cos, sin, lengths, splits)`` for ``grid_thw``: the rotary cos/sin ``[n_patches, 1, head_dim]`` (float32,
        unsqueezed for the heads, as ``apply_rotary_pos_emb_vision`` uses them), the attention lengths (one per
        frame) and the merged tokens per image. Built by transformers' own helpers and rotary module, once per grid.

        Example:
            >>> cos, sin, lengths, splits = LeanVision(model).setup([(1, 8, 8)])   # doctest: +SKIP
            >>> lengths, splits                                                    # doctest: +SKIP
            ([64], [16])
        """
        from transformers.vision_utils import get_vision_attention_seqlens, get_vision_position_ids

        t = self.tower
        dev = t.patch_embed.proj.weight.device
        key = (_grid_key(grid_thw), dev)
        hit = self._setup.get(key)
        if hit is not None:
            self._setup.move_to_end(key)
            return hit
        grid = torch.tensor(key[0], dtype=torch.long)  # integer set-up: the same on the host as on the device
        pos = get_vision_position_ids(grid, t.spatial_merge_size).to(dev)
        cu, _ = get_vision_attention_seqlens(grid, t.config)
        # the angles are floats: computed on the tower's device by its own module, as its forward computes them
        cos, sin = t.rotary_pos_emb(torch.empty(0, device=dev), pos)
        hit = (cos.unsqueeze(-2).float(), sin.unsqueeze(-2).float(), (cu[1:] - cu[:-1]).tolist(),
               (grid.prod(-1) // t.spatial_merge_size ** 2).tolist())
        self._setup[key] = hit
        while len(self._setup) > self.cache_grids:
            self._setup.popitem(last=False)
        return hit

    def embed(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """The patch embedding ``[n_patches, embed_dim]`` of ``pixel_values[n_patches, C * T * P * P]``: the Conv3d
        as ``PatchEmbed`` runs it, or (``patch_matmul``) one matmul over the flattened patches.

        Example:
            >>> LeanVision(model).embed(pixel_values).shape                        # doctest: +SKIP
            torch.Size([256, 128])
        """
        pe = self.tower.patch_embed
        w = pe.proj.weight
        x = pixel_values.to(w.dtype)  # get_image_features' cast to the tower's dtype (its first weight's: this one)
        if self.patch_matmul:  # inexact: the conv's kernel accumulates in another order
            return F.linear(x.reshape(x.shape[0], -1), w.reshape(pe.embed_dim, -1), pe.proj.bias)
        c = pe.proj
        x = x.view(-1, pe.in_channels, pe.temporal_patch_size, pe.patch_size, pe.patch_size)
        return F.conv3d(x, w, c.bias, c.stride, c.padding, c.dilation, c.groups).view(-1, pe.embed_dim)

    def __call__(self, pixel_values: torch.Tensor, grid_thw) -> tuple:
        """The per-image features (a tuple of ``[tokens_i, hidden]``) of ``pixel_values`` over ``grid_thw`` (a
        ``[n, 3]`` tensor on any device, or triples; a host one spares the device a sync).

        Example:
            >>> [f.shape for f in LeanVision(model)(pixel_values, [(1, 8, 16), (1, 8, 16)])]   # doctest: +SKIP
            [torch.Size([32, 256]), torch.Size([32, 256])]
        """
        cos, sin, lengths, splits = self.setup(grid_thw)
        t = self.tower
        h = self.embed(pixel_values)
        n = h.shape[0]
        for blk in t.blocks:
            a, mlp = blk.attn, blk.mlp
            x = _layer_norm(h, blk.norm1)
            q, k, v = F.linear(x, a.qkv.weight, a.qkv.bias).reshape(n, 3, a.num_heads, -1).permute(1, 0, 2, 3) \
                .unbind(0)
            # apply_rotary_pos_emb_vision: rotate in float32, back to the activations' dtype
            qf, kf = q.float(), k.float()
            q = ((qf * cos) + (_rotate_half(qf) * sin)).to(q.dtype)
            k = ((kf * cos) + (_rotate_half(kf) * sin)).to(k.dtype)
            q, k, v = (s.transpose(0, 1).unsqueeze(0) for s in (q, k, v))
            # one SDPA per frame (the tower attends within a frame), as VisionAttention's non-flash path runs it
            o = torch.cat([_attend(a, qi, ki, vi, None, False)
                           for qi, ki, vi in zip(q.split(lengths, 2), k.split(lengths, 2), v.split(lengths, 2))], dim=1)
            h = h + F.linear(o.reshape(n, -1).contiguous(), a.proj.weight, a.proj.bias)
            x = _layer_norm(h, blk.norm2)
            h = h + F.linear(mlp.act.forward(F.linear(x, mlp.fc1.weight, mlp.fc1.bias)), mlp.fc2.weight, mlp.fc2.bias)
        m = t.merger
        x = _layer_norm(h, m.ln_q).view(-1, m.hidden_size)
        l1, act, l2 = m.mlp
        x = F.linear(act.forward(F.linear(x, l1.weight, l1.bias)), l2.weight, l2.bias)
        return torch.split(x, splits)
