"""The built wheel: every bundled model inside it, no result, log, probe or study; installed from the wheel (not
editable) into a fresh venv, ``mmspec demo`` runs offline from outside the repository.

Why: an editable install reads the models from the checkout, so a package-data rule that misses a file only shows
for users who ``pip install`` the wheel. The wheel is built from a copy of the files git would ship (tracked and
untracked-but-not-ignored), so the checkout gets no ``build/`` folder and a local stray file cannot hide a gap.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = {"mmspec.vision": "vision", "mmspec.drivers": "drivers", "mmspec.image_ar": "image_ar"}
# What must never ship: training logs, validation logs, per-phase configs, probes, studies, reproduce/driver
# scripts, bench records. (A model folder keeps its config.json / train_config.json / eval.json / README.md.)
FORBIDDEN = re.compile(r"(train_log|val_log|train_config_phase|/probes/|/studies/|/drive-sim/|\.sh$|/bench-[^/]*$"
                       r"|^results/|\.png$)")


def _source_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                         capture_output=True, text=True, check=True).stdout.split("\n")
    return [f for f in out if f and (REPO / f).is_file()]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs the git checkout (the wheel is built from the files git would ship)")
    src = tmp_path_factory.mktemp("src")
    for f in _source_files():
        (src / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / f, src / f)
    out = tmp_path_factory.mktemp("wheel")
    # build isolation: pip installs the build backend pyproject.toml asks for (setuptools>=68) from the package
    # index, as for any user; a venv's own setuptools may be older (Python 3.11's ensurepip bundles 65.5)
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(src)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    (whl,) = out.glob("mmspec-*.whl")
    return whl


@pytest.mark.slow
def test_the_wheel_holds_every_bundled_model_and_no_result(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = [f for f in _source_files() if any(f.startswith(d + "/assets/") for d in PACKAGES.values())]
    assert any(f.startswith("vision/assets/reader/") for f in shipped)  # the listing itself is not empty
    missing = [f for f in shipped if f"mmspec/{f}" not in names]
    assert not missing, f"bundled files left out of the wheel: {missing}"
    bad = sorted(n for n in names if FORBIDDEN.search(n))
    assert not bad, f"results / logs / studies in the wheel: {bad}"
    bad_in_source = sorted(f for f in shipped if FORBIDDEN.search(f))
    assert not bad_in_source, f"results / logs / studies inside a package's assets (move them to results/): {bad_in_source}"
    # every runtime module ships (the package list in pyproject.toml names each subpackage)
    modules = [f for f in _source_files() if f.endswith(".py") and f.split("/")[0] in ("mmspec", *PACKAGES.values())]
    prefix = {"mmspec": "mmspec", **{v: f"mmspec/{v}" for v in PACKAGES.values()}}
    lost = [m for m in modules if f"{prefix[m.split('/')[0]]}/{m.split('/', 1)[1]}" not in names]
    assert not lost, f"modules left out of the wheel (add their package to pyproject.toml): {lost}"


@pytest.mark.slow
def test_the_installed_wheel_runs_the_demo_offline_outside_the_checkout(wheel, tmp_path):
    """A fresh venv (not editable) gets the wheel; its dependencies come from this environment's site-packages,
    added as a plain path (so this environment's editable mmspec, a .pth hook there, is not seen)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    with zipfile.ZipFile(wheel) as z:  # installing a pure wheel is unpacking it into site-packages
        z.extractall(site)
    deps = sysconfig.get_paths()["purelib"]
    Path(site, "deps.pth").write_text(deps + "\n")
    entry = venv / "bin" / "mmspec"
    entry.write_text(f"#!{py}\nimport sys\nfrom mmspec.cli import main\nsys.exit(main())\n")
    entry.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    # mmspec's cache is shared with the other tests (the reader assembled from the GGUF is keyed by its parts'
    # digests, so the wheel's identical assets hit it); the network is off.
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    where = subprocess.run([str(py), "-c", "import mmspec, mmspec.vision; print(mmspec.__file__); "
                            "print(mmspec.vision.__file__)"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert where.returncode == 0, where.stderr[-2000:]
    assert all(line.startswith(site) for line in where.stdout.split()), where.stdout  # the wheel's, not the checkout's
    done = subprocess.run([str(entry), "demo", "--max-new-tokens", "48"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    out = done.stdout
    # What `make demo` prints on the bundled reader (this test is also the demo's own test: one demo run for both):
    # equality to generate in the dtype auto picks (bf16 where the CPU computes in it natively, float32 elsewhere),
    # the reader's report card, and which drafter auto took (a shipped head, or the page-lookup fallback).
    assert re.search(r"equals model.generate \(greedy, (bfloat16|float32)\): True", out), out[-2000:]
    assert "wall clock" in out and "dtype: " in out and re.search(r"target passes: model.generate \d+, mmspec \d+", out)
    assert "the bundled reader" in out and re.search(r"character error rate docs 0\.\d+", out), out[-2000:]
    assert re.search(r"auto: (chose \S+|no saved drafter (matches this target; using the fallback drafter "
                     r"page-lookup|beats the fallback drafter page-lookup; using it))", out), out[-2000:]
