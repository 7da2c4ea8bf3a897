"""mmspec parse-docs: the document batch job (inputs, failures, resume after a kill, processes) and the
repetition guard, on tiny Qwen2-VLs rigged to write a fixed text and stop, or to loop."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from PIL import Image

from mmspec.cli import main
from mmspec.vision.documents import GuardSettings, RepetitionGuard, find_loop
from mmspec.vision.documents.job import ParseConfig, parse_documents

CHAIN_START = 20  # token ids the rigged models write: single characters of the tiny tokenizer
PROMPT = "Transcribe this page to Markdown."


def _rig(path, chain: int, loop: bool, delta: float = 0.05, base=None) -> str:
    """A tiny Qwen2-VL that writes tokens ``CHAIN_START .. CHAIN_START + chain - 1`` and then ends (``loop=False``)
    or starts over (``loop=True``; end-of-turn is then the runner-up by ``delta`` logits at the cycle's end, so
    greedy decoding loops forever and sampling at temperature 1 leaves the loop after a few cycles).

    The layers are silenced (output projections zeroed), so the last hidden state is the last token's embedding;
    embeddings are one-hot per chain token plus a shared bias dimension the LM head uses to rule out every other
    token. ``base``: a tiny VLM folder to start from (else one is built).
    """
    import shutil

    from transformers import Qwen2VLForConditionalGeneration

    from mmspec.demo import build_tiny_vlm

    if base is None:
        build_tiny_vlm(path, seed=0)
    else:
        shutil.copytree(base, path, dirs_exist_ok=True)
    model = Qwen2VLForConditionalGeneration.from_pretrained(path)
    text = model.config.get_text_config()
    hidden, vocab = text.hidden_size, text.vocab_size
    eos = model.generation_config.eos_token_id
    eos = eos[0] if isinstance(eos, list) else eos
    bias, other = hidden - 2, hidden - 1
    ids = list(range(CHAIN_START, CHAIN_START + chain))
    assert chain <= bias
    lm = model.model.language_model
    with torch.no_grad():
        for layer in lm.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        emb = torch.zeros(vocab, hidden)
        emb[:, other] = emb[:, bias] = 1
        for i, t in enumerate(ids):
            emb[t] = 0
            emb[t, i] = emb[t, bias] = 1
        lm.embed_tokens.weight.copy_(emb)
        lm.norm.weight.fill_(1.0)
        head = torch.zeros(vocab, hidden)
        head[:, bias] = -5.0
        head[ids + [eos], bias] = 0
        head[ids[0], other] = 3.0
        for i in range(chain - 1):
            head[ids[i + 1], i] = 3.0
        if loop:
            head[ids[0], chain - 1] = 3.0
            head[eos, chain - 1] = 3.0 - delta
        else:
            head[eos, chain - 1] = 3.0
        model.config.tie_word_embeddings = False
        text.tie_word_embeddings = False
        model.lm_head.weight = torch.nn.Parameter(head)
    model.save_pretrained(path)
    return str(path)


@pytest.fixture(autouse=True)
def _own_drafter_cache(tmp_path_factory, monkeypatch):
    # --drafter auto also looks in the mmspec drafter cache: keep other runs' drafters out of these tests
    monkeypatch.setenv("MMSPEC_CACHE", str(tmp_path_factory.mktemp("mmspec-cache")))


@pytest.fixture(scope="module")
def ending_vlm(tmp_path_factory, tiny_vlm):
    return _rig(tmp_path_factory.mktemp("ending-vlm"), chain=12, loop=False, base=tiny_vlm)


@pytest.fixture(scope="module")
def looping_vlm(tmp_path_factory, tiny_vlm):
    return _rig(tmp_path_factory.mktemp("looping-vlm"), chain=4, loop=True, base=tiny_vlm)


def _png(path, shade: int = 255, size=(100, 80)):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.new("RGB", size, (shade, shade, shade)).save(path)
    return path


def _pdf(path, pages: int = 2):
    imgs = [Image.new("RGB", (100, 80), (255, 255 - 20 * i, 255)) for i in range(pages)]
    imgs[0].save(path, "PDF", save_all=True, append_images=imgs[1:], resolution=72.0)
    return path


def _records(out) -> list:
    with open(os.path.join(out, "pages.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _run(model, inputs, out, *extra) -> int:
    return main(["parse-docs", *map(str, inputs), "--out", str(out), "--model", model, "--dtype", "float32",
                 "--no-progress", *map(str, extra)])


# ---------------------------------------------------------------------------------------------- loop detection
def test_find_loop_needs_repeats_and_span():
    assert find_loop([3, 4] + [7, 8, 9] * 4, min_repeats=3, min_tokens=9) == (3, 2)
    assert find_loop([7, 8, 9] * 2, min_repeats=3, min_tokens=2) is None       # two periods are not a loop
    assert find_loop([5] * 20, min_repeats=3, min_tokens=32) is None           # a short run (a rule, dots)
    assert find_loop([1, 2] + [5] * 40, min_repeats=3, min_tokens=32) == (1, 2)
    assert find_loop([1, 2, 3] * 3 + [1, 2], min_repeats=3, min_tokens=9) == (3, 0)  # a period may be cut short
    assert find_loop([1, 2, 3] * 5 + [4], min_repeats=3, min_tokens=9) is None      # the loop must end the text
    rng = np.random.default_rng(0)
    assert find_loop(rng.integers(0, 500, 2000)) is None
    # the shortest period is found, and one longer than max_period is not looked for
    assert find_loop(list(range(50)) * 3, min_repeats=3, min_tokens=32, max_period=64) == (50, 0)
    assert find_loop(list(range(50)) * 3, min_repeats=3, min_tokens=32, max_period=40) is None


def test_guard_cuts_a_loop_inside_verification_and_equals_generate(looping_vlm):
    from mmspec import MMSpecPipeline, generate

    pipe = MMSpecPipeline.from_pretrained(looping_vlm, dtype="float32")
    img = Image.new("RGB", (100, 80), "white")
    inputs = pipe.prepare(images=[[img], [img]], prompt=[PROMPT, "Read this page."])
    settings = GuardSettings(min_repeats=3, min_tokens=16)
    eos = pipe.model.generation_config.eos_token_id
    eos = eos[0] if isinstance(eos, list) else eos
    prompt_len = inputs["input_ids"].shape[1]

    plain = pipe.model.generate(**inputs, max_new_tokens=60, do_sample=False)
    assert plain.shape[1] - prompt_len == 60                                      # without the guard: to the cap
    ref = pipe.model.generate(**inputs, max_new_tokens=60, do_sample=False,
                              logits_processor=[RepetitionGuard(eos, settings)])
    for drafter in (None, "lookup"):  # lookup drafts a loop perfectly: the guard must still cut it mid-tree
        out = generate(pipe.model, inputs, drafter=drafter, max_new_tokens=60, do_sample=False,
                       logits_processor=[RepetitionGuard(eos, settings)])
        assert torch.equal(out.sequences, ref)
    gen = ref[0, prompt_len:].tolist()
    assert gen[-1] == eos and len(gen) == 17                        # 16 looping tokens, then end of turn
    assert find_loop(gen[:-1], 3, 16) == (4, 0)


# ---------------------------------------------------------------------------------------------- the job
def test_inputs_are_walked_and_named_by_the_input_tree(tmp_path):
    from mmspec.errors import InvalidInputError
    from mmspec.vision.documents.job import markdown_path
    from mmspec.vision.documents.sources import discover

    _png(tmp_path / "scans" / "b" / "x.png")
    _png(tmp_path / "scans" / ".hidden" / "y.png")
    _png(tmp_path / "scans" / "out" / "markdown" / "z.png")       # the job's own output inside an input
    _pdf(str(tmp_path / "scans" / "x.pdf"))
    _png(tmp_path / "x.png")
    names = [s.name for s in discover([tmp_path / "scans", tmp_path / "x.png"], exclude=tmp_path / "scans" / "out")]
    assert names == ["scans/b/x.png", "scans/x.pdf", "x.png"]
    _png(tmp_path / "other" / "x.png")
    with pytest.raises(InvalidInputError, match="both named 'x.png'"):
        discover([tmp_path / "x.png", tmp_path / "other" / "x.png"])
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(InvalidInputError, match="not a supported document"):
        discover([tmp_path / "notes.txt"])
    assert markdown_path("o", "scans/x.pdf", taken={"scans/x"}) == "o/markdown/scans/x.pdf.md"


def test_pages_inputs_failures_and_markdown(ending_vlm, tmp_path):
    from pypdf import PdfWriter

    src = tmp_path / "scans"
    _png(src / "a" / "p1.png")
    _png(src / "a" / "p2.jpg", 200)
    _pdf(str(src / "two.pdf"))
    _png(src / "two.png", 100)  # same stem as two.pdf: both Markdown files keep their suffix
    (src / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 40)
    (src / "empty.png").write_bytes(b"")
    (src / "broken.pdf").write_bytes(b"%PDF-1.4\n1 0 obj << /Type /Catalog >>\ntrailer\n%%EOF")
    (src / "notes.txt").write_text("not a document")  # other file types in a folder are skipped
    for name, user in (("locked.pdf", "secret"), ("owner-only.pdf", "")):
        w = PdfWriter(clone_from=_pdf(str(tmp_path / "plain.pdf")))
        w.encrypt(user_password=user, owner_password="owner", algorithm="RC4-128")  # RC4: no extra dependency
        w.write(str(src / name))
    frames = [Image.new("RGB", (100, 80), (255, 255, s)) for s in (255, 200)]
    frames[0].save(src / "fax.tiff", save_all=True, append_images=frames[1:])

    out = tmp_path / "out"
    assert _run(ending_vlm, [src], out, "--batch-size", 3) == 1                    # some page failed
    recs = {r["id"]: r for r in _records(out)}
    chain = "".join(chr(ord(")") + i) for i in range(12))  # what the ending model writes (token 20 is ')')
    ok = ["a/p1.png#1", "a/p2.jpg#1", "two.pdf#1", "two.pdf#2", "two.png#1", "owner-only.pdf#1",
          "owner-only.pdf#2", "fax.tiff#1", "fax.tiff#2"]
    failed = {"corrupt.png#1": "corrupt", "empty.png#1": "empty", "broken.pdf#1": "cannot open PDF",
              "locked.pdf#1": "encrypted PDF"}
    assert sorted(recs) == sorted(ok + list(failed))
    for rid in ok:
        r = recs[rid]
        assert r["status"] == "ok" and r["error"] is None and r["text"] == chain, r
        assert r["tokens"] == 13 and r["attempts"][0]["finish"] == "eos" and not r["changed_by_guard"]
        assert r["timings"]["decode_s"] > 0 and r["page"] >= 1
    for rid, word in failed.items():
        assert recs[rid]["status"] == "failed" and word in recs[rid]["error"], recs[rid]
    md = out / "markdown"  # the input folder's own name is not repeated
    assert (md / "a" / "p1.md").read_text() == chain + "\n"
    assert (md / "two.png.md").read_text() == chain + "\n" and not (md / "two.md").exists()
    assert (md / "two.pdf.md").read_text() == f"<!-- page 1 -->\n\n{chain}\n\n<!-- page 2 -->\n\n{chain}\n"
    assert "failed: encrypted PDF" in (md / "locked.md").read_text()
    assert not (md / "notes.md").exists()


def test_guard_retries_a_looping_page_on_the_ladder(looping_vlm, tmp_path):
    src = tmp_path / "in"
    _png(src / "p.png")
    out = tmp_path / "out"
    assert _run(looping_vlm, [src], out, "--temperatures", "0,1", "--loop-min-tokens", 40) == 0
    (r,) = _records(out)
    first, second = r["attempts"]
    assert first["temperature"] == 0 and first["finish"] == "loop" and first["loop"] == {"period": 4, "start": 0}
    assert first["tokens"] == 41                                    # 40 looping tokens, then the forced end
    assert second["temperature"] == 1 and second["finish"] == "eos" and second["seed"] is not None
    assert r["status"] == "ok" and r["changed_by_guard"] and r["text"] == ")*+," * ((second["tokens"] - 1) // 4)

    # Every try loops: the page fails, with what happened, and the job says so.
    out2 = tmp_path / "out2"
    assert _run(looping_vlm, [src], out2, "--temperatures", "0,0", "--loop-min-tokens", 40) == 1
    (r,) = _records(out2)
    assert r["status"] == "failed" and r["error"] == "every try (2) ended in a repetition loop"
    assert [a["finish"] for a in r["attempts"]] == ["loop", "loop"]

    # Guard off: one greedy try to the token cap, recorded as such, nothing labelled as changed.
    out3 = tmp_path / "out3"
    assert _run(looping_vlm, [src], out3, "--no-repetition-guard", "--max-new-tokens", 30) == 1
    (r,) = _records(out3)
    assert r["attempts"][0]["finish"] == "length" and r["tokens"] == 30 and not r["changed_by_guard"]


def test_resume_after_a_crash_redoes_only_unfinished_pages(ending_vlm, tmp_path, monkeypatch):
    from mmspec.vision.documents import job

    src = tmp_path / "in"
    for i in range(5):
        _png(src / f"p{i}.png", 250 - i)
    out = tmp_path / "out"
    cfg = dict(inputs=[str(src)], out=str(out), model=ending_vlm, dtype="float32", batch_size=2, progress=False)
    real = job._Decoder.decode
    calls = []

    def crash_on_second_batch(self, ids, images):
        calls.append(ids)
        if len(calls) == 2:
            raise KeyboardInterrupt  # killed while the second batch decodes
        return real(self, ids, images)

    monkeypatch.setattr(job._Decoder, "decode", crash_on_second_batch)
    with pytest.raises(KeyboardInterrupt):
        parse_documents(ParseConfig(**cfg))
    assert [r["id"] for r in _records(out)] == ["p0.png#1", "p1.png#1"]
    # A writer that died inside a line (a power cut) leaves a stub: it is cut, not read, not kept.
    with open(out / "pages.jsonl", "ab") as f:
        f.write(b'{"id": "p2.png#1", "status": "ok", "te')
    monkeypatch.setattr(job._Decoder, "decode", real)
    summary = parse_documents(ParseConfig(**cfg))
    assert summary["done_before"] == 2 and summary["decoded"] == 3 and summary["job_failed"] == 0
    recs = _records(out)
    assert [r["id"] for r in recs] == [f"p{i}.png#1" for i in range(5)]           # each once, none lost
    # A finished job redoes nothing.
    again = parse_documents(ParseConfig(**cfg))
    assert again["decoded"] == 0 and again["done_before"] == 5 and len(_records(out)) == 5


def test_processes_split_the_manifest_and_share_the_folder(ending_vlm, tmp_path):
    src = tmp_path / "in"
    _png(src / "a.png")
    _pdf(str(src / "b.pdf"), pages=3)
    out = tmp_path / "out"
    cfg = dict(inputs=[str(src)], out=str(out), model=ending_vlm, dtype="float32", progress=False, world_size=2)
    first = parse_documents(ParseConfig(rank=1, **cfg))
    assert first["mine"] == 2 and first["decoded"] == 2                   # items 1 and 3 of a.png, b.pdf#1..3
    assert not (out / "markdown" / "b.md").exists()                # b.pdf#2 is rank 0's, not done yet
    second = parse_documents(ParseConfig(rank=0, **cfg))
    assert second["decoded"] == 2 and second["job_done"] == 4
    ids = [r["id"] for r in _records(out)]
    assert sorted(ids) == ["a.png#1", "b.pdf#1", "b.pdf#2", "b.pdf#3"] and len(set(ids)) == 4
    assert (out / "markdown" / "b.md").read_text().count("<!-- page") == 3


def test_a_rerun_with_other_settings_is_refused(ending_vlm, tmp_path, capsys):
    src = tmp_path / "in"
    _png(src / "a.png")
    out = tmp_path / "out"
    assert _run(ending_vlm, [src], out) == 0
    assert _run(ending_vlm, [src], out, "--max-new-tokens", 7) == 2
    assert "other settings (max_new_tokens)" in capsys.readouterr().err
    assert _run(ending_vlm, [tmp_path / "missing"], out) == 2


# ---------------------------------------------------------------------------------------------- real processes
def _env() -> dict:
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def _descendants(pid: int) -> list:
    """Processes below ``pid`` (read from /proc: the ranks torchrun started)."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                pass
    out, frontier = [], [pid]
    while frontier:
        kids = [c for c, p in parents.items() if p in frontier]
        out += kids
        frontier = kids
    return out


@pytest.fixture(scope="module")
def slow_ending_vlm(tmp_path_factory, tiny_vlm):
    return _rig(tmp_path_factory.mktemp("slow-ending-vlm"), chain=30, loop=False, base=tiny_vlm)  # 31 tokens a page


@pytest.mark.slow
def test_torchrun_job_killed_at_once_then_resumed(slow_ending_vlm, tmp_path):
    """Two torchrun processes share one job, each its share of the manifest; the launcher and both ranks are
    SIGKILLed mid-run; a rerun (one process) finishes it: every page exactly once, nothing written before the
    kill rewritten."""
    src = tmp_path / "in"
    for i in range(16):
        _png(src / f"p{i:02d}.png", 255 - i)
    _pdf(str(src / "doc.pdf"), pages=3)
    out = tmp_path / "out"
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    opts = ["--out", str(out), "--model", slow_ending_vlm, "--dtype", "float32", "--threads", "1", "--batch-size",
            "1", "--no-progress"]
    proc = subprocess.Popen([torchrun, "--nproc_per_node", "2", "-m", "mmspec.cli", "parse-docs", str(src), *opts],
                            env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pages = out / "pages.jsonl"
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if pages.exists() and len({r["rank"] for r in _records(out)}) == 2 and len(_records(out)) >= 4:
            break
        time.sleep(0.01)
    assert proc.poll() is None, "the run ended before it could be killed"
    # torchrun starts each rank in its own session: kill the launcher and both ranks at once, by id.
    group = [proc.pid] + _descendants(proc.pid)
    assert len(group) >= 3
    for pid in group:
        os.kill(pid, signal.SIGKILL)
    proc.wait()
    for pid in group[1:]:
        while _state(pid) not in ("Z", "gone"):
            time.sleep(0.01)
    manifest = [it["id"] for it in json.loads((out / "manifest.json").read_text())["items"]]
    before = _records(out)
    assert 4 <= len(before) < 19
    assert all(manifest.index(r["id"]) % 2 == r["rank"] for r in before)            # each rank took its share
    assert main(["parse-docs", str(src), *opts]) == 0
    recs = _records(out)
    ids = [r["id"] for r in recs]
    assert sorted(ids) == sorted(manifest) and len(ids) == 19                       # each page exactly once
    assert recs[: len(before)] == before                                            # nothing rewritten
    assert all(r["status"] == "ok" for r in recs)
    assert (out / "markdown" / "doc.md").read_text().count("<!-- page") == 3


@pytest.mark.slow
def test_bundled_target_pages_read_as_its_own_greedy_decoding(tmp_path):
    """parse-docs without --model reads with the bundled document model (the reader, else the testbed target) and
    its default drafter; every page's text is that model's own greedy decoding."""
    from mmspec.vision.documents.sample import write_sample_folder
    from mmspec.workloads import get_workload

    model = get_workload("docs").bundled_model() or get_workload("testbed-docs").bundled_model()
    if model is None:
        pytest.skip("no bundled document model in this install")
    from mmspec import MMSpecPipeline
    from mmspec.vision.documents import default_prompt

    src = tmp_path / "in"
    write_sample_folder(src, n_png=2, n_pdf_pages=0)
    out = tmp_path / "out"
    assert main(["parse-docs", str(src), "--out", str(out), "--dtype", "float32", "--threads", "1",
                 "--batch-size", "2", "--no-progress"]) == 0
    recs = _records(out)
    pipe = MMSpecPipeline.from_pretrained(model, dtype="float32")
    for r in recs:
        inputs = pipe.prepare(images=[str(src / os.path.basename(r["source"]))], prompt=default_prompt())
        ref = pipe.model.generate(**inputs, do_sample=False, max_new_tokens=1024)
        assert r["text"] == pipe.decode_new(ref, inputs["input_ids"].shape[1])[0]
        assert r["attempts"][0]["finish"] == "eos" and r["tau"] > 1.0                  # the drafter drafted
