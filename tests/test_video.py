"""Video input: clips written with PyAV, read back with decord, decoded speculatively on a tiny Qwen2-VL.

Greedy output with a video must equal the target's own ``generate`` on the same processor inputs (fp32), at
batch 1 and 2 (clips of different lengths and sizes, so rows carry different numbers of video tokens).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mmspec
from mmspec.drafters import NoisyOracleDrafter
from mmspec.errors import InvalidInputError
from mmspec.vision.video import Video, load_video, sample_indices

av = pytest.importorskip("av")
pytest.importorskip("decord")

NEW = 16


def write_clip(path, n_frames: int, fps: int = 10, size=(64, 48)):
    """An mp4 (mpeg4) whose frame ``i`` has red level ``12 * i`` and a white bar starting at column ``2 * i``."""
    w, h = size
    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=fps)
        stream.width, stream.height, stream.pix_fmt = w, h, "yuv420p"
        for i in range(n_frames):
            frame = np.zeros((h, w, 3), np.uint8)
            frame[:, :, 0] = min(255, 12 * i)
            frame[h // 4: h // 2, 2 * i: 2 * i + 8] = 255
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return str(path)


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    d = tmp_path_factory.mktemp("clips")
    return write_clip(d / "a.mp4", 20), write_clip(d / "b.mp4", 28, fps=14, size=(80, 56))


def test_sampling_rule():
    assert sample_indices(20, 10.0, num_frames=4) == [0, 6, 13, 19]
    assert sample_indices(20, 10.0, fps=2.5) == [0, 5, 10, 14, 19]
    assert sample_indices(20, 10.0, fps=2.5, frame_multiple=2) == [0, 6, 13, 19]
    assert sample_indices(20, 10.0, fps=0.1, frame_multiple=2) == [0, 19]  # under one frame: one whole patch
    assert sample_indices(1, 10.0, fps=2.0, frame_multiple=2) == [0]  # the processor repeats it to fill the patch
    assert sample_indices(20, 10.0, fps=100.0) == list(range(20))  # capped at the clip's frames
    assert sample_indices(20, 10.0, fps=100.0, max_frames=6, frame_multiple=4) == [0, 6, 13, 19]
    assert sample_indices(20, 10.0) == sample_indices(20, 10.0, fps=2.0)  # the default rate
    for bad in (dict(fps=1.0, num_frames=2), dict(num_frames=0), dict(num_frames=21), dict(fps=0.0),
                dict(fps=float("nan")), dict(num_frames=2.5)):
        with pytest.raises(InvalidInputError):
            sample_indices(20, 10.0, **bad)
    with pytest.raises(InvalidInputError, match="frame rate"):
        sample_indices(20, 0.0, fps=2.0)
    with pytest.raises(InvalidInputError, match="no frames"):
        sample_indices(0, 10.0, num_frames=1)


def test_clip_written_with_pyav_reads_back(clips):
    video = load_video(clips[0], num_frames=4)
    assert isinstance(video, Video) and video.frames.dtype == np.uint8
    assert video.frames.shape == (4, 48, 64, 3)
    m = video.metadata
    assert (m.total_num_frames, m.fps, m.width, m.height, m.duration) == (20, 10.0, 64, 48, 2.0)
    assert m.frames_indices == [0, 6, 13, 19] and m.sampled_fps == pytest.approx(2.0)
    # The frames are the ones asked for, in order: the bar's left edge is at column 2 * index.
    for frame, i in zip(video.frames, m.frames_indices):
        bright = frame[16:20, :, 1].mean(axis=0) > 128
        assert abs(int(np.argmax(bright)) - 2 * i) <= 1
    assert load_video(video) is video
    assert load_video(clips[0], fps=5.0).num_frames == 10


def test_bad_clips_say_why(tmp_path, clips):
    with pytest.raises(InvalidInputError, match="not found"):
        load_video(tmp_path / "missing.mp4")
    with pytest.raises(InvalidInputError, match="folder"):
        load_video(tmp_path)
    (tmp_path / "empty.mp4").write_bytes(b"")
    with pytest.raises(InvalidInputError, match="empty"):
        load_video(tmp_path / "empty.mp4")
    (tmp_path / "junk.mp4").write_bytes(b"not a video at all " * 64)
    with pytest.raises(InvalidInputError, match="unreadable"):
        load_video(tmp_path / "junk.mp4")
    with av.open(str(tmp_path / "none.mp4"), "w") as c:  # a container with a stream and no frames
        s = c.add_stream("mpeg4", rate=10)
        s.width, s.height, s.pix_fmt = 32, 32, "yuv420p"
        c.start_encoding()
    with pytest.raises(InvalidInputError, match="has no frames"):
        load_video(tmp_path / "none.mp4")
    with pytest.raises(InvalidInputError, match="more frames than the clip holds"):
        load_video(clips[0], num_frames=50)
    with pytest.raises(InvalidInputError, match="URL"):
        load_video("https://example.com/clip.mp4")
    with pytest.raises(InvalidInputError, match="path of a video file"):
        load_video(np.zeros((2, 4, 4, 3)))


def _reference(pipe, clip_lists, prompts, **sampling):
    """The processor run by hand (chat template with video entries, frames sampled here) and plain generate."""
    texts, frames, metas = [], [], []
    for clip_list, p in zip(clip_lists, prompts):
        content = [{"type": "video"} for _ in clip_list] + [{"type": "text", "text": p}]
        texts.append(pipe.processor.apply_chat_template([{"role": "user", "content": content}],
                                                        add_generation_prompt=True, tokenize=False))
        for c in clip_list:
            v = load_video(c, frame_multiple=2, **sampling)
            frames.append(v.frames)
            metas.append(v.metadata)
    inputs = pipe.processor(text=texts, videos=frames, video_metadata=metas, do_sample_frames=False,
                            return_tensors="pt", padding=True)
    with torch.no_grad():
        return inputs, pipe.model.generate(**inputs, max_new_tokens=NEW, do_sample=False)


def _vocab(pipe) -> int:
    return int(pipe.model.get_output_embeddings().weight.shape[0])


def test_video_greedy_equals_generate(vlm_pipe, clips):
    prompt = "What happens in the video?"
    inputs, ref = _reference(vlm_pipe, [[clips[0]]], [prompt], num_frames=4)
    assert int((inputs["input_ids"] == vlm_pipe.model.config.video_token_id).sum()) == \
        int(inputs["video_grid_thw"].prod(-1).sum()) // 4  # 2x2 merged patches
    out = vlm_pipe(video=clips[0], num_frames=4, prompt=prompt, max_new_tokens=NEW)
    assert torch.equal(out.sequences, ref) and out.stats.lossless
    plen = inputs["input_ids"].shape[1]
    assert out.text == vlm_pipe.decode_new(ref, plen)[0]
    # A drafter that is mostly right: accepted drafts sit after the video's M-RoPE positions (the rope delta).
    oracle = NoisyOracleDrafter(ref[:, plen:], depth=4, corrupt_p=0.3, vocab_size=_vocab(vlm_pipe),
                                seed=0)
    spec = mmspec.generate(vlm_pipe.model, vlm_pipe.prepare(video=clips[0], num_frames=4, prompt=prompt),
                           drafter=oracle, max_new_tokens=NEW)
    assert torch.equal(spec.sequences, ref) and spec.stats.tau > 1.5


def test_video_batch_equals_generate(vlm_pipe, clips):
    """Two rows, clips of different rates and sizes (different numbers of video tokens), plus an image row."""
    prompts = ["What happens?", "Describe the motion."]
    inputs, ref = _reference(vlm_pipe, [[clips[0]], [clips[1]]], prompts, fps=4.0)
    assert inputs["video_grid_thw"][:, 0].tolist() == [4, 4]  # 8 frames each: 4 temporal patches
    assert inputs["video_grid_thw"][0].tolist() != inputs["video_grid_thw"][1].tolist()
    out = vlm_pipe(video=list(clips), fps=4.0, prompt=prompts, max_new_tokens=NEW)
    assert torch.equal(out.sequences, ref)
    plen = inputs["input_ids"].shape[1]
    oracle = NoisyOracleDrafter(ref[:, plen:], depth=3, corrupt_p=0.2, extra_branches=2,
                                vocab_size=_vocab(vlm_pipe), seed=3)
    spec = mmspec.generate(vlm_pipe.model, vlm_pipe.prepare(video=list(clips), fps=4.0, prompt=prompts),
                           drafter=oracle, max_new_tokens=NEW)
    assert torch.equal(spec.sequences, ref)


def test_video_request_errors(vlm_pipe, clips, tiny_vlm):
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from mmspec.vision import VLMPipeline

    with pytest.raises(InvalidInputError, match="not found"):
        vlm_pipe(video="/no/such/clip.mp4", prompt="What happens?")
    with pytest.raises(InvalidInputError, match="prompt 1: video file not found"):
        vlm_pipe(video=[clips[0], "/no/such/clip.mp4"], prompt=["a", "b"])
    with pytest.raises(InvalidInputError, match="list of 2 entries"):
        vlm_pipe(video=clips[0], prompt=["a", "b"])
    with pytest.raises(InvalidInputError, match="not both"):
        vlm_pipe(video=clips[0], fps=2, num_frames=4, prompt="a")
    with pytest.raises(InvalidInputError, match="pass video=PATH"):
        vlm_pipe(fps=2, prompt="a")
    tok = AutoTokenizer.from_pretrained(tiny_vlm)
    llama = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)).eval()
    with pytest.raises(InvalidInputError, match="takes no video"):
        VLMPipeline(llama, tok)(video=clips[0], prompt="What happens?")


def test_qwen2_5_vl_processor_gets_seconds_per_grid(vlm_pipe, clips):
    """Qwen2.5-VL's temporal positions read second_per_grid_ts = temporal patch / sampled rate."""
    from transformers import Qwen2_5_VLProcessor

    from mmspec.vision import VLMPipeline

    old = vlm_pipe.processor
    proc = Qwen2_5_VLProcessor(image_processor=old.image_processor, video_processor=old.video_processor,
                               tokenizer=old.tokenizer, chat_template=old.chat_template)
    pipe = VLMPipeline(vlm_pipe.model, proc)
    inputs = pipe.prepare(video=clips[0], fps=5.0, prompt="What happens?")  # 10 of 20 frames at 10 fps: 5 fps
    assert inputs["second_per_grid_ts"].tolist() == pytest.approx([2 / 5.0])
    assert inputs["video_grid_thw"][0, 0].item() == 5


def test_cli_generate_with_a_video(tiny_vlm, vlm_pipe, clips, capsys):
    import json

    from mmspec.cli import main

    assert main(["generate", "--model", tiny_vlm, "--video", clips[0], "--num-frames", "4", "--prompt", "What happens?",
                 "--max-new-tokens", "6", "--json"]) == 0
    got = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert got["text"] == vlm_pipe(video=clips[0], num_frames=4, prompt="What happens?", max_new_tokens=6).text
    assert main(["generate", "--model", tiny_vlm, "--video", "/no/such/clip.mp4", "--prompt", "What happens?"]) == 2
    assert "video file not found: /no/such/clip.mp4" in capsys.readouterr().err


def test_qwen2_5_vl_video_greedy_equals_generate(vlm_pipe, clips):
    """Qwen2.5-VL places video tokens in time by second_per_grid_ts: mmspec's prefill positions and drafted tokens
    must follow it exactly as generate does (a tiny random Qwen2.5-VL on the tiny VLM's tokenizer)."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2_5_VLProcessor

    from mmspec.vision import VLMPipeline

    old = vlm_pipe.processor
    base = vlm_pipe.model.config
    text = base.text_config.to_dict()
    # Weights large enough that a token's temporal position changes the output (checked below).
    text.update(rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
                initializer_range=0.3)
    cfg = Qwen2_5_VLConfig(text_config=text, vision_config=dict(
        depth=1, hidden_size=32, out_hidden_size=text["hidden_size"], intermediate_size=64, num_heads=2, patch_size=14,
        spatial_merge_size=2, temporal_patch_size=2, window_size=56, fullatt_block_indexes=[0], initializer_range=0.3),
        image_token_id=base.image_token_id, video_token_id=base.video_token_id,
        vision_start_token_id=base.vision_start_token_id, vision_end_token_id=base.vision_end_token_id,
        tie_word_embeddings=True)
    torch.manual_seed(0)
    model = Qwen2_5_VLForConditionalGeneration(cfg).eval()
    model.generation_config.eos_token_id = vlm_pipe.model.generation_config.eos_token_id
    model.generation_config.pad_token_id = vlm_pipe.model.generation_config.pad_token_id
    proc = Qwen2_5_VLProcessor(image_processor=old.image_processor, video_processor=old.video_processor,
                               tokenizer=old.tokenizer, chat_template=old.chat_template)
    pipe = VLMPipeline(model, proc, drafter="lookup")
    prompts = ["What happens?", "Describe the motion."]
    inputs = pipe.prepare(video=list(clips), fps=4.0, prompt=prompts)
    assert inputs["second_per_grid_ts"].tolist() == pytest.approx([0.5, 0.5])  # 8 frames of 2 s: 4 fps
    timeless = {k: v for k, v in inputs.items() if k != "second_per_grid_ts"}
    with torch.no_grad():
        ref = model.generate(**inputs, max_new_tokens=NEW, do_sample=False)
        assert not torch.equal(model.generate(**timeless, max_new_tokens=NEW, do_sample=False), ref)
    assert torch.equal(pipe(video=list(clips), fps=4.0, prompt=prompts, max_new_tokens=NEW).sequences, ref)
    plen = inputs["input_ids"].shape[1]
    oracle = NoisyOracleDrafter(ref[:, plen:], depth=4, corrupt_p=0.25, vocab_size=_vocab(pipe), seed=5)
    spec = mmspec.generate(model, inputs, drafter=oracle, max_new_tokens=NEW)
    assert torch.equal(spec.sequences, ref) and spec.stats.tau > 1.5
