"""The progress contract: the annotation's one reader, the report's ``progress`` entries,
the agent's scraper (rates, reasons, the pod's own address) and the client counter."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.node.progress import ProgressScraper, ProgressTarget, counter_value, pod_address, targets
from contracts.agentreport import (
    AgentReport,
    ReportedGpu,
    ReportedProgress,
    ReportError,
    decode_report,
    encode_report,
)
from contracts.annotations import PROGRESS, AnnotationError, ProgressEndpoint, parse_progress
from contracts.state import bounded_annotations
from tandem.progress import ProgressCounter


def test_the_annotation_names_a_port_path_and_counters() -> None:
    got = parse_progress("port=9400, steps=train_steps_total,samples=train_samples")
    assert got == ProgressEndpoint(9400, "train_steps_total", "/metrics", "train_samples")
    assert parse_progress("port=8080,path=/m/x,steps=s").path == "/m/x"


@pytest.mark.parametrize("value", [
    "", "steps=s", "port=9400", "port=0,steps=s", "port=9400,steps=s,steps=t",
    "port=9400,steps=bad-name", "port=9400,steps=s,host=evil.example",
    "port=9400,path=http://evil/,steps=s", "port=9400,path=/../x,steps=s", 42,
    "port=9400,steps=" + "s" * 600])
def test_a_bad_annotation_is_refused_with_its_field(value: object) -> None:
    with pytest.raises(AnnotationError) as err:
        parse_progress(value)
    assert err.value.field == PROGRESS


def test_the_state_document_repeats_the_progress_annotation() -> None:
    kept, omitted = bounded_annotations({PROGRESS: "port=1,steps=s"})
    assert kept == ((PROGRESS, "port=1,steps=s"),) and omitted == 0


def _report(progress: tuple[ReportedProgress, ...]) -> AgentReport:
    return AgentReport("n", (ReportedGpu(0, "GPU-0", "NVIDIA H100", 80000.0,
                                         progress=progress),))


def test_progress_entries_round_trip_and_are_optional() -> None:
    entries = (ReportedProgress("uid-a", 3.5, 10.0, 112.0), ReportedProgress("uid-b", 1.0, 10.0))
    assert decode_report(encode_report(_report(entries))) == _report(entries)
    doc = encode_report(_report(()))
    assert "progress" not in doc["gpus"][0]  # older extenders see nothing new
    assert decode_report(doc).gpus[0].progress == ()


@pytest.mark.parametrize("entry, field", [
    ({"pod_uid": "", "steps_per_s": 1, "window_s": 1}, "pod_uid"),
    ({"pod_uid": "u", "steps_per_s": -1, "window_s": 1}, "steps_per_s"),
    ({"pod_uid": "u", "steps_per_s": float("nan"), "window_s": 1}, "steps_per_s"),
    ({"pod_uid": "u", "steps_per_s": 1, "window_s": 0}, "window_s"),
    ({"pod_uid": "u", "steps_per_s": 1, "window_s": 1, "samples_per_s": "x"}, "samples_per_s"),
])
def test_a_bad_progress_entry_names_its_field(entry: dict, field: str) -> None:
    doc = encode_report(_report(()))
    doc["gpus"][0]["progress"] = [entry]
    with pytest.raises(ReportError) as err:
        decode_report(doc)
    assert err.value.path == f"gpus[0].progress[0].{field}"


def test_a_pod_listed_twice_is_refused() -> None:
    doc = encode_report(_report((ReportedProgress("u", 1.0, 1.0),)))
    doc["gpus"][0]["progress"] *= 2
    with pytest.raises(ReportError, match="twice"):
        decode_report(doc)


def test_counter_value_sums_series_and_refuses_garbage() -> None:
    page = ('# TYPE steps counter\nsteps_total{rank="0"} 10\nsteps_total{rank="1"} 12\n'
            "other 5\n")
    assert counter_value(page, "steps") == 22
    assert counter_value(page, "missing") is None
    assert counter_value("steps NaN\n", "steps") is None
    assert counter_value("steps -3\n", "steps") is None


def test_pod_address_reads_the_pods_network_namespace(tmp_path: Path) -> None:
    net = tmp_path / "41" / "net"
    net.mkdir(parents=True)
    (net / "fib_trie").write_text(
        "Main:\n  +-- 0.0.0.0/0 3 0 5\n     |-- 10.244.1.0\n        /24 link UNICAST\n"
        "     |-- 10.244.1.17\n        /32 host LOCAL\n  +-- 127.0.0.0/8 2 0 2\n"
        "     |-- 127.0.0.1\n        /32 host LOCAL\n")
    assert pod_address(tmp_path, 41) == "10.244.1.17"
    assert pod_address(tmp_path, 42) is None


class _Pages:
    def __init__(self) -> None:
        self.pages: dict[str, str | None] = {}
        self.now = 0.0

    def get(self, url: str) -> str | None:
        return self.pages.get(url)


def test_the_scraper_reports_rates_and_skips_with_reasons() -> None:
    pages = _Pages()
    scraper = ProgressScraper(pages.get, clock=lambda: pages.now)
    target = ProgressTarget("u", (0, 1), ProgressEndpoint(9400, "steps", samples="samples"),
                            "10.0.0.5")
    url = "http://10.0.0.5:9400/metrics"
    pages.pages[url] = "steps 100\nsamples 3200\n"
    assert scraper.scrape([target]) == {}  # the first scrape gives no rate
    pages.now, pages.pages[url] = 10.0, "steps 150\nsamples 4800\n"
    got = scraper.scrape([target])
    assert got[0] == got[1] == (ReportedProgress("u", 5.0, 10.0, 160.0),)
    pages.now, pages.pages[url] = 20.0, "steps 3\nsamples 96\n"
    assert scraper.scrape([target]) == {}  # restarted: a reset, never a negative rate
    pages.now, pages.pages[url] = 30.0, "nothing here\n"
    assert scraper.scrape([target]) == {}
    pages.pages[url] = None
    assert scraper.scrape([target]) == {}
    assert scraper.skipped == {"first-scrape": 1, "counter-reset": 1, "no-counter": 1,
                               "unreachable": 1}


def test_targets_need_a_readable_annotation_and_an_address(tmp_path: Path) -> None:
    net = tmp_path / "7" / "net"
    net.mkdir(parents=True)
    (net / "fib_trie").write_text("     |-- 10.1.2.3\n        /32 host LOCAL\n")
    skipped: list[tuple[str, str]] = []
    pods = [("a", 0, {PROGRESS: "port=9400,steps=s"}), ("a", 1, {PROGRESS: "port=9400,steps=s"}),
            ("b", 0, {PROGRESS: "port=oops"}), ("c", 0, {PROGRESS: "port=1,steps=s"}),
            ("d", 0, {})]
    found = targets(pods, {"a": [7], "c": [8]}, tmp_path, lambda r, u: skipped.append((r, u)))
    assert found == [ProgressTarget("a", (0, 1), ProgressEndpoint(9400, "s"), "10.1.2.3")]
    assert sorted(skipped) == [("bad-annotation", "b"), ("no-address", "c")]


def test_the_client_counter_serves_what_the_scraper_reads() -> None:
    counter = ProgressCounter(port=0, host="127.0.0.1")
    try:
        counter.step(samples=32)
        counter.step(samples=32)
        endpoint = parse_progress(counter.annotation())
        scraper = ProgressScraper()
        page = scraper._get(f"http://127.0.0.1:{endpoint.port}{endpoint.path}")
        assert page is not None
        assert counter_value(page, endpoint.steps) == 2
        assert counter_value(page, endpoint.samples or "") == 64
        with pytest.raises(ValueError):
            counter.step(steps=-1)
    finally:
        counter.close()
