"""``mmspec train``: config validation, target data on disk (shards, resume), training, checkpoints and resume,
and a two-process run (torchrun, gloo) on the tiny demo VLM with the docs/charts workloads."""

import inspect
import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

import mmspec
from mmspec.cli import main
from mmspec.demo import tiny_vlm_path
from mmspec.errors import InvalidInputError
from mmspec.registry import make_drafter
from mmspec.train import (TrainConfig, collect_data, fit, get_trainer, latest_checkpoint, read_shard,
                          register_trainer, trainer_kinds, EagleTrainer)

TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")


def _cfg(out_dir, **kw):
    base = dict(kind="eagle", target=tiny_vlm_path(), out=str(out_dir), workloads=("testbed-docs", "testbed-charts"), n_train=4,
                max_new_tokens=8, steps=3, batch_size=2, shard_size=2, save_every=2, progress=False)
    base.update(kw)
    return TrainConfig(**base)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """Stage 1 once: 4 items (2 docs, 2 charts) in 2 shards."""
    out = tmp_path_factory.mktemp("train-data")
    collect_data(_cfg(out))
    return out / "data"


def _with_data(data_dir, out):
    shutil.copytree(data_dir, out / "data")
    return out


@pytest.fixture(scope="module")
def pipe():
    from mmspec import MMSpecPipeline

    return MMSpecPipeline.from_pretrained(tiny_vlm_path())


# --------------------------------------------------------------------------- validation
@pytest.mark.parametrize("kw, msg", [
    ({"kind": "nope"}, "unknown trainer kind"),
    ({"workloads": ("docs", "nope")}, "unknown workload"),
    ({"workloads": ()}, "at least one workload"),
    ({"steps": 0}, "steps must be a positive integer"),
    ({"batch_size": -1}, "batch_size"),
    ({"n_train": 0}, "n_train"),
    ({"lr": 0.0}, "lr must be > 0"),
    ({"save_every": -1}, "save_every"),
    ({"layer_ids": (1, 2)}, "three target layers"),
    ({"target": "/no/such/target"}, "target folder not found"),
    ({"out": ""}, "output folder"),
])
def test_config_rejects(tmp_path, kw, msg):
    with pytest.raises(InvalidInputError, match=msg):
        _cfg(tmp_path, **kw).validate()
    assert not os.listdir(tmp_path)  # failed before writing anything


def test_layer_ids_checked_against_target(tmp_path):
    cfg = _cfg(tmp_path, layer_ids=(1, 2, 5))
    cfg.validate()  # fine without the target...
    with pytest.raises(InvalidInputError, match="out of range for a target with 2 layers"):
        cfg.validate_target()  # ...refused once its config (2 layers) is read, before any weights load
    with pytest.raises(InvalidInputError, match="out of range"):
        collect_data(cfg)
    assert not os.listdir(tmp_path)
    _cfg(tmp_path, layer_ids=(0, 1, 2)).validate_target()


def test_registry():
    assert "eagle" in trainer_kinds() and isinstance(get_trainer("eagle"), EagleTrainer)

    class Mine(EagleTrainer):
        kind = "eagle-test"

    from mmspec import train as train_mod

    register_trainer("eagle-test", Mine)
    try:
        assert isinstance(get_trainer("eagle-test"), Mine)
    finally:
        train_mod._TRAINERS.pop("eagle-test", None)
    with pytest.raises(InvalidInputError):
        register_trainer("a:b", Mine)


def test_every_registered_trainer_takes_the_reference_answer():
    """The data stage calls record(..., reference=...); a trainer without it is refused at registration."""
    for kind in trainer_kinds():
        assert "reference" in inspect.signature(type(get_trainer(kind)).record).parameters, kind

    class Old(EagleTrainer):
        def record(self, cfg, model, inputs, layer_ids):
            return {}

    with pytest.raises(InvalidInputError, match="reference"):
        register_trainer("old-style", Old)


def test_cli_user_error(tmp_path, capsys):
    rc = main(["train", "--target", tiny_vlm_path(), "--out", str(tmp_path / "o"), "--steps", "0"])
    assert rc == 2 and "steps must be a positive integer" in capsys.readouterr().err


# --------------------------------------------------------------------------- stage 1
def test_shards_written_readable_and_from_the_target(data_dir, pipe):
    index = json.loads((data_dir / "index.json").read_text())
    assert index["complete"] and index["layer_ids"] == [1, 1, 1]
    assert [s["file"] for s in index["shards"]] == ["shard-00000.safetensors", "shard-00001.safetensors"]
    assert index["fingerprint"]["model_type"] == "qwen2_vl"
    recs = [r for s in index["shards"] for r in read_shard(str(data_dir / s["file"]))]
    assert len(recs) == 4
    some = [r for s in index["shards"] for r in read_shard(str(data_dir / s["file"]), keys=("labels",))]
    assert [set(r) for r in some] == [{"labels"}] * 4 and all(torch.equal(a["labels"], b["labels"])
                                                              for a, b in zip(some, recs))
    for r in recs:
        n, P = len(r["tokens"]), int(r["prompt_len"])
        assert r["features"].shape == (n, 3 * 64) and r["labels"].shape == (n,) and P < n <= P + 8
        # the target's argmax over prompt + response reproduces its own greedy response: the forward saw the
        # same image (pixels, M-RoPE positions) as generate did
        assert torch.equal(r["labels"][P - 1: n - 1], r["tokens"][P:])
    # the first record is docs/train/0 through the pipeline's preprocessing: same prompt ids, image tokens in it
    from mmspec.workloads import get_workload

    ex = get_workload("testbed-docs").example("train", 0)
    ids = pipe.prepare(images=ex.images, prompt=ex.prompt)["input_ids"][0]
    first = read_shard(str(data_dir / "shard-00000.safetensors"))[0]
    assert torch.equal(first["tokens"][: len(ids)], ids)
    assert (ids == pipe.model.config.image_token_id).sum() > 0


def test_complete_data_is_found_again_through_a_relative_target_path(data_dir, tmp_path, monkeypatch):
    """The index records the target as an absolute path, as the rerun compares it: a data stage run again with
    the same relative ``--target`` finds its complete data instead of refusing it as other settings."""
    out = tmp_path / "rel"
    target = tiny_vlm_path()
    monkeypatch.chdir(os.path.dirname(target))
    cfg = dict(n_train=2, shard_size=2, target=os.path.basename(target))
    collect_data(_cfg(out, **cfg))
    assert collect_data(_cfg(out, **cfg)) == str(out / "data")
    assert json.loads((out / "data" / "index.json").read_text())["target"] == os.path.abspath(target)


def test_stage1_resume_skips_written_shards(data_dir, tmp_path):
    out = _with_data(data_dir, tmp_path)
    d = out / "data"
    before = {p: os.stat(d / p).st_mtime_ns for p in ("shard-00000.safetensors", "shard-00001.safetensors")}
    collect_data(_cfg(out))  # complete index: nothing to do
    assert {p: os.stat(d / p).st_mtime_ns for p in before} == before
    # a job killed while writing shard 1: no index, no shard 1 (only a stray temporary file)
    os.remove(d / "index.json")
    os.remove(d / "shard-00001.safetensors")
    (d / "shard-00001.safetensors.tmp-123").write_bytes(b"partial")
    collect_data(_cfg(out))
    assert os.stat(d / "shard-00000.safetensors").st_mtime_ns == before["shard-00000.safetensors"]
    assert (d / "shard-00001.safetensors").is_file() and json.loads((d / "index.json").read_text())["complete"]
    # shards written with other settings are refused, never mixed in
    with pytest.raises(InvalidInputError, match="other settings"):
        collect_data(_cfg(out, max_new_tokens=9))
    os.remove(d / "index.json")
    with pytest.raises(InvalidInputError, match="other settings"):
        collect_data(_cfg(out, max_new_tokens=9))
    a = read_shard(str(data_dir / "shard-00001.safetensors"))
    b = read_shard(str(d / "shard-00001.safetensors"))
    assert all(torch.equal(x[k], y[k]) for x, y in zip(a, b) for k in x)


# --------------------------------------------------------------------------- stage 2
def test_train_saves_lossless_drafter(data_dir, tmp_path, pipe):
    out = _with_data(data_dir, tmp_path)
    fit(_cfg(out))
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3]
    # Unrolled as deep as the head drafts (num_draft_tokens 4) unless told otherwise.
    assert all(len(r["loss"]) == 4 and len(r["acc"]) == 4 and r["lr"] > 0 for r in log)
    assert latest_checkpoint(str(out)).endswith("step-000003")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["drafter_kind"] == "eagle" and cfg["target_fingerprint"]["model_type"] == "qwen2_vl"
    drafter = make_drafter(f"eagle:{out}", pipe.model)
    from mmspec.workloads import get_workload

    for w in ("testbed-docs", "testbed-charts"):
        ex = get_workload(w).example("test", 0)
        inputs = pipe.prepare(images=ex.images, prompt=ex.prompt)
        ref = pipe.model.generate(**inputs, max_new_tokens=12, do_sample=False)
        got = mmspec.generate(pipe.model, inputs, drafter=drafter, max_new_tokens=12)
        assert torch.equal(got.sequences, ref), w


def test_held_out_shards_are_not_trained_on_and_are_scored(data_dir, tmp_path):
    """``val_shards=1``: the last shard never reaches the optimiser, and every checkpoint and the end write the
    head's loss and top-1 per unrolled step on it to ``val_log.jsonl``; holding out every shard is refused."""
    from mmspec.train import ShardStream

    out = _with_data(data_dir, tmp_path)
    stream = ShardStream(str(out / "data"), holdout=1)
    assert len(stream.paths) == 1 and len(stream.held_out) == 1 and stream.held_out[0].endswith("00001.safetensors")
    held = {tuple(r["tokens"].tolist()) for r in read_shard(stream.held_out[0])}
    seen = set()
    for _, rec in zip(range(6), stream):  # three epochs of the one training shard
        seen.add(tuple(rec["tokens"].tolist()))
    assert seen and not seen & held
    fit(_cfg(out, val_shards=1))
    val = [json.loads(line) for line in (out / "val_log.jsonl").read_text().splitlines()]
    assert [v["step"] for v in val] == [2, 3] and all(v["records"] == 2 for v in val)
    assert all(len(v["acc"]) == 4 and all(0.0 <= a <= 1.0 for a in v["acc"]) and v["loss"][0] > 0 for v in val)
    with pytest.raises(InvalidInputError, match="val_shards 2 leaves nothing to train on"):  # said by validate()
        fit(_cfg(_with_data(data_dir, tmp_path / "b"), val_shards=2))


def test_resume_continues_step_count(data_dir, tmp_path):
    out = _with_data(data_dir, tmp_path)
    fit(_cfg(out, steps=4, save_every=2, lr=1e-2))
    full = (out / "model.safetensors").read_bytes()
    log_full = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
    # the same run, "killed" after the step-2 checkpoint: then resumed
    out2 = _with_data(data_dir, tmp_path / "b")
    fit(_cfg(out2, steps=4, save_every=2, lr=1e-2))
    shutil.rmtree(out2 / "checkpoints" / "step-000004")
    os.remove(out2 / "model.safetensors")
    lines = (out2 / "train_log.jsonl").read_text().splitlines()[:2]
    (out2 / "train_log.jsonl").write_text("\n".join(lines) + "\n")
    fit(_cfg(out2, steps=4, save_every=2, lr=1e-2, resume=True))
    log = [json.loads(x) for x in (out2 / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3, 4]
    assert [r["lr"] for r in log] == pytest.approx([r["lr"] for r in log_full])  # the schedule continued
    state = torch.load(out2 / "checkpoints" / "step-000004" / "trainer_state.pt", weights_only=True)
    assert state["step"] == 4 and (out2 / "model.safetensors").is_file() and full
    # already finished: a further resume does nothing
    fit(_cfg(out2, steps=4, save_every=2, resume=True))
    assert len((out2 / "train_log.jsonl").read_text().splitlines()) == 4


def test_cli_train_end_to_end(tmp_path, pipe):
    out = tmp_path / "cli"
    rc = main(["train", "--kind", "eagle", "--target", tiny_vlm_path(), "--workload", "testbed-docs,testbed-charts", "--n-train", "2",
               "--max-new-tokens", "4", "--steps", "2", "--batch-size", "2", "--shard-size", "1", "--out", str(out),
               "--val-shards", "1", "--no-progress"])
    assert rc == 0
    assert (out / "data" / "shard-00001.safetensors").is_file() and (out / "train_log.jsonl").is_file()
    assert json.loads((out / "val_log.jsonl").read_text().splitlines()[-1])["records"] == 1
    make_drafter(f"eagle:{out}", pipe.model)


# --------------------------------------------------------------------------- two processes
_SCRIPT = textwrap.dedent("""
    import json, os, sys
    import torch
    torch.set_num_threads(1)
    from mmspec.train import TrainConfig, fit, _accelerator
    out, target = sys.argv[1], sys.argv[2]
    acc = _accelerator()
    cfg = TrainConfig(kind="eagle", target=target, out=out, steps=3, batch_size=2, save_every=2, progress=False)
    d = fit(cfg, acc)
    digest = float(sum(p.double().sum() for p in d.parameters() if p.requires_grad))
    with open(os.path.join(out, f"rank-{acc.process_index}.json"), "w") as f:
        json.dump({"rank": acc.process_index, "world": acc.num_processes, "digest": digest}, f)
""")


def test_two_process_training_smoke(data_dir, tmp_path):
    if not os.path.isfile(TORCHRUN):
        pytest.skip("torchrun not installed next to the interpreter")
    out = _with_data(data_dir, tmp_path / "ddp")
    script = tmp_path / "ddp_train.py"
    script.write_text(_SCRIPT)
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run([TORCHRUN, "--standalone", "--nproc_per_node", "2", str(script), str(out), tiny_vlm_path()],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = [json.loads((out / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert [(r["rank"], r["world"]) for r in ranks] == [(0, 2), (1, 2)]
    assert ranks[0]["digest"] == pytest.approx(ranks[1]["digest"], rel=1e-6)  # gradients were synchronised
    log = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3] and all(r["world_size"] == 2 for r in log)  # written once
    assert sorted(os.listdir(out / "checkpoints")) == ["step-000002", "step-000003"]
    assert (out / "model.safetensors").is_file()


def test_a_resumed_run_keeps_the_unroll_it_started_with(data_dir, tmp_path):
    """A run started with an explicit unroll and resumed without one must not switch to the default."""
    out = _with_data(data_dir, tmp_path)
    fit(_cfg(out, steps=2, save_every=2, ttt_steps=2))
    fit(_cfg(out, steps=3, save_every=2, resume=True))
    log = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3] and all(len(r["loss"]) == 2 for r in log)


# --------------------------------------------------------------------------- what a user sees (issue 13)
def test_cli_progress_bar_shows_logged_values_and_a_summary_at_the_end(data_dir, tmp_path, capsys):
    """The bar once showed the *sum* of the unrolled losses (a number in no log) and the run ended silently."""
    import re

    out = _with_data(data_dir, tmp_path)
    rc = main(["train", "--stage", "fit", "--target", tiny_vlm_path(), "--workload", "testbed-docs,testbed-charts",
               "--out", str(out), "--n-train", "4",
               "--shard-size", "2", "--steps", "3", "--batch-size", "2", "--save-every", "0", "--val-shards", "1"])
    cap = capsys.readouterr()
    assert rc == 0
    log = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
    shown = re.findall(r"loss1=([0-9.]+), acc1=([0-9.]+)", cap.err)
    assert shown, cap.err
    assert float(shown[-1][0]) == pytest.approx(log[-1]["loss"][0], abs=1e-3)  # the log's first unrolled step
    assert float(shown[-1][1]) == pytest.approx(log[-1]["acc"][0], abs=1e-3)
    summary = cap.out.strip().splitlines()[-1]
    assert summary.startswith("mmspec train: eagle drafter saved to ") and str(out) in summary
    assert "step 3" in summary and "held-out top-1" in summary
    rc = main(["train", "--stage", "data", "--target", tiny_vlm_path(), "--workload", "testbed-docs,testbed-charts",
               "--out", str(out), "--n-train", "4",
               "--shard-size", "2", "--max-new-tokens", "8", "--no-progress"])
    assert rc == 0 and "target data in " in capsys.readouterr().out.strip().splitlines()[-1]


def test_trained_weights_and_shards_are_not_private(data_dir, tmp_path):
    import stat

    out = _with_data(data_dir, tmp_path)
    fit(_cfg(out))
    mask = os.umask(0)
    os.umask(mask)
    for f in [out / "model.safetensors", *(out / "checkpoints").glob("*/model.safetensors"),
              *(out / "data").glob("shard-*.safetensors")]:
        assert stat.S_IMODE(os.stat(f).st_mode) == 0o666 & ~mask, f  # safetensors alone writes 0600
