"""The user's own requests: ``mmspec bench --inputs`` and ``mmspec generate --inputs --out`` on a JSONL file
written here (images beside it, a text-only line, references on some lines), and every bad line a clear
error naming its line."""

from __future__ import annotations

import json

import pytest

from mmspec.cli import main
from mmspec.demo import draw_test_image
from mmspec.errors import InvalidImageError, InvalidInputError
from mmspec.inputs import JsonlWriter, load_requests, text_quality


@pytest.fixture
def requests_file(tmp_path):
    (tmp_path / "img").mkdir()
    draw_test_image().save(tmp_path / "img" / "a.png")
    draw_test_image(140, 84).save(tmp_path / "img" / "b.png")
    lines = [{"images": ["img/a.png"], "prompt": "Describe the image.", "reference": "A red square."},
             {"images": ["img/a.png", "img/b.png"], "prompt": "What differs?"},
             {"prompt": "How many shapes are there?", "id": "text-only", "reference": ""}]
    path = tmp_path / "req.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")  # a blank line is skipped
    return path


def test_requests_load_with_paths_relative_to_the_file(requests_file):
    reqs = load_requests(requests_file)
    assert [r.id for r in reqs] == ["req/1", "req/2", "text-only"]
    assert reqs[1].images == [str(requests_file.parent / "img" / "a.png"), str(requests_file.parent / "img" / "b.png")]
    assert reqs[2].images == [] and reqs[2].meta["has_reference"] and not reqs[1].meta["has_reference"]


@pytest.mark.parametrize("line, message", [
    ('{"prompt": "x"', "line 2: not valid JSON"),
    ('["prompt"]', "line 2: a request must be a JSON object"),
    ('{"prompt": "x", "image": ["a.png"]}', r"line 2: unknown keys \['image'\]"),
    ('{"images": []}', "line 2: 'prompt' must be a non-empty string"),
    ('{"prompt": "  "}', "line 2: 'prompt' must be a non-empty string"),
    ('{"prompt": "x", "images": [3]}', "line 2: 'images' must be a list of file paths"),
    ('{"prompt": "x", "reference": 5}', "line 2: 'reference' must be a string"),
    ('{"prompt": "x", "id": "one"}', "line 2: duplicate id 'one' \\(first on line 1\\)"),
])
def test_bad_lines_are_errors_naming_the_line(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "fine", "id": "one"}\n' + line + "\n")
    with pytest.raises(InvalidInputError, match=message):
        load_requests(path)


def test_missing_images_files_and_empty_files_are_errors(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"prompt": "x", "images": ["nope.png"]}\n')
    with pytest.raises(InvalidImageError, match="line 1: image file not found: nope.png"):
        load_requests(path)
    path.write_text("\n")
    with pytest.raises(InvalidInputError, match="holds no requests"):
        load_requests(path)
    with pytest.raises(InvalidInputError, match="no such requests file"):
        load_requests(tmp_path / "absent.jsonl")


def test_text_quality_leaves_out_requests_without_reference():
    q = text_quality(["abc", "zz", "x"], ["abd", None, "x"])
    assert q == {"n": 2, "exact_match": 0.5, "char_error_rate": 1 / 4}
    assert text_quality(["a"], [None]) is None


def test_bench_on_the_users_inputs_writes_valid_json(tiny_vlm, requests_file, tmp_path, capsys):
    out = tmp_path / "bench.json"
    rc = main(["bench", "--model", tiny_vlm, "--inputs", str(requests_file), "--systems", "ar,lookup",
               "--batch-sizes", "1,2", "--max-new-tokens", "6", "--json", str(out), "--no-progress"])
    assert rc == 0, capsys.readouterr().err
    data = json.loads(out.read_text())
    recs = data["results"]
    assert {(r["workload"], r["system"], r["batch_size"]) for r in recs} == {
        ("inputs:req.jsonl", s, b) for s in ("ar", "lookup") for b in (1, 2)}
    for r in recs:
        assert r["status"] == "ok" and r["n_examples"] == 3 and r["identical_rate"] == 1.0
        q = r["quality"]  # two of the three lines carry a reference (one of them empty)
        assert q["n"] == 2 and 0 <= q["exact_match"] <= 1 and q["char_error_rate"] >= 0
    assert data["meta"]["args"]["inputs"] == str(requests_file)
    assert "inputs:req.jsonl" in capsys.readouterr().out


def test_bench_inputs_without_references_has_no_quality(tiny_vlm, tmp_path):
    from mmspec.bench import BenchConfig, run_bench

    path = tmp_path / "plain.jsonl"
    path.write_text('{"prompt": "Hello there."}\n{"prompt": "Count to three."}\n')
    report = run_bench(BenchConfig(model=tiny_vlm, inputs=str(path), systems=["ar"], batch_sizes=[1],
                                   max_new_tokens=4, n=1), progress=False)
    (rec,) = report.results
    assert rec["quality"] is None and rec["n_examples"] == 1  # --n takes the first n lines
    with pytest.raises(InvalidInputError, match="--inputs replaces --workload"):
        run_bench(BenchConfig(model=tiny_vlm, inputs=str(path), workloads=["docs"]), progress=False)


def test_generate_inputs_writes_one_line_per_request_in_order_and_resumes(tiny_vlm, requests_file, tmp_path,
                                                                         capsys):
    import mmspec

    out = tmp_path / "out.jsonl"
    args = ["generate", "--model", tiny_vlm, "--inputs", str(requests_file), "--out", str(out),
            "--max-new-tokens", "5", "--batch-size", "2", "--no-progress"]
    assert main(args) == 0
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["id"] for r in rows] == ["req/1", "req/2", "text-only"] and [r["line"] for r in rows] == [1, 2, 3]
    assert rows[0]["reference"] == "A red square." and "reference" not in rows[1]
    pipe = mmspec.MMSpecPipeline.from_pretrained(tiny_vlm)  # the same text as one request at a time
    for r, req in zip(rows, load_requests(requests_file)):
        assert r["text"] == pipe(images=req.images or None, prompt=req.prompt, max_new_tokens=5).text
        assert r["stats"]["generated"] > 0
    # a job killed while writing line 2: the partial line is dropped and only the missing requests run
    out.write_text(out.read_text().splitlines(keepends=True)[0] + '{"id": "req/2", "te')
    capsys.readouterr()
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "2 requests written" in err and "(1 already there, skipped)" in err
    assert [json.loads(x)["id"] for x in out.read_text().splitlines()] == ["req/1", "req/2", "text-only"]


@pytest.mark.parametrize("extra, message", [
    (["--prompt", "hi"], "drop --prompt"),
    ([], "--inputs needs --out"),
    (["--out", "OUT", "--batch-size", "0"], "--batch-size must be >= 1"),
    # a bad --out is said before the model loads (the model folder does not even exist here)
    (["--out", "/no/such/folder/o.jsonl"], "output folder does not exist"),
    (["--out", "DIR"], "is a folder"),
    (["--out", "REQ"], "the requests file itself"),
])
def test_generate_inputs_argument_errors(requests_file, tmp_path, capsys, extra, message):
    names = {"OUT": str(tmp_path / "o.jsonl"), "DIR": str(tmp_path), "REQ": str(requests_file)}
    args = ["generate", "--model", "/no/such/model", "--inputs", str(requests_file)] + [names.get(a, a) for a in extra]
    assert main(args) == 2
    assert message in capsys.readouterr().err


def test_generate_without_prompt_or_inputs_is_an_error(capsys):
    assert main(["generate", "--model", "/no/such/model"]) == 2
    assert "give --prompt" in capsys.readouterr().err


def test_writer_refuses_a_foreign_file(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text('{"other": 1}\n')
    with pytest.raises(InvalidInputError, match="line 1: not an output line"):
        JsonlWriter(path)


def test_writer_never_wipes_a_file_that_is_not_its_own(tmp_path):
    """A one-line JSON document without a final newline (say a results.json) is refused, not rewritten; a last
    complete row that only lacks its newline is kept; a folder is refused."""
    path = tmp_path / "results.json"
    path.write_text('{"score": 1}')
    with pytest.raises(InvalidInputError, match="not an output line"):
        JsonlWriter(path)
    assert path.read_text() == '{"score": 1}'
    path.write_text('{"id": "a", "text": "x"}\n{"id": "b", "text": "y"}')
    assert JsonlWriter(path).done == {"a", "b"} and path.read_text().endswith('"y"}\n')
    with pytest.raises(InvalidInputError, match="is a folder"):
        JsonlWriter(tmp_path)


def test_generate_inputs_refuses_answers_to_other_requests_under_the_same_id(tiny_vlm, requests_file, tmp_path):
    from mmspec import MMSpecPipeline
    from mmspec.inputs import generate_requests

    pipe = MMSpecPipeline.from_pretrained(tiny_vlm)
    out = tmp_path / "out.jsonl"
    reqs = load_requests(requests_file)
    generate_requests(pipe, reqs[:1], out, progress=False, max_new_tokens=3)
    with pytest.raises(InvalidInputError, match="another request or with other generation settings"):
        generate_requests(pipe, reqs[:1], out, progress=False, max_new_tokens=4)  # other settings
    edited = requests_file.parent / "edited.jsonl"
    edited.write_text(requests_file.read_text().replace("Describe the image.", "Describe it."))
    moved = [r for r in load_requests(edited)][:1]
    moved[0].id = reqs[0].id
    with pytest.raises(InvalidInputError, match="another request"):
        generate_requests(pipe, moved, out, progress=False, max_new_tokens=3)
    with pytest.raises(InvalidInputError, match="the requests file itself"):
        generate_requests(pipe, reqs, requests_file, progress=False, max_new_tokens=3)
    assert generate_requests(pipe, reqs[:1], out, progress=False, max_new_tokens=3)["skipped"] == 1


def test_edit_distance_is_levenshtein_on_unicode_and_lines():
    """rapidfuzz's Levenshtein against the textbook dynamic programme, on strings with accents, pipes and
    newlines (what pages and tables hold), empty strings included."""
    import random

    from mmspec.inputs import edit_distance

    def textbook(a, b):
        prev = list(range(len(b) + 1))
        for i, ca in enumerate(a, 1):
            cur = [i]
            for j, cb in enumerate(b, 1):
                cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
            prev = cur
        return prev[-1]

    rng = random.Random(0)
    for _ in range(200):
        a, b = ("".join(rng.choice("ab é|\n") for _ in range(rng.randint(0, 30))) for _ in range(2))
        assert edit_distance(a, b) == textbook(a, b)
    assert edit_distance("", "") == 0 and edit_distance("kitten", "sitting") == 3
