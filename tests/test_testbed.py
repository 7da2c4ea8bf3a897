"""The testbed target, its runtime (:mod:`mmspec.vision.testbed`: batches with answer-only labels, evaluation,
grounding, the reference drafter's τ) and its training (:mod:`mmspec.vision.testbed_train`: the character-reader
targets, a resumable training run, grow / remerge / ungroup-kv, export), and the direction between the two."""

import json
import math
import multiprocessing

import pytest
import torch

from mmspec.vision.testbed import (MERGE, PATCH, build_target, evaluate, grounding, make_batch, reference_ids,
                                   reference_tau)
from mmspec.vision.testbed_train import (CHARSET, TargetTrainConfig, aux_targets, char_locations, export_target,
                                         reading_targets, self_feed_inputs, train_target)
from mmspec.workloads import get_workload


@pytest.fixture(scope="module")
def tiny():
    return build_target("tiny", tokenizer_texts=200, vocab_size=400)


@pytest.fixture(scope="module")
def examples():
    return (get_workload("testbed-docs", char_boxes=True).examples("train", 2)
            + get_workload("testbed-charts", char_boxes=True).examples("train", 2))


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
    cfg = TargetTrainConfig(out=str(tmp_path), size="tiny", steps=3, stop_after=2, batch_size=2, save_every=1,
                            tokenizer_texts=100, vocab_size=400, warmup=1, track_weight=0.5, spell_weight=0.5,
                            relay_weight=0.5)
    train_target(cfg, progress=False)
    log = [json.loads(line) for line in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2]
    assert all(r["lm_loss"] > 0 and r["aux_loss"] > 0 and r["read_loss"] > 0 and r["locate_loss"] > 0
               and r["track_loss"] > 0 and r["spell_loss"] > 0 and r["relay_loss"] > 0 for r in log)
    speller = torch.load(tmp_path / "state.pt", weights_only=True)["speller"]["proj.weight"].clone()
    cfg.stop_after = 0
    train_target(cfg, progress=False)  # resumes at step 2, same schedule
    log = [json.loads(line) for line in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3]
    state = torch.load(tmp_path / "state.pt", weights_only=True)
    assert state["step"] == 3 and not torch.equal(state["speller"]["proj.weight"], speller)  # resumed and trained
    assert "relay" in state and "relay_optimizer" in state
    from transformers import AutoProcessor, Qwen2VLForConditionalGeneration

    model = Qwen2VLForConditionalGeneration.from_pretrained(tmp_path)
    res = evaluate(model, AutoProcessor.from_pretrained(tmp_path), "charts", n=2, max_new_tokens=4, batch_size=2)
    assert res["n"] == 2 and 0.0 <= res["exact_match"] <= 1.0 and res["char_error_rate"] > 0
    blocks = evaluate(model, AutoProcessor.from_pretrained(tmp_path), "docs", n=2, max_new_tokens=4, batch_size=2,
                      options={"mode": "block"})
    assert set(blocks["exact_by_kind"]) == {"block"} and blocks["cer_by_kind"]["block"] == blocks["char_error_rate"]
    # The saved config is sdpa again (eager was only for reading the attention probabilities in training).
    assert model.config.text_config._attn_implementation in (None, "sdpa")
    out = export_target(str(tmp_path), str(tmp_path / "export"))
    shipped = Qwen2VLForConditionalGeneration.from_pretrained(out)
    assert shipped.dtype == torch.float32  # stored in bfloat16, loaded as float32
    from safetensors import safe_open

    with safe_open(str(tmp_path / "export" / "model.safetensors"), "pt") as f:
        assert f.get_tensor(next(iter(f.keys()))).dtype == torch.bfloat16


def test_char_locations_follow_the_drawn_runs(examples):
    ex = examples[0]  # a docs item: every drawn run is a piece of the Markdown answer
    locs = char_locations(ex, ex.target)
    for run in ex.meta["runs"]:
        i = ex.target.find(run["text"])
        if i < 0 or not run.get("chars") or len(run["chars"]) != len(run["text"]) + 1:
            continue
        x, y = locs[i]
        assert run["chars"][0] <= x <= run["chars"][1] and run["box"][1] <= y <= run["box"][3]
    assert locs[ex.target.index("\n")] is None if "\n" in ex.target else True  # line breaks are not drawn
    assert sum(loc is not None for loc in locs) > 0.5 * len(ex.target)


def test_reading_targets_point_at_the_cell_of_the_next_token(tiny, examples):
    _, proc = tiny
    batch = make_batch(proc, examples)
    where = reading_targets(proc, examples, batch)
    image_id = proc.tokenizer.convert_tokens_to_ids(proc.image_token)
    for b, ex in enumerate(examples):
        q = (where[b] >= 0).nonzero().flatten()
        assert len(q) > 0
        assert (batch["labels"][b, q + 1] != -100).all()  # only answer tokens are read
        assert (batch["input_ids"][b, where[b, q]] == image_id).all()  # ... from image tokens
        # The first answer token that is drawn: its cell is the one under its first drawn character.
        q0 = int(q[0])
        tok = proc.tokenizer.decode(batch["input_ids"][b, q0 + 1])
        locs = char_locations(ex, ex.target)
        first = next(i for i, loc in enumerate(locs) if loc is not None)
        assert ex.target[first:].startswith(tok.strip()[:1])
        x, y = locs[first]
        _, _, gw = batch["image_grid_thw"][b].tolist()
        cell = int(y) // (PATCH * MERGE) * (gw // MERGE) + int(x) // (PATCH * MERGE)
        image_pos = (batch["input_ids"][b] == image_id).nonzero().flatten()
        assert int(where[b, q0]) == int(image_pos[cell])


def test_patch_reading_loss_rewards_reading_not_silence():
    from mmspec.vision.testbed_train import patch_reading_loss

    torch.manual_seed(0)
    y = torch.zeros(6, 4, len(CHARSET))
    y[0, 0, 33] = y[0, 0, 34] = y[3, 2, 40] = 1  # two characters under one patch, one under another
    silent = torch.full(y.shape, -6.0)  # predicts nothing anywhere
    reading = silent.clone()
    reading[..., 0] = 6.0  # blank where nothing is drawn...
    reading[0, 0, 33] = reading[0, 0, 34] = reading[3, 2, 40] = 8.0  # ...and the characters where they are
    for kind in ("softmax", "bce"):
        loss_r, acc_r = patch_reading_loss(reading, y, kind)
        loss_s, _ = patch_reading_loss(silent, y, kind)
        assert loss_r < loss_s and acc_r == 1.0
    # The softmax loss separates reading from silence by a wide margin; BCE over 95 classes barely does.
    soft = patch_reading_loss(silent, y)[0] / patch_reading_loss(reading, y)[0]
    bce = patch_reading_loss(silent, y, "bce")[0] / patch_reading_loss(reading, y, "bce")[0]
    assert soft > 10 * bce
    assert patch_reading_loss(reading, torch.zeros_like(y))[1] == 0.0  # no characters: accuracy undefined -> 0


def test_config_errors_are_caught_before_training(tmp_path):
    from mmspec.errors import InvalidInputError

    with pytest.raises(InvalidInputError, match="track_weight"):
        train_target(TargetTrainConfig(out=str(tmp_path), read_weight=0.0, track_weight=0.5), progress=False)
    with pytest.raises(InvalidInputError, match="aux_loss"):
        train_target(TargetTrainConfig(out=str(tmp_path), aux_loss="sigmoid"), progress=False)
    with pytest.raises(InvalidInputError, match="self_feed"):
        train_target(TargetTrainConfig(out=str(tmp_path), self_feed=1.5), progress=False)


def test_self_feed_replaces_answer_tokens_only():
    """Prompt tokens and the first answer token (it follows the prompt) never change; a swapped position
    takes the prediction made one position earlier; the share reported is the share of answer tokens changed."""
    ids = torch.tensor([[5, 6, 7, 10, 11, 12, 13, 2], [0, 5, 6, 20, 21, 22, 2, 0]])
    labels = torch.tensor([[-100, -100, -100, 10, 11, 12, 13, 2], [-100, -100, -100, 20, 21, 22, 2, -100]])
    predicted = torch.full((2, 7), 99)
    predicted[1, 4] = 22  # right there: nothing to swap
    same, changed = self_feed_inputs(ids, labels, predicted, 0.0)
    assert torch.equal(same, ids) and changed == 0.0
    fed, changed = self_feed_inputs(ids, labels, predicted, 1.0)
    assert fed[0].tolist() == [5, 6, 7, 10, 99, 99, 99, 99]
    assert fed[1].tolist() == [0, 5, 6, 20, 99, 22, 99, 0]  # padding after the end stays
    assert changed == 6 / 9
    g = torch.Generator().manual_seed(0)
    half, changed = self_feed_inputs(ids, labels, predicted, 0.5, g)
    swapped = (half != ids)
    assert 0 < swapped.sum() < 6 and changed == swapped.sum().item() / 9
    assert (half[swapped] == 99).all() and not swapped[:, :4].any()


def test_self_feed_training_keeps_the_reading_targets(tmp_path):
    """One step with every mispredicted answer token fed back: tokens change, and the reading loss (targets
    matched against the batch's ids) is still computed, because targets are taken before the swap."""
    cfg = TargetTrainConfig(out=str(tmp_path), size="tiny", steps=1, batch_size=2, save_every=1, tokenizer_texts=100,
                            vocab_size=400, warmup=1, self_feed=1.0)
    train_target(cfg, progress=False)
    rec = json.loads((tmp_path / "train_log.jsonl").read_text().splitlines()[0])
    assert rec["self_fed"] > 0.3 and rec["read_loss"] > 0


def test_grounding_separates_a_reader_from_a_guesser(tiny):
    """An oracle that predicts every next token when it sees a picture, and token 0 when the picture is
    blank, must score 1.0 with the image and near 0 blank; a model that ignores the image scores the same."""
    _, proc = tiny

    class Oracle(torch.nn.Module):
        def __init__(self, reads: bool):
            super().__init__()
            self.reads = reads

        def forward(self, input_ids, pixel_values=None, **_):
            sees = self.reads and pixel_values.std(0).max() > 0  # a white page is the same in every patch
            nxt = torch.roll(input_ids, -1, dims=1) if sees else torch.zeros_like(input_ids)
            return type("Out", (), {"logits": torch.nn.functional.one_hot(nxt, 512).float()})()

    reader = grounding(Oracle(True), proc, "docs", n=3, batch_size=2, options={"mode": "block"})
    assert reader["accuracy"] == 1.0 and reader["accuracy_blank"] < 0.1
    assert set(reader["by_kind"]) == {"block"}
    guesser = grounding(Oracle(False), proc, "charts", n=2, batch_size=2)
    assert guesser["accuracy"] == guesser["accuracy_blank"] < 0.1


def test_reading_targets_skip_an_answer_merged_into_the_prompt():
    """Line item 62054 is "4.": the bundled tokenizer merges it with the prompt's last newline, so no answer
    token starts after the prompt; that row gets no reading target (it crashed a training run)."""
    from transformers import AutoProcessor

    from mmspec.vision.testbed import bundled_target

    if bundled_target() is None:  # an install without the repository's assets
        pytest.skip("no bundled target in this install")
    proc = AutoProcessor.from_pretrained(bundled_target())
    w = get_workload("testbed-docs", mode="line", char_boxes=True)
    odd, plain = w.example("train", 62054), w.example("train", 0)
    assert odd.target == "4."
    batch = make_batch(proc, [odd, plain])
    where = reading_targets(proc, [odd, plain], batch)
    assert (where[0] < 0).all() and (where[1] >= 0).any()


def test_reference_tau_counts_rounds_by_kind(tiny):
    """The reference is the answer as the target would emit it (end-of-turn included); reference_tau runs the
    reference-knowing drafter over each kind's items and pools its rounds."""
    model, proc = tiny
    wl = get_workload("testbed-docs", mode="mix", block_fraction=0.5)
    exs = wl.examples("test", 4)
    for ex in exs:
        ids = reference_ids(proc, ex)
        assert ids[-1] == proc.tokenizer.eos_token_id and proc.tokenizer.decode(ids[:-1]).strip() == ex.target
    res = reference_tau(model, proc, "docs", n=4, max_new_tokens=6, depth=3, batch_size=2,
                        options={"mode": "mix", "block_fraction": 0.5})
    assert set(res["by_kind"]) == {ex.meta["kind"] for ex in exs}
    rounds = sum(k["rounds"] for k in res["by_kind"].values())
    assert 4 <= rounds <= 4 * 5  # every row ran at least one round, at most one per token after the first
    assert 1.0 <= res["reference_tau"] <= 4.0 and len(res["accept_rate"]) <= 3 and res["dtype"] == "float32"
    # Its outputs are plain greedy ones: the same quality figures as evaluate's, kind by kind.
    plain = evaluate(model, proc, "docs", n=4, max_new_tokens=6, options={"mode": "mix", "block_fraction": 0.5})
    for kind, figures in res["by_kind"].items():
        assert figures["char_error_rate"] == pytest.approx(plain["cer_by_kind"][kind])
        assert figures["exact_match"] == plain["exact_by_kind"][kind]


def test_probe_warmup_detaches_the_fresh_probes_features(tmp_path, monkeypatch):
    """During the probe warm-up the patch reader and the locator see detached features (no gradient from a
    probe that knows nothing reaches the tower or the first layer); afterwards they train them again."""
    from mmspec.vision import testbed_train

    seen = {"reader": [], "locator": []}
    reader_forward, locator_loss = testbed_train.PatchReader.forward, testbed_train._Locator.loss

    def forward(self, h):
        seen["reader"].append(h.requires_grad)
        return reader_forward(self, h)

    def loss(self, h, batch, image_id):
        seen["locator"].append(h.requires_grad)
        return locator_loss(self, h, batch, image_id)

    monkeypatch.setattr(testbed_train.PatchReader, "forward", forward)
    monkeypatch.setattr(testbed_train._Locator, "loss", loss)
    cfg = TargetTrainConfig(out=str(tmp_path), size="tiny", steps=3, batch_size=2, save_every=3, tokenizer_texts=100,
                            vocab_size=400, warmup=1, probe_warmup=2)
    train_target(cfg, progress=False)
    assert seen == {"reader": [False, False, True], "locator": [False, False, True]}


def test_grow_target_is_the_same_function_with_more_layers(tiny, examples, tmp_path):
    """``grow``: appended text layers and vision blocks start as the identity (same logits, same greedy output,
    the saved patch reader carried over), so training a grown target starts where the smaller one stood."""
    from transformers import Qwen2VLForConditionalGeneration

    from mmspec.errors import InvalidInputError
    from mmspec.vision.testbed_train import grow_target

    model, processor = tiny
    src, out = tmp_path / "src", tmp_path / "grown"
    model.save_pretrained(src)
    processor.save_pretrained(src)
    torch.save({"reader": {"w": torch.ones(2)}, "locator": {"w": torch.zeros(3)}, "optimizer": {}}, src / "state.pt")
    grow_target(str(src), str(out), text_layers=4, vision_depth=3, progress=False)
    grown = Qwen2VLForConditionalGeneration.from_pretrained(out, dtype=torch.float32).eval()
    small = Qwen2VLForConditionalGeneration.from_pretrained(src, dtype=torch.float32).eval()
    assert grown.config.text_config.num_hidden_layers == 4 and len(grown.model.language_model.layers) == 4
    assert grown.config.vision_config.depth == 3 and len(grown.model.visual.blocks) == 3
    assert float(grown.model.language_model.layers[3].self_attn.o_proj.weight.detach().abs().sum()) == 0.0
    assert float(grown.model.language_model.layers[3].self_attn.q_proj.weight.detach().abs().sum()) > 0.0
    batch = make_batch(processor, examples[:2])
    batch.pop("labels")
    with torch.no_grad():
        a, b = small(**batch).logits, grown(**batch).logits
    assert torch.allclose(a, b, atol=1e-5), (a - b).abs().max()
    with torch.no_grad():
        ga = small.generate(**batch, do_sample=False, max_new_tokens=6)
        gb = grown.generate(**batch, do_sample=False, max_new_tokens=6)
    assert torch.equal(ga, gb)
    carried = torch.load(out / "state.pt", weights_only=True)
    assert set(carried) == {"reader", "locator"} and torch.equal(carried["reader"]["w"], torch.ones(2))
    with pytest.raises(InvalidInputError, match="only adds layers"):
        grow_target(str(out), str(tmp_path / "smaller"), text_layers=2, progress=False)


@pytest.mark.slow
def test_remerge_target_gives_one_vision_token_per_patch_and_trains(tiny, examples, tmp_path):
    """``remerge --merge 1``: config and processor agree (the batch has one image token per patch, the labels still
    cover exactly the answer), tower and text model carried, the merger's MLP new, patch reader and locator left
    behind; the reading targets and patch reader follow the new cells, and training runs."""
    from transformers import AutoProcessor, Qwen2VLForConditionalGeneration

    from mmspec.errors import InvalidInputError
    from mmspec.vision.testbed import merge_size
    from mmspec.vision.testbed_train import PatchReader, remerge_target

    model, processor = tiny
    src, out = tmp_path / "src", tmp_path / "m1"
    model.save_pretrained(src)
    processor.save_pretrained(src)
    torch.save({"reader": {"w": torch.ones(2)}, "locator": {"w": torch.zeros(3)}, "optimizer": {}}, src / "state.pt")
    remerge_target(str(src), str(out), merge=1, progress=False)
    m1 = Qwen2VLForConditionalGeneration.from_pretrained(out, dtype=torch.float32).eval()
    p1 = AutoProcessor.from_pretrained(out)
    assert m1.config.vision_config.spatial_merge_size == 1 and merge_size(p1) == 1 and merge_size(processor) == MERGE
    old, new = model.state_dict(), m1.state_dict()
    assert torch.equal(old["model.visual.blocks.0.attn.qkv.weight"], new["model.visual.blocks.0.attn.qkv.weight"])
    assert torch.equal(old["lm_head.weight"], new["lm_head.weight"])
    assert old["model.visual.merger.mlp.0.weight"].shape != new["model.visual.merger.mlp.0.weight"].shape
    assert not (out / "state.pt").exists()  # reader and locator name cells of the old merge: both start fresh
    batch = make_batch(p1, examples)
    image_id = p1.tokenizer.convert_tokens_to_ids(p1.image_token)
    per_image = batch["image_grid_thw"].prod(-1)
    assert ((batch["input_ids"] == image_id).sum(1) == per_image).all()  # one token per patch (4x merge 2's)
    for i, ex in enumerate(examples):
        ids = batch["input_ids"][i][batch["labels"][i] != -100]
        assert p1.tokenizer.decode(ids[:-1]).strip() == ex.target.strip()
    where = reading_targets(p1, examples, batch)
    docs = 0  # a docs page's first drawn character sits in the patch its reading target names
    ex = examples[docs]
    run = next(r for r in ex.meta["runs"] if r.get("chars") and r["text"][0] != " ")
    gw = int(batch["image_grid_thw"][docs, 2])
    cells = (batch["input_ids"][docs] == image_id).nonzero().flatten()
    x, y = (run["chars"][0] + run["chars"][1]) / 2, (run["box"][1] + run["box"][3]) / 2
    assert int(cells[int(y) // PATCH * gw + int(x) // PATCH]) in where[docs].tolist()
    grid = tuple(batch["image_grid_thw"][docs, 1:].tolist())
    assert aux_targets(ex, grid, 1).shape == (grid[0] * grid[1], 1, len(CHARSET))
    assert PatchReader(8, 5, merge=1)(torch.zeros(3, 8)).shape == (3, 1, 5)
    cfg = TargetTrainConfig(out=str(tmp_path / "run"), init=str(out), size="tiny", steps=1, batch_size=2,
                            save_every=1, warmup=1, track_weight=0.5, probe_warmup=1)
    train_target(cfg, progress=False)
    log = json.loads((tmp_path / "run" / "train_log.jsonl").read_text().splitlines()[0])
    assert log["aux_loss"] > 0 and log["read_loss"] > 0 and log["locate_loss"] > 0
    with pytest.raises(InvalidInputError, match="merge must be"):
        remerge_target(str(src), str(tmp_path / "bad"), merge=4, progress=False)


def test_ordered_targets_spell_each_token_in_reading_order(examples):
    from mmspec.vision.testbed_train import ordered_targets

    ex = examples[0]
    w, h = ex.images[0].size
    grid = (h // PATCH, w // PATCH)
    y = ordered_targets(ex, grid, slots=16)
    assert y.shape == (grid[0] // MERGE * (grid[1] // MERGE), 16)
    # Each token's slots: characters (class = CHARSET index + 1), then only "none" (0).
    assert all((row[(row > 0).sum():] == 0).all() for row in y)
    # Reading the tokens of one body line left to right spells the run (spaces included).
    run = next(r for r in ex.meta["runs"] if r.get("chars") and len(r["text"]) > 8)
    yc = (run["box"][1] + run["box"][3]) / 2
    py = int(yc) // PATCH
    row = [(run["chars"][i] + run["chars"][i + 1]) / 2 for i in range(len(run["text"]))]
    cells = sorted({(py // MERGE) * (grid[1] // MERGE) + int(x) // PATCH // MERGE for x in row})
    spelled = iter("".join(CHARSET[i - 1] for k in cells for i in y[k].tolist() if i))
    # Another line may share these tokens (it comes before or after within each): the run is a subsequence.
    assert all(ch in spelled for ch in run["text"])
    assert ordered_targets(ex, grid, slots=2).shape[1] == 2  # cut at the slot count


def test_ordered_reading_loss_rewards_the_right_order():
    from mmspec.vision.testbed_train import patch_reading_loss

    y = torch.zeros(3, 4, dtype=torch.long)
    y[0, :2] = torch.tensor([34, 35])  # token 0 shows two characters, in this order; tokens 1-2 show nothing
    right = torch.full((3, 4, len(CHARSET) + 1), -4.0)
    right[..., 0] = 4.0
    right[0, 0, 0], right[0, 1, 0] = -4.0, -4.0
    right[0, 0, 34] = right[0, 1, 35] = 4.0
    swapped = right.clone()
    swapped[0, 0, 34], swapped[0, 0, 35], swapped[0, 1, 35], swapped[0, 1, 34] = -4.0, 4.0, -4.0, 4.0
    loss_r, acc_r = patch_reading_loss(right, y, "ordered")
    loss_s, acc_s = patch_reading_loss(swapped, y, "ordered")
    assert acc_r == 1.0 and acc_s == 0.0 and loss_r < loss_s / 10


@pytest.mark.slow
def test_vision_only_training_changes_the_tower_alone(tmp_path):
    from transformers import Qwen2VLForConditionalGeneration

    init = tmp_path / "init"
    train_target(TargetTrainConfig(out=str(init), size="tiny", steps=1, batch_size=1, save_every=1,
                                   tokenizer_texts=100, vocab_size=400, warmup=1), progress=False)
    out = tmp_path / "vo"
    train_target(TargetTrainConfig(out=str(out), init=str(init), steps=2, batch_size=2, save_every=2, warmup=1,
                                   lr=1e-2, aux_loss="ordered", vision_only=True, read_weight=0.0), progress=False)
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2] and all(r["lm_loss"] == 0 and r["aux_loss"] > 0 for r in log)
    a = Qwen2VLForConditionalGeneration.from_pretrained(init).state_dict()
    b = Qwen2VLForConditionalGeneration.from_pretrained(out).state_dict()
    changed = {k for k in a if not torch.equal(a[k], b[k])}
    assert changed and all(".visual." in k or k.startswith("visual.") for k in changed), sorted(changed)[:5]
    from mmspec.errors import InvalidInputError

    with pytest.raises(InvalidInputError, match="aux_weight"):
        train_target(TargetTrainConfig(out=str(tmp_path / "x"), vision_only=True, aux_weight=0.0), progress=False)


def test_spelling_table_spells_every_printable_token(tiny):
    from mmspec.vision.testbed_train import SPELL, spelling_table

    _, proc = tiny
    tok = proc.tokenizer
    table = spelling_table(tok)
    assert table.shape == (len(tok), SPELL)
    special = set(tok.all_special_ids)
    # The end token (and every other special token) spells nothing: the speller's loss skips it, as it says.
    assert tok.eos_token_id in special and all((table[v] == 0).all() for v in special)
    for v in range(len(tok)):
        if v in special:
            continue
        text = tok.decode([v])
        spelled = "".join(CHARSET[i - 1] for i in table[v].tolist() if i)
        printable = ""
        for ch in text[:SPELL]:
            if ch not in CHARSET:
                break
            printable += ch
        assert spelled == printable
        assert (table[v, len(spelled):] == 0).all()


def test_relay_loss_spells_the_token_the_head_reads(tiny, examples):
    """The relay targets are the ordered characters of the image token each reading position points at."""
    from mmspec.vision.testbed_train import PatchReader, _relay_loss, ordered_targets

    model, proc = tiny
    ex = [e for e in examples if len(e.images) == 1][:2]
    batch = make_batch(proc, ex)
    where = reading_targets(proc, ex, batch)
    image_id = proc.tokenizer.convert_tokens_to_ids(proc.image_token)
    b, q = [int(t[0]) for t in (where >= 0).nonzero(as_tuple=True)]
    first = int((batch["input_ids"][b] == image_id).nonzero()[0, 0])
    grid = tuple(batch["image_grid_thw"][b, 1:].tolist())
    want = ordered_targets(ex[b], grid, MERGE, 8)[int(where[b, q]) - first]
    assert (want > 0).any()
    # A reader whose logits are exactly the one-hot of the wanted string for every position is right at (b, q).
    reader = PatchReader(8, len(CHARSET) + 1, MERGE, cells=8)
    heads = torch.zeros(*batch["input_ids"].shape, 16)
    spelled = [ordered_targets(e, tuple(g), MERGE, 8) for e, g in zip(ex, batch["image_grid_thw"][:, 1:].tolist())]
    loss, acc = _relay_loss([reader], {("heads", 2): heads}, [2], where, batch["input_ids"], spelled, image_id, 8)
    assert loss > 0 and 0.0 <= acc <= 1.0
    torch.nn.init.zeros_(reader.proj.weight)
    with torch.no_grad():
        reader.proj.bias.copy_(torch.nn.functional.one_hot(want, len(CHARSET) + 1).flatten().float() * 20)
    only = torch.full_like(where, -1)
    only[b, q] = where[b, q]
    loss, acc = _relay_loss([reader], {("heads", 2): heads}, [2], only, batch["input_ids"], spelled, image_id, 8)
    assert acc == 1.0 and loss < 1e-3


def test_ungroup_kv_target_is_the_same_function(tiny, examples, tmp_path):
    from transformers import AutoProcessor, Qwen2VLForConditionalGeneration

    from mmspec.vision.testbed_train import ungroup_kv_target

    model, proc = tiny
    model.save_pretrained(tmp_path / "src")
    proc.save_pretrained(tmp_path / "src")
    out = ungroup_kv_target(str(tmp_path / "src"), str(tmp_path / "kv"), progress=False)
    new = Qwen2VLForConditionalGeneration.from_pretrained(out).eval()
    tc = new.config.text_config
    assert model.config.text_config.num_key_value_heads < tc.num_key_value_heads == tc.num_attention_heads
    batch = make_batch(AutoProcessor.from_pretrained(out), examples[:2])
    batch.pop("labels")
    with torch.no_grad():
        torch.testing.assert_close(new(**batch).logits, model.eval()(**batch).logits, atol=1e-4, rtol=1e-4)


def _log(path) -> list:
    """A run's logged figures, step by step, without its timings (which differ from run to run)."""
    rows = [json.loads(line) for line in (path / "train_log.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in ("sec", "data_sec")} for r in rows]


def test_data_workers_and_a_time_budget_keep_the_losses(tiny, tmp_path):
    """Data workers build each step's inputs from the step index alone: a run with 2 workers, stopped by a tiny
    time budget after its first step (checkpoint saved) and resumed, logs exactly the losses of a run with none."""
    model, proc = tiny
    model.save_pretrained(tmp_path / "init")
    proc.save_pretrained(tmp_path / "init")
    common = dict(init=str(tmp_path / "init"), size="tiny", steps=3, batch_size=2, save_every=10, warmup=1,
                  track_weight=0.5, relay_weight=0.5)
    train_target(TargetTrainConfig(out=str(tmp_path / "plain"), **common), progress=False)
    budget = TargetTrainConfig(out=str(tmp_path / "workers"), data_workers=2, max_minutes=1e-6, **common)
    train_target(budget, progress=False)
    assert [r["step"] for r in _log(tmp_path / "workers")] == [1]  # the budget was spent after one step...
    assert torch.load(tmp_path / "workers" / "state.pt", weights_only=True)["step"] == 1  # ...which was saved
    assert multiprocessing.active_children() == []  # the workers of the stopped run are gone
    budget.max_minutes = 0.0
    train_target(budget, progress=False)  # resumes at step 1, its workers starting from step 1's items
    assert multiprocessing.active_children() == []
    plain, workers = _log(tmp_path / "plain"), _log(tmp_path / "workers")
    assert [r["step"] for r in workers] == [1, 2, 3] and plain == workers
    assert all(r["relay_loss"] > 0 and r["read_loss"] > 0 for r in workers)


def test_device_options_are_checked_before_training(tmp_path):
    from mmspec.errors import InvalidInputError

    with pytest.raises(InvalidInputError, match="device"):
        train_target(TargetTrainConfig(out=str(tmp_path), device="tpu"), progress=False)
    with pytest.raises(InvalidInputError, match="amp"):
        train_target(TargetTrainConfig(out=str(tmp_path), amp="fp16"), progress=False)
    with pytest.raises(InvalidInputError, match="data_workers"):
        train_target(TargetTrainConfig(out=str(tmp_path), data_workers=-1), progress=False)
    if not torch.cuda.is_available():
        with pytest.raises(InvalidInputError, match="no CUDA"):
            train_target(TargetTrainConfig(out=str(tmp_path), device="cuda"), progress=False)
    assert not (tmp_path / "train_log.jsonl").exists()


def test_device_strings_and_bf16_support_are_checked_before_the_model_loads(tmp_path, monkeypatch):
    """``cuda:x`` is an input error (torch.device would raise a RuntimeError), as are a GPU index past the ones
    torch sees and bf16 on a GPU without it; the GPU side is checked here with torch's answers patched."""
    from mmspec.errors import InvalidInputError
    from mmspec.vision import testbed_train

    for bad in ("cuda:x", "cuda:", "cuda:-1", "cuda:0:1", "gpu"):
        with pytest.raises(InvalidInputError, match="device must be"):
            train_target(TargetTrainConfig(out=str(tmp_path), device=bad), progress=False)
    assert not (tmp_path / "train_log.jsonl").exists()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(testbed_train, "_cuda_bf16", lambda index: index == 0)  # cuda:0 has bf16, cuda:1 does not
    with pytest.raises(InvalidInputError, match="sees 2 CUDA device"):
        testbed_train._train_device(TargetTrainConfig(device="cuda:2"))
    with pytest.raises(InvalidInputError, match="no native bfloat16"):
        testbed_train._train_device(TargetTrainConfig(device="cuda:1", amp="bf16"))
    assert testbed_train._train_device(TargetTrainConfig(device="cuda:1")) == (torch.device("cuda:1"), None)  # auto
    assert testbed_train._train_device(TargetTrainConfig(device="cuda")) == (torch.device("cuda"), torch.bfloat16)
    assert testbed_train._train_device(TargetTrainConfig(device="auto", amp="none")) == (torch.device("cuda"), None)


def test_bf16_autocast_on_the_cpu_trains_and_saves_float32(tiny, tmp_path):
    """The autocast path without a GPU: two bf16 steps on the CPU with finite losses; weights and probes are
    saved in float32 and load back (the probes through load_probes). One short text line per step: the patch
    embedding's bf16 Conv3d backward is slow on a CPU (about 16 s a step at batch 2 of pages and charts)."""
    from transformers import Qwen2VLForConditionalGeneration

    from mmspec.vision.testbed_train import load_probes

    model, proc = tiny
    model.save_pretrained(tmp_path / "init")
    proc.save_pretrained(tmp_path / "init")
    cfg = TargetTrainConfig(out=str(tmp_path / "run"), init=str(tmp_path / "init"), steps=2, batch_size=1,
                            docs_fraction=1.0, workload_options={"docs": {"mode": "line"}, "charts": {}},
                            save_every=2, warmup=1, amp="bf16", relay_weight=0.5)
    train_target(cfg, progress=False)
    log = _log(tmp_path / "run")
    assert [r["step"] for r in log] == [1, 2]
    assert all(math.isfinite(v) for r in log for k, v in r.items() if k.endswith("_loss"))
    assert all(r["lm_loss"] > 0 and r["relay_loss"] > 0 for r in log)
    back = Qwen2VLForConditionalGeneration.from_pretrained(tmp_path / "run")
    assert {p.dtype for p in back.parameters()} == {torch.float32}
    probes = load_probes(str(tmp_path / "run"))
    assert set(probes) == {"reader", "locator", "relay"}
    assert {t.dtype for state in probes.values() for t in state.values()} == {torch.float32}


def test_probes_load_from_state_pt_else_probes_pt(tmp_path):
    """load_probes: a run's state.pt first (its optimizer and step left out), else probes.pt (save_probes'), else
    a clear error; the probe scripts' ordered reader refuses a reader of another kind by its shape."""
    from mmspec.errors import InvalidInputError
    from mmspec.vision.testbed_train import PatchReader, _ordered_reader, load_probes, save_probes

    with pytest.raises(InvalidInputError, match="neither state.pt"):
        load_probes(str(tmp_path))
    assert load_probes(str(tmp_path), missing_ok=True) == {}
    ordered = PatchReader(8, len(CHARSET) + 1, cells=6)
    save_probes({"reader": ordered, "optimizer": {"state": {}}, "step": 3}, str(tmp_path / "probes.pt"))
    assert set(torch.load(tmp_path / "probes.pt", weights_only=True)) == {"reader"}
    assert _ordered_reader(load_probes(str(tmp_path)), 8, MERGE).cells == 6
    torch.save({"reader": PatchReader(8).state_dict(), "locator": {"w": torch.ones(2)}, "optimizer": {}, "step": 1},
               tmp_path / "state.pt")
    probes = load_probes(str(tmp_path))
    assert set(probes) == {"reader", "locator"}  # state.pt wins
    with pytest.raises(InvalidInputError, match="not an 'ordered' one"):
        _ordered_reader(probes, 8, MERGE, "run")
    assert set(load_probes(str(tmp_path / "probes.pt"))) == {"reader"}  # a file by name


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_training_in_bf16_saves_float32_and_resumes_on_the_cpu(tiny, tmp_path):
    """On a GPU: two bf16-autocast steps with every probe; the checkpoint is float32 and resumes on the CPU."""
    from transformers import Qwen2VLForConditionalGeneration

    model, proc = tiny
    model.save_pretrained(tmp_path / "init")
    proc.save_pretrained(tmp_path / "init")
    cfg = TargetTrainConfig(out=str(tmp_path / "run"), init=str(tmp_path / "init"), size="tiny", steps=3,
                            stop_after=2, batch_size=2, warmup=1, device="cuda", track_weight=0.5, spell_weight=0.5,
                            relay_weight=0.5, self_feed=0.5, data_workers=1)
    train_target(cfg, progress=False)
    assert Qwen2VLForConditionalGeneration.from_pretrained(tmp_path / "run").dtype == torch.float32
    cfg.device, cfg.stop_after, cfg.data_workers = "cpu", 0, 0
    train_target(cfg, progress=False)
    log = _log(tmp_path / "run")
    assert [r["step"] for r in log] == [1, 2, 3] and all(r["lm_loss"] > 0 and r["relay_loss"] > 0 for r in log)


@pytest.mark.slow
def test_train_gpu_script_round_trip_on_the_cpu(tiny, tmp_path):
    """results/vision/train_gpu.sh as a future GPU session runs it, with DEVICE=cpu: prepare a carry folder from a
    checkpoint, train it for a tiny budget (a stop and a save, as on the device), pack the result into <= 15 MiB
    parts, and unpack them into a checkpoint that loads in float32 and names the probes a run with --init reads.
    A carry prepared with other fonts stops the training process before any work (exit 2, nothing packed)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    model, proc = tiny
    model.save_pretrained(tmp_path / "src")
    proc.save_pretrained(tmp_path / "src")
    repo = Path(__file__).resolve().parents[1]
    script = str(repo / "results" / "vision" / "train_gpu.sh")
    env = dict(os.environ, PY=sys.executable, CARRY=str(tmp_path / "carry"), WHEEL="0", OMP_NUM_THREADS="1",
               DEVICE="cpu", MINUTES="0.02", WORKERS="1", OUT=str(tmp_path / "out"), RUN_DIR=str(tmp_path / "run"))
    (tmp_path / "out").mkdir()

    def sh(*args, rc=0):
        done = subprocess.run(["bash", script, *args], cwd=repo, env=env, capture_output=True, text=True)
        assert done.returncode == rc, done.stderr[-3000:]
        return done.stdout if rc == 0 else done.stderr

    assert "tracked files" in sh("prepare", str(tmp_path / "src"))
    fonts = tmp_path / "carry" / "fonts.txt"
    found = fonts.read_text()
    assert found.split() == __import__("mmspec.vision.workloads.render", fromlist=["font_families"]).font_families()
    fonts.write_text("no-such-family\n")  # another machine's fonts: the training process stops before any work
    err = sh("train", "--steps", "50", rc=2)
    assert "prepared: 'no-such-family'" in err and "no checkpoint" in err and not list((tmp_path / "out").iterdir())
    fonts.write_text(found)
    # MINUTES=0.02 from the script's start is spent before training starts: it runs its one step and stops.
    sh("train", "--steps", "50", "--batch-size", "2", "--warmup", "1")
    parts = sorted((tmp_path / "out").glob("ckpt.tar.part-*"))
    assert parts and all(p.stat().st_size <= 15 * 2**20 for p in parts)
    summary = json.loads((tmp_path / "out" / "train_summary.json").read_text())
    assert 1 <= summary["steps"] < 50 and summary["weights_dtype"] == "float32"  # stopped by the budget
    assert summary["train_rc"] == 0
    sh("unpack", str(tmp_path / "out"), str(tmp_path / "back"))
    back = tmp_path / "back"
    assert json.loads((back / "train_config.json").read_text())["device"] == "cpu"
    assert set(torch.load(back / "probes.pt", weights_only=True)) == {"reader", "locator"}
    assert [json.loads(line)["step"] for line in (back / "train_log.jsonl").read_text().splitlines()] == list(
        range(1, summary["steps"] + 1))


def test_training_imports_the_runtime_never_the_reverse():
    """Only training code reaches :mod:`mmspec.vision.testbed_train` (directly or through other modules, lazy imports
    counted: the import graph of tests/test_import_order.py); the training module itself imports the runtime."""
    from test_import_order import import_graph

    graph = import_graph()
    train = "mmspec.vision.testbed_train"
    reach, todo = set(), [train]
    while todo:
        module = todo.pop()
        for importer in (m for m, deps in graph.items() if module in deps and m not in reach):
            reach.add(importer)
            todo.append(importer)
    training = {"mmspec.drivers.train_vla", "mmspec.drivers.distill"}  # the VLA's training and its distillation
    assert reach <= training, f"runtime modules importing the testbed's training: {sorted(reach - training)}"
    assert "mmspec.vision.testbed" in graph[train] and train not in graph["mmspec.vision.testbed"]
