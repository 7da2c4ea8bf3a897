"""TreeLogitsProcessor's direct path for scores-only processors (mmspec/processing.py): the processors called
without LogitsProcessorList's per-call signature inspection, SuppressTokensLogitsProcessor's mask built once. The
scores must be bit-identical to LogitsProcessorList's, whatever the combination and order."""

from __future__ import annotations

import pytest
import torch
from transformers import (LogitsProcessorList, MinPLogitsWarper, SuppressTokensLogitsProcessor,
                          TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)

from mmspec.processing import TreeLogitsProcessor
from mmspec.tree import DraftTree

V = 50
SUPPRESS = [0, 3, 4, 17, 49]

COMBOS = {
    "suppress": lambda: [SuppressTokensLogitsProcessor(SUPPRESS)],
    "temperature": lambda: [TemperatureLogitsWarper(0.7)],
    "suppress+temperature+top_k": lambda: [SuppressTokensLogitsProcessor(SUPPRESS), TemperatureLogitsWarper(1.3),
                                           TopKLogitsWarper(7)],
    "suppress+top_p": lambda: [SuppressTokensLogitsProcessor(SUPPRESS), TopPLogitsWarper(0.8)],
    "temperature+top_k+top_p+min_p": lambda: [TemperatureLogitsWarper(0.5), TopKLogitsWarper(10),
                                              TopPLogitsWarper(0.9), MinPLogitsWarper(0.05)],
    "top_k then suppress (order kept)": lambda: [TopKLogitsWarper(3), SuppressTokensLogitsProcessor(SUPPRESS),
                                                 TemperatureLogitsWarper(0.9)],
    "two suppressors": lambda: [SuppressTokensLogitsProcessor([1, 2]), SuppressTokensLogitsProcessor(SUPPRESS)],
}


def _scores(seed, b, q, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(b, q, V, generator=g) * (1 + seed % 4)
    s[0, 0, 5] = s[0, 0, 6]  # ties at the top-k / top-p boundary are where an order slip would show
    return s.to(dtype)


@pytest.mark.parametrize("name", sorted(COMBOS))
def test_direct_path_equals_logits_processor_list(name):
    procs = LogitsProcessorList(COMBOS[name]())
    tp = TreeLogitsProcessor(procs, torch.zeros(2, 3, dtype=torch.long))
    assert tp.mode == "scores-only" and tp._direct is not None  # the fast path is the one under test
    for seed in range(12):
        b, q = 1 + seed % 2, 1 + seed % 5
        logits = _scores(seed, b, q)
        trees = [DraftTree.from_chain(list(range(1, q))) for _ in range(b)]
        got = tp(list(range(b)), [[] for _ in range(b)], trees, logits)
        want = procs(torch.zeros(b * q, 1, dtype=torch.long), logits.reshape(b * q, V)).reshape(b, q, V)
        assert torch.equal(got, want) and got.dtype == want.dtype, (name, seed)
        first = logits[:, 0]
        assert torch.equal(tp.first(torch.zeros(b, 3, dtype=torch.long), first), procs(None, first))


def test_suppress_mask_built_once_per_vocab_and_device():
    procs = LogitsProcessorList([SuppressTokensLogitsProcessor(SUPPRESS)])
    tp = TreeLogitsProcessor(procs, torch.zeros(1, 1, dtype=torch.long))
    sup = tp._direct[0]
    for seed in range(3):
        tp([0], [[]], [DraftTree.from_chain([1, 2])], _scores(seed, 1, 3))
    assert len(sup._masks) == 1
    wider = torch.randn(4, V + 7)  # another vocabulary size: its own mask, the same result as the processor's
    assert torch.equal(tp.first(None, wider), procs(None, wider))
    assert len(sup._masks) == 2
    half = torch.randn(3, V).to(torch.bfloat16)  # dtype kept, -inf where suppressed
    assert torch.equal(tp.first(None, half), procs(None, half)) and tp.first(None, half).dtype == torch.bfloat16


def test_unknown_or_subclassed_processors_keep_the_list_call():
    class MyTemperature(TemperatureLogitsWarper):  # a subclass may take more arguments: not called directly
        pass

    MyTemperature.__name__ = "TemperatureLogitsWarper"
    tp = TreeLogitsProcessor(LogitsProcessorList([MyTemperature(0.5)]), torch.zeros(1, 1, dtype=torch.long))
    assert tp.mode == "scores-only" and tp._direct is None
    logits = torch.randn(1, 2, V)
    assert torch.equal(tp([0], [[]], [DraftTree.from_chain([1])], logits), logits / 0.5)
