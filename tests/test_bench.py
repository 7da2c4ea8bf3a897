"""``mmspec bench``: records, JSON, PNG and errors, on the tiny VLM with a workload defined here.

The workload is defined in this file so the bench is tested without the docs/charts worlds; a drafter
kind that always fails is registered to check that a failing system is recorded, not fatal.
"""

from __future__ import annotations

import json

import pytest

import mmspec
from mmspec.bench import HF_BATCH1_ONLY, BenchConfig, parse_csv, run_bench
from mmspec.cli import main
from mmspec.demo import draw_test_image
from mmspec.drafters.base import Drafter
from mmspec.registry import register_drafter
from mmspec.workloads import Example, Workload, register_workload

PROMPTS = (
    "Describe the image. The image shows a red square, a blue circle and a green triangle.",
    "How many shapes are there? There are three shapes. How many shapes are there?",
    "What color is the circle?",
)


@register_workload
class BenchShapes(Workload):
    """Three prompts about one small picture, cycling; two image sizes so batches pad unequally."""

    name = "bench-test-shapes"

    def example(self, split, index):
        return Example(id=f"{self.name}/{split}/{index}", prompt=PROMPTS[index % len(PROMPTS)], target="",
                       images=[draw_test_image(112 + 28 * (index % 2), 84)])


class _BrokenDrafter(Drafter):
    kind = "bench-test-broken"

    def propose(self, ctx):
        raise RuntimeError("this drafter always fails")


register_drafter("bench-test-broken", lambda target, **kw: _BrokenDrafter())

SYSTEMS = ["ar", "hf-prompt-lookup", "hf-assistant", "lookup", "draft-model", "draft-model;min_confidence=0.05",
           "bench-test-broken"]
BATCH_SIZES = [1, 4]
NUMBER = (int, float)
FIELDS = {  # field -> types allowed when status is "ok" (every field is None when it is not)
    "workload": str, "system": str, "spec": str, "kind": str, "batch_size": int, "status": str, "n_examples": int,
    "tau": (*NUMBER, type(None)), "accept_rate": (list, type(None)), "accepted_hist": (list, type(None)),
    "ceiling_rounds": (int, type(None)), "speedup_vs_ar": NUMBER, "speedup_median": NUMBER, "forwards_per_token": NUMBER,
    "target_forwards": int, "tokens_per_s": NUMBER, "tokens_per_s_vs_ar": NUMBER, "time_s": NUMBER, "identical_to_ar": bool, "new_tokens": int,
    "lossless": bool, "identical_rate": NUMBER, "divergences": list, "dtype": str,
}
ALWAYS = ("workload", "system", "spec", "kind", "batch_size", "status", "n_examples", "dtype")


@pytest.fixture(scope="module")
def draft_model(tmp_path_factory) -> str:
    """Another tiny Qwen2-VL (other seed, same tokenizer): the draft model and the HF assistant."""
    from mmspec.demo import build_tiny_vlm

    return build_tiny_vlm(tmp_path_factory.mktemp("tiny-draft"), seed=1)


@pytest.fixture(scope="module")
def report(tiny_vlm, draft_model):
    cfg = BenchConfig(model=tiny_vlm, workloads=[BenchShapes.name], systems=SYSTEMS, draft_model=draft_model, n=4,
                      max_new_tokens=12, batch_sizes=BATCH_SIZES)
    return run_bench(cfg, progress=False)


def _by_key(results):
    return {(r["workload"], r["system"], r["batch_size"]): r for r in results}


def test_one_record_per_workload_system_batch_size_with_typed_fields(report):
    data = json.loads(report.to_json())
    results = data["results"]
    assert len(results) == len(SYSTEMS) * len(BATCH_SIZES)
    assert set(_by_key(results)) == {(BenchShapes.name, s, b) for s in SYSTEMS for b in BATCH_SIZES}
    for r in results:
        assert set(FIELDS) <= set(r), set(FIELDS) - set(r)
        assert r["status"] == "ok" or r["status"].startswith(("unsupported: ", "error: ")), r["status"]
        for name, types in FIELDS.items():
            if r["status"] == "ok" or name in ALWAYS:
                assert isinstance(r[name], types), (r["system"], name, r[name])
            else:
                assert r[name] is None, (r["system"], name)
        assert r["n_examples"] == 4
    meta = data["meta"]
    for key in ("date", "machine", "torch", "transformers", "model", "args", "device", "dtype"):
        assert meta[key], key
    assert meta["dtype"] == "float32" and all(r["dtype"] == "float32" for r in results)  # stored in fp32
    assert meta["args"]["max_new_tokens"] == 12 and meta["args"]["systems"] == SYSTEMS


def test_ar_is_the_reference(report):
    for bs in BATCH_SIZES:
        ar = _by_key(report.results)[(BenchShapes.name, "ar", bs)]
        assert ar["status"] == "ok" and ar["speedup_vs_ar"] == ar["speedup_median"] == 1.0 and ar["tau"] == 1.0
        assert ar["forwards_per_token"] == 1.0 and ar["identical_to_ar"] is True and ar["new_tokens"] > 0


def test_mmspec_systems_are_identical_to_ar_at_batch_1_and_4(report):
    recs = _by_key(report.results)
    for system in ("lookup", "draft-model", "draft-model;min_confidence=0.05"):  # the last: --draft-model's path
        for bs in BATCH_SIZES:
            r = recs[(BenchShapes.name, system, bs)]
            assert r["status"] == "ok" and r["identical_to_ar"] is True and r["lossless"] is True, r
            assert r["tau"] >= 1.0 and r["speedup_vs_ar"] > 0
            assert sum(r["accepted_hist"]) >= r["ceiling_rounds"]
            assert r["new_tokens"] == recs[(BenchShapes.name, "ar", bs)]["new_tokens"]
    lookup4 = recs[(BenchShapes.name, "lookup", 4)]
    # Batch 4 ran as one batch whose rows accepted different lengths.
    assert sum(1 for n in lookup4["accepted_hist"] if n) >= 2
    assert lookup4["tau"] > 1.0 and lookup4["forwards_per_token"] < 1.0


def test_transformers_assisted_generation_is_batch_1_only(report):
    recs = _by_key(report.results)
    for system in ("hf-prompt-lookup", "hf-assistant"):
        assert recs[(BenchShapes.name, system, 4)]["status"] == HF_BATCH1_ONLY
        r = recs[(BenchShapes.name, system, 1)]
        assert r["tau"] is None  # transformers does not expose its rounds
        assert r["status"] == "ok" and r["forwards_per_token"] > 0, r
    lookup = recs[(BenchShapes.name, "hf-prompt-lookup", 1)]
    # Its drafts would copy the image placeholders (transformers 5.24 then fails): suppressed, and recorded.
    assert "suppress_tokens" in lookup["note"] and lookup["identical_to_ar"] is True
    assert recs[(BenchShapes.name, "lookup", 1)]["note"] is None


def test_failing_system_is_recorded_and_the_run_goes_on(report):
    r = _by_key(report.results)[(BenchShapes.name, "bench-test-broken", 1)]
    assert r["status"].startswith("error: ") and "this drafter always fails" in r["status"]
    assert r["kind"] == "mmspec" and r["speedup_vs_ar"] is None


def test_table_lists_every_record(report):
    table = report.table()
    for s in SYSTEMS:
        assert s in table
    assert HF_BATCH1_ONLY in table


def test_cli_bench_writes_json_and_png(tiny_vlm, tmp_path, capsys):
    from PIL import Image

    out_json, out_png = tmp_path / "b.json", tmp_path / "b.png"
    rc = main(["bench", "--model", tiny_vlm, "--workload", BenchShapes.name, "--systems", "ar,hf-prompt-lookup,lookup",
               "--quick", "--n", "4", "--max-new-tokens", "8", "--json", str(out_json), "--png", str(out_png),
               "--no-progress"])
    stdout = capsys.readouterr().out
    assert rc == 0
    assert "speedup" in stdout and "lookup" in stdout
    data = json.loads(out_json.read_text())
    assert {(r["system"], r["batch_size"]) for r in data["results"]} == {
        (s, b) for s in ("ar", "hf-prompt-lookup", "lookup") for b in (1, 4)}
    assert data["meta"]["args"]["quick"] is True
    with Image.open(out_png) as im:
        assert im.format == "PNG" and im.size[0] > 100 and im.size[1] > 100


@pytest.mark.parametrize("changes, message", [
    ({"workloads": ["no-such-workload"]}, "unknown workload"),
    ({"systems": ["ar", "no-such-system"]}, "unknown system"),
    ({"systems": ["draft-model"]}, "--draft-model"),
    ({"systems": ["lookup & draft-model;num_draft_tokens=2"]}, "--draft-model"),
    ({"batch_sizes": [0]}, "batch sizes"),
    ({"n": 0}, "n must be a positive integer"),
])
def test_bad_requests_raise_before_loading_the_model(changes, message):
    cfg = BenchConfig(**{"model": "/no/such/model", "workloads": [BenchShapes.name], **changes})
    with pytest.raises(mmspec.InvalidInputError, match=message):
        run_bench(cfg, progress=False)


def test_cli_bad_requests_exit_2(tmp_path, capsys):
    assert main(["bench", "--workload", "no-such-workload", "--no-progress"]) == 2
    assert "unknown workload" in capsys.readouterr().err
    assert main(["bench", "--workload", BenchShapes.name, "--batch-sizes", "1,x"]) == 2
    assert "batch size" in capsys.readouterr().err
    assert main(["bench", "--workload", BenchShapes.name, "--json", str(tmp_path / "nope" / "b.json")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_parse_csv():
    assert parse_csv(" a, b ,,c") == ["a", "b", "c"] and parse_csv(None) is None
    with pytest.raises(mmspec.InvalidInputError):
        parse_csv("1,two", int, "batch size")


def test_budget_suffix_systems():
    from mmspec.bench import _resolve_systems

    assert _resolve_systems(["lookup+budget"], None) == ["ar", "lookup+budget"]
    with pytest.raises(mmspec.InvalidInputError, match="mmspec drafters"):
        _resolve_systems(["hf-prompt-lookup+budget"], None)


def test_system_specs_with_options_and_bundled_defaults(tiny_vlm):
    from mmspec.bench import System, _resolve_systems, build_systems
    from mmspec.registry import make_drafter

    assert _resolve_systems(["lookup;num_draft_tokens=3"], None) == ["ar", "lookup;num_draft_tokens=3"]
    assert _resolve_systems(None, None, ["eagle:/x"]) == ["ar", "ceiling", "hf-prompt-lookup", "lookup",
                                                          "lookup;history_tokens=20000", "eagle:/x",
                                                          "eagle:/x & lookup;history_tokens=20000"]
    assert System("eagle:/a/b;topk=4", None, 1).label == "eagle;topk=4"
    model = mmspec.MMSpecPipeline.from_pretrained(tiny_vlm).model
    (_, sys_) = build_systems(["ar", "lookup;num_draft_tokens=3;max_matches=2"], model, BenchConfig(), 8)
    assert sys_.drafter.num_draft_tokens == 3 and sys_.drafter.max_matches == 2
    with pytest.raises(mmspec.InvalidInputError, match="bad option"):
        make_drafter("lookup;num_draft_tokens", None)


def test_default_model_is_the_bundled_target_when_one_ships():
    from mmspec.bench import default_model_path
    from mmspec.vision.testbed import bundled_target

    docs = mmspec.workloads.get_workload("testbed-docs")
    assert docs.bundled_model() == bundled_target()
    if bundled_target() is None:
        pytest.skip("no trained testbed target in this checkout")
    assert default_model_path([BenchShapes(), docs]) == bundled_target()
    import os

    for spec in docs.bundled_drafters():
        kind, _, path = spec.partition(":")
        assert kind == "eagle" and os.path.isfile(os.path.join(path, "config.json"))


@pytest.mark.slow
def test_default_quick_bench_on_the_bundled_target(tmp_path, capsys):
    """`mmspec bench --quick` with no model named: the bundled trained target, its EAGLE head, valid JSON."""
    from mmspec.vision.testbed import bundled_target

    if bundled_target() is None:
        pytest.skip("no trained testbed target in this checkout")
    out = tmp_path / "quick.json"
    assert main(["bench", "--quick", "--workload", "testbed-docs", "--batch-sizes", "1", "--n", "2", "--json", str(out),
                 "--no-progress"]) == 0
    data = json.loads(out.read_text())
    systems = {r["system"]: r for r in data["results"]}
    assert {"ar", "hf-prompt-lookup", "lookup", "lookup;history_tokens=20000"} <= set(systems)
    assert data["meta"]["model"] == bundled_target()
    for r in data["results"]:
        assert r["status"] == "ok" and r["identical_to_ar"] is True, r
    if any(s.startswith("eagle") for s in systems):
        assert systems["eagle"]["tau"] >= 1.0


def test_a_bare_trained_kind_means_the_shipped_head_or_an_error():
    """`--systems eagle` once built an untrained head and reported its τ of 1.0 as "eagle"."""
    from mmspec.bench import _resolve_systems

    assert _resolve_systems(["eagle", "eagle+budget", "eagle;topk=3"], None, ["eagle:/h"]) == [
        "ar", "eagle:/h", "eagle:/h+budget", "eagle:/h;topk=3"]
    assert _resolve_systems(["eagle:/mine"], None, []) == ["ar", "eagle:/mine"]
    with pytest.raises(mmspec.InvalidInputError, match="no trained eagle head"):
        _resolve_systems(["lookup", "eagle+budget"], None, [])


def test_drafters_forget_across_requests_after_the_warm_up():
    """A timed request must never be drafted from its own output remembered in the warm-up."""
    import torch

    from mmspec.bench import MMSpecSystem, System, _bench_cell
    from mmspec.drafters import PromptLookupDrafter

    class Recorder(System):
        kind = "ar"

        def __init__(self, name):
            super().__init__(name, None, 4)
            self.log = []

        def forget(self):
            self.log.append("forget")

        def run(self, inputs):
            self.log.append("run")
            return torch.zeros(1, 5, dtype=torch.long), None, 1

    systems = [Recorder("ar"), Recorder("other")]
    bar = type("Bar", (), {"update": lambda self, n: None})()
    batch = {"input_ids": torch.zeros(1, 2, dtype=torch.long)}
    _bench_cell([batch, batch], ["a", "b"], 1, systems, torch.device("cpu"), set(), bar)
    assert all(s.log == ["run", "forget", "run", "run"] for s in systems)
    memory = PromptLookupDrafter(history_tokens=100)
    memory.remember([1, 2, 3])
    MMSpecSystem("lookup", None, 4, memory).forget()
    assert len(memory._history) == 0 and memory.candidates([9, 1]) == []


def test_union_systems_resolve_label_and_build(tiny_vlm):
    from mmspec.bench import _resolve_systems, build_systems
    from mmspec.drafters import UnionDrafter

    names = _resolve_systems(["eagle & lookup;history_tokens=9+budget"], None, ["eagle:/x"])
    assert names == ["ar", "eagle:/x & lookup;history_tokens=9+budget"]
    with pytest.raises(mmspec.InvalidInputError, match="unknown system"):
        _resolve_systems(["lookup & nonsense"], None)
    with pytest.raises(mmspec.InvalidInputError, match="no trained eagle"):
        _resolve_systems(["lookup & eagle"], None)
    model = mmspec.MMSpecPipeline.from_pretrained(tiny_vlm).model
    (_, union) = build_systems(["ar", "lookup;max_matches=1 & lookup;history_tokens=9"], model,
                               BenchConfig(lookup_tokens=5), 8)
    assert isinstance(union.drafter, UnionDrafter) and union.label == "lookup;max_matches=1 & lookup;history_tokens=9"
    assert [d.num_draft_tokens for d in union.drafter.drafters] == [5, 5]  # as deep as HF prompt lookup


def test_identity_rate_and_first_divergence_with_its_logit_margin(tiny_vlm):
    """A row that differs from AR is counted out of ``identical_rate`` and located: first differing position,
    both tokens, and the target's logit margin between them there (AR's greedy token leads, so >= 0)."""
    import torch

    from mmspec.bench import _divergences, _row_tokens

    pipe = mmspec.MMSpecPipeline.from_pretrained(tiny_vlm)
    inputs = pipe.prepare(images=[[draw_test_image()], [draw_test_image(140, 84)]], prompt=list(PROMPTS[:2]))
    ar = pipe.model.generate(**inputs, do_sample=False, max_new_tokens=6)
    other = ar.clone()
    P = inputs["input_ids"].shape[1]
    other[1, P + 3] = (other[1, P + 3] + 1) % pipe.model.config.get_text_config().vocab_size
    a, b = _row_tokens(ar, P, set()), _row_tokens(other, P, set())
    assert a[0] == b[0] and a[1] != b[1]
    (d,) = _divergences(pipe.model, inputs, ar, [1], b, a, "batch-x")
    assert d["row"] == 1 and d["position"] == 3 and d["ar_token"] == a[1][3] and d["token"] == b[1][3]
    assert d["margin"] >= 0 and d["top2_gap"] >= 0 and 0 < d["ar_prob"] <= 1
    fwd = {**inputs, "input_ids": ar[:, : P + 3],
           "attention_mask": torch.cat([inputs["attention_mask"], torch.ones(2, 3, dtype=torch.long)], 1)}
    if "mm_token_type_ids" in inputs:  # the three new tokens are text
        fwd["mm_token_type_ids"] = torch.cat([inputs["mm_token_type_ids"],
                                              torch.zeros(2, 3, dtype=inputs["mm_token_type_ids"].dtype)], 1)
    with torch.no_grad():  # the margin is read off the logits that predict position 3 of row 1
        logits = pipe.model(**fwd).logits
    want = float(logits[1, -1, a[1][3]] - logits[1, -1, b[1][3]])
    assert abs(d["margin"] - want) < 1e-3


def test_ceiling_row_entropy_fit_and_share_of_ceiling(tiny_vlm):
    """The ceiling (the target's own greedy output as the draft) accepts every draft and stays identical to AR;
    every mmspec record fits accepted length against the target's entropy and gives its share of the ceiling."""
    cfg = BenchConfig(model=tiny_vlm, workloads=[BenchShapes.name], systems=["ceiling;depth=4", "lookup"], n=3,
                      max_new_tokens=10, batch_sizes=[1])
    recs = {r["system"]: r for r in run_bench(cfg, progress=False).results}
    ceil, lookup = recs["ceiling;depth=4"], recs["lookup"]
    assert ceil["status"] == "ok" and ceil["identical_rate"] == 1.0 and ceil["of_ceiling"] == 1.0
    assert ceil["accept_rate"] and all(a == 1.0 for a in ceil["accept_rate"]), ceil["accept_rate"]
    assert ceil["tau"] > lookup["tau"] and ceil["forwards_per_token"] < 0.5
    assert lookup["of_ceiling"] == pytest.approx(lookup["speedup_vs_ar"] / ceil["speedup_vs_ar"])
    fit = lookup["draftability"]
    assert fit is not None and fit["n"] >= 3 and fit["mean_entropy"] > 0 and 0 <= fit["r2"] <= 1
    with pytest.raises(mmspec.InvalidInputError, match="depth=N"):
        run_bench(BenchConfig(model=tiny_vlm, workloads=[BenchShapes.name], systems=["ceiling;deep=3"]))


def test_entropy_trace_is_the_targets_root_entropy(tiny_vlm):
    """``record_entropy``: one [entropy, committed] pair per row-round; with no drafter the root entropy is that
    of the distribution each step's token is the argmax of."""
    import torch

    from mmspec.decode import generate

    pipe = mmspec.MMSpecPipeline.from_pretrained(tiny_vlm)
    inputs = pipe.prepare(images=[draw_test_image()], prompt=PROMPTS[0])
    out = generate(pipe.model, inputs, drafter=None, max_new_tokens=5, record_entropy=True)
    trace = out.stats.entropy_trace
    # the first token is prefill's; the last round (it ends the row at the length cap) is left out
    assert len(trace) == out.stats.row_rounds - 1 == 3 and all(c == 1 for _, c in trace)
    with torch.no_grad():
        ref = pipe.model.generate(**inputs, max_new_tokens=5, do_sample=False, output_scores=True,
                                  return_dict_in_generate=True)
    for (h, _), scores in zip(trace, ref.scores[1:]):
        p = torch.softmax(scores[0].float(), -1)
        assert h == pytest.approx(float(-(p * p.clamp_min(1e-30).log()).sum()), rel=1e-3, abs=1e-4)
    plain = generate(pipe.model, inputs, drafter=None, max_new_tokens=5).stats
    assert plain.entropy_trace == [] and plain.audit_time == 0.0
    # the entropy is bookkeeping: its seconds are counted apart, and the bench's clock leaves them out
    assert 0.0 < out.stats.audit_time < out.stats.total_time
    from mmspec.bench import _timed

    class Run:
        def run(self, inputs):
            return None, out.stats, 0

    assert _timed(Run(), inputs, torch.device("cpu"))[3] < 0.0  # an instant run minus the recorded audit time


def test_sampling_run_names_rules_and_skips_identity(tiny_vlm):
    """``--sample``: every system samples with the same per-batch seed, a system may name its acceptance rule
    (GLANCE's sample-then-match beside the default speculative sampling), records say the rule and whether it is
    lossless, identity with AR is not judged and the greedy ceiling does not run. AR's samples are the model's
    own (``generate(do_sample=True)`` with the batch's seed)."""
    from mmspec.bench import parse_sampling, split_rule

    sampling = parse_sampling("temperature=0.8,top_k=20")
    assert sampling == {"temperature": 0.8, "top_k": 20}
    cfg = BenchConfig(model=tiny_vlm, workloads=[BenchShapes.name], n=2, max_new_tokens=8, batch_sizes=[1, 2],
                      systems=["lookup", "lookup;rule=sample_then_match", "lookup;rule=greedy", "ceiling"],
                      sampling=sampling)
    report = run_bench(cfg, progress=False)
    recs = _by_key(report.results)
    for bs in (1, 2):
        ar, spec = recs[(BenchShapes.name, "ar", bs)], recs[(BenchShapes.name, "lookup", bs)]
        stm = recs[(BenchShapes.name, "lookup;rule=sample_then_match", bs)]
        greedy = recs[(BenchShapes.name, "lookup;rule=greedy", bs)]
        assert ar["status"] == spec["status"] == stm["status"] == greedy["status"] == "ok"
        assert ar["sampling"] == spec["sampling"] == sampling
        assert spec["identical_rate"] is None and spec["identical_to_ar"] is None and spec["divergences"] == []
        assert spec["lossless"] is True and stm["lossless"] is True
        assert greedy["lossless"] is False  # a greedy rule under sampling does not keep the distribution
        assert recs[(BenchShapes.name, "ceiling", bs)]["status"].startswith("unsupported")
        # texts differ in length under sampling: the throughput ratio is the fair one, and it is what it says
        want = (spec["new_tokens"] / spec["time_s"]) / (ar["new_tokens"] / ar["time_s"])
        assert spec["tokens_per_s_vs_ar"] == pytest.approx(want) and ar["tokens_per_s_vs_ar"] == 1.0
    assert "sampling run" in report.table() and "tok/s x" in report.table()
    assert report.meta["sampling"] == sampling
    # AR's batch-1 draws are generate's own under the batch's seed: seed 0 for the first batch
    import torch

    from mmspec.bench import ARSystem

    pipe = mmspec.MMSpecPipeline.from_pretrained(tiny_vlm)
    ex = BenchShapes().examples("test", 1)[0]
    inputs = pipe.prepare(images=[ex.images], prompt=[ex.prompt])
    ar_sys = ARSystem("ar", pipe.model, 8)
    ar_sys.sampling, ar_sys.seed = sampling, 5
    torch.manual_seed(5)
    want = pipe.model.generate(**inputs, do_sample=True, max_new_tokens=8, **sampling)
    assert torch.equal(ar_sys.run(inputs)[0], want)
    assert split_rule("eagle:/h;topk=3;rule=lantern++:lambda=2+budget") == ("eagle:/h;topk=3+budget", "lantern++;lambda=2")


@pytest.mark.parametrize("systems, text, message", [
    (["lookup;rule=nope"], None, "unknown acceptance rule"),
    (["ar;rule=greedy"], None, "takes no acceptance rule"),
    (["lookup"], "temperature=0", "temperature must be > 0"),
    (["lookup"], "temperature=nan", "temperature must be > 0"),
    (["lookup;rule=nope & lookup"], None, "system 'lookup;rule=nope & lookup': unknown acceptance rule"),
    (["lookup"], "beam=2", "bad --sample item"),
])
def test_bad_sampling_requests_raise_before_loading(systems, text, message):
    from mmspec.bench import parse_sampling

    with pytest.raises(mmspec.InvalidInputError, match=message):
        run_bench(BenchConfig(model="/no/such/model", workloads=[BenchShapes.name], systems=systems,
                              sampling=parse_sampling(text)))


def test_sampling_is_refused_for_plain_pipeline_workloads():
    """The driving and image workloads run their own pipelines' decoding: --sample would be silently ignored."""
    from mmspec.bench import parse_sampling

    with pytest.raises(mmspec.InvalidInputError, match="--sample applies to the VLM workloads"):
        run_bench(BenchConfig(workloads=["images"], sampling=parse_sampling("temperature=0.7")))
