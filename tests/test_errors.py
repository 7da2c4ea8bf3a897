"""Every user-caused error is an MMSpecError subclass, with a clear message, raised before model work."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

import mmspec
from mmspec import (ContextLengthError, DrafterMismatchError, InvalidImageError, InvalidInputError, MMSpecError,
                    MMSpecPipeline, UnsupportedModelError)
from mmspec.vision import load_image


@pytest.fixture
def no_model_work(vlm_pipe, monkeypatch):
    """Fail the test if the pipeline reaches generation or the model runs."""
    import mmspec.vision.pipeline as vp

    def boom(*a, **k):
        raise AssertionError("model work started before the error was raised")

    monkeypatch.setattr(vp, "generate", boom)
    monkeypatch.setattr(vlm_pipe.model, "forward", boom)
    return vlm_pipe


def test_error_family():
    for cls in (InvalidInputError, InvalidImageError, ContextLengthError, DrafterMismatchError, UnsupportedModelError):
        assert issubclass(cls, MMSpecError)
    assert issubclass(InvalidImageError, InvalidInputError)


# ---------------------------------------------------------------------------- images
def test_missing_file(tmp_path):
    with pytest.raises(InvalidImageError, match="not found"):
        load_image(tmp_path / "nope.png")


def test_empty_file(tmp_path):
    p = tmp_path / "empty.png"
    p.write_bytes(b"")
    with pytest.raises(InvalidImageError, match="empty"):
        load_image(str(p))


def test_unreadable_file(tmp_path):
    p = tmp_path / "garbage.png"
    p.write_bytes(b"this is not an image at all" * 10)
    with pytest.raises(InvalidImageError, match="not an image"):
        load_image(p)


def test_truncated_file(tmp_path, shapes_image):
    good = tmp_path / "good.png"
    shapes_image.save(good)
    bad = tmp_path / "truncated.png"
    bad.write_bytes(good.read_bytes()[:60])
    with pytest.raises(InvalidImageError, match="truncated.png"):
        load_image(bad)


def test_folder_and_url(tmp_path):
    with pytest.raises(InvalidImageError, match="folder"):
        load_image(tmp_path)
    with pytest.raises(InvalidImageError, match="URL"):
        load_image("https://example.com/a.png")


@pytest.mark.parametrize("size", [(0, 10), (10, 0), (0, 0)])
def test_zero_size_image(size):
    with pytest.raises(InvalidImageError, match="zero size"):
        load_image(Image.new("RGB", size))


@pytest.mark.parametrize("arr", [np.zeros((0, 5, 3), np.uint8), np.zeros((5, 0), np.uint8), np.array([]),
                                 torch.zeros(3, 0, 4), torch.empty(0)])
def test_empty_array(arr):
    with pytest.raises(InvalidImageError, match="empty image array"):
        load_image(arr)


def test_bad_array_shape_and_type():
    with pytest.raises(InvalidImageError, match="channels"):
        load_image(np.zeros((5, 6, 7), np.uint8))
    with pytest.raises(InvalidImageError, match="dims"):
        load_image(np.zeros((2, 2, 2, 3, 3), np.uint8))
    with pytest.raises(InvalidImageError, match="NaN"):
        load_image(np.full((4, 4, 3), np.nan, np.float32))
    with pytest.raises(InvalidImageError, match="cannot use a dict"):
        load_image({"x": 1})


def test_array_layouts_and_dtypes():
    rgb = np.random.default_rng(0).integers(0, 256, (5, 7, 3), dtype=np.uint8)
    ref = load_image(rgb)
    assert ref.size == (7, 5) and ref.mode == "RGB"
    assert np.array_equal(np.asarray(load_image(rgb.transpose(2, 0, 1).copy())), rgb)  # CHW array
    assert np.array_equal(np.asarray(load_image(torch.from_numpy(rgb.copy()).permute(2, 0, 1))), rgb)  # CHW tensor
    assert np.array_equal(np.asarray(load_image(rgb.astype(np.float32) / 255.0)), rgb)
    assert load_image(np.zeros((4, 6), np.uint8)).size == (6, 4)  # grey
    assert load_image(np.zeros((4, 6, 4), np.uint8)).mode == "RGB"  # RGBA


def test_pipeline_rejects_bad_images_before_model_work(no_model_work, tmp_path, shapes_image):
    pipe = no_model_work
    empty = tmp_path / "empty.jpg"
    empty.write_bytes(b"")
    with pytest.raises(InvalidImageError, match="not found"):
        pipe(images=[str(tmp_path / "missing.png")], prompt="Describe.", max_new_tokens=4)
    with pytest.raises(InvalidImageError, match="image 1: image file is empty"):
        pipe(images=[shapes_image, empty], prompt="Describe.", max_new_tokens=4)
    with pytest.raises(InvalidImageError, match="prompt 1: image file is empty"):
        pipe(images=[[shapes_image], empty], prompt=["a", "b"], max_new_tokens=4)
    with pytest.raises(InvalidImageError, match="zero size"):
        pipe(images=[Image.new("RGB", (0, 3))], prompt="Describe.", max_new_tokens=4)
    with pytest.raises(InvalidImageError, match="empty image array"):
        pipe(images=[np.zeros((0, 0, 3))], prompt="Describe.", max_new_tokens=4)


# ---------------------------------------------------------------------------- request arguments
@pytest.mark.parametrize("bad", [0, -3, 2.5, "8", True])
def test_max_new_tokens(no_model_work, shapes_image, bad):
    with pytest.raises(InvalidInputError, match="max_new_tokens"):
        no_model_work(images=[shapes_image], prompt="Describe.", max_new_tokens=bad)


@pytest.mark.parametrize("bad", [0, -1])
def test_max_new_tokens_zero_in_generate(vlm_pipe, shapes_image, bad):
    inputs = vlm_pipe.prepare([shapes_image], "Describe.")
    with pytest.raises(InvalidInputError, match="max_new_tokens"):
        mmspec.generate(vlm_pipe.model, inputs, max_new_tokens=bad)


def test_malformed_requests(no_model_work, shapes_image):
    pipe = no_model_work
    with pytest.raises(InvalidInputError, match="prompt is required"):
        pipe(images=[shapes_image], max_new_tokens=4)
    with pytest.raises(InvalidInputError, match="list of 2 entries"):
        pipe(images=[shapes_image], prompt=["a", "b"], max_new_tokens=4)
    with pytest.raises(InvalidInputError, match="empty"):
        pipe(prompt=[], max_new_tokens=4)
    with pytest.raises(InvalidInputError, match="must be a string"):
        pipe(prompt=["a", 3], max_new_tokens=4)


def test_prompt_past_context_window(no_model_work, shapes_image):
    window = no_model_work.context_window
    long_prompt = " ".join(["the"] * (window + 50))
    with pytest.raises(ContextLengthError, match=f"context window is {window}"):
        no_model_work(images=[shapes_image], prompt=long_prompt, max_new_tokens=4)
    with pytest.raises(ContextLengthError, match="prompt 1 has"):
        no_model_work(prompt=["short", long_prompt], max_new_tokens=4)


def test_prompt_near_the_window_only_warns(vlm_pipe, monkeypatch):
    import mmspec.vision.pipeline as vp

    calls = []
    monkeypatch.setattr(vp, "generate", lambda model, inputs, **kw: calls.append(kw) or _fake_out(inputs))
    window = vlm_pipe.context_window
    n = len(vlm_pipe.prepare(None, "the")["input_ids"][0])
    prompt = " ".join(["the"] * (window - n - 2))
    with pytest.warns(UserWarning, match="exceeds the context window"):
        vlm_pipe(prompt=prompt, max_new_tokens=64)
    assert calls


def _fake_out(inputs):
    from mmspec.decode import GenerateOutput

    return GenerateOutput(inputs["input_ids"], mmspec.SpecStats())


# ---------------------------------------------------------------------------- models and drafters
def test_unsupported_model_names_supported_kinds(tmp_path):
    from transformers import BertConfig, T5Config

    for name, cfg in (("t5", T5Config(d_model=16, num_layers=1, num_heads=2, d_ff=32, vocab_size=50)),
                      ("bert", BertConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                          intermediate_size=32, vocab_size=50))):
        path = tmp_path / name
        cfg.save_pretrained(path)  # the config alone: the error must come before any weights are read
        with pytest.raises(UnsupportedModelError) as e:
            MMSpecPipeline.from_pretrained(path)
        msg = str(e.value)
        assert repr(cfg.model_type) in msg and "qwen2_vl" in msg and "vlm" in msg
    with pytest.raises(UnsupportedModelError, match="encoder-decoder"):
        MMSpecPipeline.from_pretrained(tmp_path / "t5", task="vlm")


def test_unknown_task_and_missing_folder(tmp_path, tiny_vlm):
    with pytest.raises(UnsupportedModelError, match="supported tasks: .*vlm"):
        MMSpecPipeline.from_pretrained(tiny_vlm, task="no-such-task")
    with pytest.raises(InvalidInputError, match="not found"):
        MMSpecPipeline.from_pretrained(tmp_path / "missing")


def test_unknown_drafter_kind(tiny_vlm):
    with pytest.raises(InvalidInputError, match="unknown drafter kind 'nope'.*lookup"):
        MMSpecPipeline.from_pretrained(tiny_vlm, drafter="nope")
    with pytest.raises(InvalidInputError, match="needs a path"):
        mmspec.registry.make_drafter("draft-model", None)
    with pytest.raises(InvalidInputError, match="not found"):
        mmspec.registry.make_drafter("draft-model:/no/such/draft", None)
    with pytest.raises(InvalidInputError, match="cannot make a drafter"):
        mmspec.registry.make_drafter(3, None)


@pytest.fixture(scope="module")
def other_vocab_llama(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    path = tmp_path_factory.mktemp("llama-vocab-100")
    cfg = LlamaConfig(vocab_size=100, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    LlamaForCausalLM(cfg).save_pretrained(path)
    return str(path)


def test_drafter_for_another_target(tiny_vlm, other_vocab_llama):
    with pytest.raises(DrafterMismatchError, match="vocabulary"):
        MMSpecPipeline.from_pretrained(tiny_vlm, drafter=f"draft-model:{other_vocab_llama}")


def test_drafter_for_another_target_per_call(no_model_work, other_vocab_llama, shapes_image):
    from transformers import AutoModelForCausalLM

    from mmspec.drafters import DraftModelDrafter

    drafter = DraftModelDrafter(AutoModelForCausalLM.from_pretrained(other_vocab_llama))
    with pytest.raises(DrafterMismatchError, match="vocabulary"):
        no_model_work(images=[shapes_image], prompt="Describe.", max_new_tokens=4, drafter=drafter)
