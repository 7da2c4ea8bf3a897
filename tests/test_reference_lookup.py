"""The reference-knowing audit drafter: what it proposes, that decoding with it is the target's own output,
and that its τ measures how much of the output is the reference."""

import pytest
import torch

import mmspec
from mmspec.bench import BenchConfig, run_bench
from mmspec.demo import draw_test_image
from mmspec.drafters.reference import ReferenceLookupDrafter
from mmspec.errors import InvalidInputError
from mmspec.registry import make_drafter, register_drafter
from mmspec.workloads import Example, Workload, register_workload

import _tiny_qwen_vl as Q


def test_longest_tail_first_and_the_repeat_nearest_the_output_position():
    d = ReferenceLookupDrafter([[5, 6, 7, 5, 6, 8, 9]], depth=3)
    assert d.continuation(0, [5, 6]) == [7, 5, 6]         # on track: position 2, the first "5 6"
    assert d.continuation(0, [1, 1, 1, 7, 5, 6]) == [8, 9]  # "7 5 6" (3 tokens) pins the second "5 6"
    assert d.continuation(0, [4, 4, 4, 4, 5, 6]) == [8, 9]  # only "5 6": the one ending nearer position 6
    assert d.continuation(0, [9]) == []                     # the reference's last token: nothing follows
    assert d.continuation(0, [3, 2]) == []
    assert ReferenceLookupDrafter([[5, 6, 7]], min_ngram=2).continuation(0, [0, 6]) == []  # 1-token tails off


def test_misuse_is_a_clear_error():
    with pytest.raises(InvalidInputError, match="set_references"):
        ReferenceLookupDrafter([[1, 2]]).continuation(1, [1])
    with pytest.raises(InvalidInputError, match="depth"):
        ReferenceLookupDrafter(depth=0)
    with pytest.raises(InvalidInputError, match="no path"):
        make_drafter("reference-lookup:/some/dir", None)
    with pytest.raises(InvalidInputError, match="options"):
        make_drafter("reference-lookup;width=3", None)
    assert make_drafter("reference-lookup;depth=5", None).depth == 5


@pytest.fixture(scope="module")
def tiny():
    model = Q.build("qwen2_vl", seed=1)
    inputs = Q.make_inputs("qwen2_vl", [{"pre": 3, "images": [(56, 56)], "post": 4},
                                        {"pre": 6, "images": [(28, 56)], "post": 2}], seed=2)
    ref = model.generate(**inputs, max_new_tokens=24, do_sample=False, min_new_tokens=24)
    return model, inputs, ref


def test_the_target_own_output_as_reference_is_accepted_in_full(tiny):
    model, inputs, ref = tiny
    plen = inputs["input_ids"].shape[1]
    d = make_drafter("reference-lookup;depth=4", model)
    d.set_references(ref[:, plen:].tolist())
    out = mmspec.generate(model, inputs, drafter=d, max_new_tokens=24, min_new_tokens=24)
    assert torch.equal(out.sequences, ref)
    # 23 tokens after the prefill's first: rounds of 4 drafts + 1 bonus each, the last one cut by the limit.
    assert out.stats.accept_rate[:4] == [1.0, 1.0, 1.0, 1.0] and out.stats.tau == pytest.approx(23 / 5)


def test_a_reference_the_output_leaves_costs_tau_not_exactness(tiny):
    """Rows whose reference differs from the output from token 8 on: still the target's output exactly; τ
    drops, because past the divergence no tail of the output is found in what follows in the reference."""
    model, inputs, ref = tiny
    plen = inputs["input_ids"].shape[1]
    gen = ref[:, plen:].tolist()
    wrong = [row[:8] + [(t + 37) % 140 + 3 for t in row[8:]] for row in gen]
    d = ReferenceLookupDrafter(wrong, depth=4)
    out = mmspec.generate(model, inputs, drafter=d, max_new_tokens=24, min_new_tokens=24)
    assert torch.equal(out.sequences, ref)
    d.set_references(gen)
    full = mmspec.generate(model, inputs, drafter=d, max_new_tokens=24, min_new_tokens=24)
    assert out.stats.tau < full.stats.tau - 1


class _Answers(Workload):
    """Two small pictures with reference answers, for the bench's reference hand-over."""

    name = "reference-test-answers"

    def example(self, split, index):
        return Example(id=f"{self.name}/{split}/{index}", prompt="How many shapes are there?",
                       target=f"There are {index + 2} shapes.", images=[draw_test_image(112, 84)])


register_workload(_Answers)


def test_the_bench_hands_each_batch_its_references(tiny_vlm):
    """Before a system runs a batch (warm-up included) its drafter gets that batch's reference answers as the
    target would emit them; reference-lookup is then lossless like any drafter."""
    from transformers import AutoTokenizer

    calls = []

    class Recording(ReferenceLookupDrafter):
        def set_references(self, references):
            calls.append([list(r) for r in references])
            super().set_references(references)

    register_drafter("reference-test-recording", lambda target, **kw: Recording(**kw))
    cfg = BenchConfig(model=tiny_vlm, workloads=[_Answers.name], n=3, max_new_tokens=6, batch_sizes=[2],
                      systems=["ar", "reference-test-recording;depth=3", "reference-lookup"])
    recs = {r["system"]: r for r in run_bench(cfg, progress=False).results}
    for name in ("reference-test-recording;depth=3", "reference-lookup"):
        assert recs[name]["status"] == "ok" and recs[name]["identical_to_ar"] is True, recs[name]
    assert [len(c) for c in calls] == [0, 2, 2, 1]  # built without any, then the warm-up batch, then batches 1-2
    tok = AutoTokenizer.from_pretrained(tiny_vlm)
    assert tok.decode(calls[-1][0], skip_special_tokens=True) == "There are 4 shapes."
    assert calls[-1][0][-1] == tok.eos_token_id
