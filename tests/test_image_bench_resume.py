"""``mmspec bench --workload images --resume CKPT``: a run killed mid-batch (in the timed systems, then again in the
untimed seed-set-B AR run, with a torn line left behind) and resumed gives the records of an uninterrupted run (every
quality figure, target forwards, the speculative stats) and the same codes batch for batch; another configuration's
checkpoint is refused. On the tiny generator of tests/test_image_sjd.py, with the bundled world classifier (so FID
and prompt accuracy are compared too)."""

from __future__ import annotations

import json
import shutil
import sys

import pytest

from mmspec.bench import BenchConfig, run_bench
from mmspec.errors import InvalidInputError
from mmspec.image_ar import bench as image_bench
from mmspec.image_ar.generator import ImageARPipeline

from test_image_sjd import small  # noqa: F401  (the fixture: a random 2-layer llama generator, grid 4)

SYSTEMS = ["sjd;draft_len=4", "sjd;rule=lantern++:lambda=2"]
SAME = ("system", "target_forwards", "tokens", "lossless", "tau", "accept_rate", "accepted_hist", "ceiling_rounds",
        "forwards_per_token", "drafter_counters", "rule")


class _Killed(Exception):
    pass


@pytest.fixture(scope="module")
def gen(small, tmp_path_factory):  # noqa: F811
    model, tok, vq = small
    path = tmp_path_factory.mktemp("gen")
    ImageARPipeline(model, tok, vq, grid=4).save_pretrained(str(path))
    return str(path)


def _cfg(gen, resume=None, **kw):
    base = dict(model=gen, workloads=["images"], systems=SYSTEMS, n=3, batch_sizes=[1], dtype="float32", threads=1,
                resume=resume)
    return BenchConfig(**{**base, **kw})


def _run(cfg, monkeypatch, kill_at=None):
    """``run_bench(cfg)``, killed at the ``kill_at``-th code NLL (one per system per batch, then one per batch of the
    seed-set-B AR run)."""
    real, calls = image_bench.code_nll, [0]

    def counted(*a, **kw):
        calls[0] += 1
        if calls[0] == kill_at:
            raise _Killed
        return real(*a, **kw)

    # --doctest-modules also imports image_ar/bench.py as ``image_ar.bench``, and the workload registered last may
    # call that copy: patch every copy loaded.
    copies = [m for m in (sys.modules.get("mmspec.image_ar.bench"), sys.modules.get("image_ar.bench")) if m]
    for m in copies:
        monkeypatch.setattr(m, "code_nll", counted)
    try:
        return run_bench(cfg, progress=False).results
    finally:
        for m in copies:
            monkeypatch.setattr(m, "code_nll", real)


def _batches(path):
    lines = [json.loads(x) for x in open(path).read().splitlines()]
    return [(e["kind"], e["chunk"], {k: v["codes"] for k, v in e["systems"].items()} if "systems" in e else e["codes"])
            for e in lines[1:]]


@pytest.mark.slow  # four bench runs and two partial ones: ~20 s here
def test_killed_twice_then_resumed_equals_uninterrupted(gen, tmp_path, monkeypatch):
    plain = _run(_cfg(gen), monkeypatch)  # no checkpoint at all
    whole = _run(_cfg(gen, resume=str(tmp_path / "whole.jsonl")), monkeypatch)
    ck = tmp_path / "killed.jsonl"
    with pytest.raises(_Killed):  # 3 systems x 3 batches: dies in batch 1's second system
        _run(_cfg(gen, resume=str(ck)), monkeypatch, kill_at=5)
    assert [(k, i) for k, i, _ in _batches(ck)] == [("chunk", 0)]
    with pytest.raises(_Killed):  # batches 1 and 2 (6 NLLs), then dies in the noise run's second batch
        _run(_cfg(gen, resume=str(ck)), monkeypatch, kill_at=8)
    assert [(k, i) for k, i, _ in _batches(ck)] == [("chunk", 0), ("chunk", 1), ("chunk", 2), ("noise:None", 0)]
    with open(ck, "ab") as f:  # a kill in the middle of a write
        f.write(b'{"kind": "noise:None", "batch_size": 1, "chunk": 1, "nll": [0.')
    resumed = _run(_cfg(gen, resume=str(ck)), monkeypatch)
    assert _batches(ck) == _batches(tmp_path / "whole.jsonl")  # the same codes, batch for batch
    assert len(_batches(ck)) == 6
    for recs in (whole, resumed):
        assert [r["system"] for r in recs] == [r["system"] for r in plain] == ["ar"] + SYSTEMS
        for a, b in zip(plain, recs):
            assert {k: a.get(k) for k in SAME} == {k: b.get(k) for k in SAME}
            assert a["quality"] == b["quality"]  # FID, prompt accuracy, NLLs, noise floors
    q = resumed[1]["quality"]
    assert q["fid"] is not None and q["fid_n"] == 3 and q["code_nll"] > 0 and "fid_noise_floor" in q
    assert resumed[1]["tau"] > 1 and resumed[1]["speedup_vs_ar"] > 0
    again = _run(_cfg(gen, resume=str(ck)), monkeypatch, kill_at=1)  # all done: nothing is generated again
    assert [r["quality"] for r in again] == [r["quality"] for r in resumed]


def test_other_config_refused(gen, tmp_path, monkeypatch):
    ck = str(tmp_path / "ck.jsonl")
    with pytest.raises(_Killed):
        _run(_cfg(gen, resume=ck), monkeypatch, kill_at=1)
    for kw, match in ((dict(seed=1), r"\(seed differs: 0 there, 1 here\)"), (dict(n=2), "n, prompts_sha256 differ"),
                      (dict(systems=SYSTEMS[:1]), r"\(systems differs\)"), (dict(batch_sizes=[2]), "batch_sizes"),
                      (dict(dtype="bfloat16"), "dtype")):
        with pytest.raises(InvalidInputError, match=match):
            _run(_cfg(gen, resume=ck, **kw), monkeypatch)
    other = tmp_path / "gen2"  # the same generator, one file changed: another model
    shutil.copytree(gen, other)
    (other / "eval.jsonl").write_text("{}\n")  # a log beside the weights changes nothing
    with pytest.raises(_Killed):  # accepted: got as far as the first batch
        _run(_cfg(str(other), resume=ck), monkeypatch, kill_at=1)
    with open(other / "generation_config.json", "a") as f:
        f.write("\n")
    with pytest.raises(InvalidInputError, match=r"\(files differs\)"):
        _run(_cfg(str(other), resume=ck), monkeypatch)
    (tmp_path / "bad.jsonl").write_text('{"format": "something else"}\n')
    with pytest.raises(InvalidInputError, match="not an images bench checkpoint"):
        _run(_cfg(gen, resume=str(tmp_path / "bad.jsonl")), monkeypatch)
    with pytest.raises(InvalidInputError, match="folder .* does not exist"):
        _run(_cfg(gen, resume=str(tmp_path / "no" / "ck.jsonl")), monkeypatch)
    with pytest.raises(InvalidInputError, match="--resume is not supported for docs"):
        run_bench(BenchConfig(workloads=["docs", "images"], resume=ck), progress=False)
    from mmspec.cli import build_parser

    assert build_parser().parse_args(["bench", "--workload", "images", "--resume", ck]).resume == ck


def test_fingerprint_covers_spatial_heads(tmp_path):
    """The bundled spatial head (bare ``spatial``) and a named one (``spatial:DIR``) are fingerprinted by content."""
    from mmspec.image_ar.bench import _fingerprint, _systems

    head = tmp_path / "head"
    head.mkdir()
    (head / "model.safetensors").write_bytes(b"w1")
    (head / "train_log.jsonl").write_text("{}")
    cfg = BenchConfig(systems=["spatial;rounds=1", f"spatial:{head}"], n=1, batch_sizes=[1])
    fp = _fingerprint(str(tmp_path / "gen"), ["p"], list(_systems(cfg.systems)), cfg, "cpu")
    assert set(fp["files"]) == {"model", "spatial", f"spatial:{head}"} and fp["systems"][0] == "ar"
    assert "model.safetensors" in fp["files"]["spatial"]  # the shipped head's weights
    assert list(fp["files"][f"spatial:{head}"]) == ["model.safetensors"]  # its log left out
    (head / "model.safetensors").write_bytes(b"w2")
    assert _fingerprint(str(tmp_path / "gen"), ["p"], list(_systems(cfg.systems)), cfg, "cpu")["files"] != fp["files"]


def test_quality_full_mode(gen, tmp_path, monkeypatch):
    """``--quality full``: at least 1000 images per system (fewer, --quick, or a workload without a quality run is
    refused before anything loads), the noise floor even for AR alone, records marked ``mode: full``, and a
    checkpoint of a quick run is not continued as a full one. 1000 is patched down to 3 for the tiny run."""
    import mmspec.bench as core_bench
    from mmspec.cli import build_parser

    with pytest.raises(InvalidInputError, match="at least 1000 images per system.*--n 999"):
        BenchConfig(quality="full", n=999).resolved_sizes()
    with pytest.raises(InvalidInputError, match="--quick"):
        BenchConfig(quality="full", quick=True).resolved_sizes()
    with pytest.raises(InvalidInputError, match="'quick' or 'full'"):
        BenchConfig(quality="fast").resolved_sizes()
    with pytest.raises(InvalidInputError, match="no quality run for docs"):
        run_bench(BenchConfig(workloads=["docs", "images"], quality="full"), progress=False)
    args = build_parser().parse_args(["bench", "--workload", "images", "--quality", "full"])
    assert args.quality == "full" and args.batch_sizes is None  # _bench then takes QUALITY_FULL_BATCH
    assert core_bench.QUALITY_FULL_BATCH > 1

    monkeypatch.setattr(core_bench, "QUALITY_FULL_N", 3)
    ck = str(tmp_path / "ck.jsonl")
    with pytest.raises(_Killed):  # a quick run's checkpoint...
        _run(_cfg(gen, resume=ck, systems=["ar"]), monkeypatch, kill_at=2)
    with pytest.raises(InvalidInputError, match=r"\(quality differs: None there, 'full' here\)"):
        _run(_cfg(gen, resume=ck, systems=["ar"], quality="full"), monkeypatch)  # ...is not a full run's
    recs = _run(_cfg(gen, resume=str(tmp_path / "full.jsonl"), systems=["ar"], quality="full"), monkeypatch)
    q = recs[0]["quality"]
    assert q["mode"] == "full" and q["fid_n"] == 3 and q["fid_noise_floor"] is not None
    assert q["prompt_accuracy_noise"] is not None and q["code_nll_noise"] is not None
    quick = _run(_cfg(gen, systems=["ar"]), monkeypatch)[0]["quality"]
    assert quick["mode"] == "quick" and "fid_noise_floor" not in quick  # AR alone, quick: no floor (as before)
