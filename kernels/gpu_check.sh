#!/usr/bin/env bash
# One short GPU check of mmspec.kernels, for a machine with a CUDA device (run from anywhere):
#   bash kernels/gpu_check.sh [OUT_DIR]
# Through the device tool: the checkout must travel in 64 MiB and its tracked files alone were 64.4 MiB on
# 2026-12-02; the kernels read none of the bundled weights: move the three largest out for the call (see the
# recipe at the top of results/vision/train_gpu.sh), run(command="bash kernels/gpu_check.sh $OUT", timeout_s=600),
# then move them back.
# 1. the kernels' tests (interpreter on CPU tensors, as CI runs them; the CUDA build test included);
# 2. python -m mmspec.kernels.bench: every compiled kernel against its reference on the GPU (bf16 included),
#    then timings: Triton vs reference vs dense SDPA with the same mask. Writes OUT_DIR/kernels_bench.json
#    and OUT_DIR/kernels_bench.txt. About 2-4 minutes on an H100/H200 with Triton's cache cold.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${1:-${OUT:-.}}"
mkdir -p "$OUT_DIR"
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-$OUT_DIR/.triton-cache}"
"$PY" - <<'PYEOF'
import torch, triton
assert torch.cuda.is_available(), "no CUDA device visible"
print("gpu:", torch.cuda.get_device_name(0), "| torch", torch.__version__, "| triton", triton.__version__)
PYEOF
if ! "$PY" -c "import mmspec.kernels" 2>/dev/null; then
  echo "mmspec is not importable with $PY: pip install -e '.[dev,kernels]' first" >&2
  exit 2
fi
status=0
echo "== tests/test_kernels.py"
timeout 300 "$PY" -m pytest -q -p no:cacheprovider tests/test_kernels.py > "$OUT_DIR/kernels_tests.txt" 2>&1 || status=1
tail -5 "$OUT_DIR/kernels_tests.txt"
echo "== python -m mmspec.kernels.bench"
timeout 400 "$PY" -m mmspec.kernels.bench --device cuda --json "$OUT_DIR/kernels_bench.json" \
  > "$OUT_DIR/kernels_bench.txt" 2>&1 || status=1
cat "$OUT_DIR/kernels_bench.txt"
exit $status
