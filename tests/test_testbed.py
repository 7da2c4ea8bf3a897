"""The testbed target's training pieces: batches with answer-only labels, the character-reader targets,
a resumable training run, and evaluation."""

import json

import pytest
import torch

from mmspec.vision.testbed import (CHARSET, MERGE, PATCH, TargetTrainConfig, aux_targets, build_target, evaluate,
                                   make_batch, train_target)
from mmspec.workloads import get_workload


@pytest.fixture(scope="module")
def tiny():
    return build_target("tiny", tokenizer_texts=200, vocab_size=400)


@pytest.fixture(scope="module")
def examples():
    return (get_workload("docs", char_boxes=True).examples("train", 2)
            + get_workload("charts", char_boxes=True).examples("train", 2))


def test_labels_cover_exactly_the_answer(tiny, examples):
    _, proc = tiny
    batch = make_batch(proc, examples)
    eos = proc.tokenizer.eos_token_id
    for i, ex in enumerate(examples):
        ids = batch["input_ids"][i][batch["labels"][i] != -100]
        assert ids[-1].item() == eos
        assert proc.tokenizer.decode(ids[:-1]).strip() == ex.target.strip()
    gen = make_batch(proc, examples, train=False)
    assert "labels" not in gen and (gen["attention_mask"][:, -1] == 1).all()  # left-padded for generate


def test_aux_targets_mark_the_drawn_characters(examples):
    ex = examples[0]
    w, h = ex.images[0].size
    grid = (h // PATCH, w // PATCH)
    y = aux_targets(ex, grid)
    assert y.shape == (grid[0] // MERGE * (grid[1] // MERGE), MERGE * MERGE, len(CHARSET))
    run = next(r for r in ex.meta["runs"] if r.get("chars") and r["text"][0] != " ")
    x = (run["chars"][0] + run["chars"][1]) / 2
    yc = (run["box"][1] + run["box"][3]) / 2
    px, py = int(x) // PATCH, int(yc) // PATCH
    k = (py // MERGE) * (grid[1] // MERGE) + px // MERGE
    assert y[k, (py % MERGE) * MERGE + px % MERGE, CHARSET.index(run["text"][0])] == 1
    n_chars = sum(sum(c != " " for c in r["text"]) for r in ex.meta["runs"] if r.get("chars"))
    assert 0 < y.sum() <= n_chars


def test_training_runs_resumes_and_evaluates(tmp_path):
    cfg = TargetTrainConfig(out=str(tmp_path), size="tiny", steps=2, batch_size=2, save_every=1, tokenizer_texts=100,
                      vocab_size=400, warmup=1)
    train_target(cfg, progress=False)
    log = [json.loads(line) for line in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2] and all(r["lm_loss"] > 0 and r["aux_loss"] > 0 for r in log)
    cfg.steps = 3
    train_target(cfg, progress=False)  # resumes at step 2
    log = [json.loads(line) for line in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3]
    assert torch.load(tmp_path / "state.pt", weights_only=True)["step"] == 3
    from transformers import AutoProcessor, Qwen2VLForConditionalGeneration

    model = Qwen2VLForConditionalGeneration.from_pretrained(tmp_path)
    res = evaluate(model, AutoProcessor.from_pretrained(tmp_path), "charts", n=2, max_new_tokens=4, batch_size=2)
    assert res["n"] == 2 and 0.0 <= res["exact_match"] <= 1.0 and res["char_error_rate"] > 0
