"""``mmspec.decode.decode_from_state``: the rounds of ``generate`` from a state the caller prefilled (FlashDrive's
streamed cache goes through it). Same tokens as ``model.generate``; with ``keep_state`` the cache afterwards holds
the prompt and every generated token but the last, as a fresh prefill of them computes it (a stop inside an
accepted block trimmed off)."""

import pytest
import torch

from _tiny_text import model as tiny_model


@pytest.fixture(scope="module")
def lm():
    return tiny_model(vocab_size=60, hidden=32, layers=2, seed=3, std=0.3)


def _free(lm, ids, n):
    return lm.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                       eos_token_id=None, pad_token_id=0)[0, ids.shape[1]:].tolist()


def test_rounds_from_a_prefilled_state_equal_generate_and_keep_the_cache(lm):
    from mmspec.decode import decode_from_state
    from mmspec.drafters.oracle import NoisyOracleDrafter
    from mmspec.target import TargetAdapter
    from mmspec.tree import DraftTree

    ids = torch.tensor([[5, 9, 14, 3, 22, 7]])
    free = _free(lm, ids, 14)
    first = {}
    for i, t in enumerate(free):
        first.setdefault(t, i)
    stop_at = max(i for i in first.values() if i % 5)  # the end token lands inside an accepted block of 4 + 1
    assert stop_at >= 5
    eos = free[stop_at]
    want = free[: stop_at + 1]
    oracle = NoisyOracleDrafter([free + [0] * 4], depth=4, corrupt_p=0.0, vocab_size=60)
    adapter = TargetAdapter(lm)
    for keep_state in (True, False):
        state, logits, _ = adapter.prefill(ids, {"attention_mask": torch.ones_like(ids)})
        res = decode_from_state(adapter, state, logits, oracle, prompts=[ids[0].tolist()], max_new=14,
                                eos_ids={eos}, keep_state=keep_state)
        (got,), stats = res
        assert got == want and stats.rounds == -(-stop_at // 5) and stats.lossless
        assert res.state_rows == ([0] if keep_state else [])
        if keep_state:
            assert state.cache.get_seq_length() == ids.shape[1] + len(want) - 1 and bool(state.valid.all())
            ref, _, _ = adapter.prefill(torch.tensor([ids[0].tolist() + want[:-1]]),
                                        {"attention_mask": torch.ones(1, ids.shape[1] + len(want) - 1,
                                                                      dtype=torch.long)})
            for a, b in zip(state.cache.layers, ref.cache.layers):
                assert torch.allclose(a.keys, b.keys, atol=1e-5) and torch.allclose(a.values, b.values, atol=1e-5)
            # The last kept token is pending (not the drafted token past the stop): a further pass goes on from it.
            assert state.pending.tolist() == [want[-1]]
            out, _ = adapter.score(state, [DraftTree.empty()])
            _, next_logits, _ = adapter.prefill(torch.tensor([ids[0].tolist() + want]),
                                                {"attention_mask": torch.ones(1, ids.shape[1] + len(want),
                                                                              dtype=torch.long)})
            assert torch.allclose(out.logits[0, 0], next_logits[0], atol=1e-4)
        else:
            assert state.valid.shape[0] == 0  # finished rows leave the batch, as in generate


def test_a_first_token_that_stops_makes_no_round(lm):
    from mmspec.decode import decode_from_state
    from mmspec.target import TargetAdapter

    ids = torch.tensor([[5, 9, 14, 3]])
    adapter = TargetAdapter(lm)
    state, logits, _ = adapter.prefill(ids, {"attention_mask": torch.ones_like(ids)})
    res = decode_from_state(adapter, state, logits, prompts=[ids[0].tolist()], max_new=8,
                            eos_ids={_free(lm, ids, 1)[0]}, keep_state=True)
    (got,), stats = res
    assert len(got) == 1 and stats.rounds == 0 and state.cache.get_seq_length() == ids.shape[1]
    assert res.state_rows == [0]


def test_kept_state_at_batch_4_says_which_rows_stayed_and_they_decode_on(lm):
    """Rows stop in different rounds (at the first token, inside round 1, inside and at the end of round 2): only
    the last round's rows stay, ``state_rows`` names them in state order, and decoding them on from the kept state
    gives the target's own greedy continuation of exactly those rows (a wrong row label reads another prompt)."""
    from mmspec.decode import decode_from_state
    from mmspec.drafters.oracle import NoisyOracleDrafter
    from mmspec.target import TargetAdapter
    from mmspec.tree import DraftTree

    prompts = [[5, 9, 14, 3, 22, 7], [11, 4, 30], [17, 8, 2, 41, 6], [23, 12, 19, 27, 33, 40, 9]]
    free = [_free(lm, torch.tensor([p]), 20) for p in prompts]
    keeps = [8, 1, 4, 11]  # tokens each row generates before its stop
    row_of = {p[0]: r for r, p in enumerate(prompts)}  # a stop sees only the history: its first token names the row

    def stop(history) -> bool:
        r = row_of[int(history[0])]
        return len(history) - len(prompts[r]) >= keeps[r]

    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    adapter = TargetAdapter(lm)
    state, logits, _ = adapter.prefill(ids, {"attention_mask": mask})
    # A chain of 4 true tokens a round: 1 token, then 5 per round; rows 0 and 3 stop in round 2.
    res = decode_from_state(adapter, state, logits, NoisyOracleDrafter(free, depth=4, corrupt_p=0.0, vocab_size=60),
                            prompts=prompts, max_new=20, stop=stop, keep_state=True)
    generated, stats = res
    assert [len(g) for g in generated] == keeps and stats.rounds == 2
    assert all(g == f[: len(g)] for g, f in zip(generated, free))
    assert res.state_rows == [0, 3] and state.valid.shape[0] == 2
    rows = res.state_rows
    assert state.committed_lengths.tolist() == [len(prompts[r]) + len(generated[r]) - 1 for r in rows]
    assert state.pending.tolist() == [generated[r][-1] for r in rows]
    # Go on from the kept state: one pass puts each pending token in the cache, then the rounds run again.
    out, _ = adapter.score(state, [DraftTree.empty()] * len(rows))
    adapter.commit(state, [[] for _ in rows], out.logits[:, 0].argmax(-1))
    longer = [prompts[r] + generated[r] for r in rows]
    ref = [free[r][len(generated[r]): len(generated[r]) + 6] for r in rows]
    more, _ = decode_from_state(adapter, state, out.logits[:, 0], NoisyOracleDrafter(ref, depth=3, corrupt_p=0.0,
                                                                                     vocab_size=60),
                                prompts=longer, max_new=6)
    for r, m in zip(rows, more):
        assert generated[r] + m == free[r][: len(generated[r]) + 6]


def test_bad_arguments_raise_mmspec_errors(lm):
    from mmspec.decode import decode_from_state
    from mmspec.errors import InvalidInputError
    from mmspec.target import TargetAdapter

    ids = torch.tensor([[5, 9, 14, 3]])
    adapter = TargetAdapter(lm)
    state, logits, _ = adapter.prefill(ids, {"attention_mask": torch.ones_like(ids)})
    for kw, match in (({"max_new": 0}, "max_new_tokens"), ({"prompts": [[5], [9]]}, "one prompt per row"),
                      ({"scores": logits[0]}, r"\[batch, vocab\]")):
        args = {"scores": logits, "prompts": [ids[0].tolist()], "max_new": 4, **kw}
        with pytest.raises(InvalidInputError, match=match):
            decode_from_state(adapter, state, args.pop("scores"), **args)


def test_truncating_the_same_count_off_every_row_is_the_gather_it_replaces(lm):
    """``truncate`` with one count for every row crops the last columns (rows are right-aligned); the slots it keeps
    per row, their keys/values and positions are what the per-row gather keeps, on a left-padded batch of 2."""
    import copy

    from mmspec.target import TargetAdapter, _regather

    ids = torch.tensor([[0, 0, 5, 9, 14], [3, 22, 7, 8, 11]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    adapter = TargetAdapter(lm)
    state, _, _ = adapter.prefill(ids, {"attention_mask": mask})
    crop, gather = copy.deepcopy(state), copy.deepcopy(state)
    adapter.truncate(crop, [2, 2])
    kept = [torch.nonzero(gather.valid[r]).flatten()[:-2] for r in range(2)]
    _regather(gather, kept)
    gather.positions.advance(-torch.tensor([2, 2]))
    for r in range(2):
        a, b = crop.valid[r].nonzero().flatten(), gather.valid[r].nonzero().flatten()
        assert len(a) == len(b) == int(mask[r].sum()) - 2
        for x, y in zip(crop.cache.layers, gather.cache.layers):
            assert torch.equal(x.keys[r][:, a], y.keys[r][:, b]) and torch.equal(x.values[r][:, a], y.values[r][:, b])
    assert torch.equal(crop.positions.for_offsets(torch.zeros(2, 1, dtype=torch.long)),
                       gather.positions.for_offsets(torch.zeros(2, 1, dtype=torch.long)))
