"""The plain AR image pipeline: the llama backend (training, save/load, CFG sampling) and transformers'
Janus in native image mode, through the same ImageARPipeline."""

import numpy as np
import pytest
import torch

from mmspec.errors import InvalidInputError

from mmspec.image_ar.generator import ImageARPipeline, _request_ids, _unconditional, generate_codes, train_generator
from mmspec.image_ar.vq import train_vq

PROMPT = "a small red circle in the center on a white background"


def test_llama_backend_trains_saves_and_samples(tmp_path):
    torch.set_num_threads(1)
    train_vq(str(tmp_path / "vq"), steps=2, batch_size=4, progress=False, codebook_size=32, code_dim=8, hidden=16)
    train_generator(str(tmp_path / "gen"), str(tmp_path / "vq"), steps=2, batch_size=4, size="tiny", save_every=1,
                    progress=False)
    pipe = train_generator(str(tmp_path / "gen"), str(tmp_path / "vq"), steps=3, batch_size=4, size="tiny",
                           save_every=1, progress=False)  # resumes
    loaded = ImageARPipeline.from_pretrained(str(tmp_path / "gen"))
    a = loaded(PROMPT, seed=3, cfg_scale=3.0, top_k=8)
    b = loaded(PROMPT, seed=3, cfg_scale=3.0, top_k=8)
    assert a.size == (64, 64) and np.array_equal(np.asarray(a), np.asarray(b))
    assert loaded.last_timings_ms["tokens"] == 256
    # No guidance unless the model says otherwise; a saved scale comes back and is what a bare call uses.
    assert loaded.cfg_scale == 1.0
    loaded.cfg_scale = 2.5
    loaded.save_pretrained(str(tmp_path / "guided"))
    guided = ImageARPipeline.from_pretrained(str(tmp_path / "guided"))
    assert guided.cfg_scale == 2.5
    assert np.array_equal(np.asarray(guided(PROMPT, seed=4)), np.asarray(guided(PROMPT, seed=4, cfg_scale=2.5)))
    assert not np.array_equal(np.asarray(guided(PROMPT, seed=4)), np.asarray(guided(PROMPT, seed=4, cfg_scale=1.0)))
    ids, mask = _request_ids(pipe.tokenizer, [PROMPT])
    unc = _unconditional(ids, pipe.tokenizer)
    assert (unc == pipe.tokenizer.pad_token_id).sum() == ids.shape[1] - 2  # only <bos> and <boi> are kept
    g = torch.Generator().manual_seed(0)
    codes = generate_codes(loaded.model, ids, mask, loaded.tokenizer, 5, cfg_scale=1.0, top_k=1, generator=g)
    # top-1 without guidance is greedy: each code is the argmax of the model's code logits.
    offset = int(loaded.model.generation_config.image_code_offset)
    seq = torch.cat([ids, codes + offset], 1)
    logits = loaded.model(input_ids=seq, attention_mask=torch.ones_like(seq)).logits[0, ids.shape[1] - 1:-1, offset:]
    assert torch.equal(logits.argmax(-1), codes[0])


def test_generator_grid_follows_the_image_size_and_workers_train_the_same_run(tmp_path):
    """image_size sets the grid (the VQ-VAE is convolutional); drawing the pictures in DataLoader workers trains
    the same weights as drawing them in the loop; a resume at another size is refused."""
    from safetensors.torch import load_file

    from mmspec.errors import InvalidInputError

    torch.set_num_threads(1)
    train_vq(str(tmp_path / "vq"), steps=1, batch_size=2, progress=False, codebook_size=16, code_dim=8, hidden=16)
    kw = dict(batch_size=2, size="tiny", save_every=1, progress=False, image_size=32)
    one = train_generator(str(tmp_path / "one"), str(tmp_path / "vq"), steps=3, **kw)
    assert one.grid == 8 and one.model.config.max_position_embeddings >= 64 + 8 * 8
    two = train_generator(str(tmp_path / "two"), str(tmp_path / "vq"), steps=3, workers=1, **kw)
    a, b = load_file(str(tmp_path / "one" / "model.safetensors")), load_file(str(tmp_path / "two" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    assert two(PROMPT, seed=0).size == (32, 32) and two.last_timings_ms["tokens"] == 64
    with pytest.raises(InvalidInputError, match="8 x 8 grid"):
        train_generator(str(tmp_path / "two"), str(tmp_path / "vq"), steps=4, **{**kw, "image_size": 64})


def tiny_janus(prompts):
    """A tiny random transformers Janus (image mode usable) and a tokenizer trained on ``prompts``."""
    from transformers import JanusConfig, JanusForConditionalGeneration

    from mmspec.image_ar.generator import _tokenizer

    tok = _tokenizer(list(prompts), 80)
    cfg = JanusConfig(
        text_config=dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                           image_size=32, patch_size=8, num_image_tokens=16),
        vq_config=dict(embed_dim=8, num_embeddings=64, base_channels=32, channel_multiplier=[1, 2], num_res_blocks=1,
                       latent_channels=8, image_token_embed_dim=64, projection_dim=64, num_patches=4))
    torch.manual_seed(0)
    model = JanusForConditionalGeneration(cfg).eval()
    model.generation_config.generation_kwargs = {"boi_token_id": tok.convert_tokens_to_ids("<boi>")}
    model.generation_config.bos_token_id = tok.bos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    return model, tok


def test_janus_native_image_mode_through_the_same_pipeline(tmp_path):
    model, tok = tiny_janus([PROMPT, "the letter A in red on a white background"])
    model.generation_config._from_model_config = False  # as a hub checkpoint's own generation config
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    pipe = ImageARPipeline.from_pretrained(str(tmp_path))
    assert pipe.backend == "janus"
    img = pipe(PROMPT, seed=1, cfg_scale=4.0, top_k=10)
    again = pipe(PROMPT, seed=1, cfg_scale=4.0, top_k=10)
    assert img.size == (8, 8) and np.array_equal(np.asarray(img), np.asarray(again))
    assert pipe.last_timings_ms["tokens"] == 16
    # No scale in its config: transformers' Janus default; a batch comes back one image per prompt; its image
    # mode cannot run unguided, which is said up front.
    assert pipe.cfg_scale == 5.0
    assert len(pipe([PROMPT, PROMPT], seed=1)) == 2 and pipe.last_timings_ms["tokens"] == 16
    assert np.array_equal(np.asarray(pipe(PROMPT, seed=2)), np.asarray(pipe(PROMPT, seed=2, cfg_scale=5.0)))
    with pytest.raises(InvalidInputError, match="always guides"):
        pipe(PROMPT, cfg_scale=1.0)
    pipe.cfg_scale = 4.0
    pipe.save_pretrained(str(tmp_path / "saved"))
    assert ImageARPipeline.from_pretrained(str(tmp_path / "saved")).cfg_scale == 4.0


def test_bundled_generator_draws_what_its_prompts_ask():
    """Quality guard for the shipped generator: at its own defaults (no guidance, temperature 1) the world
    classifier reads every asked field back from most pictures (86% at n = 200)."""
    from mmspec.image_ar.generator import bundled_generator
    from mmspec.image_ar.quality import WorldClassifier, bundled_classifier, prompt_accuracy
    from mmspec.workloads import get_workload

    if bundled_generator() is None or bundled_classifier() is None:  # an install without the repository's assets
        pytest.skip("no bundled generator and classifier in this install")
    torch.set_num_threads(1)
    pipe = ImageARPipeline.from_pretrained(bundled_generator())
    prompts = [ex.prompt for ex in get_workload("images").examples("test", 8)]
    images = pipe(prompts, seed=0)
    clf = WorldClassifier.from_pretrained(bundled_classifier())
    assert prompt_accuracy(clf, images, prompts)["all"] >= 5 / 8
    # Why guidance is off: the unconditional rows, seeing the codes so far, are nearly as sure (0.99 / 0.94).
    from mmspec.image_ar.evaluate import teacher_forced_accuracy

    sharp = teacher_forced_accuracy(pipe, get_workload("images").examples("test", 8))
    assert sharp["teacher_forced_accuracy"] >= 0.95 and sharp["unconditional_teacher_forced_accuracy"] >= 0.8


def test_bundled_spatial_head_follows_the_generators_grid():
    """The 16 x 16 and 32 x 32 generators share shape and tokenizer: the bundled head is chosen by grid too."""
    from pathlib import Path

    from mmspec.image_ar.ssd import bundled_spatial_head

    assets = Path(__file__).resolve().parents[1] / "image_ar" / "assets"
    found = {}
    for gen in ("image-gen", "image-gen-32"):
        if not (assets / gen / "image_generation.json").is_file():
            pytest.skip(f"no bundled {gen}")
        pipe = ImageARPipeline.from_pretrained(str(assets / gen))
        found[pipe.grid] = bundled_spatial_head(pipe.model)
    assert Path(found[16]).name == "spatial-head" and Path(found[32]).name == "spatial-head-32"
    del pipe.model.generation_config.image_grid  # no grid named, heads of two grids fit: no guess
    assert bundled_spatial_head(pipe.model) is None
