"""Compact (bfloat16 on disk) checkpoints of the shipped models: the driving VLA, the image generator with its
VQ-VAE, and the world classifier load back as the bf16-rounded weights (float32 when asked, the stored bf16 by
default where the device computes in it); what ``dtype="auto"`` means."""

import os

import pytest
import torch

from mmspec.checkpoints import save_state_compact
from mmspec.errors import InvalidInputError


def _rounded(state):
    return {k: v.to(torch.bfloat16).float() if v.is_floating_point() else v for k, v in state.items()}


def test_driving_vla_round_trips_in_bfloat16(tmp_path):
    from mmspec.drivers.train_vla import DrivingVLA, build_vla

    torch.manual_seed(0)
    vla = build_vla("tiny", tokenizer_texts=40, vocab_size=300).eval()
    before = {k: v.clone() for k, v in vla.backbone.state_dict().items()}
    vla.save_pretrained(str(tmp_path), dtype=torch.bfloat16)
    for k, v in vla.backbone.state_dict().items():  # saving compactly must not round the live model
        assert torch.equal(v, before[k]), k
    assert os.path.getsize(tmp_path / "model.safetensors") < 0.6 * 4 * sum(p.numel() for p in vla.backbone.parameters())
    loaded = DrivingVLA.from_pretrained(str(tmp_path), dtype="float32")
    assert loaded.backbone.dtype == torch.float32 and next(vla.backbone.parameters()).dtype == torch.float32
    want = _rounded(vla.expert.state_dict())
    for k, v in loaded.expert.state_dict().items():
        assert v.dtype == torch.float32 and torch.equal(v, want[k]), k
    w = _rounded(vla.backbone.state_dict())
    for k, v in loaded.backbone.state_dict().items():
        assert torch.equal(v, w[k]), k


def test_generator_vq_and_classifier_round_trip_in_bfloat16(tmp_path):
    from mmspec.image_ar.generator import ImageARPipeline, build_generator
    from mmspec.image_ar.quality import WorldClassifier
    from mmspec.image_ar.vq import VQVAE

    torch.manual_seed(0)
    vq = VQVAE(codebook_size=16, code_dim=8, hidden=16).eval()
    model, tok = build_generator(vq, "tiny", tokenizer_texts=50, vocab_size=120)
    pipe = ImageARPipeline(model, tok, vq, grid=16)
    pipe.save_pretrained(str(tmp_path / "gen"), dtype=torch.bfloat16)
    loaded = ImageARPipeline.from_pretrained(str(tmp_path / "gen"), dtype=torch.float32)
    assert loaded.model.dtype == torch.float32
    for ref, got in ((model, loaded.model), (vq, loaded.vq)):
        want = _rounded(ref.state_dict())
        for k, v in got.state_dict().items():
            assert v.dtype == want[k].dtype and torch.equal(v, want[k]), k
    a = loaded("a red circle in the center on a white background", seed=1, cfg_scale=2.0)
    assert a.size == (64, 64)
    clf = WorldClassifier().eval()
    clf.save_pretrained(str(tmp_path / "clf"), dtype=torch.bfloat16)
    back = WorldClassifier.from_pretrained(str(tmp_path / "clf"))
    assert torch.equal(back.heads["pattern"].weight, clf.heads["pattern"].weight.to(torch.bfloat16).float())


def test_state_without_dtype_is_written_as_is(tmp_path):
    from safetensors.torch import load_file

    save_state_compact({"w": torch.tensor([1.0 / 3])}, str(tmp_path / "w.safetensors"))
    assert load_file(str(tmp_path / "w.safetensors"))["w"].item() == torch.tensor(1.0 / 3).item()


def test_exports_write_loadable_compact_copies(tmp_path):
    from mmspec.drivers.train_vla import DrivingVLA, build_vla, export_vla
    from mmspec.image_ar.quality import WorldClassifier, export_classifier

    torch.manual_seed(0)
    build_vla("tiny", tokenizer_texts=40, vocab_size=300).save_pretrained(str(tmp_path / "vla"))
    (tmp_path / "vla" / "train_log.jsonl").write_text('{"step": 1}\n')
    out = export_vla(str(tmp_path / "vla"), str(tmp_path / "vla-out"))
    assert (tmp_path / "vla-out" / "train_log.jsonl").exists()
    assert DrivingVLA.from_pretrained(out, dtype="float32").expert.in_proj[0].weight.dtype == torch.float32
    WorldClassifier().save_pretrained(str(tmp_path / "clf"))
    small = export_classifier(str(tmp_path / "clf"), str(tmp_path / "clf-out"))
    assert os.path.getsize(os.path.join(small, "model.safetensors")) < 0.6 * os.path.getsize(tmp_path / "clf" / "model.safetensors")


def _native(monkeypatch, yes: bool):
    """Pretend the CPU computes in bf16 natively (``yes``) or only emulates it, whatever this machine is."""
    import mmspec.checkpoints as ck

    monkeypatch.setattr(ck, "native_dtype", lambda dtype, device="cpu": yes or dtype == torch.float32)


def test_auto_is_the_stored_dtype_where_native_else_float32(tmp_path, monkeypatch):
    from mmspec.checkpoints import dtype_note, resolve_dtype, stored_dtype
    from mmspec.drivers.train_vla import DrivingVLA, build_vla

    torch.manual_seed(0)
    vla = build_vla("tiny", tokenizer_texts=40, vocab_size=300).eval()
    vla.save_pretrained(str(tmp_path / "bf16"), dtype=torch.bfloat16)
    vla.save_pretrained(str(tmp_path / "fp32"))
    assert stored_dtype(tmp_path / "bf16") == torch.bfloat16 and stored_dtype(tmp_path / "fp32") == torch.float32
    _native(monkeypatch, True)
    assert resolve_dtype("auto", tmp_path / "bf16") == torch.bfloat16 and dtype_note("auto", tmp_path / "bf16") is None
    loaded = DrivingVLA.from_pretrained(str(tmp_path / "bf16"))  # its config.json says float32: the weights decide
    assert loaded.backbone.dtype == torch.bfloat16 and loaded.expert.in_proj[0].weight.dtype == torch.bfloat16
    assert DrivingVLA.from_pretrained(str(tmp_path / "fp32")).backbone.dtype == torch.float32
    _native(monkeypatch, False)
    assert resolve_dtype(None, tmp_path / "bf16") == torch.float32
    assert "run in float32" in dtype_note("auto", tmp_path / "bf16")
    assert resolve_dtype("bfloat16", tmp_path / "bf16") == torch.bfloat16  # a named dtype is always obeyed
    assert dtype_note("bfloat16", tmp_path / "bf16") is None


def test_bad_dtype_names_are_clear_errors(tmp_path):
    import pytest

    from mmspec.checkpoints import resolve_dtype
    from mmspec.cli import main
    from mmspec.errors import InvalidInputError

    with pytest.raises(InvalidInputError, match="unknown dtype 'bogus'.*auto, bfloat16, float16, float32"):
        resolve_dtype("bogus")
    with pytest.raises(InvalidInputError, match="unknown dtype"):
        from mmspec import MMSpecPipeline

        MMSpecPipeline.from_pretrained(str(tmp_path), dtype="int3")
    for cmd in (["generate", "--model", "m", "--prompt", "p"], ["bench"], ["demo"], ["train", "--target", "t", "--out", "o"]):
        with pytest.raises(SystemExit) as e:
            main(cmd + ["--dtype", "bogus"])
        assert e.value.code == 2


def test_bundled_models_are_stored_in_bfloat16():
    """What ``auto`` loads the shipped checkpoints in, where the device computes in bf16."""
    from mmspec.checkpoints import stored_dtype
    from mmspec.drivers.train_vla import VLA_DIR
    from mmspec.image_ar.generator import GENERATOR_DIR
    from mmspec.vision.testbed import TARGET_DIR

    for path in (TARGET_DIR, VLA_DIR, GENERATOR_DIR):
        if os.path.isdir(path):
            assert stored_dtype(path) == torch.bfloat16, path


def test_pipeline_and_its_drafters_follow_the_target_dtype(tmp_path, monkeypatch, tiny_vlm):
    """``MMSpecPipeline.from_pretrained(dtype=...)``: the target in that dtype, and an eagle head built for it too
    (unless its spec names another)."""
    from mmspec import MMSpecPipeline
    from mmspec.drafters import EagleDrafter

    head = EagleDrafter.from_target(MMSpecPipeline.from_pretrained(tiny_vlm).model)
    head.save_pretrained(str(tmp_path / "head"))
    pipe = MMSpecPipeline.from_pretrained(tiny_vlm, drafter=f"eagle:{tmp_path / 'head'}", dtype="bfloat16")
    assert pipe.model.dtype == torch.bfloat16 and pipe.drafter.fc.weight.dtype == torch.bfloat16
    pipe = MMSpecPipeline.from_pretrained(tiny_vlm, drafter=f"eagle:{tmp_path / 'head'};dtype=float32",
                                          dtype="bfloat16")
    assert pipe.drafter.fc.weight.dtype == torch.float32
    out = pipe(images=None, prompt="hello", max_new_tokens=4)  # a float32 head over bf16 states runs
    assert out.sequences.shape[1] > 0
    assert MMSpecPipeline.from_pretrained(tiny_vlm).model.dtype == torch.float32  # stored in float32


def test_bundled_target_and_head_load_in_bfloat16_where_native(monkeypatch):
    from mmspec import MMSpecPipeline
    from mmspec.vision.testbed import TARGET_DIR

    if not os.path.isdir(TARGET_DIR):
        import pytest

        pytest.skip("no bundled target in this checkout")
    _native(monkeypatch, True)
    pipe = MMSpecPipeline.from_pretrained(TARGET_DIR, drafter="eagle")
    assert pipe.model.dtype == torch.bfloat16 and pipe.drafter.fc.weight.dtype == torch.bfloat16
    _native(monkeypatch, False)
    assert MMSpecPipeline.from_pretrained(TARGET_DIR).model.dtype == torch.float32


def test_auto_falls_back_to_the_configs_dtype_where_weights_are_unreadable(tmp_path, monkeypatch, tiny_vlm):
    """A checkpoint whose stored dtype mmspec cannot read (``.bin`` weights, a hub id: simulated here) follows its
    config's dtype in ``auto``, except where that dtype would be emulated."""
    import shutil

    from transformers import AutoModelForImageTextToText

    import mmspec.checkpoints as ck
    from mmspec import MMSpecPipeline

    out = tmp_path / "bf16"
    shutil.copytree(tiny_vlm, out)
    AutoModelForImageTextToText.from_pretrained(tiny_vlm).to(torch.bfloat16).save_pretrained(str(out))
    monkeypatch.setattr(ck, "stored_dtype", lambda path: None)
    _native(monkeypatch, True)
    assert MMSpecPipeline.from_pretrained(str(out)).model.dtype == torch.bfloat16  # its config says bf16
    _native(monkeypatch, False)
    assert MMSpecPipeline.from_pretrained(str(out)).model.dtype == torch.float32


@pytest.mark.parametrize("content", [b"", b"\x05\x00\x00\x00\x00\x00\x00\x00{not", b"\xff" * 64,
                                     (4).to_bytes(8, "little") + b"[1,2"])
def test_a_damaged_weights_file_is_a_clear_error(tmp_path, content):
    """Reading the stored dtype of a folder whose safetensors file is cut short or garbage names the file,
    rather than failing deep in JSON or memory allocation."""
    from mmspec.checkpoints import stored_dtype

    (tmp_path / "model.safetensors").write_bytes(content)
    with pytest.raises(InvalidInputError, match="model.safetensors is not a readable safetensors file"):
        stored_dtype(tmp_path)
