"""MMSpecPipeline on a tiny real Qwen2-VL: output equals plain greedy model.generate, registry behaviour."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from mmspec import MMSpecPipeline, SpecStats
from mmspec.pipelines import PipelineOutput
from mmspec.registry import (drafter_kinds, make_drafter, pipeline_class_for, register_drafter, supported_model_types,
                             supported_tasks)

MAX_NEW = 16


@pytest.fixture(scope="module")
def noise_image():
    rng = np.random.default_rng(0)
    return Image.fromarray(rng.integers(0, 256, (70, 90, 3), dtype=np.uint8))


def reference(path, model, prompts, image_lists, max_new=MAX_NEW):
    """Plain ``model.generate`` on the same chat prompt, built here without the pipeline."""
    from transformers import AutoProcessor

    proc = AutoProcessor.from_pretrained(path)
    proc.tokenizer.padding_side = "left"
    texts = []
    for p, ims in zip(prompts, image_lists):
        content = [{"type": "image"} for _ in ims] + [{"type": "text", "text": p}]
        texts.append(proc.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                              tokenize=False))
    flat = [im for ims in image_lists for im in ims]
    inputs = proc(images=flat or None, text=texts, return_tensors="pt", padding=True)
    with torch.no_grad():
        seq = model.generate(**inputs, max_new_tokens=max_new, do_sample=False)
    plen = inputs["input_ids"].shape[1]
    return seq, [proc.decode(row[plen:], skip_special_tokens=True) for row in seq]


def test_from_pretrained_picks_the_vlm_pipeline(vlm_pipe):
    from mmspec.vision import VLMPipeline

    assert type(vlm_pipe) is VLMPipeline
    assert type(vlm_pipe.model).__name__ == "Qwen2VLForConditionalGeneration"
    assert vlm_pipe.tokenizer.padding_side == "left"
    assert vlm_pipe.drafter.kind == "lookup"


def test_single_image_equals_generate(vlm_pipe, tiny_vlm, shapes_image):
    prompt = "Describe the image. How many shapes are there?"
    out = vlm_pipe(images=[shapes_image], prompt=prompt, max_new_tokens=MAX_NEW)
    ref, ref_text = reference(tiny_vlm, vlm_pipe.model, [prompt], [[shapes_image]])
    assert isinstance(out, PipelineOutput) and isinstance(out.text, str)
    assert torch.equal(out.sequences, ref)
    assert out.text == ref_text[0]
    assert isinstance(out.stats, SpecStats)
    assert out.stats.drafter == "lookup" and out.stats.lossless
    assert out.stats.generated == ref.shape[1] - vlm_pipe.prepare([shapes_image], prompt)["input_ids"].shape[1]
    assert out.stats.tau >= 1.0


def test_single_image_not_in_a_list(vlm_pipe, shapes_image):
    a = vlm_pipe(images=shapes_image, prompt="Describe the image.", max_new_tokens=8)
    b = vlm_pipe(images=[shapes_image], prompt="Describe the image.", max_new_tokens=8)
    assert torch.equal(a.sequences, b.sequences)


def test_two_images_equal_generate(vlm_pipe, tiny_vlm, shapes_image, noise_image):
    prompt = "What differs between the two pictures?"
    out = vlm_pipe(images=[shapes_image, noise_image], prompt=prompt, max_new_tokens=MAX_NEW)
    ref, ref_text = reference(tiny_vlm, vlm_pipe.model, [prompt], [[shapes_image, noise_image]])
    assert int((out.sequences[0] == vlm_pipe.model.config.image_token_id).sum()) > 0
    assert torch.equal(out.sequences, ref)
    assert out.text == ref_text[0]


def test_batch_of_two_prompts_equals_generate(vlm_pipe, tiny_vlm, shapes_image, noise_image):
    prompts = ["Describe the image.", "How many shapes are there in this picture, and what colors are they?"]
    images = [[shapes_image], [noise_image, shapes_image]]
    out = vlm_pipe(images=images, prompt=prompts, max_new_tokens=MAX_NEW)
    ref, ref_text = reference(tiny_vlm, vlm_pipe.model, prompts, images)
    assert isinstance(out.text, list) and len(out.text) == 2
    assert torch.equal(out.sequences, ref)
    assert out.text == ref_text
    assert out.stats.prefill_rows == 2


def test_text_only_prompt_to_a_vlm(vlm_pipe, tiny_vlm):
    out = vlm_pipe(prompt="The quick brown fox", max_new_tokens=MAX_NEW)
    ref, ref_text = reference(tiny_vlm, vlm_pipe.model, ["The quick brown fox"], [[]])
    assert torch.equal(out.sequences, ref) and out.text == ref_text[0]


def test_image_types_give_the_same_output(vlm_pipe, shapes_image, image_file):
    arr = np.array(shapes_image)
    tensor = torch.from_numpy(arr).permute(2, 0, 1).contiguous()  # CHW uint8
    outs = [vlm_pipe(images=[im], prompt="Describe.", max_new_tokens=6).sequences
            for im in (shapes_image, image_file, arr, tensor, arr.astype(np.float32) / 255.0)]
    for o in outs[1:]:
        assert torch.equal(o, outs[0])


def test_no_drafter_and_per_call_drafter(vlm_pipe, shapes_image):
    base = vlm_pipe(images=[shapes_image], prompt="Describe.", max_new_tokens=10)
    plain = vlm_pipe(images=[shapes_image], prompt="Describe.", max_new_tokens=10, drafter=None)
    chain = vlm_pipe(images=[shapes_image], prompt="Describe.", max_new_tokens=10,
                     drafter={"kind": "lookup", "max_matches": 1, "num_draft_tokens": 3})
    assert plain.stats.drafter == "" and chain.stats.drafter == "lookup"
    assert torch.equal(base.sequences, plain.sequences) and torch.equal(base.sequences, chain.sequences)


def test_sampling_is_seeded(vlm_pipe, shapes_image):
    a = vlm_pipe(images=[shapes_image], prompt="Describe.", max_new_tokens=8, do_sample=True, seed=3)
    b = vlm_pipe(images=[shapes_image], prompt="Describe.", max_new_tokens=8, do_sample=True, seed=3)
    assert torch.equal(a.sequences, b.sequences)
    assert a.stats.rule == "speculative_sampling"


@pytest.fixture(scope="module")
def tiny_draft_vlm(tmp_path_factory):
    from mmspec.demo import build_tiny_vlm

    return build_tiny_vlm(tmp_path_factory.mktemp("tiny-draft-vlm"), seed=1)


def test_draft_model_from_a_path(tiny_vlm, tiny_draft_vlm, shapes_image):
    pipe = MMSpecPipeline.from_pretrained(tiny_vlm, drafter=f"draft-model:{tiny_draft_vlm}")
    assert pipe.drafter.kind == "draft-model"
    assert type(pipe.drafter.model) is type(pipe.model)  # same auto class as the target
    out = pipe(images=[shapes_image], prompt="Describe the image.", max_new_tokens=MAX_NEW)
    ref, ref_text = reference(tiny_vlm, pipe.model, ["Describe the image."], [[shapes_image]])
    assert torch.equal(out.sequences, ref) and out.text == ref_text[0]
    assert out.stats.drafter == "draft-model"


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory, tiny_vlm):
    """A text-only Llama sharing the tiny VLM's tokenizer (loaded with AutoModelForCausalLM)."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from mmspec.demo import CHAT_TEMPLATE

    path = tmp_path_factory.mktemp("tiny-llama")
    tok = AutoTokenizer.from_pretrained(tiny_vlm)
    tok.chat_template = CHAT_TEMPLATE
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      initializer_range=0.1, eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
                      pad_token_id=tok.pad_token_id, bos_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def test_text_only_target_uses_causal_lm(tiny_llama):
    pipe = MMSpecPipeline.from_pretrained(tiny_llama, drafter="lookup")
    assert type(pipe.model).__name__ == "LlamaForCausalLM"
    prompts = ["Describe the image.", "The quick brown fox jumps over the lazy dog."]
    out = pipe(prompt=prompts, max_new_tokens=MAX_NEW)
    enc = pipe.tokenizer([pipe.tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                                             add_generation_prompt=True) for p in prompts],
                         return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.no_grad():
        ref = pipe.model.generate(**enc, max_new_tokens=MAX_NEW, do_sample=False)
    assert torch.equal(out.sequences, ref)
    assert out.text == pipe.tokenizer.batch_decode(ref[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)


# ---------------------------------------------------------------------------- registry
def test_registry_lookups():
    from mmspec.vision import VLMPipeline

    assert "vlm" in supported_tasks()
    assert {"qwen2_vl", "qwen2_5_vl", "llama"} <= set(supported_model_types("vlm"))
    assert pipeline_class_for() is VLMPipeline  # default task
    assert pipeline_class_for(model_type="qwen2_vl") is VLMPipeline
    assert pipeline_class_for(task="vlm", model_type="t5") is VLMPipeline  # explicit task wins
    assert {"lookup", "draft-model"} <= set(drafter_kinds())


def test_make_drafter_spellings():
    from mmspec.drafters import PromptLookupDrafter

    d = PromptLookupDrafter(num_draft_tokens=2)
    assert make_drafter(None, None) is None
    assert make_drafter(d, None) is d
    assert isinstance(make_drafter("lookup", None), PromptLookupDrafter)
    assert make_drafter({"kind": "lookup", "max_matches": 2}, None).max_matches == 2
    assert make_drafter("lookup", None, num_draft_tokens=5).num_draft_tokens == 5


def test_register_drafter_adds_a_kind():
    from mmspec.drafters import PromptLookupDrafter

    register_drafter("test-chain", lambda target, path=None, **kw: PromptLookupDrafter(max_matches=1, **kw))
    assert make_drafter("test-chain", None).max_matches == 1
    assert "test-chain" in drafter_kinds()


def test_core_never_imports_modality_packages_at_import_time():
    code = ("import sys, mmspec, mmspec.decode, mmspec.pipelines, mmspec.registry, mmspec.cli, mmspec.demo, "
            "mmspec.drafters\n"
            "bad = [m for m in ('mmspec.vision', 'mmspec.drivers', 'mmspec.image_ar') if m in sys.modules]\n"
            "assert not bad, bad\n"
            "from mmspec import MMSpecPipeline\n"
            "assert 'mmspec.vision' not in sys.modules\n"
            "from mmspec.registry import pipeline_class_for\n"
            "pipeline_class_for()\n"
            "assert 'mmspec.vision' in sys.modules\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_quickstart_example_runs_offline(tmp_path, capsys):
    import runpy
    from pathlib import Path

    example = Path(__file__).resolve().parents[1] / "examples" / "quickstart.py"
    quickstart = runpy.run_path(str(example), run_name="quickstart")
    out = quickstart["main"](out_dir=str(tmp_path / "tiny"), max_new_tokens=8)
    printed = capsys.readouterr().out
    assert "equals model.generate: True" in printed and "SpecStats[lookup" in printed
    assert out.stats.generated >= 1
