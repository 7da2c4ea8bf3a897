"""``drafter="auto"``: saved drafters ranked by their validation τ on this target (by fingerprint), with the
reasons for every one left out; the validation block ``mmspec train`` writes; the fallback when nothing fits.

The drafters here are untrained EAGLE heads saved for the tiny demo VLM: the choice reads only their configs
(validation figures and fingerprints written by the test), so no training is needed except in the one test of
``fit`` writing the block.
"""

from __future__ import annotations

import json
import logging
import os

import pytest

from mmspec import MMSpecPipeline
from mmspec.drafters.auto import AutoChoice, choose_drafter, drafter_cache_dir, find_candidates
from mmspec.drafters.validation import (read_drafter_config, record_validation, tau_estimate, validation_from_log,
                                        write_validation)
from mmspec.errors import InvalidInputError
from mmspec.registry import make_drafter


@pytest.fixture(scope="module")
def target(tiny_vlm):
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(tiny_vlm).eval()  # name_or_path: the tiny VLM's folder


@pytest.fixture(scope="module")
def head_dir(tmp_path_factory, target):
    """One untrained EAGLE head saved for the target; tests copy it and rewrite its config."""
    path = tmp_path_factory.mktemp("eagle-head")
    make_drafter("eagle;untrained=true", target).save_pretrained(path)
    return path


def _saved(head_dir, dest, tau=None, fingerprint=None, kind=None, weights=True):
    """A copy of the saved head at ``dest`` with a validation τ, a changed fingerprint or kind, or no weights."""
    os.makedirs(dest, exist_ok=True)
    config = json.loads((head_dir / "config.json").read_text())
    if fingerprint:
        config["target_fingerprint"].update(fingerprint)
    if kind:
        config["drafter_kind"] = kind
    (dest / "config.json").write_text(json.dumps(config))
    if weights:
        (dest / "model.safetensors").write_bytes((head_dir / "model.safetensors").read_bytes())
    if tau is not None:
        write_validation(dest, {"tau": tau, "accept_rate": [], "records": 8, "source": "test"})
    return dest


@pytest.fixture
def no_cache(monkeypatch, tmp_path):
    """An empty mmspec cache, so the user's own ~/.cache/mmspec/drafters never enters a test."""
    monkeypatch.setenv("MMSPEC_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "drafters"


def test_tau_estimate_and_validation_block(tmp_path):
    assert tau_estimate([1.0, 1.0, 1.0]) == 4.0 and tau_estimate([0.0, 1.0]) == 1.0
    assert tau_estimate([0.8, 0.5]) == pytest.approx(1 + 0.8 + 0.4)
    with pytest.raises(InvalidInputError):
        tau_estimate([1.5])
    log = tmp_path / "val_log.jsonl"
    log.write_text('{"step": 2, "loss": [1.0, 2.0], "acc": [0.5, 0.5], "records": 4}\n'
                   '{"step": 4, "loss": [0.5, 0.6], "acc": [0.8, 0.5], "records": 4}\n{"step": 6, "acc"')  # cut line
    block = validation_from_log(str(log))
    assert block == {"tau": 2.2, "accept_rate": [0.8, 0.5], "records": 4, "source": "val_log step 4",
                     "estimate": "teacher-forced top-1"}
    assert validation_from_log(str(log), step=2)["tau"] == 1.75 and validation_from_log(str(log), step=3) is None


def test_write_validation_keeps_the_config_and_the_drafter_loads(head_dir, tmp_path, target):
    d = _saved(head_dir, tmp_path / "h")
    before = read_drafter_config(d)
    (d / "val_log.jsonl").write_text('{"step": 9, "acc": [0.5], "records": 3}\n')
    assert record_validation(d)["source"] == "val_log step 9"
    after = read_drafter_config(d)
    assert after.pop("validation")["tau"] == 1.5 and after == before
    assert make_drafter(f"eagle:{d}", target).kind == "eagle"  # the block does not disturb loading
    with pytest.raises(InvalidInputError, match="no saved drafter"):
        write_validation(tmp_path, {"tau": 2.0})
    with pytest.raises(InvalidInputError, match="finite 'tau'"):
        write_validation(d, {"tau": float("nan")})
    assert record_validation(tmp_path / "nothing") is None


def test_auto_picks_the_best_matching_validation_tau(head_dir, tmp_path, target, no_cache):
    runs = tmp_path / "runs"
    _saved(head_dir, runs / "a", tau=2.1)
    _saved(head_dir, runs / "b", tau=3.0)
    _saved(head_dir, runs / "c", tau=5.0, fingerprint={"hidden_size": 999})  # best figure, another target
    _saved(head_dir, runs / "d")  # trained without held-out shards: no figures
    _saved(head_dir, runs / "e", tau=9.0, kind="no-such-kind")
    _saved(head_dir, runs / "f", tau=9.0, weights=False)
    _saved(head_dir, no_cache / "g", tau=2.5)
    _saved(head_dir, runs / "h", tau=9.0)
    config = json.loads((runs / "h" / "config.json").read_text())
    (runs / "h" / "config.json").write_text(json.dumps({**config, "target_fingerprint": {}}))  # matches nothing
    (runs / "not-a-drafter").mkdir()
    drafter = make_drafter(f"auto:{runs}", target)
    choice = drafter.auto_choice
    assert isinstance(choice, AutoChoice) and choice.fallback is None
    assert choice.chosen.path == str(runs / "b") and choice.chosen.source == "folder" and choice.chosen.tau == 3.0
    assert drafter.kind == "eagle" and drafter.fingerprint["hidden_size"] == target.config.text_config.hidden_size
    ranked = [(os.path.basename(c.path), c.reason is None) for c in choice.candidates]
    assert ranked[:4] == [("b", True), ("g", True), ("a", True), ("d", True)]  # measured by tau, unmeasured last
    reasons = {os.path.basename(c.path): c.reason for c in choice.skipped}
    assert "fingerprint does not match" in reasons["c"] and "hidden_size: trained for 999" in reasons["c"]
    assert "not registered" in reasons["e"] and "model.safetensors" in reasons["f"]
    assert "no target_fingerprint" in reasons["h"]
    assert choice.notes[0].startswith(f"auto: chose eagle (folder) {runs / 'b'}, validation tau 3.00")
    assert any("skipped eagle (folder)" in n and "/c:" in n for n in choice.notes)


def test_a_head_must_beat_the_fallbacks_measured_tau(head_dir, tmp_path, target, no_cache, monkeypatch):
    """A checkpoint that names its training-free drafter and that drafter's measured τ (the reader: page lookup,
    τ ~6 on its pages) keeps it over a shipped head with a lower validation τ, and says why; a better head wins."""
    from mmspec.drafters.auto import FALLBACK_KEY, FALLBACK_VALIDATION_KEY

    monkeypatch.setattr(target.config, FALLBACK_KEY, "lookup;num_draft_tokens=3", raising=False)
    monkeypatch.setattr(target.config, FALLBACK_VALIDATION_KEY, {"tau": 4.0, "source": "a test run"}, raising=False)
    _saved(head_dir, tmp_path / "runs" / "weak", tau=2.4)
    _saved(head_dir, tmp_path / "runs" / "plain")  # no figures: cannot show it beats the fallback
    drafter = make_drafter(f"auto:{tmp_path / 'runs'}", target)
    assert drafter.kind == "lookup" and drafter.num_draft_tokens == 3
    reasons = {os.path.basename(c.path): c.reason for c in drafter.auto_choice.skipped}
    assert reasons["weak"] == "validation tau 2.40, not above the fallback lookup;num_draft_tokens=3's tau 4.00 " \
                              "(a test run)"
    assert reasons["plain"].startswith("no validation figures, not above")
    assert drafter.auto_choice.notes[0] == "auto: no saved drafter beats the fallback drafter " \
                                           "lookup;num_draft_tokens=3; using it"
    _saved(head_dir, tmp_path / "runs" / "strong", tau=4.5)
    assert make_drafter(f"auto:{tmp_path / 'runs'}", target).auto_choice.chosen.path == str(tmp_path / "runs" / "strong")
    # a fallback the user names is not the checkpoint's: its figure does not apply
    chosen = make_drafter({"kind": "auto", "path": str(tmp_path / "runs" / "weak"), "fallback": "lookup"}, target)
    assert chosen.auto_choice.chosen.path == str(tmp_path / "runs" / "weak")


def test_the_cache_and_ties(head_dir, tmp_path, target, no_cache):
    _saved(head_dir, no_cache / "x", tau=3.0)
    assert drafter_cache_dir() == str(no_cache)
    assert make_drafter("auto", target).auto_choice.chosen.path == str(no_cache / "x")
    _saved(head_dir, tmp_path / "mine", tau=3.0)  # one saved drafter named directly; a tie goes to the folder
    assert make_drafter("auto", target, drafter_dir=str(tmp_path / "mine")).auto_choice.chosen.source == "folder"
    assert make_drafter("auto;cache=false", target).auto_choice.chosen is None  # cache not searched


def test_no_match_falls_back_to_lookup_and_says_why(head_dir, tmp_path, target, no_cache, caplog):
    _saved(head_dir, tmp_path / "other", tau=4.0, fingerprint={"vocab_size": 7, "tokenizer_hash": "0" * 16})
    with caplog.at_level(logging.WARNING, logger="mmspec"):
        drafter = make_drafter(f"auto:{tmp_path}", target)
    assert drafter.kind == "lookup" and drafter.auto_choice.fallback == "lookup"
    notes = drafter.auto_choice.notes
    assert notes[0] == "auto: no saved drafter matches this target; using the fallback drafter lookup"
    assert "vocab_size: trained for 7" in notes[1] and "tokenizer_hash" in notes[1]
    assert "fallback drafter lookup" in caplog.text
    with pytest.raises(InvalidInputError, match="fallback is 'none'.*vocab_size"):
        make_drafter(f"auto:{tmp_path};fallback=none", target)
    # The fallback's own options travel in its spec (a ';' inside a spec string would end the fallback's).
    assert make_drafter({"kind": "auto", "path": str(tmp_path), "fallback": "lookup;num_draft_tokens=3"},
                        target).num_draft_tokens == 3


def test_a_broken_best_candidate_is_skipped_at_load(head_dir, tmp_path, target, no_cache):
    _saved(head_dir, tmp_path / "good", tau=2.0)
    bad = _saved(head_dir, tmp_path / "bad", tau=4.0)
    (bad / "model.safetensors").write_bytes(b"not safetensors")
    choice = make_drafter(f"auto:{tmp_path}", target).auto_choice
    assert choice.chosen.path == str(tmp_path / "good")
    assert [c.reason.startswith("failed to load") for c in choice.skipped] == [True]


def test_auto_bad_requests(tmp_path, target):
    with pytest.raises(InvalidInputError, match="pass the loaded target"):
        make_drafter("auto", None)
    with pytest.raises(InvalidInputError, match="drafter folder not found"):
        make_drafter("auto:/no/such/runs", target)
    with pytest.raises(InvalidInputError, match="unknown options for 'auto'"):
        make_drafter("auto;topk=3", target)
    with pytest.raises(InvalidInputError, match="other than 'auto'"):
        make_drafter("auto;fallback=auto", target)
    with pytest.raises(InvalidInputError, match="both name a folder"):
        make_drafter(f"auto:{tmp_path}", target, drafter_dir=str(tmp_path))
    assert choose_drafter(None).chosen is None and find_candidates(target, cache_dir=None) == []


def test_bundled_drafters_compete_and_pipeline_notes(head_dir, tmp_path, tiny_vlm, monkeypatch, no_cache):
    """A workload that bundles the target and a head: "auto" sees it as a bundled candidate; a better figure under
    drafter_dir wins; the pipeline shows the choice as pipe.notes."""
    import mmspec.workloads as W

    bundled = _saved(head_dir, tmp_path / "bundled-head", tau=2.5)

    class Shipped(W.Workload):
        name = "auto-test"

        def bundled_model(self):
            return tiny_vlm

        def bundled_drafters(self):
            return [f"eagle:{bundled};num_draft_tokens=3"]

    monkeypatch.setitem(W._WORKLOADS, Shipped.name, Shipped)
    pipe = MMSpecPipeline.from_pretrained(tiny_vlm, drafter="auto")
    assert pipe.drafter_choice.chosen.source == "bundled" and pipe.drafter.num_draft_tokens == 3  # spec's options
    assert pipe.notes == [f"auto: chose eagle (bundled) {bundled}, validation tau 2.50 (test)"]
    _saved(head_dir, tmp_path / "runs" / "better", tau=3.5)
    pipe = MMSpecPipeline.from_pretrained(tiny_vlm, drafter="auto", drafter_dir=str(tmp_path / "runs"))
    assert pipe.drafter_choice.chosen.path == str(tmp_path / "runs" / "better")
    assert [c.source for c in pipe.drafter_choice.candidates] == ["folder", "bundled"]
    with pytest.raises(InvalidInputError, match="drafter_dir goes with drafter='auto'"):
        MMSpecPipeline.from_pretrained(tiny_vlm, drafter="lookup", drafter_dir=str(tmp_path))
    assert MMSpecPipeline.from_pretrained(tiny_vlm, drafter="lookup").notes == []


@pytest.mark.slow
def test_fit_writes_the_validation_block_auto_ranks_by(tiny_vlm, tmp_path, target, no_cache):
    """``mmspec train`` with held-out shards ends by writing the last held-out record into the saved drafter's
    config; without them it writes none."""
    from mmspec.train import TrainConfig, collect_data, fit

    def cfg(out, **kw):
        return TrainConfig(kind="eagle", target=tiny_vlm, out=str(out), workloads=("testbed-docs",), n_train=4,
                           max_new_tokens=6, steps=2, batch_size=2, shard_size=2, save_every=0, progress=False, **kw)

    collect_data(cfg(tmp_path / "runs" / "held"))
    fit(cfg(tmp_path / "runs" / "held", val_shards=1))
    last = json.loads((tmp_path / "runs" / "held" / "val_log.jsonl").read_text().splitlines()[-1])
    block = read_drafter_config(tmp_path / "runs" / "held")["validation"]
    assert block["source"] == "val_log step 2" and block["accept_rate"] == last["acc"]
    assert block["tau"] == pytest.approx(tau_estimate(last["acc"]), abs=1e-4) and block["records"] == last["records"]
    os.rename(tmp_path / "runs" / "held" / "data", tmp_path / "data")  # the data is no drafter of its own
    (tmp_path / "runs" / "plain").mkdir()
    os.rename(tmp_path / "data", tmp_path / "runs" / "plain" / "data")
    fit(cfg(tmp_path / "runs" / "plain"))
    assert "validation" not in read_drafter_config(tmp_path / "runs" / "plain")
    choice = make_drafter(f"auto:{tmp_path / 'runs'}", target).auto_choice
    assert [os.path.basename(c.path) for c in choice.candidates] == ["held", "plain"]  # measured first


def test_the_bundled_target_gets_its_shipped_head(no_cache):
    """The shipped EAGLE head carries its validation figures (results/vision/README.md says how they were written),
    so "auto" on the bundled target loads it."""
    from mmspec.vision.testbed import bundled_eagle, bundled_target

    if bundled_target() is None or bundled_eagle() is None:
        pytest.skip("no bundled target in this install")
    pipe = MMSpecPipeline.from_pretrained(bundled_target(), drafter="auto", dtype="float32")
    chosen = pipe.drafter_choice.chosen
    assert chosen.source == "bundled" and os.path.realpath(chosen.path) == os.path.realpath(bundled_eagle())
    assert chosen.validation["source"] == "val_log step 3000" and chosen.tau == pytest.approx(2.5858)
    assert pipe.drafter.kind == "eagle" and pipe.notes[0].startswith("auto: chose eagle (bundled)")
