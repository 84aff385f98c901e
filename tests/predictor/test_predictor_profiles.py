"""Batching profiles: the shipped Nexus files, the planning margin, linear fits, stores."""

from __future__ import annotations

from pathlib import Path

import pytest

from contracts.profilefile import ProfileFileError
from predictor.batching import ProfileError
from predictor.errors import ProfileNotFound
from predictor.profiles import (
    NEXUS_MARGIN,
    NO_MARGIN,
    ProfileStore,
    fit_linear,
    load_nexus_dir,
    parse_nexus,
    profiles_from_batching_rows,
    profiles_from_document,
)


def test_shipped_nexus_profiles_parse(nexus_profiles_dir: Path) -> None:
    profiles = {p.model: p for p in load_nexus_dir(nexus_profiles_dir)}
    assert set(profiles) == {"vgg16", "vgg_face", "vgg_s", "yolo9000"}
    vgg = profiles["vgg16"]
    assert vgg.gpu_name == "TITAN_X_(Pascal)"
    assert vgg.batches[0] == 1
    assert vgg.mean_ms[0] == pytest.approx(6.2774)
    assert vgg.std_ms[0] == pytest.approx(0.0223517)
    assert vgg.memory_mib[0] == pytest.approx(949944320 / 2**20)
    assert vgg.preprocess_ms == pytest.approx((3.30644, 1.53562))
    assert profiles["yolo9000"].profile_id == "darknet:yolo9000:1:480x480"


def test_nexus_margin_is_mean_plus_std_times_1_15(nexus_profiles_dir: Path) -> None:
    vgg = next(p for p in load_nexus_dir(nexus_profiles_dir) if p.model == "vgg16")
    profile = vgg.to_profile("titanx")
    assert profile.latency_ms(1) == pytest.approx((6.2774 + 0.0223517) * 1.15)
    raw = vgg.to_profile("titanx", margin=NO_MARGIN)
    assert raw.latency_ms(2) == pytest.approx(14.499)
    # VGG-16 measures batch 5 faster than batch 4: the table answers the running max
    assert raw.latency_ms(5) == raw.latency_ms(4)


def test_linear_fit_of_vgg16_is_close_to_linear(nexus_profiles_dir: Path) -> None:
    vgg = next(p for p in load_nexus_dir(nexus_profiles_dir) if p.model == "vgg16")
    fit = fit_linear(vgg.batches, vgg.planned_ms(NEXUS_MARGIN))
    assert fit.r2 > 0.99
    assert 2.0 < fit.alpha_ms < 5.0
    linear = vgg.to_profile("titanx", linear=True)
    assert linear.alpha_ms == pytest.approx(fit.alpha_ms)


@pytest.mark.parametrize(
    ("xs", "ys", "alpha", "beta", "r2"),
    [
        ([1, 2, 3, 4], [5, 7, 9, 11], 2.0, 3.0, 1.0),
        ([1, 3], [1, 1], 0.0, 1.0, 1.0),
        ([1, 2, 3], [1, 3, 2], 0.5, 1.0, 0.25),
    ],
    ids=["exact-line", "flat", "noisy"],
)
def test_fit_linear(xs, ys, alpha, beta, r2) -> None:
    fit = fit_linear(xs, ys)
    assert (fit.alpha_ms, fit.beta_ms, fit.r2) == pytest.approx((alpha, beta, r2))


@pytest.mark.parametrize(
    "text",
    [
        "a:b:1\nGPU\n",
        "nocolons\nGPU\nForward latency\nbatch,latency(us),std(us),memory(B)\n1,2,3,4",
        "a:b:1\nGPU\nForward latency\nbatch,latency(us),std(us),memory(B)\n1,x,3,4",
        "a:b:1\nGPU\nForward latency\nbatch,latency(us),std(us),memory(B)\n0,2,3,4",
        "a:b:1\nGPU\nPreprocess latency\nmean(us),std(us)\n1,2\nmore\n",
    ],
    ids=["too-short", "bad-id", "non-numeric", "batch-zero", "no-forward-section"],
)
def test_broken_nexus_files_raise_profile_error(text: str) -> None:
    with pytest.raises(ProfileError):
        parse_nexus(text)


def test_plan_file_entries() -> None:
    def one(entry: dict) -> object:
        (profile,) = profiles_from_document({"profiles": [entry]}, "t").values()
        return profile

    lin = one({"model": "A", "gpu_type": "t", "linear": {"alpha_ms": 3.125, "beta_ms": 37.5}})
    assert lin.latency_ms(4) == pytest.approx(50.0)
    tab = one({"model": "B", "gpu_type": "t", "table": [[4, 50], [8, 90]], "memory_mib": 500})
    assert tab.latency_ms(6) == pytest.approx(70.0)
    assert tab.memory_mib == 500
    with pytest.raises(ProfileFileError):
        one({"model": "C", "gpu_type": "t"})
    with pytest.raises(ProfileFileError):
        one({"model": "C", "gpu_type": "t", "linear": {"alpha_ms": 1}})


def test_batching_rows_and_store_errors() -> None:
    rows = [
        {
            "model": "m",
            "gpu_product": "g",
            "batch_size": b,
            "latency_mean_ms": 2.0 * b,
            "latency_std_ms": 0.0,
            "mem_mib": 100.0 + b,
        }
        for b in (1, 2, 4)
    ]
    [profile] = profiles_from_batching_rows(rows, NO_MARGIN)
    store = ProfileStore([profile])
    assert store.get("m", "g").latency_ms(3) == pytest.approx(6.0)
    assert store.get("m", "g").memory_mib == 104.0
    with pytest.raises(ProfileNotFound) as info:
        store.get("m", "other-gpu")
    assert (info.value.model, info.value.gpu_type) == ("m", "other-gpu")
    assert info.value.known == (("m", "g"),)
