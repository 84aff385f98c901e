"""Faults and hostile input, counted: what broke, what leaked, what answered 5xx.

Two parts, both in process on loopback:

- **Fuzzing.** Every endpoint body tandem serves (tests/fuzz_strategies.py: the
  extender's verbs and agent reports, the inference server's session and infer
  endpoints, the session proxy) gets ``--examples`` Hypothesis cases with right
  headers, as many with fuzzed headers, and a tenth of that of deeply nested or
  huge-number JSON. Counted per endpoint: cases, answers by class, 5xx, and
  property violations (5xx, traceback, 4xx without reason, state changed by a
  rejected request).
- **Fault campaign.** Two extender replicas (``kube`` source, real watches) on the
  loopback API server (lab/fakes/kube_api.py) bind ``--binds`` pods while
  faults are injected at random: bind answered 500/503/429/409 or lost after it
  was applied or stalled past the client timeout, event posts failing, pod watch
  history compacted (410) while pods end, the leader crashing mid-bind (a standby
  takes over), and agent reports renumbering GPUs. kube-scheduler's retry is
  played after each failed bind. At the end the leader's ledger and a freshly
  started replica's are audited against the pods the API server bound: reservations
  lost, leaked or moved (goal 0), and GPUs over their pod limit (goal 0).

    python benchmarks/fault_injection.py --examples 500 --binds 300
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# Run as a script, benchmarks/ is sys.path[0] and its predictor.py would shadow the package.
if Path(sys.path[0] or ".").resolve() == HERE:
    sys.path[0] = str(ROOT)
if str(ROOT / "tests") not in sys.path:
    sys.path.append(str(ROOT / "tests"))  # the fuzz strategies and the audited cluster
from bench_modules import load  # noqa: E402
from fault_cluster import PlainWatch, audit, cluster, k8s_pod, truth  # noqa: E402
from fuzz_strategies import Harness, check, fuzz_settings  # noqa: E402
from hypothesis import given  # noqa: E402

from extender.state.view import encoded  # noqa: E402

_common = load("_common")
FAULT_KINDS = ("none", "bind-500", "bind-503", "bind-429", "bind-409", "bind-lost",
               "bind-stall", "events-500", "watch-410", "failover", "renumber")
SMALL = {"tandem.io/gpu-util": "5", "tandem.io/gpu-mem-mib": "1000"}


# ---- fuzzing ----------------------------------------------------------------------------
def _fuzz_one(target: Any, kind: str, strategy: Any, n: int, tally: Counter[str],
              violations: list[str]) -> None:
    """``n`` cases of ``strategy`` against ``target``, tallied (violations never raise)."""
    @fuzz_settings(n, shrink=False, derandomize=True)
    @given(strategy)
    def one(req: Any) -> None:
        status, found = check(target, req)
        tally["cases"] += 1
        tally[f"{status // 100}xx"] += 1
        if status >= 500:
            tally[f"5xx_{kind}"] += 1
        if found:
            tally[f"violations_{kind}"] += 1
            if len(violations) < 3:
                violations.append(f"{kind}: {found} ({req.body[:60]!r})")
    one()


def fuzz(examples: int) -> dict[str, Any]:
    """Per endpoint: cases tried, answers by class, 5xx and property violations."""
    harness = Harness()
    endpoints: dict[str, Any] = {}
    try:
        for target in harness.targets():
            tally: Counter[str] = Counter()
            violations: list[str] = []
            runs = [("body", target.requests(), examples),
                    ("headers", target.requests(headers=True), examples),
                    ("deep-or-huge-json", target.adversarial(), max(1, examples // 10))]
            for kind, strategy, n in runs:
                if kind == "deep-or-huge-json" and "DELETE" in target.name:
                    continue
                _fuzz_one(target, kind, strategy, n, tally, violations)
            endpoints[target.name] = {
                "cases": tally["cases"],
                "answers": {k: tally[k] for k in ("2xx", "4xx", "5xx") if tally[k]},
                "violations": {k.removeprefix("violations_"): v for k, v in tally.items()
                               if k.startswith("violations_")},
                "answers_5xx": {k.removeprefix("5xx_"): v for k, v in tally.items()
                                if k.startswith("5xx_")},
                "examples": violations}
    finally:
        harness.close()
    return endpoints


# ---- fault campaign ------------------------------------------------------------------------
def wait_for(predicate: Any, seconds: float = 10.0) -> bool:
    """Poll ``predicate`` until true or ``seconds`` pass."""
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _report(replica: Any, node: str, uuids: list[str]) -> None:
    body = {"node": node, "timestamp": 1.0, "interval_seconds": 1.0,
            "gpus": [{"index": i, "uuid": u, "product": "NVIDIA A100-SXM4-40GB",
                      "memory_total_mib": 40960, "memory_used_mib": 0,
                      "utilization_percent": 0, "processes": []} for i, u in enumerate(uuids)]}
    r = replica.post("/v1/agents/report", body, {"Authorization": "Bearer agent-token"})
    assert r.status_code == 200, r.get_json()


def overcommitted(fake: Any, limit: int = 8) -> int:
    """GPUs (by UUID) holding more bound pods than the pod limit."""
    per_gpu = Counter((node, u) for node, uuids in truth(fake).values() for u in uuids)
    return sum(1 for count in per_gpu.values() if count > limit)


def campaign(binds: int, seed: int, nodes: int = 4) -> dict[str, Any]:
    """Bind ``binds`` pods under random faults; audit the ledgers at the end."""
    rng = random.Random(seed)
    faults: Counter[str] = Counter()
    outcomes: Counter[str] = Counter()
    unclear: list[str] = []
    with cluster(nodes) as c:
        leader = c.replica(PlainWatch)
        uuids = {f"gpu-{i}": [f"GPU-{i}-{g}" for g in range(3)] for i in range(nodes)}
        for node, ids in uuids.items():
            _report(leader, node, ids)
        bound: list[str] = []
        for i in range(binds):
            # Every kind once first (so a small run covers them all), then at random.
            name = f"p{i}"
            kind = FAULT_KINDS[i] if i < len(FAULT_KINDS) else rng.choice(FAULT_KINDS)
            faults[kind] += 1
            c.fake.put_pod(k8s_pod(name, SMALL))
            node = f"gpu-{rng.randrange(nodes)}"
            if kind.startswith("bind-"):
                code = kind.removeprefix("bind-")
                c.fake.inject("POST", "/binding$", int(code) if code.isdigit() else code,
                              stall_seconds=0.4)
            elif kind == "events-500":
                c.fake.inject("POST", "/events$", 500, times=2)
            elif kind == "watch-410" and bound:
                for gone in rng.sample(bound, min(3, len(bound))):  # pods end in the gap
                    bound.remove(gone)
                    c.fake.delete_pod("ml", gone)
                c.fake.compact()
                c.fake.inject("GET", r"^/api/v1/pods\?.*watch=true", 410)
            elif kind == "renumber":  # a GPU vanishes and the rest renumber, then it returns
                ids = uuids[node]
                _report(leader, node, ids[1:])
                _report(leader, node, ids[1:] + ids[:1])
                uuids[node] = ids[1:] + ids[:1]
            answer = leader.bind(name, node)
            if kind == "failover":  # the leader's binding is written, then it crashes
                c.fake.inject("POST", "/binding$", "lost")
                c.fake.put_pod(k8s_pod(f"{name}-f", SMALL))
                leader.bind(f"{name}-f", node)
                leader.source.stop()
                leader = c.replica(PlainWatch)  # the standby, now leading, rebuilt from the API
                for n, ids in uuids.items():
                    _report(leader, n, ids)
                answer = leader.bind(f"{name}-f", node)  # kube-scheduler's retry
                outcomes["failover-retry-" + ("error" if answer["Error"] else "ok")] += 1
                bound.append(f"{name}-f")
                answer = {"Error": ""}
            error = answer["Error"]
            if error:
                clear = any(w in error for w in ("outcome unknown", "failed:", "no longer fits",
                                                 "already"))
                if not clear and len(unclear) < 5:
                    unclear.append(error)
                outcomes["error-clear" if clear else "error-unclear"] += 1
                answer = leader.bind(name, node)  # kube-scheduler's retry
                outcomes["retry-ok" if not answer["Error"] else "retry-error"] += 1
            else:
                outcomes["bound"] += 1
            if not answer["Error"]:
                bound.append(name)
            if len(bound) > 48:  # churn: pods end, so the cluster never fills up
                c.fake.delete_pod("ml", bound.pop(rng.randrange(len(bound))))
        settled = wait_for(lambda: audit(c.fake, leader.state).clean
                           and encoded(leader.state.snapshot())["assumed"] == 0)
        live = audit(c.fake, leader.state)
        restarted = c.replica()
        for node, ids in uuids.items():
            _report(restarted, node, ids)
        rebuilt = audit(c.fake, restarted.state)
        return {
            "binds": binds, "seed": seed, "nodes": nodes, "gpus_per_node": 3,
            "faults_per_kind": dict(sorted(faults.items())),
            "api_faults_injected": dict(sorted(c.fake.faults_injected.items())),
            "bind_outcomes": dict(sorted(outcomes.items())),
            "unclear_errors": unclear,
            "pods_bound_at_end": len(truth(c.fake)),
            "ledger_settled_within_10s": settled,
            "reservations": {
                "leader": {"lost": len(live.lost), "leaked": len(live.leaked),
                           "moved": len(live.moved)},
                "restarted_replica": {"lost": len(rebuilt.lost), "leaked": len(rebuilt.leaked),
                                      "moved": len(rebuilt.moved)}},
            "gpus_over_pod_limit": overcommitted(c.fake),
        }


def run(examples: int, binds: int, seed: int) -> dict[str, Any]:
    """Both parts and the totals the issue asks for."""
    started = time.perf_counter()
    endpoints = fuzz(examples)
    fuzz_seconds = time.perf_counter() - started
    faults = campaign(binds, seed)
    res = faults["reservations"]
    return {
        "benchmark": "fault_injection",
        "summary": {
            "endpoints_fuzzed": list(endpoints),
            "cases_tried": sum(e["cases"] for e in endpoints.values()),
            "answers_5xx": sum(e["answers"].get("5xx", 0) for e in endpoints.values()),
            "property_violations": sum(v for e in endpoints.values()
                                       for v in e["violations"].values()),
            "faults_injected": sum(v for k, v in faults["faults_per_kind"].items()
                                   if k != "none"),
            "reservations_lost": res["leader"]["lost"] + res["restarted_replica"]["lost"],
            "reservations_leaked": res["leader"]["leaked"] + res["restarted_replica"]["leaked"],
            "gpus_over_pod_limit": faults["gpus_over_pod_limit"],
        },
        "fuzzing": {"examples_per_run": examples, "seconds": round(fuzz_seconds, 1),
                    "endpoints": endpoints},
        "fault_campaign": faults,
        "seconds": round(time.perf_counter() - started, 1),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Parse options, run, print and write the result."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=500,
                        help="Hypothesis cases per endpoint and run (default 500)")
    parser.add_argument("--binds", type=int, default=300, help="pods bound under faults")
    parser.add_argument("--seed", type=int, default=15)
    _common.add_out_option(parser, "fault_injection")
    args = parser.parse_args(argv)
    result = {**run(args.examples, args.binds, args.seed),
              **_common.context(("hypothesis", "kubernetes", "flask", "numpy"))}
    _common.write_result(result, args.out)
    return result


if __name__ == "__main__":
    main()
