"""The examples a user copies run offline on the bundled reader, and show what they say they show."""

from __future__ import annotations

import os
import runpy
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture(scope="module")
def reader(bundled_reader_folder):
    return bundled_reader_folder


@pytest.mark.slow
def test_pipeline_from_pretrained_example(reader, capsys):
    """Loads the reader with drafter auto, reads a held-out page close to its Markdown, same text as generate."""
    from mmspec.vision.reader.evaluate import cer

    ex = runpy.run_path(str(EXAMPLES / "pipeline_from_pretrained.py"), run_name="example")
    got = ex["main"](page=1003, max_new_tokens=48, dtype="float32")
    assert got["text"] == got["reference_text"]  # float32: lossless token for token
    assert got["drafter"] == "page-lookup" and got["tau"] > 1.5
    assert cer([got["text"]], [got["target"][: len(got["text"])]])["cer"] < 0.2
    assert any(n.startswith("auto: ") for n in got["notes"])
    assert "same text as model.generate: True" in capsys.readouterr().out


@pytest.mark.slow
def test_parse_folder_example_writes_records_and_markdown_and_resumes(reader, tmp_path, capsys):
    """One PNG page and a two-page PDF, each decoded to its end: three records, two Markdown documents; a rerun
    decodes nothing."""
    ex = runpy.run_path(str(EXAMPLES / "parse_folder.py"), run_name="example")
    folder, out = str(tmp_path / "pages"), str(tmp_path / "parsed")
    got = ex["main"](folder=folder, out=out, pngs=1, pdf_pages=2)
    records = got["records"]
    assert sorted((os.path.basename(r["source"]), r["page"], r["status"]) for r in records) == \
        [("page-000.png", 1, "ok"), ("scan.pdf", 1, "ok"), ("scan.pdf", 2, "ok")], records
    assert all(r["text"].startswith("#") and r["tau"] > 1.5 for r in records)
    assert sum(1 for _ in Path(out, "markdown").rglob("*.md")) == 2
    assert got["summary"]["decoded"] == 3 and got["summary"]["job_failed"] == 0
    again = ex["main"](folder=folder, out=out, pngs=1, pdf_pages=2)
    assert again["summary"]["decoded"] == 0 and again["summary"]["done_before"] == 3
    assert len(again["records"]) == 3 and "parse-docs: 0 pages decoded (3 done before)" in capsys.readouterr().out
