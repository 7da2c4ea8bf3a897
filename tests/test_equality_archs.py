"""Lossless greedy speculative decoding on real HF architectures, token for token.

For tiny random fp32 models of Qwen2 (text; sdpa and eager attention), LLaVA, Idefics3 (SmolVLM family) and
PaliGemma, ``mmspec.generate(model, inputs, drafter=..., max_new_tokens=N)`` must return the same
``sequences`` as ``model.generate(**inputs, max_new_tokens=N, do_sample=False)``:

* at batch 1, and at batch 4 with unequal, left-padded prompts (and images where the model takes them);
* with no drafter (plain AR through mmspec's loop), prompt lookup, a smaller draft model of the same
  architecture, and a noisy oracle proposing chains and trees;
* at batch 4 with an eos token that ends rows at different times (pad filling), and with an eos that ends
  one row on its very first token (the row leaves the batch right after prefill).

A second group checks the KV-cache invariants after every commit for 500 rounds on a tiny Qwen2.

On a mismatch the assertion reports the first differing step and ``generate``'s own logit gap between the
two tokens there, so a float near-tie (gap < 1e-4) is told apart from a real bug at once.
"""

from __future__ import annotations

import functools

import pytest
import torch

import mmspec
from mmspec.drafters import DraftModelDrafter, NoisyOracleDrafter, PromptLookupDrafter, UnionDrafter
from mmspec.target import TargetAdapter

from _tiny_archs import BUILDERS, PAD, VOCAB

MAX_NEW = 24
NEAR_TIE = 1e-4

ARCHS = ["qwen2", "qwen2-eager", "llava", "idefics3", "paligemma"]

# PaliGemma's positions are 1-indexed (its prepare_inputs_for_generation adds 1); it stays in the matrix
# because an earlier TargetAdapter tracked the unshifted positions and drifted by one from the second token.
ARCH_PARAMS = ARCHS
CASES = ["b1", "b4-eos-mid", "b4-eos-first"]
DRAFTERS = ["none", "lookup", "draft-model", "draft-model-stop", "oracle-chain", "oracle-tree", "union"]


# ---------------------------------------------------------------- fixtures (built once per module)
@functools.lru_cache(maxsize=None)
def _arch(name: str):
    return BUILDERS[name]()


def _generate_ref(model, inputs: dict, eos):
    return model.generate(**inputs, max_new_tokens=MAX_NEW, do_sample=False, eos_token_id=eos, pad_token_id=PAD,
                          output_logits=True, return_dict_in_generate=True)


def _first_hit(row: list[int], tok: int) -> int | None:
    return row.index(tok) if tok in row else None


def _pick_eos_mid(tails: list[list[int]]) -> int:
    """A token the reference emits mid-way in some rows but not at the same step in all: rows then finish at
    different times. Prefer the most distinct finish times, then a row that never emits it (runs to the end)."""
    best, best_key = None, None
    for tok in sorted({t for row in tails for t in row} - {PAD}):  # eos != pad, so pad filling is visible
        hits = [_first_hit(row, tok) for row in tails]
        finite = [h for h in hits if h is not None]
        if not any(1 <= h <= MAX_NEW - 3 for h in finite) or min(finite) == 0:
            continue
        ends = {h if h is not None else MAX_NEW for h in hits}
        key = (len(ends), None in hits, -tok)
        if best_key is None or key > best_key:
            best, best_key = tok, key
    assert best is not None and best_key[0] >= 2, f"no eos candidate ends rows at different times in {tails}"
    return best


def _pick_eos_first(tails: list[list[int]]) -> int:
    """Row 0's first token, as long as some other row does not start with it (so not every row ends at once)."""
    tok = tails[0][0]
    assert tok != PAD, "row 0 starts with the pad token; eos must differ from pad"
    assert any(row[0] != tok for row in tails[1:]), f"every row starts with {tok}; pick another case"
    return tok


@functools.lru_cache(maxsize=None)
def _case(arch_name: str, case: str):
    """(inputs, eos, reference generate output) for one architecture and batch case."""
    arch = _arch(arch_name)
    batch = 1 if case == "b1" else 4
    inputs = arch.make_inputs(batch)
    eos = None
    if case != "b1":
        plain = _generate_ref(arch.model, inputs, None)
        prompt_len = inputs["input_ids"].shape[1]
        tails = plain.sequences[:, prompt_len:].tolist()
        eos = _pick_eos_mid(tails) if case == "b4-eos-mid" else _pick_eos_first(tails)
    ref = _generate_ref(arch.model, inputs, eos)
    if eos is not None:  # the case must really end rows at different times, with pad filling after them
        tails = ref.sequences[:, inputs["input_ids"].shape[1]:].tolist()
        ends = {(_first_hit(row, eos) if eos in row else MAX_NEW) for row in tails}
        assert len(ends) >= 2, f"eos {eos} does not end rows at different times: {tails}"
    return inputs, eos, ref


@pytest.fixture(scope="module", params=ARCH_PARAMS)
def arch_name(request):
    _arch(request.param)  # build once, before timing the tests that use it
    return request.param


def _make_drafter(kind: str, arch, ref_tail: torch.Tensor):
    if kind == "none":
        return None
    if kind == "lookup":
        return PromptLookupDrafter()
    if kind == "draft-model":
        return DraftModelDrafter(arch.draft, num_draft_tokens=4)
    if kind == "draft-model-stop":  # cut where the cumulative probability drops below 0.02: chains of 1-4
        return DraftModelDrafter(arch.draft, num_draft_tokens=4, min_confidence=0.02)
    if kind == "union":  # a corrupted oracle's chain, a draft model's chain and lookup with memory, merged
        return UnionDrafter([NoisyOracleDrafter(ref_tail, depth=4, corrupt_p=0.3, vocab_size=VOCAB),
                             DraftModelDrafter(arch.draft, num_draft_tokens=3),
                             PromptLookupDrafter(history_tokens=200)])
    branches = 0 if kind == "oracle-chain" else 3
    return NoisyOracleDrafter(ref_tail, depth=4, corrupt_p=0.3, vocab_size=VOCAB, extra_branches=branches)


# ---------------------------------------------------------------- comparison with a diagnosis
def _min_gap(ref, prompt_len: int, eos) -> float:
    """Smallest top-1/top-2 logit gap over every step where a row was still generating."""
    logits = torch.stack(ref.logits, dim=1)  # [B, T, V]
    top2 = logits.topk(2, dim=-1).values
    gaps = top2[..., 0] - top2[..., 1]
    best = float("inf")
    for r, row in enumerate(ref.sequences[:, prompt_len:].tolist()):
        end = (row.index(eos) + 1) if (eos is not None and eos in row) else len(row)
        best = min(best, float(gaps[r, :end].min()))
    return best


def assert_same_as_generate(out_seq: torch.Tensor, ref, prompt_len: int, eos, what: str) -> None:
    expected = ref.sequences
    if out_seq.shape == expected.shape and torch.equal(out_seq, expected):
        return
    lines = [f"{what}: mmspec.generate differs from model.generate",
             f"  shapes: mmspec {tuple(out_seq.shape)} vs generate {tuple(expected.shape)}"]
    width = min(out_seq.shape[1], expected.shape[1])
    diff = (out_seq[:, :width] != expected[:, :width]).nonzero().tolist()
    if diff:
        r, c = min(diff, key=lambda rc: (rc[1], rc[0]))
        step = c - prompt_len
        got, want = int(out_seq[r, c]), int(expected[r, c])
        lines.append(f"  first difference: row {r}, generated step {step}: mmspec {got}, generate {want}")
        if 0 <= step < len(ref.logits):
            lg = ref.logits[step][r].float()
            gap = float(lg[want] - lg[got])
            kind = "NEAR-TIE (float noise)" if gap < NEAR_TIE else "NOT a near-tie: a real divergence"
            lines.append(f"  generate's logit gap there, logit[{want}] - logit[{got}] = {gap:.3e} -> {kind}")
        lines.append(f"  mmspec   row {r}: {out_seq[r, prompt_len:].tolist()}")
        lines.append(f"  generate row {r}: {expected[r, prompt_len:].tolist()}")
    lines.append(f"  eos={eos}; smallest greedy margin in the reference: {_min_gap(ref, prompt_len, eos):.3e}")
    raise AssertionError("\n".join(lines))


# ---------------------------------------------------------------- equality tests
@pytest.mark.parametrize("drafter_kind", DRAFTERS)
@pytest.mark.parametrize("case", CASES)
def test_greedy_equals_generate(arch_name, case, drafter_kind):
    arch = _arch(arch_name)
    inputs, eos, ref = _case(arch_name, case)
    prompt_len = inputs["input_ids"].shape[1]
    drafter = _make_drafter(drafter_kind, arch, ref.sequences[:, prompt_len:])
    out = mmspec.generate(arch.model, inputs, drafter=drafter, max_new_tokens=MAX_NEW, eos_token_id=eos,
                          pad_token_id=PAD)
    assert_same_as_generate(out.sequences, ref, prompt_len, eos, f"{arch_name}/{case}/{drafter_kind}")
    assert out.stats.lossless
    # One target pass per round plus the prefill; a drafter never costs more passes than plain AR.
    assert out.stats.target_forwards == out.stats.rounds + 1
    assert out.stats.rounds <= MAX_NEW - 1


def test_reference_margins_are_clear():
    """The fixtures decide every greedy step by a clear margin, so no equality test can hinge on float noise."""
    for name in ARCHS:
        for case in CASES:
            inputs, eos, ref = _case(name, case)
            gap = _min_gap(ref, inputs["input_ids"].shape[1], eos)
            assert gap > NEAR_TIE, f"{name}/{case}: greedy margin {gap:.2e} is too small for an exact test"


def test_draft_model_matches_target_shapes():
    """Each draft model is a smaller model of the target's architecture with the same vocabulary."""
    for name in ARCHS:
        arch = _arch(name)
        assert type(arch.draft) is type(arch.model)
        tgt, drf = arch.model.config.get_text_config(), arch.draft.config.get_text_config()
        assert drf.vocab_size == tgt.vocab_size == VOCAB
        assert drf.num_hidden_layers < tgt.num_hidden_layers
        assert sum(p.numel() for p in arch.draft.parameters()) < sum(p.numel() for p in arch.model.parameters())


# ---------------------------------------------------------------- KV cache invariants over 500 rounds
class _CommitSpy:
    """Wraps ``TargetAdapter.commit``/``select_rows`` of the target's adapter and checks the cache after each."""

    def __init__(self, target, prompt_lengths: list[int]):
        self.target = target
        self.prompt_lengths = prompt_lengths
        self.generated = [0] * len(prompt_lengths)
        self.active = None  # original row of each state row, known once the target's adapter acts
        self.commits = 0
        self.max_cache = 0

    def on_tokens(self, row: int, tokens: list[int]) -> None:
        self.generated[row] += len(tokens)

    def check(self, state) -> None:
        valid = state.valid
        if not self.active:  # every row finished this round: nothing is cached any more
            assert valid.shape[0] == 0 and all(layer.keys.shape[0] == 0 for layer in state.cache.layers)
            return
        counts = valid.sum(dim=1)
        length = valid.shape[1]
        for i, layer in enumerate(state.cache.layers):
            assert layer.keys.shape[-2] == length, f"layer {i} keys hold {layer.keys.shape[-2]} slots, valid {length}"
            assert layer.values.shape[-2] == length, f"layer {i} values hold {layer.values.shape[-2]} slots"
            assert layer.keys.shape[0] == valid.shape[0] == len(self.active)
        assert length == int(counts.max()), f"cache length {length} != longest row's committed {int(counts.max())}"
        for i, r in enumerate(self.active):
            want = self.prompt_lengths[r] + self.generated[r] - 1  # the pending token is not cached yet
            assert int(counts[i]) == want, f"row {r}: {int(counts[i])} cached slots, expected {want}"
            # right-aligned: the valid slots of a row are contiguous and end at the last slot
            assert bool(valid[i, length - int(counts[i]):].all())
        self.max_cache = max(self.max_cache, length)

    def install(self, monkeypatch) -> None:
        spy = self
        orig_commit, orig_select = TargetAdapter.commit, TargetAdapter.select_rows

        def commit(adapter, state, paths, next_tokens, keep_rows=None):
            orig_commit(adapter, state, paths, next_tokens, keep_rows=keep_rows)
            if adapter.model is spy.target:
                if spy.active is None:
                    spy.active = list(range(len(spy.prompt_lengths)))
                if keep_rows is not None:
                    spy.active = [spy.active[int(i)] for i in keep_rows]
                spy.commits += 1
                spy.check(state)

        def select_rows(adapter, state, keep):
            orig_select(adapter, state, keep)
            if adapter.model is spy.target:
                assert spy.active is None, "select_rows on the target only runs right after prefill"
                spy.active = [int(i) for i in keep]
                spy.check(state)

        monkeypatch.setattr(TargetAdapter, "commit", commit)
        monkeypatch.setattr(TargetAdapter, "select_rows", select_rows)


LONG_NEW = 501  # the first token comes from the prefill: plain AR then runs exactly 500 rounds


@pytest.mark.parametrize("drafter_kind", ["none", "oracle-tree"])
def test_kv_cache_matches_committed_length_500_rounds(monkeypatch, drafter_kind):
    arch = _arch("qwen2")
    model = arch.model
    inputs = arch.make_inputs(4)
    mask = inputs["attention_mask"]
    prompt_len = inputs["input_ids"].shape[1]
    ref = model.generate(**inputs, max_new_tokens=LONG_NEW, do_sample=False, eos_token_id=None, pad_token_id=PAD,
                         output_logits=True, return_dict_in_generate=True)
    spy = _CommitSpy(model, mask.sum(dim=1).tolist())
    spy.install(monkeypatch)
    if drafter_kind == "none":
        drafter = None
    else:  # a tree with rejections at every depth: compaction drops rejected slots, rows drift apart
        drafter = NoisyOracleDrafter(ref.sequences[:, prompt_len:], depth=4, corrupt_p=0.3, vocab_size=VOCAB,
                                     extra_branches=3)
    out = mmspec.generate(model, inputs, drafter=drafter, max_new_tokens=LONG_NEW, eos_token_id=None,
                          pad_token_id=PAD, on_tokens=spy.on_tokens)
    assert spy.commits == out.stats.rounds
    assert spy.generated == [LONG_NEW] * 4
    if drafter is None:
        assert spy.commits == 500
        # round k leaves prompt + k slots; the last round (k = 500) finishes every row and empties the batch
        assert spy.max_cache == int(mask.sum(dim=1).max()) + LONG_NEW - 2
    assert_same_as_generate(out.sequences, ref, prompt_len, None, f"qwen2/500-rounds/{drafter_kind}")
