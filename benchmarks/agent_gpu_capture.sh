#!/usr/bin/env bash
# Real-GPU capture for the node agent (issue 5): the agent's report and /metrics
# scraped while a model runs, beside nvidia-smi in the same run.
#
# On a machine with an NVIDIA GPU, from the repository root:
#     bash benchmarks/agent_gpu_capture.sh [DEST]
# Through the device tool (at most 8 files come back, so the capture is bundled):
#     run(command="DEVICE_OUT=$OUT bash benchmarks/agent_gpu_capture.sh", timeout_s=300)
#   then unpack $files_at/agent_gpu_capture.tar.gz into benchmarks/results/agent_gpu_capture/.
#
# DEST (default benchmarks/results/agent_gpu_capture/) receives environment.txt,
# nvidia-smi-{before,during,during-2,after}.csv, compute-apps-during.csv,
# report-once.json, report-during.json, metrics-during.txt, load.log, agent-*.log,
# pytest-gpu.txt and summary.json (benchmarks/agent_gpu_capture_summary.py).
# Settings: PYTHON (default .venv/bin/python, else python3: the GPU image has no
# venv), LOAD_SECONDS (40), WARMUP_SECONDS (15), METRICS_PORT (19401), DEVICE_OUT.
# A failing step is recorded in errors.txt and the capture goes on, so one broken
# call does not cost the rest of a device session.
set -uo pipefail

if [ -n "${PYTHON:-}" ]; then PY="$PYTHON"
elif [ -x .venv/bin/python ]; then PY=.venv/bin/python
else PY=python3; fi
DEST="${1:-benchmarks/results/agent_gpu_capture}"
PORT="${METRICS_PORT:-19401}"
LOAD_SECONDS="${LOAD_SECONDS:-40}"
WARMUP_SECONDS="${WARMUP_SECONDS:-15}"
mkdir -p "$DEST"
: > "$DEST/errors.txt"
export NODE_NAME="${NODE_NAME:-$(hostname)}" PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
TANDEM=("$PY" -c 'from tandem.cli import main; main()')  # no function: $! must be its PID
tandem() { "${TANDEM[@]}" "$@"; }
step() {  # step NAME CMD...: run, and note a failure without stopping the capture
  local name="$1"; shift
  "$@" || echo "$name: exit $?" >> "$DEST/errors.txt"
}
smi() {
  nvidia-smi --query-gpu=timestamp,index,uuid,name,memory.total,memory.used,utilization.gpu,utilization.memory,power.draw,temperature.gpu,mig.mode.current \
    --format=csv,nounits > "$1"
}

{
  date -u +%Y-%m-%dT%H:%M:%SZ
  nvidia-smi --query-gpu=driver_version,name --format=csv
  "$PY" -c 'import platform, importlib.metadata as m; print("python", platform.python_version(), "nvidia-ml-py", m.version("nvidia-ml-py"))'
  git rev-parse HEAD 2>/dev/null || true
} > "$DEST/environment.txt" 2>&1

step nvidia-smi-before smi "$DEST/nvidia-smi-before.csv"
step report-once tandem agent run --gpus nvml --once --json > "$DEST/report-once.json"

# A model on GPU 0: a torch (CUDA) convolution net if torch sees a GPU, else ONNX
# Runtime's CUDA provider on a small conv graph. The load log says which one ran
# and its PID, which the summary looks for among the agent's processes.
"$PY" - "$LOAD_SECONDS" > "$DEST/load.log" 2>&1 <<'PYLOAD' &
import os, sys, time
seconds = float(sys.argv[1])
end = time.time() + seconds
print("pid", os.getpid(), flush=True)
try:
    import torch
    assert torch.cuda.is_available(), "torch without CUDA"
    net = torch.nn.Sequential(*[torch.nn.Conv2d(64, 64, 3, padding=1) for _ in range(8)]).cuda().half()
    x = torch.randn(32, 64, 112, 112, device="cuda", dtype=torch.half)
    print("load: torch", torch.__version__, torch.cuda.get_device_name(0), flush=True)
    n = 0
    with torch.no_grad():
        while time.time() < end:
            net(x); n += 1
            if n % 20 == 0:
                torch.cuda.synchronize()
    print("batches", n, flush=True)
except Exception as err:  # fall back to ONNX Runtime
    print("torch load unavailable:", err, flush=True)
    import numpy as np, onnx, onnxruntime as ort
    from onnx import helper, TensorProto
    w = helper.make_tensor("w", TensorProto.FLOAT, [64, 64, 3, 3], np.random.rand(64 * 64 * 9).astype("float32"))
    nodes = [helper.make_node("Conv", ["x" if i == 0 else f"y{i-1}", "w"], [f"y{i}"], pads=[1, 1, 1, 1]) for i in range(8)]
    graph = helper.make_graph(nodes, "load", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [16, 64, 112, 112])],
                              [helper.make_tensor_value_info("y7", TensorProto.FLOAT, None)], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 10
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CUDAExecutionProvider"])
    print("load: onnxruntime", ort.__version__, sess.get_providers(), flush=True)
    if "CUDAExecutionProvider" not in sess.get_providers():
        sys.exit("no GPU load: neither torch nor ONNX Runtime can use CUDA here")
    x = np.random.rand(16, 64, 112, 112).astype("float32")
    n = 0
    while time.time() < end:
        sess.run(None, {"x": x}); n += 1
    print("batches", n, flush=True)
PYLOAD
LOAD_PID=$!

# The long-running agent (no extender: reports are built but not pushed) serving /metrics.
"${TANDEM[@]}" agent run --gpus nvml --interval-seconds 1 --metrics-port "$PORT" \
  --metrics-addr 127.0.0.1 > "$DEST/agent-stdout.log" 2> "$DEST/agent-stderr.log" &
AGENT_PID=$!
trap 'kill "$AGENT_PID" "$LOAD_PID" 2>/dev/null || true' EXIT

sleep "$WARMUP_SECONDS"   # model warm-up plus several agent intervals
step nvidia-smi-during smi "$DEST/nvidia-smi-during.csv"
step compute-apps nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv,nounits \
  > "$DEST/compute-apps-during.csv"
step report-during tandem agent run --gpus nvml --interval-seconds 1 --once --json \
  > "$DEST/report-during.json"
step metrics "$PY" -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:$PORT/metrics', timeout=10).read().decode())" \
  > "$DEST/metrics-during.txt"
step nvidia-smi-during-2 smi "$DEST/nvidia-smi-during-2.csv"

kill -TERM "$AGENT_PID"
wait "$AGENT_PID"; echo "agent exit on SIGTERM: $?" >> "$DEST/agent-stderr.log"
wait "$LOAD_PID" || echo "load: exit $?" >> "$DEST/errors.txt"
trap - EXIT
step nvidia-smi-after smi "$DEST/nvidia-smi-after.csv"
step pytest-gpu "$PY" -m pytest -q -p no:cacheprovider tests/agent/test_agent_sources.py -m gpu \
  > "$DEST/pytest-gpu.txt" 2>&1
step summary "$PY" benchmarks/agent_gpu_capture_summary.py "$DEST"

if [ -n "${DEVICE_OUT:-}" ]; then
  tar -czf "$DEVICE_OUT/agent_gpu_capture.tar.gz" -C "$DEST" .
  cp "$DEST/summary.json" "$DEVICE_OUT/agent_gpu_capture_summary.json" 2>/dev/null || true
fi
echo "captured into $DEST"
[ ! -s "$DEST/errors.txt" ] || { echo "failed steps:"; cat "$DEST/errors.txt"; exit 1; }
