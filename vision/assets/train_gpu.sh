#!/usr/bin/env bash
# Train the testbed target on a lent GPU (the device tool's `run`) for a wall-clock budget, from a checkpoint
# carried in the working tree, and bring the result back in <= 16 MiB files.
#
# Three steps, two of them here:
#
# 1. HERE, once:  vision/assets/train_gpu.sh prepare /work/ckpt/SOURCE
#    fills .carry/ (ignored through .git/info/exclude): the source checkpoint (weights in bfloat16, config saying
#    float32: from_pretrained upcasts; INIT_DTYPE=float32 keeps them exact at twice the bytes) with its probes
#    (reader, locator, speller, relay: probes.pt, read by --init), the TTF fonts the workloads render with (the
#    GPU image may have none: items would then render in Pillow's bitmap font, another distribution), the list of
#    font families this machine renders with, and the transformers wheel installed here (the image has 5.17,
#    mmspec wants >= 5.20; WHEEL=0 skips it). It prints the size that will travel: tracked files + .carry must stay
#    under the device's 64 MiB (on 2026-12-02 the tracked files alone were 64.4 MiB: make room first, e.g. move
#    the bundled weights the call does not read out of the checkout for the call and back after it:
#      mkdir -p /tmp/aside && for f in vision/assets/testbed-vlm/model.safetensors image_ar/assets/world-classifier/model.safetensors
#      drivers/assets/driving-vla/model.safetensors; do mkdir -p /tmp/aside/$(dirname $f); mv $f /tmp/aside/$f; done
#    then, after the call: (cd /tmp/aside && find . -type f) | while read f; do mv /tmp/aside/$f $f; done).
#
# 2. ON THE DEVICE, one call of the device tool (schedule, batch and loss weights are yours; the command is one
#    line of at most 2,000 characters). Building a step's inputs costs about 0.05 s per item on one core here
#    (2026-12-02, loaded machine, rendering 70% of it): 14 workers should feed about 8 steps/s of batch 32, so
#    8 minutes hold a few thousand steps; the log's data_sec says whether the GPU waited on them:
#      run(command="MINUTES=8 bash vision/assets/train_gpu.sh train --steps 20000 --batch-size 32 --lr 3e-4
#                   --warmup 200 --save-every 2000 --read-weight 0.5 --locate-weight 0.5 --relay-weight 0.5",
#          carry=[".carry"], timeout_s=600)
#    The command trains .carry/init (--init; fresh optimizer and schedule) on cuda in bf16 autocast with
#    nproc - 2 data workers, stops cleanly after MINUTES of training (default 8: model loading and packing fit in
#    the remaining 2 of the 10-minute call; the 15 device minutes of a session also pay the machine's start) and
#    writes $OUT/ckpt.tar.part-00, -01, ... (15 MiB each) and $OUT/train_summary.json (steps, median seconds per
#    step and waiting for data, GPU). Nothing is installed into the image: the carried wheel goes to /tmp/site and
#    mmspec is imported from this checkout through a tree of links on PYTHONPATH. The optimizer state
#    (state.pt, about 8 bytes per parameter) is NOT brought back: too big for the 64 MiB that come back. A later
#    run therefore starts from the result with --init (fresh optimizer; give it a short --warmup), not a resume.
#    The weights come back in float32 when they take under 56 MiB so, else in bfloat16 (SAVE_DTYPE=float32 or
#    bfloat16 forces one). Not yet run on a GPU: tested on a CPU with DEVICE=cpu (tests/test_testbed.py).
#
# 3. HERE, after the call:  vision/assets/train_gpu.sh unpack FILES_AT /work/ckpt/NAME
#    (FILES_AT: the folder the `run` reply names as files_at) joins the parts into /work/ckpt/NAME, checks that
#    from_pretrained loads it in float32 and prints the last log line. Then evaluate it
#    (python -m mmspec.vision.testbed eval --model /work/ckpt/NAME ...) or train on from it with --init.
#
# Environment: MINUTES (train budget, default 8), DEVICE (cuda; cpu to try the script on a CPU), WORKERS (data
# workers, default nproc - 2), CARRY (default .carry), OUT (set by the device tool), RUN_DIR (default
# /tmp/testbed-run), PY (default python3), SAVE_DTYPE (auto|float32|bfloat16), INIT_DTYPE and WHEEL (prepare).
# Arguments after `train` go to `python -m mmspec.vision.testbed train` unchanged; --init, --out, --device,
# --data-workers and --max-minutes are set here.
set -euo pipefail

PY=${PY:-python3}
CARRY=${CARRY:-.carry}
mode=${1:-}
shift || true

case "$mode" in
prepare)
    src=${1:?usage: train_gpu.sh prepare CHECKPOINT_DIR}
    if [[ "$CARRY" != /* ]] && ! grep -qx "/$CARRY/" .git/info/exclude 2>/dev/null; then
        mkdir -p .git/info && echo "/$CARRY/" >> .git/info/exclude  # it travels as carry, never as a tracked file
    fi
    rm -rf "$CARRY/init" "$CARRY/fonts" "$CARRY/whl"
    mkdir -p "$CARRY/fonts" "$CARRY/whl"
    SRC="$src" DST="$CARRY" INIT_DTYPE=${INIT_DTYPE:-bfloat16} "$PY" - <<'EOF'
import os, shutil, torch
from mmspec.vision.testbed import export_target
from mmspec.vision.workloads.render import _font_files, font_families

src, dst = os.environ["SRC"], os.environ["DST"]
export_target(src, os.path.join(dst, "init"), getattr(torch, os.environ["INIT_DTYPE"]))
for name in ("state.pt", "probes.pt"):  # the probes only: the optimizer stays here (a new run gets a fresh one)
    if os.path.isfile(os.path.join(src, name)):
        saved = torch.load(os.path.join(src, name), map_location="cpu", weights_only=True)
        torch.save({k: v for k, v in saved.items() if k in ("reader", "locator", "speller", "relay")},
                   os.path.join(dst, "init", "probes.pt"))
        break
for name, path in _font_files().items():
    shutil.copy(path, os.path.join(dst, "fonts", name))
with open(os.path.join(dst, "fonts.txt"), "w") as f:
    f.write(" ".join(font_families()) + "\n")
import transformers
with open(os.path.join(dst, "whl", "wanted.txt"), "w") as f:
    f.write(f"transformers=={transformers.__version__}\n")
EOF
    if [ "${WHEEL:-1}" != 0 ]; then
        "$PY" -m pip download -q --no-deps --only-binary=:all: -d "$CARRY/whl" -r "$CARRY/whl/wanted.txt"
    fi
    tracked=$(git ls-files -z | xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s}')
    carried=$(du -sb "$CARRY" | cut -f1)
    awk -v t="$tracked" -v c="$carried" -v n="$CARRY" -v s="$src" 'BEGIN {printf "prepared %s from %s: tracked " \
        "files %.1f MiB + %s %.1f MiB travel (the device takes at most 64 MiB)\n", n, s, t / 2^20, n, c / 2^20}'
    ;;
train)
    device=${DEVICE:-cuda}
    run=${RUN_DIR:-/tmp/testbed-run}
    out=${OUT:?OUT (where the results go) is not set: run this through the device tool}
    [ -d "$CARRY/init" ] || { echo "no $CARRY/init: run 'train_gpu.sh prepare CHECKPOINT' here first" >&2; exit 2; }
    if compgen -G "$CARRY/whl/*.whl" > /dev/null; then
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
            "$CARRY"/whl/*.whl
        export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
    fi
    case $CARRY in /*) fonts=$CARRY/fonts ;; *) fonts=$PWD/$CARRY/fonts ;; esac
    # One progress line every 60 s: the reply keeps only the output's last 12,000 characters.
    export MMSPEC_FONT_DIRS=$fonts OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} PYTHONUNBUFFERED=1 TQDM_MININTERVAL=60
    # mmspec.vision lives in vision/ (pyproject's package-dir), so PYTHONPATH=. cannot import it; a tree of links
    # that mirrors the mapping can, with nothing installed (an editable install wants setuptools' build backend).
    tree=$run-pythonpath
    rm -rf "$tree" && mkdir -p "$tree/mmspec"
    ln -s "$PWD"/mmspec/* "$tree/mmspec/"
    for sub in vision drivers image_ar kernels; do ln -s "$PWD/$sub" "$tree/mmspec/$sub"; done
    export PYTHONPATH=$tree${PYTHONPATH:+:$PYTHONPATH}
    # One import of what training needs (the carried transformers included), from this checkout (through the tree
    # or an install of it), and the fonts found.
    have=$("$PY" -c "import os, mmspec.vision.testbed as t; here = os.path.realpath('.') + os.sep
assert os.path.realpath(t.__file__).startswith(here), f'mmspec imported from {t.__file__}, not from {here}'
from mmspec.vision.workloads.render import font_families as f; print(' '.join(f()))")
    # Items are drawn in a font chosen among the families found: other families render other items. Stop before
    # spending the budget (with a machine's own extra fonts, name the prepared ones in --workload-options).
    if [ -f "$CARRY/fonts.txt" ] && [[ "$*" != *'"fonts"'* ]]; then
        if [ "$have" != "$(cat "$CARRY/fonts.txt")" ]; then
            list=$(tr ' ' '\n' < "$CARRY/fonts.txt" | grep -v '^$' | sed 's/.*/"&"/' | paste -sd, -)
            echo "fonts found here: '$have'; prepared: '$(cat "$CARRY/fonts.txt")'. If the prepared ones are all" \
                 "here, add --workload-options '{\"docs\": {\"fonts\": [$list]}, \"charts\": {\"fonts\": [$list]}}'" >&2
            exit 2
        fi
    fi
    workers=${WORKERS:-$(( $(nproc) > 3 ? $(nproc) - 2 : 1 ))}
    [ "$device" = cpu ] || nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
    rm -rf "$run"
    "$PY" -m mmspec.vision.testbed train --init "$CARRY/init" --out "$run" --device "$device" \
        --data-workers "$workers" --max-minutes "${MINUTES:-8}" "$@"
    RUN="$run" PACK="$run-pack" SAVE_DTYPE=${SAVE_DTYPE:-auto} "$PY" - <<'EOF'
import json, os, shutil, torch
from mmspec.vision.testbed import export_target

run, pack = os.environ["RUN"], os.path.join(os.environ["PACK"], "ckpt")
shutil.rmtree(pack, ignore_errors=True)
want = os.environ["SAVE_DTYPE"]
fp32 = os.path.getsize(os.path.join(run, "model.safetensors"))
dtype = want if want != "auto" else ("float32" if fp32 < 56 * 2**20 else "bfloat16")  # 64 MiB come back at most
export_target(run, pack, getattr(torch, dtype))  # weights, processor, train_log.jsonl, train_config.json
saved = torch.load(os.path.join(run, "state.pt"), map_location="cpu", weights_only=True)
torch.save({k: v for k, v in saved.items() if k in ("reader", "locator", "speller", "relay")},
           os.path.join(pack, "probes.pt"))
log = [json.loads(line) for line in open(os.path.join(run, "train_log.jsonl"))]
secs = sorted(r["sec"] for r in log[len(log) // 10:])  # the first steps pay for warm-up and compilation
summary = {"steps": log[-1]["step"], "weights_dtype": dtype, "last": log[-1],
           "median_sec_per_step": secs[len(secs) // 2] if secs else None,
           "median_data_sec": sorted(r["data_sec"] for r in log)[len(log) // 2],
           "torch": torch.__version__, "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}
with open(os.path.join(os.environ["OUT"], "train_summary.json"), "w") as f:
    json.dump(summary, f, indent=1)
print(json.dumps(summary))
EOF
    tar -C "$run-pack" -cf - ckpt | split -b 15M -d - "$out/ckpt.tar.part-"
    ls -l "$out"
    ;;
unpack)
    at=${1:?usage: train_gpu.sh unpack FILES_AT DEST}
    dest=${2:?usage: train_gpu.sh unpack FILES_AT DEST}
    [ ! -e "$dest" ] || { echo "$dest exists: choose a new folder" >&2; exit 2; }
    tmp=$(mktemp -d)
    cat "$at"/ckpt.tar.part-* | tar -x -C "$tmp"
    mkdir -p "$(dirname "$dest")"
    mv "$tmp/ckpt" "$dest"
    rmdir "$tmp"
    [ ! -f "$at/train_summary.json" ] || cp "$at/train_summary.json" "$dest/"
    DEST="$dest" "$PY" - <<'EOF'
import os, torch
from transformers import Qwen2VLForConditionalGeneration

model = Qwen2VLForConditionalGeneration.from_pretrained(os.environ["DEST"])
assert model.dtype == torch.float32, model.dtype
print(f"{os.environ['DEST']}: {sum(p.numel() for p in model.parameters())} parameters, loads in float32")
EOF
    tail -n 1 "$dest/train_log.jsonl"
    ;;
*)
    echo "usage: train_gpu.sh prepare CHECKPOINT | train [TRAIN ARGS] | unpack FILES_AT DEST (see the top of $0)" >&2
    exit 2
    ;;
esac
