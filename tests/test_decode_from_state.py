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
        (got,), stats = decode_from_state(adapter, state, logits, oracle, prompts=[ids[0].tolist()], max_new=14,
                                          eos_ids={eos}, keep_state=keep_state)
        assert got == want and stats.rounds == -(-stop_at // 5) and stats.lossless
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
    (got,), stats = decode_from_state(adapter, state, logits, prompts=[ids[0].tolist()], max_new=8,
                                      eos_ids={_free(lm, ids, 1)[0]}, keep_state=True)
    assert len(got) == 1 and stats.rounds == 0 and state.cache.get_seq_length() == ids.shape[1]


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
