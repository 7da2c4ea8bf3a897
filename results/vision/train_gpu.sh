#!/usr/bin/env bash
# Train the testbed target on a lent GPU (the device tool's `run`) for a wall-clock budget, from a checkpoint
# carried in the working tree, and bring the result back in <= 16 MiB files.
#
# Three steps, two of them here:
#
# 1. HERE, once:  results/vision/train_gpu.sh prepare /work/ckpt/SOURCE
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
#    7 minutes hold a few thousand steps; the log's data_sec says whether the GPU waited on them:
#      run(command="MINUTES=7 bash results/vision/train_gpu.sh train --steps 20000 --batch-size 32 --lr 3e-4
#                   --warmup 200 --save-every 2000 --read-weight 0.5 --locate-weight 0.5 --relay-weight 0.5",
#          carry=[".carry"], timeout_s=600)
#    The command trains .carry/init (--init; fresh optimizer and schedule) on cuda in bf16 autocast with
#    nproc - 2 data workers and stops cleanly (checkpoint saved) MINUTES after the script began (default 7: the
#    wheel install, font check, worker start and model loading are inside it; --max-minutes is set to what is
#    left, at least one step runs). Results reach $OUT only at the end, and a 600 s call that times out brings
#    back nothing, so training runs under `timeout`: 60 s past MINUTES it is killed (TERM, then KILL 10 s later),
#    and whatever checkpoint it last saved (--save-every, or the budget's stop) is packed all the same; the
#    script then still exits with training's status (124: killed). MINUTES=7 thus ends the call by about 8.5
#    minutes at worst (packing takes well under 30 s). It writes $OUT/train_summary.json first (the checkpoint's
#    steps, train_rc, median seconds per step and waiting for data, GPU), then $OUT/ckpt.tar.part-00, -01, ...
#    (15 MiB each; the log cut at the checkpoint's step). The 15 device minutes of a session also pay the
#    machine's start.
#    /dev/shm: the data workers hand each step's inputs to the loop through shared memory (about 4 MiB per item
#    of the batch, mostly pixel values; 2 steps ahead per worker), and a small /dev/shm (a container's default
#    is 64 MiB) ends the run with a "bus error". The script reads `df /dev/shm` and caps the workers so that
#    workers x 2 x batch x 4 MiB stay within half of its free space (0 workers: the loop renders its own items,
#    slowly; it says so on stderr). It caps rather than switching torch to the "file_system" sharing strategy:
#    that strategy also allocates in /dev/shm (shm_open; checked on 2026-12-02) and would not help.
#    Nothing is installed into the image: the carried wheel goes to /tmp/site and mmspec is imported from this
#    checkout through a tree of links on PYTHONPATH. The optimizer state
#    (state.pt, about 8 bytes per parameter) is NOT brought back: too big for the 64 MiB that come back. A later
#    run therefore starts from the result with --init (fresh optimizer; give it a short --warmup), not a resume.
#    The weights come back in float32 when they take under 56 MiB so, else in bfloat16 (SAVE_DTYPE=float32 or
#    bfloat16 forces one). Not yet run on a GPU: tested on a CPU with DEVICE=cpu (tests/test_testbed.py).
#
# 3. HERE, after the call:  results/vision/train_gpu.sh unpack FILES_AT /work/ckpt/NAME
#    (FILES_AT: the folder the `run` reply names as files_at) joins the parts into /work/ckpt/NAME, checks that
#    from_pretrained loads it in float32 and prints the last log line. Then evaluate it
#    (python -m mmspec.vision.testbed eval --model /work/ckpt/NAME ...) or train on from it with --init.
#
# Environment: MINUTES (budget from the script's start to the clean stop, default 7), DEVICE (cuda; cpu to try the
# script on a CPU), WORKERS (data workers, default nproc - 2, capped by /dev/shm), CARRY (default .carry), OUT (set
# by the device tool), RUN_DIR (default /tmp/testbed-run), PY (default python3), SAVE_DTYPE (auto|float32|bfloat16),
# INIT_DTYPE and WHEEL (prepare).
# Arguments after `train` go to `python -m mmspec.vision.testbed_train train` unchanged; --init, --out, --device,
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
from mmspec.vision.testbed_train import export_target, load_probes, save_probes
from mmspec.vision.workloads.render import _font_files, font_families

src, dst = os.environ["SRC"], os.environ["DST"]
export_target(src, os.path.join(dst, "init"), getattr(torch, os.environ["INIT_DTYPE"]))
probes = load_probes(src, missing_ok=True)  # the probes only: the optimizer stays here (a new run gets a fresh one)
if probes:
    save_probes(probes, os.path.join(dst, "init", "probes.pt"))
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
    # The budget runs from this script's start: wheel install, font check, worker start and model loading count.
    budget=$(awk -v m="${MINUTES:-7}" 'BEGIN {printf "%d", m * 60}')
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
    # Items are drawn in a font chosen among the families found: other families render other items. The training
    # process checks them first and stops before any work (with a machine's own extra fonts, name the prepared ones
    # in --workload-options: then there is no check).
    fonts_wanted=
    if [ -f "$CARRY/fonts.txt" ] && [[ "$*" != *'"fonts"'* ]]; then
        fonts_wanted=$(cat "$CARRY/fonts.txt")
    fi
    workers=${WORKERS:-$(( $(nproc) > 3 ? $(nproc) - 2 : 1 ))}
    # Workers hand each step's inputs over in /dev/shm, 2 steps ahead each, about 4 MiB per item of the batch
    # (pixel values): cap them so that this fits in half of its free space (see the header).
    batch=8  # TargetTrainConfig's default
    prev=
    for a in "$@"; do
        case $a in --batch-size=*) batch=${a#*=} ;; esac
        [ "$prev" != --batch-size ] || batch=$a
        prev=$a
    done
    shm=$(df -Pk /dev/shm 2>/dev/null | awk 'NR == 2 {print int($4 / 1024)}' || true)
    if [ -n "$shm" ] && [ "$workers" -gt 0 ]; then
        fit=$(( shm / 2 / (2 * 4 * batch) ))
        if [ "$fit" -lt "$workers" ]; then
            echo "train_gpu.sh: /dev/shm has $shm MiB free: $fit data workers in place of $workers (batch $batch)" >&2
            workers=$fit
        fi
    fi
    [ "$device" = cpu ] || nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
    rm -rf "$run"
    # Training stops cleanly (checkpoint saved) MINUTES after this script began (at least one step); 60 s past
    # that it is killed (TERM, then KILL 10 s later) and the last checkpoint it saved is packed all the same.
    left=$(( budget - SECONDS ))
    max_min=$(awk -v s="$left" 'BEGIN {printf "%.4f", (s > 1 ? s : 1) / 60}')
    # One process (each start imports torch): mmspec imported from this checkout (through the tree or an install
    # of it) with the carried transformers, the fonts found checked, then `python -m mmspec.vision.testbed_train train`.
    rc=0
    FONTS_WANTED=$fonts_wanted timeout --kill-after=10 $(( (left > 0 ? left : 0) + 60 )) "$PY" -c '
import json, os, sys
import mmspec.vision.testbed_train as t
from mmspec.vision.workloads.render import font_families
here = os.path.realpath(".") + os.sep
assert os.path.realpath(t.__file__).startswith(here), f"mmspec imported from {t.__file__}, not from {here}"
have, want = " ".join(font_families()), os.environ["FONTS_WANTED"]
if want and have != want:
    names = json.dumps(want.split())
    print(f"fonts found here: {have!r}; prepared: {want!r}. If the prepared ones are all here, add "
          f"""--workload-options '"'"'{{"docs": {{"fonts": {names}}}, "charts": {{"fonts": {names}}}}}'"'"'""",
          file=sys.stderr)
    sys.exit(2)
sys.exit(t.main(["train", *sys.argv[1:]]))' --init "$CARRY/init" --out "$run" --device "$device" \
        --data-workers "$workers" --max-minutes "$max_min" "$@" || rc=$?
    if [ "$rc" != 0 ]; then
        echo "train_gpu.sh: training ended with status $rc$([ "$rc" != 124 ] || echo ' (killed past the budget)')" >&2
    fi
    if [ ! -f "$run/model.safetensors" ]; then
        echo "train_gpu.sh: no checkpoint in $run to pack" >&2
        exit $(( rc ? rc : 1 ))
    fi
    RUN="$run" PACK="$run-pack" SAVE_DTYPE=${SAVE_DTYPE:-auto} TRAIN_RC=$rc "$PY" - <<'EOF'
import json, os, shutil, torch
from mmspec.train import trim_log
from mmspec.vision.testbed_train import export_target, load_probes, save_probes

run, pack = os.environ["RUN"], os.path.join(os.environ["PACK"], "ckpt")
state = os.path.join(run, "state.pt")  # written after the weights: the step they hold (none: the first save died)
step = torch.load(state, map_location="cpu", weights_only=True, mmap=True)["step"] if os.path.isfile(state) else None
log = [json.loads(line) for line in open(os.path.join(run, "train_log.jsonl"))]
log = [r for r in log if step is None or r["step"] <= step]  # steps past the checkpoint (a killed run) are lost
secs = sorted(r["sec"] for r in log[len(log) // 10:])  # the first steps pay for warm-up and compilation
want = os.environ["SAVE_DTYPE"]
fp32 = os.path.getsize(os.path.join(run, "model.safetensors"))
dtype = want if want != "auto" else ("float32" if fp32 < 56 * 2**20 else "bfloat16")  # 64 MiB come back at most
summary = {"steps": step, "train_rc": int(os.environ["TRAIN_RC"]), "weights_dtype": dtype,
           "last": log[-1] if log else None, "median_sec_per_step": secs[len(secs) // 2] if secs else None,
           "median_data_sec": sorted(r["data_sec"] for r in log)[len(log) // 2] if log else None,
           "torch": torch.__version__, "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}
with open(os.path.join(os.environ["OUT"], "train_summary.json"), "w") as f:  # first: it comes back if export fails
    json.dump(summary, f, indent=1)
print(json.dumps(summary))
shutil.rmtree(pack, ignore_errors=True)
export_target(run, pack, getattr(torch, dtype))  # weights, processor, train_log.jsonl, train_config.json
if step is not None:
    trim_log(os.path.join(pack, "train_log.jsonl"), step)
probes = load_probes(run, missing_ok=True)
if probes:
    save_probes(probes, os.path.join(pack, "probes.pt"))
EOF
    tar -C "$run-pack" -cf - ckpt | split -b 15M -d - "$out/ckpt.tar.part-"
    ls -l "$out"
    exit "$rc"
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
