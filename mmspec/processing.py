"""generate()'s logits processors, applied to every node of a batch of draft trees.

``generate`` passes each step's scores through a :class:`~transformers.LogitsProcessorList` that may read
the row's whole history (repetition penalty, n-gram blocking, min length). To stay lossless each tree
node must be processed on *its own* history: the padded prompt row, the row's generated tokens and the
path down to the node, exactly the ``input_ids`` ``generate`` would hold when scoring it.

Three cost tiers, picked once per call:

* no processors (plain greedy): the raw logits;
* processors that read only the scores (temperature, top-k, top-p, ...: the sampling default): one call on
  all nodes of all rows at once;
* history readers: one call per depth per row, on stacked histories; a processor that may hold per-row
  state (a batch-shaped tensor, a batch id) runs each node in its own row's slot of a full-batch call.

Example:
    >>> from transformers import LogitsProcessorList, TemperatureLogitsWarper
    >>> procs = TreeLogitsProcessor(LogitsProcessorList([TemperatureLogitsWarper(0.5)]), torch.zeros(1, 3, dtype=torch.long))
    >>> procs.mode
    'scores-only'
"""

from __future__ import annotations

import copy

import torch

from .tree import DraftTree

__all__ = ["TreeLogitsProcessor"]

# Read only the scores, never input_ids.
_SCORES_ONLY = {
    "TemperatureLogitsWarper", "TopPLogitsWarper", "TopKLogitsWarper", "TopHLogitsWarper", "MinPLogitsWarper",
    "TypicalLogitsWarper", "EpsilonLogitsWarper", "EtaLogitsWarper", "InfNanRemoveLogitsProcessor",
    "LogitNormalization", "SuppressTokensLogitsProcessor",
}
# Output for a row depends only on that row's input_ids and scores.
_ROW_FREE = _SCORES_ONLY | {
    "MinLengthLogitsProcessor", "MinNewTokensLengthLogitsProcessor", "NoRepeatNGramLogitsProcessor",
    "SequenceBiasLogitsProcessor", "NoBadWordsLogitsProcessor", "ForcedBOSTokenLogitsProcessor",
    "ForcedEOSTokenLogitsProcessor", "ExponentialDecayLengthPenalty", "SuppressTokensLogitsProcessor",
    "SuppressTokensAtBeginLogitsProcessor",
}


def _row_view(processors, row: int):
    """``processors`` specialised to batch row ``row`` (then row-free), or ``None`` if that is not possible."""
    from transformers import LogitsProcessorList

    out = LogitsProcessorList()
    for p in processors:
        name = type(p).__name__
        if name == "RepetitionPenaltyLogitsProcessor":
            if isinstance(p.prompt_ignore_length, torch.Tensor):
                p = copy.copy(p)
                p.prompt_ignore_length = int(p.prompt_ignore_length[row])
        elif name not in _ROW_FREE:
            return None
        out.append(p)
    return out


class TreeLogitsProcessor:
    """Process target logits for ``[root] + nodes`` of every active row as ``generate`` would.

    Args:
        processors: the list ``generate`` builds (``model._get_logits_processor``).
        padded_prompt: ``[B, P]`` prompt ids as given (left padding included: ``generate`` sees it too).
    """

    def __init__(self, processors, padded_prompt: torch.Tensor):
        self.processors = processors
        self.padded_prompt = padded_prompt
        self.batch = padded_prompt.shape[0]
        names = {type(p).__name__ for p in processors}
        if not processors:
            self.mode = "none"
        elif names <= _SCORES_ONLY:
            self.mode = "scores-only"
        else:
            self.mode = "history"
        self._views: dict = {}

    def first(self, input_ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """Scores for the token after the prompt (the prefill step), for the whole batch."""
        return self.processors(input_ids, logits) if self.mode != "none" else logits

    def __call__(self, rows: list[int], generated: list[list[int]], trees: list[DraftTree], logits: torch.Tensor):
        """``logits[B, Q, V]`` of the active ``rows`` -> processed scores (a tensor, or a list per row)."""
        if self.mode == "none":
            return logits
        if self.mode == "scores-only":
            b, q, v = logits.shape
            dummy = torch.zeros(b * q, 1, dtype=torch.long, device=logits.device)
            return self.processors(dummy, logits.reshape(b * q, v)).reshape(b, q, v)
        return [self._row(r, generated[r], t, logits[i, : len(t) + 1]) for i, (r, t) in enumerate(zip(rows, trees))]

    def _row(self, row: int, generated: list[int], tree: DraftTree, logits: torch.Tensor) -> torch.Tensor:
        if row not in self._views:
            self._views[row] = _row_view(self.processors, row)
        procs = self._views[row]
        dev = logits.device
        base = torch.cat([self.padded_prompt[row], torch.tensor(generated, dtype=torch.long)]).to(dev)
        n = len(tree)
        paths = [tree.path_to(i) for i in range(n)]
        hists = [base] + [torch.cat([base, torch.as_tensor(tree.tokens[p], device=dev)]) for p in paths]
        out = torch.empty_like(logits)
        if procs is not None:
            depth = [0] + [len(p) for p in paths]
            for d in sorted(set(depth)):
                idx = [i for i, x in enumerate(depth) if x == d]
                out[idx] = procs(torch.stack([hists[i] for i in idx]), logits[idx])
            return out
        for i, h in enumerate(hists):
            res = self.processors(h[None].expand(self.batch, -1).contiguous(),
                                  logits[i : i + 1].expand(self.batch, -1).clone())
            out[i] = res[row]
        return out
