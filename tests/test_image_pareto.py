"""image_ar/pareto.py: the issue-18 table, tolerances, Pareto front and bars from a bench JSON (hand-built records, so
every edge is known), and the command writing the table and the plot."""

from __future__ import annotations

import json

import pytest

from mmspec.errors import InvalidInputError
from mmspec.image_ar.pareto import bars, main, pareto_rows, table


def _rec(system, speedup, fid, acc, forwards, lossless=False, bs=1, floor=3.0, noise=0.01):
    return {"workload": "images", "status": "ok", "system": system, "batch_size": bs, "lossless": lossless,
            "speedup_vs_ar": speedup, "target_forwards": forwards, "tau": 256 / forwards, "reference": "ar",
            "quality": {"fid": fid, "fid_n": 256, "fid_noise_floor": floor, "prompt_accuracy": acc,
                        "prompt_accuracy_noise": noise, "code_nll": 1.0}}


RECORDS = [_rec("ar", 1.0, 100.0, 0.80, 512, lossless=True),
           _rec("sjd", 2.0, 101.0, 0.81, 256, lossless=True),
           _rec("spatial", 3.0, 99.0, 0.80, 128, lossless=True),
           _rec("edge", 3.6, 105.0, 0.78, 100),        # FID exactly AR + 5% (> the 3.0 floor), accuracy exactly -0.02
           _rec("acc_out", 5.0, 100.0, 0.779, 64),     # accuracy just past the 0.02 minimum spread
           _rec("fid_out", 4.0, 105.01, 0.80, 80),     # FID just past the tolerance
           _rec("slow_bad", 2.5, 150.0, 0.50, 200),    # dominated by spatial (faster, lower FID)
           _rec("ar", 1.0, 1.0, 1.0, 2, lossless=True, bs=4)]  # another batch size: not in the default table


def test_rows_tolerance_front_and_bars():
    rows = {r["system"]: r for r in pareto_rows(RECORDS)}
    assert list(rows) == ["ar", "sjd", "spatial", "edge", "acc_out", "fid_out", "slow_bad"]  # batch 1 only
    assert rows["spatial"]["forwards_ratio"] == 4.0 and rows["ar"]["fid_tolerance"] == 5.0
    assert rows["ar"]["accuracy_tolerance"] == 0.02  # the spread (0.01) is below the 2-point minimum
    within = {s for s, r in rows.items() if r["within_tolerance"]}
    assert within == {"ar", "sjd", "spatial", "edge"}
    front = {s for s, r in rows.items() if r["pareto"]}
    assert front == {"spatial", "acc_out"}  # acc_out (5x, FID 100) dominates edge and fid_out; spatial has FID 99
    b = bars(list(rows.values()))
    assert (b["fastest_lossless"], b["lossless_bar_holds"]) == ("spatial", True)
    assert (b["fastest_within_tolerance"], b["fastest_within_tolerance_speedup"], b["quality_bar_holds"]) == \
        ("edge", 3.6, True)
    # A noise floor above 5% of AR's FID widens the tolerance to it.
    wide = [dict(r, quality=dict(r["quality"], fid_noise_floor=6.0)) for r in RECORDS]
    assert next(r for r in pareto_rows(wide) if r["system"] == "fid_out")["within_tolerance"]
    # No lossless system above AR, nothing within tolerance past 3.5x: both bars fail.
    b = bars(pareto_rows([RECORDS[0], RECORDS[4]]))
    assert not b["lossless_bar_holds"] and b["fastest_lossless"] is None and not b["quality_bar_holds"]
    assert "fails (no lossless system" in table(pareto_rows([RECORDS[0], RECORDS[4]]))


def _bench_json(tmp_path):
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"results": RECORDS, "meta": {"date": "2026-12-02", "device": "cpu"}}))
    return path


def test_table_and_command(tmp_path, capsys):
    path, md = _bench_json(tmp_path), tmp_path / "t.md"
    assert main([str(path), "--md", str(md)]) == 0
    text = md.read_text()
    assert text.strip() == capsys.readouterr().out.strip()
    assert "| `edge` | no | 100 | 5.12x | 3.60x |" in text and "Lossless bar (>= 1.8x): holds (spatial: 3.00x)" in text
    assert "batch size 4" not in text and main([str(path), "--batch-size", "4"]) == 0
    with pytest.raises(InvalidInputError, match="no images records"):
        pareto_rows([], None)
    with pytest.raises(InvalidInputError, match="cannot read"):
        main([str(tmp_path / "missing.json")])
    (tmp_path / "list.json").write_text(json.dumps(RECORDS))  # the records alone, not a bench run
    with pytest.raises(InvalidInputError, match="not a bench JSON"):
        main([str(tmp_path / "list.json")])


@pytest.mark.slow  # importing matplotlib and drawing take a few seconds here
def test_pareto_png(tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "p.png"
    assert main([str(_bench_json(tmp_path)), "--png", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_kid_column_and_quality_run_note():
    """KID x 1000 with its noise floor where the records carry it; a --quality full run at batch 16 says its speed bars
    are not judged on it, a batch-1 run says nothing of the kind."""
    kid = [dict(r, quality=dict(r["quality"], kid=0.0074, kid_noise_floor=0.0012)) for r in RECORDS[:3]]
    text = table(pareto_rows(kid))
    assert "| 100.0 | 7.40 | 0.800 |" in text and "KID x 1000 1.20" in text and "quality run" not in text
    full = [dict(r, batch_size=16, quality=dict(r["quality"], mode="full")) for r in kid]
    assert "A quality run (--quality full) at batch size 16" in table(pareto_rows(full))
