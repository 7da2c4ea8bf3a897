"""Prompt-lookup drafter: candidate order, periodic extension, tree merging."""

from mmspec.drafters import PromptLookupDrafter
from mmspec.drafters.base import DraftContext
from mmspec.tree import DraftTree


def test_longest_ngram_and_most_recent_first():
    d = PromptLookupDrafter(num_draft_tokens=3, max_ngram=3, max_matches=3)
    seq = [1, 2, 3, 9, 8, 2, 3, 7, 6, 1, 2, 3]
    # n=3 "1 2 3" matches at 0 -> [9, 8, 2]; n=2 "2 3" at 5 -> [7, 6, 1] (and at 1: a duplicate);
    # n=1 finds only duplicates again.
    assert d.candidates(seq) == [[9, 8, 2], [7, 6, 1]]


def test_no_match_gives_empty_tree():
    d = PromptLookupDrafter()
    ctx = DraftContext(sequences=[[1, 2, 3, 4]], rows=[0], remaining=[10], prompt_lengths=[4])
    assert len(d.propose(ctx)[0]) == 0


def test_continuation_extends_periodically_past_the_end():
    d = PromptLookupDrafter(num_draft_tokens=7, max_matches=1)
    assert d.candidates([7, 5, 6, 5, 6, 5, 6]) == [[5, 6, 5, 6, 5, 6, 5]]
    assert d.candidates([4, 1, 2, 3, 1, 2, 3]) == [[1, 2, 3, 1, 2, 3, 1]]


def test_several_matches_merge_into_a_tree():
    d = PromptLookupDrafter(num_draft_tokens=2, max_ngram=1, max_matches=4)
    ctx = DraftContext(sequences=[[5, 1, 5, 2, 5, 3, 5]], rows=[0], remaining=[10], prompt_lengths=[7])
    tree = d.propose(ctx)[0]
    assert sorted(tree.token_paths()) == [[1, 5], [2, 5], [3, 5]]
    assert tree.max_depth == 2 and len(tree) == 6


def test_incremental_index_equals_a_fresh_scan():
    """propose() keeps one n-gram index per row across rounds; it must give what a fresh scan gives."""
    import numpy as np

    rng = np.random.default_rng(0)
    d = PromptLookupDrafter(num_draft_tokens=5, max_ngram=3, max_matches=3)
    seq = list(rng.integers(0, 6, 20))
    ctx = DraftContext(sequences=[np.asarray(seq)], rows=[7], remaining=[100], prompt_lengths=[20])
    d.begin(ctx)
    for _ in range(40):
        seq += list(rng.integers(0, 6, int(rng.integers(1, 4))))
        ctx.sequences = [np.asarray(seq)]
        tree = d.propose(ctx)[0]
        fresh = PromptLookupDrafter(num_draft_tokens=5, max_ngram=3, max_matches=3).candidates(seq)
        assert tree.token_paths() == DraftTree.from_sequences(fresh, budget=d.budget).token_paths()


def test_history_remembers_earlier_outputs_and_stays_lossless():
    """Cross-request memory: a second batch whose prompts lead into what an earlier batch generated drafts
    from it (fewer rounds), the output is still the target's own, and old requests are dropped first."""
    import numpy as np
    import torch

    import _tiny_text as T
    from mmspec.decode import generate

    torch.manual_seed(0)
    tok = T.tokenizer()
    model = T.model(len(tok), seed=3, std=0.3)
    enc = tok(["the chart value", "a red table row"], return_tensors="pt", padding=True)
    ar = model.generate(**enc, max_new_tokens=24, do_sample=False, min_new_tokens=24)
    memory = PromptLookupDrafter(num_draft_tokens=6, max_ngram=3, max_matches=1, history_tokens=1000)
    plain = PromptLookupDrafter(num_draft_tokens=6, max_ngram=3, max_matches=1)
    first = generate(model, enc, memory, max_new_tokens=24, min_new_tokens=24)
    assert torch.equal(first.sequences, ar) and len(memory._history) == 2 * 25  # two outputs + separators
    again = generate(model, enc, memory, max_new_tokens=24, min_new_tokens=24)
    base = generate(model, enc, plain, max_new_tokens=24, min_new_tokens=24)
    assert torch.equal(again.sequences, ar) and torch.equal(base.sequences, ar)
    assert again.stats.rounds < base.stats.rounds
    small = PromptLookupDrafter(history_tokens=10)
    for k in range(5):
        small.remember([100 + k] * 4)
    assert len(small._history) <= 10 and small._history[-2] == 104 and 100 not in small._history
    assert small.candidates([7, 104]) == [[104], [104, 104], [104, 104, 104]]  # cut at the end of a request
    small.remember(list(range(200, 230)))  # one request longer than the whole memory: its tail is kept
    assert len(small._history) == 10 and small._history[-2] == 229
    with np.testing.assert_raises(ValueError):
        PromptLookupDrafter(history_tokens=-1)


def test_draft_model_in_a_union_follows_paths_through_other_members():
    """The accepted path may run through another member's branch or past the draft model's depth: a draft model
    that is the target itself must still propose exactly the target's next token every round."""
    import torch

    import _tiny_text as T
    from mmspec.decode import generate
    from mmspec.drafters import DraftModelDrafter, NoisyOracleDrafter, UnionDrafter

    tok = T.tokenizer()
    model = T.model(len(tok), seed=3, std=0.3)
    enc = tok(["the chart value", "a red table row"], return_tensors="pt", padding=True)
    ref = model.generate(**enc, max_new_tokens=20, do_sample=False, min_new_tokens=20)
    plen = enc["input_ids"].shape[1]
    oracle = NoisyOracleDrafter(ref[:, plen:], depth=6, corrupt_p=0.1, vocab_size=len(tok), seed=1)
    twin = DraftModelDrafter(model, num_draft_tokens=3)
    firsts = []
    orig = twin.propose
    twin.propose = lambda ctx: [firsts.append((r, len(s), int(t.tokens[0]))) or t
                                for r, s, t in zip(ctx.rows, ctx.sequences, orig(ctx))]
    out = generate(model, enc, UnionDrafter([oracle, twin]), max_new_tokens=20, min_new_tokens=20)
    assert torch.equal(out.sequences, ref)
    pad = (enc["attention_mask"] == 0).sum(1)  # sequences hold the unpadded prompt
    assert firsts and all(int(ref[r, n + pad[r]]) == t for r, n, t in firsts if n + pad[r] < ref.shape[1])
