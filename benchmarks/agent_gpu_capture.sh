#!/usr/bin/env bash
# Real-GPU capture for the node agent (issue 5): the agent's report and /metrics
# scraped while a model runs, beside nvidia-smi in the same run. Run as-is from the
# repository root on a machine with an NVIDIA GPU:
#     bash benchmarks/agent_gpu_capture.sh [OUT_DIR]
# Writes OUT_DIR (default benchmarks/results/agent_gpu_capture/): environment.txt,
# nvidia-smi-before/during/after.csv, compute-apps-during.csv, report-once.json,
# report-during.json, metrics-during.txt, load.log, pytest-gpu.txt, summary.json.
set -euo pipefail

PY="${PYTHON:-.venv/bin/python}"
OUT="${1:-benchmarks/results/agent_gpu_capture}"
PORT="${METRICS_PORT:-19401}"
LOAD_SECONDS="${LOAD_SECONDS:-40}"
mkdir -p "$OUT"
export NODE_NAME="${NODE_NAME:-$(hostname)}"
tandem() { "$PY" -c 'from extender.cli import main; main()' "$@"; }
smi() {
  nvidia-smi --query-gpu=timestamp,index,uuid,name,memory.total,memory.used,utilization.gpu,utilization.memory,power.draw,temperature.gpu,mig.mode.current \
    --format=csv,nounits > "$1"
}

{
  date -u +%Y-%m-%dT%H:%M:%SZ
  nvidia-smi --query-gpu=driver_version,name --format=csv
  "$PY" -c 'import platform, importlib.metadata as m; print(platform.python_version(), m.version("nvidia-ml-py"))'
  git rev-parse HEAD 2>/dev/null || true
} > "$OUT/environment.txt" 2>&1

smi "$OUT/nvidia-smi-before.csv"
tandem agent run --gpus nvml --once --json > "$OUT/report-once.json"

# A model on GPU 0: torch (CUDA) convolution net if available, else ONNX Runtime's
# CUDA provider on a small conv graph. The load log says which one ran.
"$PY" - "$LOAD_SECONDS" > "$OUT/load.log" 2>&1 <<'PYLOAD' &
import sys, time
seconds = float(sys.argv[1])
end = time.time() + seconds
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
    x = np.random.rand(16, 64, 112, 112).astype("float32")
    n = 0
    while time.time() < end:
        sess.run(None, {"x": x}); n += 1
    print("batches", n, flush=True)
PYLOAD
LOAD_PID=$!

# The long-running agent (no extender: reports are built but not pushed) serving /metrics.
tandem agent run --gpus nvml --interval-seconds 1 --metrics-port "$PORT" --metrics-addr 127.0.0.1 \
  > "$OUT/agent-stdout.log" 2> "$OUT/agent-stderr.log" &
AGENT_PID=$!
trap 'kill "$AGENT_PID" "$LOAD_PID" 2>/dev/null || true' EXIT

sleep 15   # model warm-up plus several agent intervals
smi "$OUT/nvidia-smi-during.csv"
nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv,nounits > "$OUT/compute-apps-during.csv"
tandem agent run --gpus nvml --interval-seconds 1 --once --json > "$OUT/report-during.json"
"$PY" -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:$PORT/metrics').read().decode())" \
  > "$OUT/metrics-during.txt"
smi "$OUT/nvidia-smi-during-2.csv"

kill -TERM "$AGENT_PID"; wait "$AGENT_PID" || true   # SIGTERM must stop it cleanly
wait "$LOAD_PID" || true
trap - EXIT
smi "$OUT/nvidia-smi-after.csv"
"$PY" -m pytest -q -p no:cacheprovider tests/test_agent_sources.py -m gpu > "$OUT/pytest-gpu.txt" 2>&1 || true

# Side-by-side summary: GPU utilisation and memory as nvidia-smi and the agent saw them.
"$PY" - "$OUT" <<'PYSUM'
import csv, json, re, sys
from pathlib import Path
out = Path(sys.argv[1])
def smi(name):
    rows = list(csv.reader((out / name).read_text().splitlines()))
    head = [h.strip() for h in rows[0]]
    return [dict(zip(head, (c.strip() for c in r))) for r in rows[1:]]
report = json.loads((out / "report-during.json").read_text())
metrics = (out / "metrics-during.txt").read_text()
def metric(name, gpu):
    m = re.search(rf'^{name}{{[^}}]*gpu="{gpu}"[^}}]*}} (\S+)$', metrics, re.M)
    return float(m.group(1)) if m else None
summary = {"gpus": []}
for g in report["gpus"]:
    i = g["index"]
    rows = [r for name in ("nvidia-smi-during.csv", "nvidia-smi-during-2.csv") for r in smi(name) if r["index"] == str(i)]
    summary["gpus"].append({
        "index": i, "product": g["product"],
        "nvidia_smi_util_percent": [r["utilization.gpu [%]"] for r in rows],
        "agent_report_util_percent": g["utilization_percent"],
        "metrics_DCGM_FI_DEV_GPU_UTIL": metric("DCGM_FI_DEV_GPU_UTIL", i),
        "nvidia_smi_memory_used_mib": [r["memory.used [MiB]"] for r in rows],
        "agent_report_memory_used_mib": g["memory_used_mib"],
        "metrics_DCGM_FI_DEV_FB_USED": metric("DCGM_FI_DEV_FB_USED", i),
        "agent_processes": g["processes"],
    })
summary["load"] = (out / "load.log").read_text().splitlines()[:3]
(out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
print(json.dumps(summary, indent=2))
PYSUM
echo "captured into $OUT"
