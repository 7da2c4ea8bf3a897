"""Every Python snippet of the README runs (issue 31: ``from mmspec.kernels.hf import register_tree_attention``
was printed there and raised ImportError).

Each ```python block is executed as written, after replacing its placeholders (a hub id such as
``path/to/qwen2-vl``, ``page.png``, ``clip.mp4``, ``PATH``) with local stand-ins built in the test: the tiny
random Qwen2-VL, images and a clip written here, a tiny Llama. Names a snippet uses without defining them
(``processor``, ``model``, ``image``, ``chat_text``) are given the tiny VLM's. Blocks that load the bundled
trained models are marked slow. A block that cannot run offline must say so in the README and be listed in
``NOT_RUN`` with the reason; the list is empty today.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
NOT_RUN: dict = {}
"""First line of a block -> why it cannot run offline (none today)."""
SLOW_MARKERS = ("drivers/assets", "image_ar/assets", "bundled_model()", "bundled_reader", "testbed-vlm")


def _blocks() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return [textwrap_dedent(b) for b in re.findall(r"```python\n(.*?)```", text, re.S)]


def textwrap_dedent(block: str) -> str:
    import textwrap

    return textwrap.dedent(block)


BLOCKS = _blocks()


def test_the_readme_has_python_snippets_and_each_compiles():
    assert len(BLOCKS) >= 4
    for b in BLOCKS:
        compile(b, "README.md", "exec")


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory, tiny_vlm):
    """Placeholder -> local path, and the names the low-level snippet takes as given."""
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    import _tiny_text
    from test_video import write_clip

    d = tmp_path_factory.mktemp("readme")
    files = {}
    for k, name in enumerate(["page.png", "a.png", "b.png", "c.png"]):
        arr = np.full((56, 84, 3), 255, np.uint8)
        arr[10:20 + 4 * k, 10:40] = 0
        Image.fromarray(arr).save(d / name)
        files[name] = str(d / name)
    files["clip.mp4"] = write_clip(d / "clip.mp4", 8)
    (d / "runs").mkdir()
    llama = d / "tiny-llama"
    _tiny_text.model(200).save_pretrained(llama)
    replace = {'"path/to/qwen2-vl"': repr(tiny_vlm), '"runs/"': repr(str(d / "runs")), "PATH": repr(str(llama))}
    replace.update({f'"{k}"': repr(v) for k, v in files.items()})
    processor = AutoProcessor.from_pretrained(tiny_vlm)
    model = AutoModelForImageTextToText.from_pretrained(tiny_vlm, dtype=torch.float32).eval()
    chat = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe."}]}]
    names = {"processor": processor, "model": model, "image": Image.open(files["page.png"]).convert("RGB"),
             "chat_text": processor.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)}
    return replace, names


def _run(block: str, stand_ins) -> dict:
    replace, names = stand_ins
    src = block
    for k, v in replace.items():
        src = re.sub(rf"(?<![\w/]){re.escape(k)}(?![\w])", lambda m, v=v: v, src)
    ns = dict(names)
    exec(compile(src, "README.md", "exec"), ns)  # noqa: S102  (the README's own code)
    return ns


def _params():
    out = []
    for k, b in enumerate(BLOCKS):
        first = b.strip().splitlines()[0]
        marks = [pytest.mark.slow] if any(m in b for m in SLOW_MARKERS) else []
        if first in NOT_RUN:
            marks.append(pytest.mark.skip(reason=NOT_RUN[first]))
        out.append(pytest.param(k, marks=marks, id=f"block{k}"))
    return out


@pytest.mark.parametrize("k", _params())
def test_readme_snippet_runs(k, stand_ins):
    _run(BLOCKS[k], stand_ins)
