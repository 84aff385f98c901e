#!/usr/bin/env bash
# One resumable chunk of the real GPU campaign, run through the device tool from the
# repository root (training_data/README.md has the whole procedure):
#
#   bash predictor/profiling/campaigns/device_chunk.sh [BUDGET_SECONDS] [SPEC]
#
# BUDGET_SECONDS (default 480) is the campaign's wall-time budget: it stops cleanly
# before a run that would not fit, so keep it about 100 s under the call's timeout_s
# (imports, CUDA start-up, graph exports and the last run's overrun).
# Results come back under $OUT, at most one folder down and 8 files in all:
#   $OUT/summary.json  the campaign summary (state: complete | budget_exhausted)
#   $OUT/log.txt       GPU identity and the profiler's stderr
#   $OUT/<gpu-slug>/   isolated.csv, colocated.csv, batching.csv, provenance.json
# Only directories whose provenance says "simulated": false come back.
# BACKEND (default cuda) and DATA_ROOT (default training_data) exist so that
# tests/predictor/profiling/test_profiling_device_chunk.py can run this script without a GPU.
set -uo pipefail
budget="${1:-480}"
spec="${2:-predictor/profiling/campaigns/hopper.yaml}"
out="${OUT:?run this through the device tool: \$OUT is where results come back}"
backend="${BACKEND:-cuda}"
data="${DATA_ROOT:-training_data}"
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >"$out/log.txt" 2>&1
"${PYTHON:-python3}" -m predictor.profiling run --backend "$backend" --out "$data" --spec "$spec" \
  --resume --budget-seconds "$budget" --no-progress --json >"$out/summary.json" 2>>"$out/log.txt"
rc=$?

# Copy back every real GPU directory (one per product; a machine has one).
for dir in "$data"/*/; do
  prov="$dir/provenance.json"
  [ -f "$prov" ] && grep -q '"simulated": false' "$prov" || continue
  slug="$(basename "$dir")"
  mkdir -p "$out/$slug"
  cp "$prov" "$out/$slug/"
  for f in isolated.csv colocated.csv batching.csv; do
    [ -f "$dir/$f" ] && cp "$dir/$f" "$out/$slug/"
  done
done
cat "$out/summary.json"
tail -n 20 "$out/log.txt"
exit "$rc"
