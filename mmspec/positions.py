"""Positions adapters: where each drafted token sits in the target's rotary space.

``generate`` decides every position; mmspec must put drafted tokens exactly where ``generate`` would
have put them, or acceptance silently falls (vLLM issue 54498). Rather than re-deriving each model's
rule, the adapter asks the model itself at prefill (``_prepare_position_ids_for_generation``, the hook
``generate`` calls: cumulative-mask positions for 1-D RoPE, ``get_rope_index`` for M-RoPE, with the
text axis prepended for the Qwen-VL family) and then advances the way ``generate`` advances during
decoding: every axis of the next token is the last token's position plus one. For M-RoPE this puts the
text after an image at ``max(image positions) + 1`` on all three axes, via the rope delta.

Positions are kept as ``next_pos[A, B]`` (``A`` axes; ``A = 1`` for plain RoPE), the position the
pending token of each row will take; a node at depth ``d`` of a draft tree takes ``next_pos + d``.

Example:
    >>> import torch
    >>> pos = StreamPositions(torch.tensor([[0, 1, 2], [0, 0, 1]]))  # 1-D RoPE: [B=2, L=3]
    >>> pos.next_pos.tolist()
    [[3, 2]]
    >>> pos.for_offsets(torch.tensor([[0, 1], [0, 1]])).tolist()
    [[3, 4], [2, 3]]
"""

from __future__ import annotations

import torch

__all__ = ["StreamPositions", "prefill_position_ids"]


def prefill_position_ids(model, input_ids: torch.Tensor, model_kwargs: dict) -> torch.Tensor | None:
    """The prefill ``position_ids`` ``generate`` would compute for these inputs (``None`` if unused).

    May set the model's own rope-delta state as a side effect, exactly as ``generate`` does.
    """
    import inspect

    if "position_ids" not in inspect.signature(model.forward).parameters:
        return None
    return model._prepare_position_ids_for_generation(input_ids, dict(model_kwargs))


class StreamPositions:
    """Per-row next positions after a prefill, in the layout the model's forward takes.

    Args:
        prefill_positions: the prefill ``position_ids``, ``[B, L]`` (1-D RoPE) or ``[A, B, L]``
            (M-RoPE: ``A`` is 3, or 4 with the text axis first as transformers 5 prepares it).
    """

    def __init__(self, prefill_positions: torch.Tensor):
        self.squeeze = prefill_positions.dim() == 2
        p = prefill_positions[None] if self.squeeze else prefill_positions
        self.next_pos = p[..., -1] + 1  # [A, B]: generate advances every axis from the last token

    def for_offsets(self, offsets: torch.Tensor) -> torch.Tensor:
        """Positions for tokens at ``offsets[B, Q]`` past the pending token (root offset 0)."""
        pos = self.next_pos[:, :, None] + offsets[None].to(self.next_pos.device)
        return pos[0] if self.squeeze else pos

    def advance(self, counts: torch.Tensor) -> None:
        """Move each row past ``counts[B]`` newly committed tokens."""
        self.next_pos = self.next_pos + counts.to(self.next_pos.device)[None]

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep only ``rows`` (batch indices), e.g. when finished rows leave the batch."""
        self.next_pos = self.next_pos[:, rows.to(self.next_pos.device)]
