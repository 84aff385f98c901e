#!/usr/bin/env bash
# One resumable chunk of the real GPU campaign, for batch GPU machines that return a job's
# results through a folder named by OUT, run from the repository root
# (training_data/README.md has the whole procedure):
#
#   bash predictor/profiling/campaigns/device_chunk.sh [BUDGET_SECONDS] [SPEC ...]
#
# BUDGET_SECONDS (default 480) is the chunk's wall-time budget, shared by the specs in
# turn (default: hopper.yaml): each runs with what the ones before it left, and the
# profiler stops cleanly before a run that would not fit, so keep the budget about
# 100 s under the call's timeout_s (imports, CUDA start-up, graph exports and the last
# run's overrun). A profiler that overruns its share by 60 s is interrupted (SIGINT:
# it writes its provenance and stops). Results go under $OUT, at most one
# folder down and 8 files in all, copied after every spec so a call cut short keeps
# what was measured:
#   $OUT/summary.json  one campaign summary per spec, one per line
#   $OUT/log.txt       GPU identity and the profilers' stderr
#   $OUT/<gpu-slug>/   isolated.csv, colocated.csv, batching.csv, provenance.json
# Only the directories this chunk wrote, and of those only the ones whose provenance says
# "simulated": false, come back.
# BACKEND (default cuda) and DATA_ROOT (default training_data) exist so that
# tests/predictor/profiling/test_profiling_device_chunk.py can run this script without a GPU.
set -uo pipefail
budget="${1:-480}"
shift $(($# > 0 ? 1 : 0))
specs=("$@")
[ ${#specs[@]} -gt 0 ] || specs=(predictor/profiling/campaigns/hopper.yaml)
out="${OUT:?set OUT to the folder where results go back}"
backend="${BACKEND:-cuda}"
data="${DATA_ROOT:-training_data}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

copy_back() {  # the real GPU directories this chunk's profilers wrote, as their summaries name them
  # (never a committed directory beside them: it would crowd the 8 files that come back)
  grep -o '"gpu_dir": "[^"]*"' "$out/summary.json" | sed 's/^"gpu_dir": "//; s/"$//' | sort -u |
  while IFS= read -r dir; do
    prov="$dir/provenance.json"
    [ -f "$prov" ] && grep -q '"simulated": false' "$prov" || continue
    slug="$(basename "$dir")"
    mkdir -p "$out/$slug"
    cp "$prov" "$out/$slug/"
    for f in isolated.csv colocated.csv batching.csv; do
      [ -f "$dir/$f" ] && cp "$dir/$f" "$out/$slug/"
    done
  done
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >"$out/log.txt" 2>&1
: >"$out/summary.json"
start=$(date +%s)
rc=0
for spec in "${specs[@]}"; do
  left=$((budget - ($(date +%s) - start)))
  if [ "$left" -lt 30 ]; then
    echo "device_chunk: $spec not started, ${left}s of the budget left" >>"$out/log.txt"
    continue
  fi
  echo "device_chunk: $spec with ${left}s" >>"$out/log.txt"
  timeout -s INT $((left + 60)) "${PYTHON:-python3}" -m predictor.profiling run \
    --backend "$backend" --out "$data" --spec "$spec" --resume --budget-seconds "$left" \
    --no-progress --json >>"$out/summary.json" 2>>"$out/log.txt"
  status=$?
  [ "$status" -eq 0 ] || rc=$status
  copy_back
done
cat "$out/summary.json"
tail -n 20 "$out/log.txt"
exit "$rc"
