# How the target's tokenizer segments the answers of docs items, real and scrambled: the share of answer tokens that
# are one character, and characters per token. Scrambled words are not in the BPE merges, so training on scrambled
# items already asks the model to copy (mostly) one character at a time: what BPE-dropout would have added.
# Usage: python results/vision/probes/token_chars.py [MODEL_DIR or "" for the bundled target] [N]
import sys
from transformers import AutoProcessor
from mmspec.vision.testbed import bundled_target, make_batch
from mmspec.workloads import get_workload
path = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] else bundled_target()
n = int(sys.argv[2]) if len(sys.argv) > 2 else 16
proc = AutoProcessor.from_pretrained(path)
tok = proc.tokenizer
special = set(tok.all_special_tokens)
for scrambled in (0.0, 1.0):
    for mode in ("line", "block", "page"):
        exs = get_workload("docs", mode=mode, scrambled_fraction=scrambled).examples("test", n)
        b = make_batch(proc, exs)
        pieces = [p for p in tok.convert_ids_to_tokens(b["input_ids"][b["labels"] != -100].tolist()) if p not in special]
        single = sum(len(p) == 1 for p in pieces) / len(pieces)
        print(f"{'scrambled' if scrambled else 'real'} {mode}: {len(pieces)} tokens, one character {single:.2f}, "
              f"characters per token {sum(map(len, pieces)) / len(pieces):.2f}", flush=True)
