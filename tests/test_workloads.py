"""The synthetic docs and charts workloads: determinism, disjoint splits, coverage, target shapes, speed."""

from __future__ import annotations

import hashlib
import re
import time

import pytest
from PIL import Image

from mmspec import InvalidInputError
from mmspec.vision.workloads import (
    BLOCK_TYPES,
    CHART_TYPES,
    REGIMES,
    ChartsWorkload,
    DocsWorkload,
    all_text,
)
from mmspec.workloads import get_workload

N_SPLIT = 200


def _key(ex):
    return hashlib.sha256(ex.images[0].tobytes()).hexdigest(), ex.target


@pytest.fixture(scope="module")
def items():
    """The first N_SPLIT items of each split of both workloads (generated once for the module)."""
    out = {}
    for w in (DocsWorkload(), ChartsWorkload()):
        for split in ("train", "test"):
            out[w.name, split] = w.examples(split, N_SPLIT)
    return out


@pytest.mark.parametrize("cls", [DocsWorkload, ChartsWorkload])
def test_deterministic_across_fresh_instances(cls):
    for split, i in [("train", 0), ("train", 17), ("test", 5), ("test", 123)]:
        a, b = cls().example(split, i), cls().example(split, i)
        assert a.images[0].tobytes() == b.images[0].tobytes()
        assert (a.prompt, a.target, a.id) == (b.prompt, b.target, b.id)
        assert a.meta == b.meta


@pytest.mark.parametrize("name", ["testbed-docs", "testbed-charts"])
def test_splits_disjoint(items, name):
    train = {_key(e) for e in items[name, "train"]}
    test = {_key(e) for e in items[name, "test"]}
    assert not train & test
    assert len(train) == N_SPLIT  # distinct items within a split, too


def test_coverage_in_first_50(items):
    docs = items["testbed-docs", "train"][:50]
    assert {e.meta["kind"] for e in docs} == {"page", "block"}
    assert {b["type"] for e in docs for b in e.meta["blocks"]} == set(BLOCK_TYPES) | {"heading"}
    charts = items["testbed-charts", "train"][:50]
    assert {e.meta["regime"] for e in charts} == set(REGIMES)
    assert {e.meta["chart_type"] for e in charts} == set(CHART_TYPES)
    assert {(e.meta["regime"], e.meta["chart_type"]) for e in items["testbed-charts", "test"][:50]} == \
        {(r, c) for r in REGIMES for c in CHART_TYPES}


def test_images_are_rgb_of_configured_size(items):
    for e in items["testbed-docs", "train"][:60]:
        im = e.images[0]
        assert isinstance(im, Image.Image) and im.mode == "RGB"
        if e.meta["kind"] == "page":
            assert im.size == (336, 448)
        else:
            assert im.width == 336 and im.height <= 448 and im.height % 28 == 0
    for e in items["testbed-charts", "train"][:30]:
        assert e.images[0].mode == "RGB" and e.images[0].size == (336, 280)
    w = DocsWorkload(width=280, height=336, mode="page")
    assert all(e.images[0].size == (280, 336) for e in w.examples("test", 5))
    c = ChartsWorkload(width=448, height=336)
    assert all(e.images[0].size == (448, 336) for e in c.examples("test", 5))


def _run_words(ex):
    return {w for r in ex.meta["runs"] for w in r["text"].split()}


def test_docs_targets_are_markdown(items):
    seen_table = seen_list = 0
    for e in items["testbed-docs", "train"][:100]:
        t = e.target
        assert t and t.isascii() and t == t.strip()
        parts = t.split("\n\n")
        assert len(parts) == len(e.meta["blocks"])
        for part, b in zip(parts, e.meta["blocks"]):
            lines = part.split("\n")
            if b["type"] == "heading":
                assert re.match(r"^#{1,2} \S", part) and len(lines) == 1
            elif b["type"] == "table":
                seen_table += 1
                assert lines[1].startswith("|---|") and all(ln.startswith("| ") and ln.endswith(" |")
                                                            for ln in lines[:1] + lines[2:])
                assert len({ln.count("|") for ln in lines}) == 1  # same number of columns on every row
            elif b["type"] == "bullets":
                seen_list += 1
                assert all(ln.startswith("- ") for ln in lines)
            elif b["type"] == "numbered":
                seen_list += 1
                assert [ln.split(". ", 1)[0] for ln in lines] == [str(k) for k in range(1, len(lines) + 1)]
            else:
                assert len(lines) == 1 and not part.startswith(("#", "-", "|"))
        # every word of the target (Markdown syntax aside) was drawn on the page
        words = set(re.sub(r"^(#+ |- |\d+\. )|\|(---\|)+|\||\^", " ", t, flags=re.M).split())
        drawn = _run_words(e) | {"".join(r["text"] for r in e.meta["runs"])}
        missing = {w for w in words if w not in drawn and not any(w in r["text"] or r["text"] in w
                                                                   for r in e.meta["runs"])}
        assert not missing, (e.id, missing)
    assert seen_table and seen_list


def test_chart_answers_are_grounded(items):
    for e in items["testbed-charts", "train"][:120]:
        m, t = e.meta, e.target
        assert t and t.isascii()
        texts = [r["text"] for r in m["runs"]]
        if m["regime"] == "copy":
            parts = t.split(", ") if m["question"] in ("legend", "categories") else [t]
            assert all(p in texts for p in parts), (e.id, t)
        elif m["regime"] == "grounded":
            assert t in texts, (e.id, e.prompt, t)
        else:
            assert t.endswith(".") and len(t.split()) >= 8
            assert m["chart_type"] in t or m["title"] in t or m["chart_type"] == "pie"
        # the data table matches the series and the labels printed
        assert [r[0] for r in m["table"]["rows"]] == m["categories"]
        for s, labels in m["labels"].items():
            assert len(labels) == len(m["categories"]) == len(m["series"][s])
            assert all(lab in texts for lab in labels)


def test_grounded_answers_are_unambiguous():
    w = ChartsWorkload(regimes=("grounded",))
    for e in w.examples("test", 60):
        m = e.meta
        for vals in m["series"].values():
            assert len(set(vals)) == len(vals)
        if m["question"] in ("argmax", "argmin"):
            assert e.target in m["categories"]


def test_text_example_matches_example():
    for w in (DocsWorkload(), ChartsWorkload()):
        for i in range(15):
            a, b = w.example("train", i), w.text_example("train", i)
            assert b.images == [] and (a.id, a.prompt, a.target) == (b.id, b.prompt, b.target)
            assert {k: v for k, v in a.meta.items() if k not in ("runs", "augment")} == b.meta


def test_registry_and_errors():
    d, c = get_workload("testbed-docs"), get_workload("testbed-charts")
    assert isinstance(d, DocsWorkload) and isinstance(c, ChartsWorkload)
    assert get_workload("testbed-docs", width=280, mode="block").example("train", 0).images[0].width == 280
    for w in (d, c):
        with pytest.raises(InvalidInputError):
            w.example("validation", 0)
        with pytest.raises(InvalidInputError):
            w.examples("dev", 2)
        with pytest.raises(InvalidInputError):
            w.example("train", -1)
    with pytest.raises(InvalidInputError):
        DocsWorkload(mode="pages")
    with pytest.raises(InvalidInputError):
        ChartsWorkload(regimes=("copy", "essay"))


def test_modes_options_and_seed():
    w = DocsWorkload(mode="page", min_blocks=1, max_blocks=1, augment=False, char_boxes=True)
    e = w.example("train", 3)
    assert e.meta["kind"] == "page" and e.meta["augment"] == {"rotation": 0.0, "blur": 0.0, "noise": 0.0}
    assert sum(b["type"] != "heading" for b in e.meta["blocks"]) == 1
    assert all(len(r["chars"]) == len(r["text"]) + 1 for r in e.meta["runs"])
    assert all(e.meta["kind"] == "block" for e in DocsWorkload(mode="block").examples("test", 10))
    assert DocsWorkload(seed=1).example("train", 0).target != DocsWorkload().example("train", 0).target


def test_line_mode_draws_one_row_of_text():
    w = DocsWorkload(mode="line", char_boxes=True)
    items = w.examples("test", 12)
    assert [e.target for e in items] == [e.target for e in w.examples("test", 12)]
    for e in items:
        (run,) = [r for r in e.meta["runs"] if r["text"].strip()]  # one drawn run: the target, on one row
        assert e.meta["kind"] == "line" and run["text"] == e.target and "\n" not in e.target
        assert e.images[0].height % 28 == 0 and e.images[0].height <= 112
    # any line of a paragraph, not only sentence starts
    assert sum(not e.target[:1].isupper() for e in w.examples("train", 40)) >= 5
    kinds = [e.meta["kind"] for e in DocsWorkload(line_fraction=0.4).examples("test", 40)]
    assert 8 <= kinds.count("line") <= 24 and "page" in kinds and "block" in kinds
    with pytest.raises(InvalidInputError):
        DocsWorkload(line_fraction=0.8, block_fraction=0.3)


def test_scrambled_text_keeps_layout_and_drops_the_language():
    import re

    plain = DocsWorkload(mode="block").examples("test", 12)
    assert all(e.meta["text"] == "natural" for e in plain)
    w = DocsWorkload(mode="block", scrambled_fraction=0.5, char_boxes=True)
    mixed = w.examples("test", 40)
    kinds = [e.meta["text"] for e in mixed]
    assert 8 <= kinds.count("scrambled") <= 32 and [e.target for e in mixed] == [e.target for e in w.examples("test", 40)]
    words = lambda es: {t for e in es for t in re.findall(r"[A-Za-z]{4,}", e.target)}  # noqa: E731
    scrambled = [e for e in mixed if e.meta["text"] == "scrambled"]
    natural = words(DocsWorkload(mode="block").examples("train", 200))
    assert len(words(scrambled) & natural) < 0.1 * len(words(scrambled))  # no vocabulary left to predict
    for e in scrambled:  # the picture shows exactly what the target says, as for natural text
        drawn = "".join(r["text"] for r in e.meta["runs"])
        assert all(ch in drawn or not ch.isalnum() for ch in e.target)
    with pytest.raises(InvalidInputError):
        DocsWorkload(scrambled_fraction=1.5)


def test_default_font_fallback(monkeypatch):
    """With no TTF on the machine, Pillow's bundled font draws everything."""
    from mmspec.vision.workloads import render

    monkeypatch.setattr(render, "_families", lambda: {})
    for w in (DocsWorkload(), ChartsWorkload()):
        assert w.fonts == ["default"]
        e = w.example("test", 4)
        assert e.images[0].mode == "RGB" and e.meta["font"] == "default"
    assert DocsWorkload(fonts="default").fonts == ["default"]


def test_all_text_is_ascii():
    texts = list(all_text("testbed-docs", "train", 20)) + list(all_text(ChartsWorkload(), "test", 20, include_prompts=True))
    assert len(texts) == 60 and all(t and t.isascii() for t in texts)


def test_fast_enough():
    for w in (DocsWorkload(), ChartsWorkload()):
        w.example("train", 10_000)  # warm the font caches
        t = time.perf_counter()
        w.examples("train", 20, start=1000)
        per = (time.perf_counter() - t) / 20
        assert per < 0.05, f"{w.name}: {per * 1000:.1f} ms per example"
