"""The ``queue:`` config section: defaults, validation with paths, env overrides, and
its translation (plus command-line overrides) into the controller's ``GateConfig``."""

from __future__ import annotations

from typing import Any

import pytest

from extender.config.loader import apply_env, load_config
from extender.config.schema import ConfigError, build_config
from extender.config.sections import QueueSettings
from extender.queue import QueueConfig, QueueError
from extender.wiring import gate_config


def test_defaults_follow_horus_and_leave_the_gate_off() -> None:
    cfg = load_config(None, environ={})
    assert cfg.queue == QueueSettings()
    assert (cfg.queue.enabled, cfg.queue.k, cfg.queue.beta) == (False, 3, 15)
    assert cfg.queue.gate_name == "tandem.io/queue"
    assert cfg.queue.namespaces == ()
    assert cfg.predictor.allow_simulated is False


def test_a_full_section_builds_frozen_values() -> None:
    cfg = build_config({"queue": {
        "enabled": True, "k": 2, "beta": 4, "starvation_seconds": 600,
        "interval_seconds": 2, "gate_name": "example.com/fair", "namespaces": ["ml", "team-b"]}})
    assert cfg.queue == QueueSettings(True, QueueConfig(2, 4, 600.0), 2.0, "example.com/fair",
                                      ("ml", "team-b"))
    assert isinstance(cfg.queue.starvation_seconds, float)


BAD = [
    ("k-zero", {"k": 0}, "queue.k: must be in 1..64"),
    ("k-text", {"k": "3"}, "queue.k: must be int, got str"),
    ("beta-bool", {"beta": True}, "queue.beta: must be int, got a boolean"),
    ("beta-huge", {"beta": 10_001}, "queue.beta: must be in 1..10000"),
    ("starvation-zero", {"starvation_seconds": 0}, "queue.starvation_seconds: must be > 0"),
    ("starvation-inf", {"starvation_seconds": float("inf")},
     "queue.starvation_seconds: must be > 0 and finite"),
    ("interval-tiny", {"interval_seconds": 0.01}, "queue.interval_seconds: must be in 0.1..3600"),
    ("gate-space", {"gate_name": "tandem queue"}, "queue.gate_name: must be a qualified name"),
    ("gate-two-slashes", {"gate_name": "a/b/c"}, "queue.gate_name: must be a qualified name"),
    ("namespace-upper", {"namespaces": ["ML"]}, "queue.namespaces: must be a list of namespace"),
    ("namespace-not-list", {"namespaces": "ml"}, "queue.namespaces: must be list, got str"),
    ("enabled-text", {"enabled": "yes"}, "queue.enabled: must be bool, got str"),
    ("unknown-key", {"weights": 1}, "queue.weights: unknown key"),
]


@pytest.mark.parametrize(("section", "problem"), [(s, p) for _, s, p in BAD],
                         ids=[i for i, _, _ in BAD])
def test_bad_values_are_reported_with_their_path(section: dict[str, Any], problem: str) -> None:
    with pytest.raises(ConfigError) as err:
        build_config({"queue": section})
    assert any(p.startswith(problem) for p in err.value.problems), err.value.problems


def test_allow_simulated_must_be_a_boolean() -> None:
    with pytest.raises(ConfigError) as err:
        build_config({"predictor": {"allow_simulated": "true"}})
    assert err.value.problems == ["predictor.allow_simulated: must be bool, got str"]


@pytest.mark.parametrize(("env", "expected"), [
    ({"TANDEM__QUEUE__ENABLED": "true"}, {"enabled": True}),
    ({"TANDEM__QUEUE__BETA": "7", "TANDEM__QUEUE__K": "2"}, {"beta": 7, "k": 2}),
    ({"TANDEM__QUEUE__NAMESPACES": "[ml, team-b]"}, {"namespaces": ("ml", "team-b")}),
    ({"TANDEM__PREDICTOR__ALLOW_SIMULATED": "true"}, {}),
], ids=["enabled", "beta-and-k", "namespaces-list", "allow-simulated"])
def test_environment_overrides(env: dict[str, str], expected: dict[str, Any]) -> None:
    cfg = build_config(apply_env({}, env))
    for key, value in expected.items():
        assert getattr(cfg.queue, key) == value
    assert cfg.predictor.allow_simulated is ("TANDEM__PREDICTOR__ALLOW_SIMULATED" in env)


def test_gate_config_carries_every_setting() -> None:
    settings = QueueSettings(True, QueueConfig(2, 4, 600.0), 2.0, "example.com/fair", ("ml",))
    gate = gate_config(settings)
    assert (gate.queue.k, gate.queue.beta, gate.queue.starvation_seconds) == (2, 4, 600.0)
    assert (gate.interval_seconds, gate.gate_name, gate.namespaces) == (
        2.0, "example.com/fair", ("ml",))


def test_command_line_overrides_win_over_the_file() -> None:
    gate = gate_config(QueueSettings(fair=QueueConfig(k=3, beta=15)), k=1, beta=2,
                       interval_seconds=0.5)
    assert (gate.queue.k, gate.queue.beta, gate.interval_seconds) == (1, 2, 0.5)


@pytest.mark.parametrize(("overrides", "field_name"), [
    ({"beta": 0}, "beta"), ({"k": 0}, "k"), ({"interval_seconds": 0.0}, "interval_seconds"),
], ids=["beta-zero", "k-zero", "interval-zero"])
def test_bad_command_line_overrides_name_the_field(overrides: dict[str, Any],
                                                   field_name: str) -> None:
    with pytest.raises(QueueError) as err:
        gate_config(QueueSettings(), **overrides)
    assert err.value.field == field_name


class _Answer:
    gpu_util_percent = 70.0
    gpu_mem_mib = 3000.0


class _FakePredictor:
    def __init__(self, artifacts: object) -> None:
        self.artifacts = artifacts
        self.calls: list[tuple[Any, ...]] = []

    def predict(self, *args: Any) -> _Answer:
        self.calls.append(args)
        return _Answer()


def _model_pod(annotations: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "ml", "annotations": annotations},
            "spec": {"containers": [{"name": "c", "resources": {
                "limits": {"tandem.io/gpu": "1"}}}]}}


def test_predictor_demand_asks_with_no_gpu_type_for_the_conservative_answer() -> None:
    from extender.wiring import predictor_demand_fn

    fake = _FakePredictor(artifacts=object())
    demand = predictor_demand_fn(fake)
    assert demand is not None
    pod = _model_pod({"tandem.io/model": "resnet50.onnx", "tandem.io/batch-size": "16"})
    assert demand(pod) == (70.0, 3000.0)
    assert fake.calls == [("resnet50.onnx", 16, None, "training")]


@pytest.mark.parametrize("predictor", [None, _FakePredictor(artifacts=None)],
                         ids=["no-predictor", "untrained"])
def test_no_demand_function_without_a_trained_model(predictor: object) -> None:
    from extender.wiring import predictor_demand_fn

    assert predictor_demand_fn(predictor) is None
