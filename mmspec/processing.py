"""generate()'s logits processors, applied to every node of a batch of draft trees.

``generate`` passes each step's scores through a :class:`~transformers.LogitsProcessorList` that may read
the row's whole history (repetition penalty, n-gram blocking, min length). To stay lossless each tree
node must be processed on *its own* history: the padded prompt row, the row's generated tokens and the
path down to the node, exactly the ``input_ids`` ``generate`` would hold when scoring it.

Three cost tiers, picked once per call:

* no processors (plain greedy): the raw logits;
* processors that read only the scores (temperature, top-k, top-p, ...: the sampling default): one call on
  all nodes of all rows at once; when every processor is exactly one of transformers' scores-only classes they
  are called directly (``LogitsProcessorList`` inspects each one's signature on every call) and
  ``SuppressTokensLogitsProcessor``'s mask is built once per vocabulary size and device (it rebuilds it with
  ``isin`` over the vocabulary on every call): the same scores, bit for bit;
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


class _SuppressOnce:
    """``SuppressTokensLogitsProcessor`` with its mask built once per (vocabulary size, device): ``-inf`` at the
    suppressed ids, the scores elsewhere, as its ``torch.where`` gives them."""

    def __init__(self, processor):
        self.tokens = processor.suppress_tokens
        self._masks: dict = {}

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        key = (scores.shape[-1], scores.device)
        mask = self._masks.get(key)
        if mask is None:
            vocab = torch.arange(scores.shape[-1], device=scores.device)
            mask = self._masks[key] = torch.isin(vocab, self.tokens.to(scores.device))
        return scores.masked_fill(mask, -float("inf"))


def _direct(processors) -> list | None:
    """``processors`` as plain ``(input_ids, scores)`` callables, in order, when each is exactly (not a subclass of)
    one of transformers' scores-only classes, whose ``__call__`` takes just those two (what ``LogitsProcessorList``
    would find by inspecting it); ``None`` otherwise."""
    from transformers.generation import logits_process

    out = []
    for p in processors:
        name = type(p).__name__
        if name not in _SCORES_ONLY or type(p) is not getattr(logits_process, name, None):
            return None
        out.append(_SuppressOnce(p) if name == "SuppressTokensLogitsProcessor" else p)
    return out


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
        self._direct = _direct(processors) if self.mode == "scores-only" else None

    def _scores_only(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self._direct is None:
            return self.processors(input_ids, scores)
        for p in self._direct:
            scores = p(input_ids, scores)
        return scores

    def first(self, input_ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """Scores for the token after the prompt (the prefill step), for the whole batch."""
        if self.mode == "none":
            return logits
        return self._scores_only(input_ids, logits) if self.mode == "scores-only" else self.processors(input_ids, logits)

    def __call__(self, rows: list[int], generated: list[list[int]], trees: list[DraftTree], logits: torch.Tensor):
        """``logits[B, Q, V]`` of the active ``rows`` -> processed scores (a tensor, or a list per row)."""
        if self.mode == "none":
            return logits
        if self.mode == "scores-only":
            b, q, v = logits.shape
            dummy = torch.zeros(b * q, 1, dtype=torch.long, device=logits.device)
            return self._scores_only(dummy, logits.reshape(b * q, v)).reshape(b, q, v)
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
