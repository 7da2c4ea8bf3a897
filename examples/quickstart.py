"""Quickstart: lossless speculative decoding on a tiny Qwen2-VL, offline.

Builds (or reuses) the tiny random Qwen2-VL of ``mmspec.demo``, loads it the way a hub checkpoint is
loaded, and decodes one image + prompt with the prompt-lookup drafter through the low-level
``mmspec.generate``; then checks the output against plain ``model.generate`` and prints the stats.
The model is random, so its text is gibberish; the speculative decoding is real.

Run:  python examples/quickstart.py [--out-dir DIR]
"""

from __future__ import annotations

import argparse

import torch
from transformers import AutoModelForImageTextToText, AutoProcessor

import mmspec
from mmspec.demo import draw_test_image, tiny_vlm_path
from mmspec.drafters import PromptLookupDrafter


def main(out_dir=None, max_new_tokens: int = 32) -> mmspec.GenerateOutput:
    path = tiny_vlm_path(out_dir)  # built once, then reused (~/.cache/mmspec/tiny-vlm by default)
    processor = AutoProcessor.from_pretrained(path)
    model = AutoModelForImageTextToText.from_pretrained(path).eval()

    image = draw_test_image()
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe the image."}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    inputs = processor(images=[image], text=[text], return_tensors="pt")

    out = mmspec.generate(model, inputs, drafter=PromptLookupDrafter(), max_new_tokens=max_new_tokens)
    with torch.no_grad():
        ref = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)

    new = out.sequences[0, inputs["input_ids"].shape[1]:]
    print("text:", repr(processor.decode(new, skip_special_tokens=True)))
    print("equals model.generate:", torch.equal(out.sequences, ref))
    print(out.stats)
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", default=None, help="where the tiny model lives (default: the mmspec cache)")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    a = ap.parse_args()
    main(a.out_dir, a.max_new_tokens)
