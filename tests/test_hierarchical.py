"""Hierarchical parallel decoding of document pages: the dense page option, the layout stage (output format,
decoding, reading order, the bundled detector), page assembly, lossless rows, and the bench's records."""

import os

import numpy as np
import pytest
import torch

from mmspec.errors import InvalidInputError
from mmspec.vision.documents.hierarchical import HierarchicalParser, assemble, block_canvas
from mmspec.vision.documents.hpd_bench import exact_blocks, parse_hierarchical
from mmspec.vision.documents.layout import (CELL, LAYOUT_TYPES, LayoutDetector, block_type, bundled_layout,
                                            evaluate_layout, page_labels, reading_order)
from mmspec.vision.workloads.docs import DENSE_PAGES, DocsWorkload, page_markdown


def test_dense_pages_are_two_columns_in_reading_order():
    w = DocsWorkload(**DENSE_PAGES)
    two_col = 0
    for ex in w.examples("test", 12):
        blocks = ex.meta["blocks"]
        assert ex.target == page_markdown(blocks) and ex.images[0].size == (672, 448)
        xs = [b["box"][0] for b in blocks]
        right = [i for i, x in enumerate(xs) if x > 336]
        # the right column's blocks come after every left-column block, each column top to bottom
        if right:
            two_col += 1
            assert right == list(range(right[0], len(blocks)))
        for col in (blocks[: right[0]] if right else blocks, [blocks[i] for i in right]):
            ys = [b["box"][1] for b in col]
            assert ys == sorted(ys)
        for i, a in enumerate(blocks):  # no two blocks overlap
            for b in blocks[i + 1:]:
                assert (a["box"][2] <= b["box"][0] or b["box"][2] <= a["box"][0] or a["box"][3] <= b["box"][1]
                        or b["box"][3] <= a["box"][1])
        assert all(b["type"] != "heading" for b in blocks[-1:])
    assert two_col >= 8
    with pytest.raises(InvalidInputError, match="columns"):
        DocsWorkload(columns=3)


def test_reading_order_columns_then_top_to_bottom():
    # title spanning both columns, two columns, a wide block under them, then two more column blocks
    boxes = [(360, 60, 650, 150), (10, 10, 650, 50), (10, 60, 320, 120), (10, 130, 320, 200),
             (360, 160, 650, 200), (10, 220, 650, 260), (360, 280, 650, 320), (10, 280, 320, 330)]
    assert reading_order(boxes) == [1, 2, 3, 0, 4, 5, 7, 6]
    # one column with narrow blocks (a table, a formula) between full-width ones: top to bottom
    single = [(12, 200, 200, 260), (12, 10, 320, 60), (12, 70, 320, 190), (40, 270, 150, 300)]
    assert reading_order(single) == [1, 2, 0, 3]
    assert reading_order([]) == [] and reading_order([(0, 0, 5, 5)]) == [0]
    # the renderer's own boxes come back in the renderer's order, on default and dense pages
    for w in (DocsWorkload(mode="page"), DocsWorkload(**DENSE_PAGES)):
        for ex in w.examples("test", 15):
            boxes = [b["box"] for b in ex.meta["blocks"]]
            assert reading_order(boxes) == list(range(len(boxes)))


def test_assemble_orders_blocks_and_marks_headings():
    blocks = [{"order": 2, "type": "table"}, {"order": 0, "type": "heading1"}, {"order": 1, "type": "paragraph"},
              {"order": 3, "type": "heading2"}]
    texts = ["| a |\n|---|\n| 1 |", "# Notes", "Some text. ", "##  Results"]
    assert assemble(blocks, texts) == "# Notes\n\nSome text.\n\n| a |\n|---|\n| 1 |\n\n## Results"
    assert assemble([{"order": 0, "type": "heading2"}, {"order": 1, "type": "paragraph"}], ["Plan", ""]) == "## Plan"
    assert exact_blocks("# Notes\n\nSome text.", [{"type": "heading", "level": 1, "text": "Notes"},
                                                 {"type": "paragraph", "text": "Some text!"}]) == (1, 2)


def test_layout_output_format_decoding_and_save_load(tmp_path):
    det = LayoutDetector(width=8)
    page = DocsWorkload(mode="page").example("test", 0).images[0]
    # a crafted probability map: two blocks of known types, one speck below the size threshold
    w, h = page.size
    gh, gw = -(-h // CELL), -(-w // CELL)
    probs = np.zeros((1 + len(LAYOUT_TYPES), gh, gw), np.float32)
    probs[0] = 1.0
    for (x0, y0, x1, y1), t in (((3, 20, 70, 40), "paragraph"), ((3, 3, 60, 10), "heading1"), ((80, 100, 81, 101),
                                                                                                  "table")):
        probs[0, y0:y1, x0:x1] = 0.1
        probs[1 + LAYOUT_TYPES.index(t), y0:y1, x0:x1] = 0.9
    blocks = det._decode(probs, (w, h))
    assert [b["type"] for b in blocks] == ["heading1", "paragraph"]
    assert [b["order"] for b in blocks] == [0, 1]
    assert blocks[0]["box"] == [3 * CELL - 2, 3 * CELL - 2, 60 * CELL + 2, 10 * CELL + 2]
    assert blocks[1]["score"] == pytest.approx(0.9)
    # the network's own output: a list per page of such dicts, boxes inside the page
    out = det.detect([page, page.resize((200, 150))])
    assert len(out) == 2
    for blocks, size in zip(out, [page.size, (200, 150)]):
        assert [b["order"] for b in blocks] == list(range(len(blocks)))
        for b in blocks:
            assert set(b) == {"type", "box", "score", "order"} and b["type"] in LAYOUT_TYPES
            x0, y0, x1, y1 = b["box"]
            assert 0 <= x0 < x1 <= size[0] and 0 <= y0 < y1 <= size[1] and 0 <= b["score"] <= 1
    det.save_pretrained(tmp_path / "lay")
    again = LayoutDetector.from_pretrained(tmp_path / "lay")
    x = LayoutDetector.page_tensor(page)[0][None]
    with torch.no_grad():  # float16 storage: the same classes up to rounding
        assert torch.allclose(det.eval()(x), again(x), atol=0.05)
    assert os.path.getsize(tmp_path / "lay" / "model.safetensors") < 3e6
    lab, wt = page_labels(DocsWorkload(mode="page").example("test", 0), w, h)
    assert lab.shape == probs.shape[1:] or lab.shape[0] >= gh
    assert set(np.unique(lab)) <= set(range(1 + len(LAYOUT_TYPES))) and wt.max() == 5.0


@pytest.mark.skipif(bundled_layout() is None, reason="no bundled layout detector")
def test_bundled_detector_finds_blocks_and_their_order():
    det = LayoutDetector.from_pretrained(bundled_layout())
    for w in (DocsWorkload(mode="page"), DocsWorkload(**DENSE_PAGES)):
        r = evaluate_layout(det, w.examples("test", 6, start=100))
        assert r["box_recall"] >= 0.85 and r["box_precision"] >= 0.85, r
        assert r["order_accuracy"] >= 0.8, r


def test_block_canvas_like_the_workload_block_items():
    page = DocsWorkload(mode="page").example("test", 1).images[0]
    c = block_canvas(page, [11, 55, 325, 182])
    assert c.size == (336, 168) and c.getpixel((1, 1)) == c.getpixel((334, 166))
    wide = block_canvas(page.resize((672, 448)), [10, 10, 660, 60])
    assert wide.size[0] % 28 == 0 and wide.size[0] > 660 and wide.size[1] % 28 == 0
    with pytest.raises(InvalidInputError):
        block_canvas(page, [50, 50, 50, 60], pad=0)


def _gold_layout(ex):
    return [{"type": block_type(b), "box": b["box"], "order": i} for i, b in enumerate(ex.meta["blocks"])]


def test_hierarchical_rows_equal_each_block_decoded_alone(vlm_pipe):
    pages = DocsWorkload(mode="page").examples("test", 2)
    layouts = [_gold_layout(e) for e in pages]
    for drafter in ("lookup", None):
        hp = HierarchicalParser(vlm_pipe, LayoutDetector(width=8), drafter=drafter, max_new_tokens=10)
        res = hp.parse([e.images[0] for e in pages], blocks=layouts)
        assert res.rows == sum(len(b) for b in layouts) >= 4
        assert (res.stats is None) == (drafter is None)
        alone = HierarchicalParser(vlm_pipe, LayoutDetector(width=8), drafter=None, max_new_tokens=10)
        for ex, lay, page in zip(pages, layouts, res.pages):
            crops = alone.crops(ex.images[0], lay)
            texts = [alone.decode_rows([c])[0][0] for c in crops]  # batch of one: the target's own decoding
            assert [b["text"] for b in page.blocks] == [t.strip() for t in texts]
            assert page.text == assemble(lay, texts)
    with pytest.raises(InvalidInputError):
        HierarchicalParser(vlm_pipe, LayoutDetector(width=8)).parse([])


def test_rows_stop_at_their_budget_and_the_batch_at_its_largest(vlm_pipe):
    """A row whose expected length the layout gives stops after ``row_budget`` x that + 8 tokens: its text is its
    own decoding with that budget, whatever the other rows of its batch were given."""
    ex = DocsWorkload(mode="page").examples("test", 1)[0]
    lay = [dict(b, tokens=t) for b, t in zip(_gold_layout(ex), [1, 6, 1, 6, 1, 6])]
    hp = HierarchicalParser(vlm_pipe, LayoutDetector(width=8), max_new_tokens=16, row_budget=1.0)
    assert [hp.budget(b["tokens"]) for b in lay] == [min(16, b["tokens"] + 8) for b in lay]
    page = hp.parse([ex.images[0]], blocks=[lay]).pages[0]
    alone = [HierarchicalParser(vlm_pipe, LayoutDetector(width=8), max_new_tokens=hp.budget(b["tokens"]),
                                row_budget=None) for b in lay]
    crops = hp.crops(ex.images[0], lay)
    assert [b["new_tokens"] for b in page.blocks] == [a.decode_rows([c])[1][0] for a, c in zip(alone, crops)]
    assert [b["text"] for b in page.blocks] == [a.decode_rows([c])[0][0].strip() for a, c in zip(alone, crops)]
    assert max(b["new_tokens"] for b in page.blocks) <= 14 and min(b["new_tokens"] for b in page.blocks) <= 9
    free = HierarchicalParser(vlm_pipe, LayoutDetector(width=8), max_new_tokens=16, row_budget=None)
    free_counts = [b["new_tokens"] for b in free.parse([ex.images[0]], blocks=[lay]).pages[0].blocks]
    assert any(f > b["new_tokens"] for f, b in zip(free_counts, page.blocks))  # the budget did cut rows
    with pytest.raises(InvalidInputError):
        HierarchicalParser(vlm_pipe, LayoutDetector(width=8), row_budget=0.5)


def test_parse_hierarchical_spec():
    p = parse_hierarchical("hierarchical;pages=dense;block_tokens=64;drafter=eagle;topk=3", ["eagle:/h/e"])
    assert (p["pages"], p["block_tokens"], p["drafter"]) == ("dense", 64, "eagle:/h/e;topk=3")
    assert p["label"] == "hierarchical;pages=dense;block_tokens=64;drafter=eagle;topk=3"
    # two systems differing only in their layout detector must not share a label
    a, b = (parse_hierarchical(f"hierarchical;layout={d};drafter=lookup")["label"] for d in ("/a/lay", "/b/lay"))
    assert a == "hierarchical;layout=/a/lay;drafter=lookup" and a != b
    p = parse_hierarchical("hierarchical;lines_per_row=2;row_tokens=20;drafter=page-lookup")
    assert (p["lines_per_row"], p["row_tokens"], p["drafter"]) == (2, 20, "page-lookup")
    for bad in ("hierarchical;speed=9", "hierarchical;block_tokens=0", "hierarchical;drafter=", "hierarchical;x",
                "hierarchical;row_tokens=0", "hierarchical;layout=/a;lines_per_row=2"):
        with pytest.raises(InvalidInputError):
            parse_hierarchical(bad)


def test_balanced_cuts_minimise_the_longest_run():
    """Against every way of cutting small random lists: the heaviest run is the least possible, every run holds
    at most ``max_len`` items, and impossible cuts raise."""
    import itertools
    import random

    from mmspec.vision.documents.hierarchical import balanced_cuts

    rng = random.Random(0)
    for _ in range(200):
        w = [rng.randint(0, 15) for _ in range(rng.randint(1, 8))]
        parts, cap = rng.randint(1, len(w)), rng.choice([None, 2, 3])
        if cap is not None and parts * cap < len(w):
            with pytest.raises(InvalidInputError):
                balanced_cuts(w, parts, cap)
            continue
        cuts = balanced_cuts(w, parts, cap)
        assert cuts[0] == 0 and cuts[-1] == len(w) and len(cuts) == parts + 1
        runs = list(zip(cuts, cuts[1:]))
        assert all(0 < b - a <= (cap or len(w)) for a, b in runs)
        best = min(max(sum(w[a:b]) for a, b in zip((0,) + c, c + (len(w),)))
                   for c in itertools.combinations(range(1, len(w)), parts - 1)
                   if all(0 < b - a <= (cap or len(w)) for a, b in zip((0,) + c, c + (len(w),))))
        assert max(sum(w[a:b]) for a, b in runs) == best


def test_bench_records_of_the_hierarchical_system(tiny_vlm, tmp_path):
    from mmspec.bench import BenchConfig, run_bench

    LayoutDetector(width=8).save_pretrained(tmp_path / "lay")
    opts = f"hierarchical;page_tokens=6;block_tokens=6;layout={tmp_path / 'lay'}"
    cfg = BenchConfig(model=tiny_vlm, workloads=["testbed-docs"], systems=[opts, opts + ";drafter=lookup"], n=2,
                      max_new_tokens=4, batch_sizes=[2], threads=1, dtype="float32")
    report = run_bench(cfg, progress=False)
    recs = {r["system"]: r for r in report.results if r["kind"] == "hierarchical"}
    assert set(recs) == {opts, opts + ";drafter=lookup"}
    assert [r["system"] for r in report.results if r["kind"] != "hierarchical"] == ["ar"]
    for name, r in recs.items():
        assert r["status"] == "ok" and r["workload"] == "testbed-docs" and r["batch_size"] == 2
        for key in ("pages_per_s", "pages_per_s_vs_ar", "char_error_rate", "ar_char_error_rate"):
            assert isinstance(r[key], float) and r[key] >= 0, key
        split = r["split"]
        assert split["full_page_ar"]["char_error_rate"] == r["ar_char_error_rate"]
        assert split["gain_parallel_blocks"] > 0 and split["full_page_ar"]["truncated"] == 2  # 6-token cap
        assert r["pages_per_s_vs_ar"] == pytest.approx(r["pages_per_s"] / split["full_page_ar"]["pages_per_s"])
        assert r["tokens_per_s_vs_ar"] == pytest.approx(r["tokens_per_s"] / split["full_page_ar"]["tokens_per_s"])
        assert r["lossless"] is False  # the page text differs from full-page decoding by design
        assert split["full_page_ar"]["new_tokens"] == 2 * 6 and r["new_tokens"] == 6 * split["hierarchical_ar"]["rows"]
    spec = recs[opts + ";drafter=lookup"]
    assert spec["tau"] >= 1 and spec["split"]["full_page_spec_identical_to_ar"] is True
    assert spec["split"]["hierarchical_spec_identical_to_hierarchical_ar"] is True
    assert "gain_speculation_hierarchical" in spec["split"] and "full_page_spec" not in recs[opts]["split"]
    with pytest.raises(InvalidInputError):
        run_bench(BenchConfig(model=tiny_vlm, workloads=["testbed-docs"], systems=["hierarchical;pages=tall"], n=1))


@pytest.fixture(scope="module")
def ending_vlm(tmp_path_factory, tiny_vlm):
    from test_parse_docs import _rig

    return _rig(tmp_path_factory.mktemp("ending-vlm"), chain=12, loop=False, base=tiny_vlm)


@pytest.mark.skipif(bundled_layout() is None, reason="no bundled layout detector")
def test_parse_docs_hierarchical_records_blocks(ending_vlm, tmp_path, monkeypatch):
    import json

    from PIL import Image

    from mmspec.vision.documents.job import ParseConfig, parse_documents

    monkeypatch.setenv("MMSPEC_CACHE", str(tmp_path / "cache"))
    src = tmp_path / "in"
    src.mkdir()
    for i, ex in enumerate(DocsWorkload(mode="page").examples("test", 2)):
        ex.images[0].save(src / f"p{i}.png")
    Image.new("RGB", (336, 448), "white").save(src / "p2.png")  # the layout stage finds no block on it
    cfg = dict(inputs=[str(src)], out=str(tmp_path / "out"), model=ending_vlm, dtype="float32", batch_size=3,
               progress=False, drafter="lookup", max_new_tokens=32)
    summary = parse_documents(ParseConfig(**cfg, hierarchical=True))
    assert summary["job_failed"] == 0 and summary["decoded"] == 3
    assert summary["retried"] == 0 and summary["loops_cut"] == 0  # no block retried (the guard is on)
    recs = {os.path.basename(r["source"]): r for r in map(json.loads, open(tmp_path / "out" / "pages.jsonl"))}
    blank = recs.pop("p2.png")
    # no block: the page is decoded whole with the page prompt, and the record says so
    assert blank["status"] == "ok" and blank["blocks"] == [] and blank["layout_fallback"] is True
    assert blank["text"] and blank["tokens"] == 13 and [a["batch"] for a in blank["attempts"]] == [1]
    assert not blank["changed_by_guard"]
    n_blocks = sum(len(r["blocks"]) for r in recs.values())
    assert max(len(r["blocks"]) for r in recs.values()) >= 2
    for r in recs.values():
        assert r["status"] == "ok" and r["blocks"] and r["timings"]["layout_s"] >= 0
        assert r["layout_fallback"] is False
        assert [b["order"] for b in r["blocks"]] == list(range(len(r["blocks"])))
        assert r["text"] == assemble(r["blocks"], [b["text"] for b in r["blocks"]])
        assert all(a["batch"] == n_blocks for a in r["attempts"])  # every block of both pages in one batch
        assert r["tokens"] == 13 * len(r["blocks"])  # the rigged target's 12 tokens and its end, per block
        # several blocks are not several tries: each block ended on its first try, and the one batch counts once
        assert not r["changed_by_guard"] and all(b["attempts"] == 1 for b in r["blocks"])
        assert len({a["call"] for a in r["attempts"]}) == 1
        assert r["timings"]["decode_s"] == pytest.approx(r["attempts"][0]["decode_s"])
    with pytest.raises(InvalidInputError, match="other settings"):  # a full-page rerun into the same folder
        parse_documents(ParseConfig(**cfg))
    with pytest.raises(InvalidInputError, match="hierarchical"):
        parse_documents(ParseConfig(**{**cfg, "out": str(tmp_path / "o2")}, layout=str(tmp_path)))


def test_guard_counts_per_block_and_call_time_once():
    from mmspec.vision.documents.job import _call_seconds, _changed, _retried

    one = {"finish": "eos", "decode_s": 2.0, "call": 1}
    # two blocks of one call, each on its first try: not changed, not retried, the call's 2 s once
    assert not _changed([one]) and _call_seconds([one, dict(one)]) == 2.0
    assert not _retried({"blocks": [{"attempts": 1}, {"attempts": 1}], "attempts": [one, one]})
    # a block retried in a second call, or ended by the guard: changed; the page holds both calls' time
    again = {"finish": "eos", "decode_s": 3.0, "call": 2}
    assert _changed([one, again]) and _changed([dict(one, finish="loop")])
    assert _call_seconds([one, one, again]) == 5.0
    assert _retried({"blocks": [{"attempts": 1}, {"attempts": 2}], "attempts": [one, one, again]})
    # full-page records (no blocks) and failed tries without a time
    assert _retried({"blocks": None, "attempts": [one, again]}) and not _retried({"blocks": None, "attempts": []})
    assert _call_seconds([{"finish": "error"}, one]) == 2.0


def test_layout_decoding_runs_without_scipy(monkeypatch):
    import sys

    from mmspec.vision.documents.layout import label_cells

    ndimage = pytest.importorskip("scipy.ndimage")
    rng = np.random.default_rng(0)
    for _ in range(200):  # scipy's numbering and boxes (it stays a dev dependency: the reference here)
        m = rng.random((int(rng.integers(1, 30)), int(rng.integers(1, 30)))) < rng.uniform(0.1, 0.8)
        ref, _ = ndimage.label(m)
        labels, boxes = label_cells(m)
        assert (labels == ref).all() and boxes == ndimage.find_objects(ref)
    monkeypatch.setitem(sys.modules, "scipy", None)  # a normal install: no scipy
    monkeypatch.setitem(sys.modules, "scipy.ndimage", None)
    det = LayoutDetector(width=8)
    probs = np.zeros((1 + len(LAYOUT_TYPES), 112, 84), np.float32)
    probs[0] = 1.0
    probs[0, 20:40, 3:70], probs[1 + LAYOUT_TYPES.index("table"), 20:40, 3:70] = 0.1, 0.9
    assert [(b["type"], b["box"]) for b in det._decode(probs, (336, 448))] == [("table", [10, 78, 282, 162])]
