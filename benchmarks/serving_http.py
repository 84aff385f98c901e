"""The inference server under a held-out load, through its real HTTP endpoint.

Run (CPU, the committed result; about 2-3 minutes):
    .venv/bin/python benchmarks/serving.py --http-load
or this scenario alone:
    .venv/bin/python benchmarks/serving_http.py --seconds 15

For each executor (ONNX Runtime and torch, on CPU) and each host condition (as
the machine is, and with a CPU hog beside the server: one busy-looping process
per core, started before the server so its start-up measurement sees it):

1. The batch-1 latency of three small MLPs is measured in this process with the
   same executor; each SLO session's rate is ``SHARE * 1000 / l(1)`` (the three
   sessions' batch-1 demand totals 12% of the executor, as in the issue's quiet
   run), capped at ``--max-rps`` so the client process can offer it.
2. ``tandem agent serve`` starts as its own process; the sessions (SLOs 50, 150,
   250 ms) register over HTTP. A refusal that names a holdable rate is followed by
   a registration at that rate (scaled down); one with none is refused.
3. A client in another process offers Poisson arrivals at 90% of each admitted
   rate, opening a new connection per request, and sends its deadline (the time it
   began connecting + the SLO - 1 ms for the answer to travel back) as
   ``X-Tandem-Deadline`` (same host, same clock).
4. Reported from the client's side: attainment (200 within the SLO over all
   requests sent; ``attainment_held``: over those not answered ``scaled_down``),
   late 200s (200 after the SLO: the goal is none), 503s by reason, p50/p99
   latency; and the server's own counters, request-path figures and each session's
   held rate (``held``: scaled down while serving, and why).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import _common
import numpy as np
import onnx

from agent.inference.executors.executors import OrtExecutor
from agent.inference.preparation.limits import ModelLimits
from agent.inference.runtime.tensors import encode_npy
from benchmarks.serving_ort import mlp

SESSIONS = [("s50", 256, 4, 50.0), ("s150", 512, 4, 150.0), ("s250", 512, 8, 250.0)]
"""(name, MLP width, layers, SLO ms)."""
SHARE = 0.04
"""Each session's batch-1 demand as a share of the executor (0.12 in all)."""
OFFERED = 0.9
REPLY_RESERVE_MS = 1.0
"""What the client keeps of its SLO for the answer to travel back."""


def batch1_ms(kind: str, path: Path, width: int, repeats: int = 200) -> float:
    """Median batch-1 latency of the model on this executor, in this process."""
    limits = ModelLimits(store_root=path.parent)
    if kind == "torch":
        from agent.inference.executors.torch_executor import TorchExecutor

        executor: Any = TorchExecutor("cpu", limits=limits, intra_op_threads=1)
    else:
        executor = OrtExecutor("cpu", limits=limits, intra_op_threads=1)
    loaded = executor.load(path.name)
    x = np.zeros((1, width), np.float32)
    for _ in range(20):
        executor.run_batch(loaded, x)
    took = []
    for _ in range(repeats):
        start = time.perf_counter()
        executor.run_batch(loaded, x)
        took.append((time.perf_counter() - start) * 1000)
    return sorted(took)[len(took) // 2]


class Server:
    """``tandem agent serve`` in its own process (a subclass may set ``command``, what
    runs in place of ``tandem``, and ``env``, added to the environment, before this)."""

    def __init__(self, kind: str, store: Path, root: Path = _common.ROOT,
                 extra: tuple[str, ...] = ()):
        command = getattr(self, "command", [str(Path(sys.executable).parent / "tandem")])
        env = {**os.environ, "PYTHONPATH": str(root), **getattr(self, "env", {})}
        self.log = tempfile.NamedTemporaryFile("w+", suffix=".log")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [*command, "agent", "serve", f"--executor={kind}", "--device=cpu", "--port=0",
             f"--model-store={store}", "--post-workers=2", *extra],
            # In its own checkout: a server's model worker (``python -m``) imports from the
            # working directory first (a baseline's prepared models with this tree's code).
            stderr=self.log, stdout=subprocess.DEVNULL, env=env, text=True, cwd=root)
        deadline = time.monotonic() + 120
        self.port = 0
        while not self.port and time.monotonic() < deadline and self.proc.poll() is None:
            time.sleep(0.1)
            for line in Path(self.log.name).read_text().splitlines():
                if '"event": "serving"' in line:
                    self.port = json.loads(line)["port"]
        if not self.port:
            self.proc.kill()
            raise RuntimeError(f"the {kind} server did not start: {self.errors()}")

    def errors(self) -> list[str]:
        """The server's log lines that mention an error (an answer 500 logs one)."""
        lines = Path(self.log.name).read_text().splitlines()
        return [ln[:2000] for ln in lines if "error" in ln.lower()][-10:]

    def call(self, method: str, path: str, body: dict | None = None) -> tuple[int, Any]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)
        try:
            data = json.dumps(body).encode() if body is not None else None
            conn.request(method, path, data, {"Content-Type": "application/json"})
            answer = conn.getresponse()
            return answer.status, json.loads(answer.read() or b"null")
        finally:
            conn.close()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def register(server: Server, name: str, model: str, slo: float, rate: float) -> dict:
    """Register; on a refusal naming a holdable rate, register again at it."""
    body = {"name": name, "model": model, "slo_ms": slo, "rate_rps": rate}
    status, answer = server.call("POST", "/v1/sessions", body)
    out: dict[str, Any] = {"asked_rps": rate}
    if status == 201:
        return {**out, "admitted_rps": rate, "batch": answer["batch"],
                "request_path": answer.get("request_path")}
    out["refusal"] = {k: answer.get(k) for k in ("reason", "message", "required", "available",
                                                  "holdable_rate_rps")}
    holdable = answer.get("holdable_rate_rps") or 0.0
    if status == 409 and holdable >= 1.0:
        status, answer = server.call("POST", "/v1/sessions", {**body, "rate_rps": holdable})
        if status == 201:
            return {**out, "admitted_rps": holdable, "scaled_down": True,
                    "batch": answer["batch"], "request_path": answer.get("request_path")}
        out["second_refusal"] = answer
    return {**out, "admitted_rps": 0.0}


def offer_poisson(sessions: list[dict], seconds: float, one: Any,
                  began: float | None = None) -> None:
    """Poisson arrivals for ``seconds`` at each session's ``rate`` (seeded by its position),
    each request ``one(name, slo_ms)`` on a pool of threads; returns when all are answered."""
    pool = ThreadPoolExecutor(256)
    began = time.monotonic() if began is None else began

    def offer(name: str, rate: float, slo: float | None, seed: int) -> None:
        rng = random.Random(seed)
        t = began
        while True:
            t += rng.expovariate(rate)
            if t - began > seconds:
                return
            delay = t - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            pool.submit(one, name, slo)

    threads = [threading.Thread(target=offer, args=(s["name"], s["rate"], s.get("slo_ms"), i))
               for i, s in enumerate(sessions) if s["rate"] > 0]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    pool.shutdown(wait=True)


def run_client(spec: dict) -> dict:
    """Poisson clients for every session, a new connection per request (client process)."""
    port, seconds = spec["port"], spec["seconds"]
    bodies = {s["name"]: encode_npy(np.zeros((1, s["width"]), np.float32))
              for s in spec["sessions"]}
    records: list[tuple[str, int, float, str, float, float]] = []
    lock = threading.Lock()

    def one(name: str, slo: float) -> None:
        start, wall = time.monotonic(), time.time() * 1000.0
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        status, why, connected, server_ms = -1, "", 0.0, -1.0
        try:
            conn.connect()
            connected = (time.monotonic() - start) * 1000
            left = slo - connected - REPLY_RESERVE_MS
            if left <= 0:
                status, why = 0, "client_expired"
            else:
                conn.request("POST", f"/v1/sessions/{name}/infer", bodies[name], {
                    "Content-Type": "application/x-npy",
                    "X-Tandem-Deadline": f"{wall + slo - REPLY_RESERVE_MS:.3f}"})
                answer = conn.getresponse()
                data = answer.read()
                status = answer.status
                server_ms = float(answer.getheader("X-Tandem-Latency-Ms") or -1)
                if status != 200:
                    why = json.loads(data).get("reason") or json.loads(data).get("error", "")
        except (OSError, http.client.HTTPException, ValueError) as exc:
            why = type(exc).__name__
        finally:
            conn.close()
        with lock:
            records.append((name, status, (time.monotonic() - start) * 1000, why, connected,
                            server_ms))

    offer_poisson(spec["sessions"], seconds, one)
    return {"records": records}


def summarise(records: list, sessions: list[dict], seconds: float) -> dict:
    out = {}
    for s in sessions:
        mine = [r for r in records if r[0] == s["name"]]
        slo = s["slo_ms"]
        ok = [r for r in mine if r[1] == 200]
        on_time = [r for r in ok if r[2] <= slo]
        reasons: dict[str, int] = {}
        for r in mine:
            if r[1] != 200:
                key = f"{r[1]} {r[3]}".strip()
                reasons[key] = reasons.get(key, 0) + 1
        lat = sorted(r[2] for r in ok)
        late = [r for r in ok if r[2] > slo]
        held = [r for r in mine if r[3] != "scaled_down"]
        out[s["name"]] = {
            "slo_ms": slo, "offered_rps": s["rate"], "sent": len(mine),
            "achieved_offered_rps": len(mine) / seconds,
            "ok_200": len(ok), "on_time_200": len(on_time), "late_200": len(ok) - len(on_time),
            "attainment": len(on_time) / len(mine) if mine else None,
            # Over the requests within the rate the server held (those above it, once
            # it scaled the session down while serving, were answered scaled_down).
            "attainment_held": len(on_time) / len(held) if held else None,
            "not_200": reasons,
            "p50_ms": lat[len(lat) // 2] if lat else None,
            "p99_ms": lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else None,
            # Where a late 200's time went: connecting, inside the server (its own
            # latency header, from the accept), and the rest (the client's side).
            "late_200_detail": [{"total_ms": round(r[2], 2), "connect_ms": round(r[4], 2),
                                 "server_ms": round(r[5], 2)} for r in late[:10]],
        }  # fmt: skip
    return out


@contextlib.contextmanager
def cpu_hogs(on: bool) -> Iterator[int]:
    """One busy-looping process per core while inside (none unless ``on``); yields
    how many."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(os.cpu_count() or 1)] if on else []
    try:
        time.sleep(0.5 if on else 0)
        yield len(hogs)
    finally:
        for p in hogs:
            p.kill()
            p.wait()


def client_records(script: str, spec: dict, seconds: float) -> list:
    """Run ``script --client SPEC`` in another process; the records it printed."""
    client = subprocess.run(
        [sys.executable, script, "--client", json.dumps(spec)],
        capture_output=True, text=True, timeout=seconds + 180,
        env={**os.environ, "PYTHONPATH": str(_common.ROOT)})
    if client.returncode != 0:
        raise RuntimeError(f"client failed: {client.stderr[-2000:]}")
    return json.loads(client.stdout)["records"]


def scenario(kind: str, hog: bool, store: Path, rates: dict[str, float],
             seconds: float, root: Path = _common.ROOT) -> dict:
    with cpu_hogs(hog) as hogs:
        load_before = _common.load_average()
        server = Server(kind, store, root)
        try:
            admitted = {name: register(server, name, f"{name}.onnx", slo, rates[name])
                        for name, _w, _l, slo in SESSIONS}
            client_sessions = [{"name": n, "width": w, "slo_ms": slo,
                                "rate": OFFERED * admitted[n]["admitted_rps"]}
                               for n, w, _l, slo in SESSIONS]
            spec = {"port": server.port, "seconds": seconds, "sessions": client_sessions}
            records = client_records(str(Path(__file__)), spec, seconds)
            _status, snap = server.call("GET", "/v1/sessions")
            server_errors = server.errors()
        finally:
            server.stop()
    server_view = {s["name"]: {k: s.get(k) for k in ("arrived", "served", "good", "late",
                                                      "dropped", "drop_reasons", "batch",
                                                      "held")}
                   for s in snap["sessions"]}
    return {
        "cpu_hog_processes": hogs, "load_average_before": load_before,
        "load_average_after": _common.load_average(),
        "admission": admitted,
        "client": summarise(records, client_sessions, seconds),
        "server": {"sessions": server_view, "request_path": snap.get("request_path"),
                   "log_errors": server_errors,
                   "latency_margin": snap["latency_margin"], "replans": snap["replans"]},
    }


def http_load(seconds: float, kinds: list[str], max_rps: float,
              baseline: Path | None = None) -> dict:
    """Every scenario for every executor (the ``--http-load`` section of serving.py);
    with ``baseline`` (another checkout), its server too, on the first executor."""
    out: dict[str, Any] = {
        "load": {"sessions": [{"name": n, "mlp_width": w, "layers": layer, "slo_ms": slo}
                              for n, w, layer, slo in SESSIONS],
                 "rate_rule": f"min({SHARE} * 1000 / l(1) ms, {max_rps}) rps per session",
                 "offered": f"{OFFERED:.0%} of each admitted rate, Poisson, new connection "
                            "per request, clients in another process",
                 "client_deadline_header": "X-Tandem-Deadline = time before connecting + "
                                           f"SLO - {REPLY_RESERVE_MS} ms (Unix ms)",
                 "seconds_per_scenario": seconds},
    }
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp)
        for name, width, layers, _slo in SESSIONS:
            onnx.save(mlp(width, layers, seed=len(name) + width), store / f"{name}.onnx")
        for kind in kinds:
            l1 = {n: batch1_ms(kind, store / f"{n}.onnx", w) for n, w, _l, _s in SESSIONS}
            rates = {n: min(SHARE * 1000.0 / l1[n], max_rps) for n in l1}
            out[kind] = {"batch1_ms": l1, "rates_rps": rates}
            for label, hog in (("as_is", False), ("cpu_hog", True)):
                out[kind][label] = scenario(kind, hog, store, rates, seconds)
                if baseline is not None and kind == kinds[0]:
                    out.setdefault("baseline", {"server_code": _baseline_label(baseline),
                                                "executor": kind})
                    out["baseline"][label] = scenario(kind, hog, store, rates, seconds,
                                                      baseline)
    out["goal"] = ("client-side attainment >= 99% for every admitted session, or the session "
                   "refused or scaled down with a reason; no 200 after its deadline")
    out["met"] = {f"{k}/{c}": _met(out[k][c]) for k in kinds for c in ("as_is", "cpu_hog")}
    if baseline is not None:
        out["met"].update({f"baseline/{c}": _met(out["baseline"][c])
                           for c in ("as_is", "cpu_hog")})
    return out


def _baseline_label(root: Path) -> str:
    """The baseline checkout's commit, for the record."""
    head = subprocess.run(["git", "-C", str(root), "log", "-1", "--format=%h %s"],
                          capture_output=True, text=True)
    return head.stdout.strip() or str(root)


def _met(result: dict) -> bool:
    """No late 200; every admitted session at 99% or more, unless the server scaled it
    down while serving (its reason is in ``server.sessions.NAME.held``)."""
    for name, row in result["client"].items():
        if row["late_200"]:
            return False
        held = (result["server"]["sessions"].get(name) or {}).get("held") or {}
        if held.get("scale_downs"):
            continue
        if result["admission"][name]["admitted_rps"] > 0 and (row["attainment"] or 0) < 0.99:
            return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--executors", default="onnxruntime,torch")
    parser.add_argument("--max-rps", type=float, default=60.0)
    parser.add_argument("--baseline", type=Path, default=None,
                        help="another checkout whose server runs the same load (first executor)")
    parser.add_argument("--client", help=argparse.SUPPRESS)
    _common.add_out_option(parser, "serving_http_cpu")
    args = parser.parse_args()
    if args.client:
        print(json.dumps(run_client(json.loads(args.client))))
        return
    started = time.perf_counter()
    out = {"benchmark": "serving_http", **http_load(args.seconds, args.executors.split(","),
                                                     args.max_rps, args.baseline)}
    out["wall_seconds"] = time.perf_counter() - started
    out.update(_common.context(("numpy", "onnxruntime", "torch", "cheroot")))
    _common.write_result(out, args.out)


if __name__ == "__main__":
    main()
