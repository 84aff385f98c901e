"""benchmarks/bind_cpu.py's own arithmetic: threads grouped by part, verbs and parts timed,
figures per pod (a run needs the 1,000-node cluster: the benchmark itself, not a test)."""

from __future__ import annotations

import time

from bench_modules import load

load("_common")  # the benchmark's own first import, found beside it when run as a script
bind_cpu = load("bind_cpu")


def test_threads_are_grouped_by_what_they_do():
    assert [bind_cpu._group(n) for n in ("CP Server Thread-12", "tandem-records-3",
                                         "tandem-watch-pods", "7")] == \
        ["http_workers", "tandem-records", "tandem-watch-pods", "unnamed"]


class Spins:
    def work(self, seconds):
        end = time.thread_time() + seconds
        while time.thread_time() < end:
            pass
        return "done"

    @staticmethod
    def still(seconds):
        return Spins().work(seconds)


def test_parts_and_verbs_count_thread_cpu(monkeypatch):
    monkeypatch.setattr(bind_cpu, "_probe_target", Spins, raising=False)
    meter = bind_cpu.PartMeter(["bind_cpu:_probe_target.work", "bind_cpu:_probe_target.still"])
    assert Spins.still(0.02) == "done"  # the static method stays static
    assert meter.cpu["bind_cpu:_probe_target.still"] >= 0.02
    assert meter.cpu["bind_cpu:_probe_target.work"] >= 0.02  # nested: counted in both

    def app(environ, start_response):
        Spins().work(0.01)
        return [b"{}"]
    verbs = bind_cpu.VerbMeter(app)
    assert verbs({"PATH_INFO": "/bind"}, None) == [b"{}"]
    verbs({"PATH_INFO": "/metrics"}, None)  # not a verb: not counted
    assert verbs.calls == {"/filter": 0, "/prioritize": 0, "/bind": 1}
    assert verbs.cpu["/bind"] >= 0.01


def test_figures_are_per_pod_and_the_bind_path_adds_its_background():
    raw = {"process_cpu_s": 1.0, "settled": True, "parts_cpu_s": {},
           "threads_cpu_s": {"http_workers": 0.6, "tandem-watch-pods": 0.1,
                             "tandem-records": 0.05, "tandem-events": 0.05, "MainThread": 0.0},
           "verbs_cpu_s": {"/filter": 0.2, "/prioritize": 0.2, "/bind": 0.1}}
    out = bind_cpu._per_pod(raw, 100)
    assert out["process_us"] == 10000.0
    assert out["cheroot_us"] == 1000.0  # the workers' time outside the verbs
    assert out["bind_path_us"] == round(1000.0 + 1000.0 / 3 + 2000.0, 1)
    assert out["bind_path_over_filter"] == round((1000.0 + 1000.0 / 3 + 2000.0) / 2000.0, 3)
    assert "MainThread" not in out["threads_us"]  # under half a microsecond per pod
