"""Compact (bfloat16 on disk, float32 on load) checkpoints of the shipped models: the driving VLA, the image
generator with its VQ-VAE, and the world classifier load back as the bf16-rounded float32 weights."""

import os

import torch

from mmspec.checkpoints import save_state_compact


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
    loaded = DrivingVLA.from_pretrained(str(tmp_path))
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
    loaded = ImageARPipeline.from_pretrained(str(tmp_path / "gen"))
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
    assert DrivingVLA.from_pretrained(out).expert.in_proj[0].weight.dtype == torch.float32
    WorldClassifier().save_pretrained(str(tmp_path / "clf"))
    small = export_classifier(str(tmp_path / "clf"), str(tmp_path / "clf-out"))
    assert os.path.getsize(os.path.join(small, "model.safetensors")) < 0.6 * os.path.getsize(tmp_path / "clf" / "model.safetensors")
