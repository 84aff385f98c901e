"""benchmarks/serving_path_cpu.py: thread roles, per-thread CPU, and the harness's window
of profiled functions."""

from __future__ import annotations

import cProfile
import json
import os
import threading
import time

from bench_modules import load

harness = load("path_cpu_harness")
serving_path_cpu = load("serving_path_cpu")


def test_thread_roles_from_names() -> None:
    assert harness.group("CP Server Thread-3") == "http_workers"
    assert harness.group("tandem-gpu") == "executor_loop"
    assert harness.group("tandem-post_1") == "post_processing"
    assert harness.group("tandem-http") == "http_accept"
    assert harness.group("Thread-7") == "other"


def test_thread_cpu_counts_this_thread() -> None:
    before = serving_path_cpu.thread_cpu(os.getpid())
    end = time.thread_time() + 0.05
    while time.thread_time() < end:
        pass
    after = serving_path_cpu.thread_cpu(os.getpid())
    me = threading.get_native_id()
    assert after[me] - before[me] >= 0.04


def test_window_keeps_what_ran_between_the_marks(tmp_path, monkeypatch) -> None:
    out = tmp_path / "h.json"
    monkeypatch.setenv(harness.OUT_ENV, str(out))
    profiler = cProfile.Profile(time.thread_time)
    monkeypatch.setitem(harness._profilers, 1, profiler)
    monkeypatch.setattr(harness, "_marks", [])

    def before_window() -> None:
        sum(range(1000))

    def in_window() -> None:
        sum(range(1000))

    profiler.enable()
    before_window()
    harness._mark()
    in_window()
    profiler.disable()
    harness._mark()
    functions = json.loads(out.read_text())["functions"]
    assert any("in_window" in k for k in functions)
    assert not any("before_window" in k for k in functions)
