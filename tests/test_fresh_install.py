"""A fresh clone works from its root: nothing in the checkout shadows an installed package (issue 31).

Why: the repository root is on ``sys.path`` for ``python -m ...`` and ``python -c ...`` run from it. When the
top-level ``kernels/`` folder was a regular package, transformers 5.25's ``import kernels`` (a PyPI package it
depends on) found the folder instead, and ``make test``, ``python -m mmspec`` and any ``from transformers
import ...`` failed from the root. These tests run exactly those commands, from the root, with the project's
interpreter.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run_from_root(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH")}
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_no_top_level_folder_is_a_package_named_like_an_installed_one():
    """A folder at the root with an ``__init__.py`` is importable under its bare name from the root; none may
    share that name with a top-level module of any installed distribution (``kernels``, for one)."""
    installed = importlib.metadata.packages_distributions()
    packages = [p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()]
    clashes = {name: installed[name] for name in packages if name in installed and name != "mmspec"}
    assert not clashes, f"root folders shadow installed packages: {clashes}"
    assert not (ROOT / "kernels" / "__init__.py").exists(), "kernels/ must stay a plain folder (kernels/README.md)"


def test_transformers_imports_from_the_root():
    done = _run_from_root("-c", "from transformers import LlamaForCausalLM, AutoModelForCausalLM; print('ok')")
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-2000:]


def test_the_installed_kernels_package_wins_from_the_root():
    """Whatever ``import kernels`` finds from the root, it is not this checkout's folder turned into a package."""
    code = ("import importlib.util as u; s = u.find_spec('kernels'); "
            "print('none' if s is None else (s.origin or 'namespace'))")
    done = _run_from_root("-c", code)
    assert done.returncode == 0, done.stderr[-2000:]
    assert not done.stdout.strip().startswith(str(ROOT / "kernels")), done.stdout


def test_python_m_pytest_collects_from_the_root():
    done = _run_from_root("-m", "pytest", "--collect-only", "-q", "tests/test_drafter_saving.py")
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert "test_drafter_saving.py::" in done.stdout


@pytest.mark.parametrize("module", ["mmspec", "mmspec.cli"])
def test_cli_module_forms_run_from_the_root(module):
    done = _run_from_root("-m", module, "--help")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage: mmspec" in done.stdout


def test_mmspec_kernels_is_the_kernels_folder():
    import mmspec.kernels

    assert Path(mmspec.kernels.__file__).resolve().parent == ROOT / "kernels" / "mmspec_kernels"


def test_tests_use_a_session_cache_not_the_users_home():
    """conftest.py points MMSPEC_CACHE at a temporary folder unless the caller set one: tests never write
    ~/.cache/mmspec (the tiny VLM, the converted SmolLM2, assembled readers)."""
    from mmspec.demo import _default_cache_dir
    from mmspec.drafters.auto import drafter_cache_dir
    from mmspec.vision.reader.lm import cache_root

    home = os.path.realpath(os.path.expanduser("~/.cache/mmspec"))
    for path in (cache_root(), str(_default_cache_dir()), drafter_cache_dir()):
        assert not os.path.realpath(path).startswith(home), path
    assert os.environ.get("MMSPEC_CACHE")
