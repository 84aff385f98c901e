"""What clients see of the inference server, at the rates they registered.

Run (CPU; about 4 minutes on 2 cores):
    .venv/bin/python benchmarks/serving_clients.py --seconds 15
The issue's check on ONNX Runtime alone (four scenarios, about 2 minutes; add
``--baseline PATH`` for another checkout's server beside it, about 4):
    .venv/bin/python benchmarks/serving_clients.py --executors onnxruntime --seconds 15

Every scenario runs ``tandem agent serve`` as its own process and its clients in
another process, each request on a new connection, on both executors
(``onnxruntime`` on CPU, ``sim``: the profiles slept on the real clock, so only the
request path uses CPU), as the host is and beside a CPU hog (one busy-looping
process per core, started before the server):

- ``slo_trio``: three SLO sessions (MLPs; SLO 50, 150, 250 ms) registered at the
  rates planned for them: their batch-1 demand at 90% of those rates totals
  ``--demand`` of one executor (1.17, the issue's load; capped at ``--max-rps``).
  A refusal naming a holdable rate is followed by a registration at that rate
  (scaled down at registration, with the refusal's reason kept). Clients offer
  Poisson arrivals at 90% of the rate each session registered.
- ``best_effort``: a best-effort job (two 3x3 Convs, the second 64 channels, on
  192x192; 20 requests/s, no deadline) registered first, then an SLO session
  (an MLP, 20 requests/s, SLO 50 ms) beside it.

The result separates what the server refused with a reason (at registration: the
409's reason and the rate it held instead) from what it shed after admitting
(every SLO request not answered 200 in time: 503s by reason, late 200s). Client
latency counts from before connecting to the answer read; each SLO request sends
its deadline (``X-Tandem-Deadline``: that time + SLO - 1 ms).
"""

from __future__ import annotations

import argparse
import http.client
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import _common
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from agent.inference.runtime.tensors import encode_npy
from benchmarks.serving_http import (
    Server,
    batch1_ms,
    client_records,
    cpu_hogs,
    offer_poisson,
)
from benchmarks.serving_ort import mlp

TRIO = [("c50", 2048, 3, 50.0), ("c150", 2048, 4, 150.0), ("c250", 2048, 5, 250.0)]
"""(name, MLP width, layers, SLO ms)."""
BESIDE = ("b50", 1024, 4, 50.0, 20.0)
"""The SLO session beside the best-effort job: (name, width, layers, SLO ms, rps)."""
BE_NAME, BE_SHAPE, BE_RPS = "conv", (1, 3, 192, 192), 20.0
OFFERED = 0.9
REPLY_RESERVE_MS = 1.0
SIM_PROFILES = """\
profiles:
  - {model: c50, gpu_type: sim, max_batch: 32, linear: {alpha_ms: 0.5, beta_ms: 2.5}}
  - {model: c150, gpu_type: sim, max_batch: 32, linear: {alpha_ms: 0.6, beta_ms: 3.4}}
  - {model: c250, gpu_type: sim, max_batch: 32, linear: {alpha_ms: 0.8, beta_ms: 4.2}}
  - {model: b50, gpu_type: sim, max_batch: 32, linear: {alpha_ms: 0.1, beta_ms: 0.5}}
  - {model: conv, gpu_type: sim, max_batch: 4, linear: {alpha_ms: 19.0, beta_ms: 1.0}}
"""
"""The sim executor's models: latencies of the order ONNX Runtime measured here."""


def conv_net(seed: int = 0) -> onnx.ModelProto:
    """Conv 3->64 and Conv 64->64 (3x3, padded) on [N, 3, 192, 192], then a mean."""
    rng = np.random.default_rng(seed)
    w0 = (rng.standard_normal((64, 3, 3, 3)) / 5).astype(np.float32)
    w1 = (rng.standard_normal((64, 64, 3, 3)) / 24).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node("Conv", ["r0", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("GlobalAveragePool", ["r1"], ["y"])]
    graph = helper.make_graph(
        nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                      ["N", *BE_SHAPE[1:]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 64, 1, 1])],
        [numpy_helper.from_array(w0, "w0"), numpy_helper.from_array(w1, "w1")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def register(server: Server, body: dict) -> dict:
    """Register; an SLO refusal naming a holdable rate is followed by one at that rate."""
    body = {k: v for k, v in body.items() if not k.startswith("_")}
    status, answer = server.call("POST", "/v1/sessions", body)
    out: dict[str, Any] = {"asked_rps": body.get("rate_rps"), "status": status}
    if status == 201:
        return {**out, "registered_rps": body.get("rate_rps"), "answer": _brief(answer)}
    out["refusal"] = {k: answer.get(k) for k in ("error", "reason", "message",
                                                  "holdable_rate_rps")}
    holdable = answer.get("holdable_rate_rps") or 0.0
    if status == 409 and holdable >= 1.0:
        status, again = server.call("POST", "/v1/sessions", {**body, "rate_rps": holdable})
        if status == 201:
            return {**out, "registered_rps": holdable, "answer": _brief(again)}
        out["second_refusal"] = again
    return {**out, "registered_rps": 0.0}


def _brief(answer: dict) -> dict:
    return {k: answer.get(k) for k in ("batch", "duty_cycle_ms", "worst_case_latency_ms",
                                       "promised", "request_path", "quantum_ms",
                                       "best_effort", "executor_share")}


def run_client(spec: dict) -> dict:
    """Poisson arrivals for every session, a new connection per request (client process)."""
    port, seconds = spec["port"], spec["seconds"]
    rng_body = np.random.default_rng(0)
    bodies = {s["name"]: encode_npy(rng_body.standard_normal(s["shape"]).astype(np.float32))
              for s in spec["sessions"]}
    records: list[tuple[str, int, float, str, float]] = []
    lock = threading.Lock()
    began = time.monotonic()

    def one(name: str, slo: float | None) -> None:
        start, wall = time.monotonic(), time.time() * 1000.0
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        status, why = -1, ""
        headers = {"Content-Type": "application/x-npy"}
        if slo is not None:
            headers["X-Tandem-Deadline"] = f"{wall + slo - REPLY_RESERVE_MS:.3f}"
        try:
            conn.request("POST", f"/v1/sessions/{name}/infer", bodies[name], headers)
            answer = conn.getresponse()
            data = answer.read()
            status = answer.status
            if status != 200:
                why = json.loads(data).get("reason") or json.loads(data).get("error", "")
        except (OSError, http.client.HTTPException, ValueError) as exc:
            why = type(exc).__name__
        finally:
            conn.close()
        done = time.monotonic()
        with lock:
            records.append((name, status, (done - start) * 1000, why, done - began))

    offer_poisson(spec["sessions"], seconds, one, began)
    return {"records": records}


def summarise(records: list, sessions: list[dict], seconds: float) -> dict:
    """Per session: what its client saw; for SLO sessions, everything not answered 200
    within the SLO is shed after admission (the session was admitted at this rate)."""
    out = {}
    for s in sessions:
        mine = [r for r in records if r[0] == s["name"]]
        ok = [r for r in mine if r[1] == 200]
        reasons: dict[str, int] = {}
        for r in mine:
            if r[1] != 200:
                key = f"{r[1]} {r[3]}".strip()
                reasons[key] = reasons.get(key, 0) + 1
        lat = sorted(r[2] for r in ok)
        row: dict[str, Any] = {
            "offered_rps": s["rate"], "sent": len(mine), "ok_200": len(ok),
            "not_200": reasons,
            "p50_ms": lat[len(lat) // 2] if lat else None,
            "p99_ms": lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else None}
        if s.get("slo_ms") is None:
            row["served_within_seconds"] = sum(1 for r in ok if r[4] <= seconds)
        else:
            on_time = sum(1 for r in ok if r[2] <= s["slo_ms"])
            row.update(slo_ms=s["slo_ms"], on_time_200=on_time, late_200=len(ok) - on_time,
                       shed_after_admission=len(mine) - on_time,
                       attainment=on_time / len(mine) if mine else None,
                       shed_by_second=_by_second(
                           [r for r in mine if r[1] != 200 or r[2] > s["slo_ms"]], seconds))
        out[s["name"]] = row
    return out


def _by_second(records: list, seconds: float) -> list[int]:
    """How many of ``records`` ended in each second of the window (when the shed came:
    the first seconds after admission, or throughout)."""
    counts = [0] * (int(seconds) + 1)
    for r in records:
        counts[min(max(int(r[4]), 0), len(counts) - 1)] += 1
    return counts


def scenario(server_args: tuple[str, ...], kind: str, hog: bool, store: Path,
             bodies: list[dict], seconds: float, root: Path = _common.ROOT) -> dict:
    """Register ``bodies`` in order, offer each session's load, read the server back."""
    with cpu_hogs(hog) as hogs:
        load_before = _common.load_average()
        server = Server(kind, store, root, extra=server_args)
        try:
            registered = {b["name"]: register(server, b) for b in bodies}
            sessions = [{"name": b["name"], "shape": b["_shape"], "slo_ms": b.get("slo_ms"),
                         "rate": (OFFERED * (registered[b["name"]]["registered_rps"] or 0.0)
                                  if "slo_ms" in b else
                                  (b["_rps"] if registered[b["name"]]["status"] == 201 else 0))}
                        for b in bodies]
            spec = {"port": server.port, "seconds": seconds, "sessions": sessions}
            records = client_records(str(Path(__file__)), spec, seconds)
            _status, snap = server.call("GET", "/v1/sessions")
            errors = server.errors()
        finally:
            server.stop()
    keep = ("kind", "arrived", "served", "good", "late", "dropped", "drop_reasons", "batch",
            "held", "promised", "throttle", "segments", "segment_overhead")
    for b in bodies:
        registered[b["name"]]["registration_body"] = {k: v for k, v in b.items()
                                                      if not k.startswith("_")}
    return {
        "cpu_hog_processes": hogs, "load_average_before": load_before,
        "load_average_after": _common.load_average(),
        "registration": registered,
        "client": summarise(records, sessions, seconds),
        "server": {"sessions": {s["name"]: {k: s.get(k) for k in keep if k in s}
                                for s in snap["sessions"]},
                   "request_path": snap.get("request_path"), "log_errors": errors,
                   "latency_margin": snap.get("latency_margin"),
                   "duty_cycle_ms": snap.get("duty_cycle_ms"), "overruns": snap.get("overruns"),
                   "best_effort_throttle": snap.get("best_effort_throttle"),
                   "executor_nice": snap.get("executor_nice"),
                   "executor_share": snap.get("executor_share")},
    }


def trio_bodies(l1: dict[str, float], demand: float, max_rps: float) -> list[dict]:
    """The SLO trio at the rates planned for it: ``demand`` of one executor unbatched at
    ``OFFERED`` of those rates, split evenly, each capped at ``max_rps``."""
    return [{"name": n, "model": f"{n}.onnx", "slo_ms": slo,
             "rate_rps": round(min(demand / len(TRIO) * 1000.0 / (OFFERED * l1[n]), max_rps), 2),
             "_shape": [1, w]} for n, w, _l, slo in TRIO]


def trio_on(kind: str, store: Path) -> tuple[tuple[str, ...], dict[str, float]]:
    """The server's options for executor ``kind`` (the sim's profiles from ``store``) and
    the trio's batch-1 latency on it (ms)."""
    if kind == "sim":
        return ((f"--profiles={store / 'profiles.yaml'}", "--gpu-type=sim"),
                {"c50": 3.0, "c150": 4.0, "c250": 5.0})
    return (), {n: batch1_ms(kind, store / f"{n}.onnx", w, repeats=50) for n, w, _l, _s in TRIO}


def be_bodies() -> list[dict]:
    name, width, _l, slo, rps = BESIDE
    return [{"name": BE_NAME, "model": f"{BE_NAME}.onnx", "weight": 1, "priority": 0,
             "_shape": list(BE_SHAPE), "_rps": BE_RPS},
            {"name": name, "model": f"{name}.onnx", "slo_ms": slo, "rate_rps": rps,
             "_shape": [1, width]}]


def met(result: dict, which: str, hog: bool) -> dict[str, bool]:
    """The issue's goals for one scenario, per session."""
    client, reg = result["client"], result["registration"]
    out = {}
    for name, row in client.items():
        if "attainment" not in row:
            refused = reg[name]["status"] != 201
            out[name] = refused or row["served_within_seconds"] >= 5
            continue
        scaled = reg[name]["registered_rps"] < (reg[name]["asked_rps"] or 0)
        shed_ok = row["shed_after_admission"] <= 0.01 * max(row["sent"], 1)
        if which == "slo_trio" and not hog:  # a quiet host: all held, nothing shed
            out[name] = (not scaled and row["shed_after_admission"] == 0
                         and (row["attainment"] or 0) >= 0.99)
        else:
            out[name] = (row["late_200"] == 0 and shed_ok
                         and (scaled or (row["attainment"] or 0) >= 0.99))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--executors", default="onnxruntime,sim")
    parser.add_argument("--scenarios", default="slo_trio,best_effort")
    parser.add_argument("--hog", default="no,yes", help="no, yes or no,yes")
    parser.add_argument("--demand", type=float, default=1.17)
    parser.add_argument("--max-rps", type=float, default=100.0)
    parser.add_argument("--baseline", type=Path, default=None,
                        help="another checkout whose server runs the same scenarios too "
                             "(first executor only)")
    parser.add_argument("--root", type=Path, default=_common.ROOT,
                        help="the checkout whose server runs (default: this one)")
    parser.add_argument("--note", action="append", default=[], help="kept in the result")
    parser.add_argument("--client", help=argparse.SUPPRESS)
    _common.add_out_option(parser, "serving_clients_cpu")
    args = parser.parse_args()
    if args.client:
        print(json.dumps(run_client(json.loads(args.client))))
        return
    started = time.perf_counter()
    out: dict[str, Any] = {"benchmark": "serving_clients", "seconds": args.seconds,
                           "demand": args.demand, "max_rps": args.max_rps,
                           "offered": f"{OFFERED:.0%} of each registered rate",
                           "notes": args.note}
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp)
        for name, width, layers, *_ in [*TRIO, BESIDE]:
            onnx.save(mlp(width, layers, seed=len(name) + layers), store / f"{name}.onnx")
        onnx.save(conv_net(), store / f"{BE_NAME}.onnx")
        (store / "profiles.yaml").write_text(SIM_PROFILES)
        for kind in args.executors.split(","):
            extra, l1 = trio_on(kind, store)
            out[kind] = {"batch1_ms": l1}
            for which in args.scenarios.split(","):
                bodies = trio_bodies(l1, args.demand, args.max_rps) if which == "slo_trio" \
                    else be_bodies()
                for hog in [h == "yes" for h in args.hog.split(",")]:
                    label = f"{which}/{'cpu_hog' if hog else 'as_is'}"
                    first = kind == args.executors.split(",")[0]
                    roots = [("", args.root)] + ([("baseline/", args.baseline)]
                                                 if args.baseline and first else [])
                    for prefix, root in roots:
                        result = scenario(extra, kind, hog, store, bodies, args.seconds, root)
                        result["met"] = met(result, which, hog)
                        out[kind][prefix + label] = result
                        print(json.dumps({prefix + label: result["met"],
                                          kind: result["client"]}), file=sys.stderr)
    out["goal"] = ("slo_trio as_is: every session registered at its planned rate, >= 99% "
                   "client-side, nothing shed; cpu_hog: >= 99% or scaled down at registration "
                   "with a reason, no late 200, at most 1% shed after admission; best_effort: "
                   "the SLO session so, and the best-effort job served >= 5 in the window or "
                   "refused with a reason")
    if args.baseline:
        head = subprocess.run(["git", "-C", str(args.baseline), "log", "-1", "--format=%h %s"],
                              capture_output=True, text=True).stdout.strip()
        out["baseline_server"] = head or str(args.baseline)
    out["wall_seconds"] = time.perf_counter() - started
    out.update(_common.context(("numpy", "onnxruntime", "cheroot")))
    _common.write_result(out, args.out)


if __name__ == "__main__":
    main()
