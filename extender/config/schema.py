"""Validating a config document: per-section tables of types and ranges, then building.

:func:`build_config` checks every key of a decoded document against :data:`SCHEMA`
(and the ``cost`` section, profile sources and model sources against their own
rules), collecting every problem with its path (``cost.curves.A100.slope: must be
>= 0``), and only when there is none builds the frozen
:class:`~extender.config.sections.ExtenderConfig`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from contracts.interferencefile import InterferenceFileError, load_interference_file
from extender.config.sections import (
    DEFAULT_MIN_COLOCATION_GAIN,
    ExtenderConfig,
    HandoffConfig,
    LearningConfig,
    NexusProfileSource,
    PredictorConfig,
    QueueSettings,
    ReportsConfig,
    ServerConfig,
    StateConfig,
)
from extender.core import CostPolicy, gpu_type_of
from extender.core.cost import MAX_PODS_RANGE
from extender.core.fragmentation import WEIGHTINGS
from extender.core.packing import PackingPolicy
from extender.core.share_score import SCORE_RANGE
from extender.queue.fair import BETA_RANGE, K_RANGE, QueueConfig
from predictor.curves import (
    CurveFileError,
    InterferenceCurve,
    load_curves,
    parse_curve,
    parse_curves,
)
from predictor.store import source_problem


class ConfigError(ValueError):
    """The configuration is invalid; ``problems`` lists every one with its path."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("invalid configuration:\n  " + "\n  ".join(problems))


SCHEMA: dict[str, dict[str, tuple[type | tuple[type, ...], Callable[[Any], bool] | None, str]]] = {
    "server": {
        "host": (str, None, ""),
        "port": (int, lambda v: 0 <= v <= 65535, "must be in 0..65535"),
        "max_body_bytes": (int, lambda v: 1024 <= v <= 1 << 30, "must be in 1 KiB..1 GiB"),
        "threads": (int, lambda v: 1 <= v <= 256, "must be in 1..256"),
        "tls_cert_file": ((str, type(None)), None, ""),
        "tls_key_file": ((str, type(None)), None, ""),
        "tls_client_ca_file": ((str, type(None)), None, ""),
        "scheduler_client_names": (list, lambda v: bool(v) and all(
            isinstance(n, str) and n for n in v), "must be a non-empty list of names"),
        "request_read_timeout_seconds": ((int, float), lambda v: 0 < v <= 300,
                                         "must be in (0, 300]"),
    },
    "state": {
        "assume_ttl_seconds": ((int, float), lambda v: v > 0, "must be > 0"),
        "demand_cache_seconds": ((int, float), lambda v: v > 0, "must be > 0"),
        "signing_key_file": ((str, type(None)), None, ""),
        "signing_key_env": (str, None, ""),
    },
    "handoff": {
        "mode": (str, lambda v: v in ("env", "device-plugin"), "must be env or device-plugin"),
        "timeout_seconds": ((int, float), lambda v: 0 < v <= 600, "must be in (0, 600]"),
    },
    "reports": {
        "staleness_seconds": ((int, float), lambda v: v > 0, "must be > 0"),
        "token_file": ((str, type(None)), None, ""),
        "token_env": (str, None, ""),
        "identity": (str, lambda v: v in ("shared-token", "service-account"),
                     "must be shared-token or service-account"),
        "audience": (str, lambda v: 0 < len(v) <= 253, "must be a non-empty string"),
        "service_account": (str, lambda v: _DNS_LABEL.fullmatch(v.partition("/")[0]) is not None
                            and _DNS_NAME.fullmatch(v.partition("/")[2]) is not None,
                            "must be namespace/name"),
    },
    "limits": {"max_pods_per_gpu": (int, lambda v: MAX_PODS_RANGE[0] <= v <= MAX_PODS_RANGE[1],
                                    f"must be in {MAX_PODS_RANGE[0]}..{MAX_PODS_RANGE[1]}"),
               "min_best_effort_slack_percent": ((int, float), lambda v: 0 <= v < 100,
                                                 "must be in [0, 100)"),
               "min_colocation_gain_percent": ((int, float, type(None)),
                                               lambda v: v is None or -100 < v <= 1000,
                                               "must be null or in (-100, 1000]"),
               "max_colocated_util_percent": ((int, float, type(None)),
                                              lambda v: v is None or 0 < v <= 10000,
                                              "must be null or in (0, 10000]"),
               "max_share_score": ((int, type(None)), lambda v: v is None or (
                   SCORE_RANGE[0] <= v <= SCORE_RANGE[1]),
                   f"must be null or in {SCORE_RANGE[0]}..{SCORE_RANGE[1]}")},
    "packing": {"enabled": (bool, None, ""),
                "w_fragmentation": ((int, float), lambda v: 0 <= v <= 1000, "must be in [0, 1000]"),
                "w_fit": ((int, float), lambda v: 0 <= v <= 1000, "must be in [0, 1000]"),
                "w_interference": ((int, float), lambda v: 0 <= v <= 1000,
                                   "must be in [0, 1000]"),
                "w_order": ((int, float), lambda v: 0 <= v <= 1000, "must be in [0, 1000]"),
                "weighting": (str, lambda v: v in WEIGHTINGS,
                              f"must be one of {', '.join(WEIGHTINGS)}"),
                "max_shapes": (int, lambda v: 1 <= v <= 10_000, "must be in 1..10000"),
                "window": (int, lambda v: 1 <= v <= 10_000_000, "must be in 1..10000000"),
                "live": (bool, None, "")},
    "profiles": {"files": (list, None, ""), "nexus": (list, None, "")},
    "predictor": {"enabled": (bool, None, ""), "artifacts_dir": ((str, type(None)), None, ""),
                  "model_store": ((str, type(None)), None, ""),
                  "allow_simulated": (bool, None, ""),
                  "allowed_model_sources": (list, None, "")},
    "learning": {
        "enabled": (bool, None, ""),
        "cold_start_util_percent": ((int, float), lambda v: 0 < v <= 100, "must be in (0, 100]"),
        "min_observations": (int, lambda v: 1 <= v <= 10_000, "must be in 1..10000"),
        "ewma_alpha": ((int, float), lambda v: 0 < v <= 1, "must be in (0, 1]"),
        "min_observed_seconds": ((int, float), lambda v: 0 <= v <= 86_400,
                                 "must be in [0, 86400]"),
        "min_pods": (int, lambda v: 1 <= v <= 1000, "must be in 1..1000"),
        "warmup_seconds": ((int, float), lambda v: 0 <= v <= 86_400, "must be in [0, 86400]"),
        "spread_margin": ((int, float), lambda v: 0 <= v <= 10, "must be in [0, 10]"),
        "max_entries": (int, lambda v: 1 <= v <= 100_000, "must be in 1..100000"),
        "configmap": ((str, type(None)), lambda v: v is None or _DNS_NAME.fullmatch(v) is not None,
                      "must be null or a DNS-1123 name"),
        "namespace": ((str, type(None)), lambda v: v is None or _DNS_LABEL.fullmatch(v) is not None,
                      "must be null or a namespace name"),
        "persist_interval_seconds": ((int, float), lambda v: 0 < v <= 86_400,
                                     "must be in (0, 86400]"),
        "prior_correction": (bool, None, ""),
        "curves": (bool, None, ""),
        "curve_min_points": (int, lambda v: 2 <= v <= 100_000, "must be in 2..100000"),
        "curve_max_step": ((int, float), lambda v: 0 < v <= 10, "must be in (0, 10]"),
        "curve_outlier_mads": ((int, float), lambda v: 0 < v <= 100, "must be in (0, 100]"),
        "curve_refit_interval_seconds": ((int, float), lambda v: 0 <= v <= 86_400,
                                         "must be in [0, 86400]"),
        "pairs": (bool, None, ""),
        "pair_explore_bonus": ((int, float), lambda v: 0 <= v <= 1, "must be in [0, 1]"),
        "pair_max_entries": (int, lambda v: 1 <= v <= 100_000, "must be in 1..100000"),
        "pair_groups": (bool, None, ""),
        "pair_prior": ((str, type(None)), lambda v: v is None or bool(v.strip()),
                       "must be a path string or null"),
        "revert_losing_seconds": ((int, float), lambda v: 0 <= v <= 86_400,
                                  "must be in [0, 86400]"),
    },
    "queue": {"enabled": (bool, None, ""),
              "k": (int, lambda v: K_RANGE[0] <= v <= K_RANGE[1],
                    f"must be in {K_RANGE[0]}..{K_RANGE[1]}"),
              "beta": (int, lambda v: BETA_RANGE[0] <= v <= BETA_RANGE[1],
                       f"must be in {BETA_RANGE[0]}..{BETA_RANGE[1]}"),
              "starvation_seconds": ((int, float), lambda v: 0 < v < float("inf"),
                                     "must be > 0 and finite"),
              "interval_seconds": ((int, float), lambda v: 0.1 <= v <= 3600,
                                   "must be in 0.1..3600"),
              "gate_name": (str, lambda v: _QUALIFIED_NAME.fullmatch(v) is not None,
                            "must be a qualified name such as tandem.io/queue"),
              "namespaces": (list, lambda v: all(isinstance(n, str) and _DNS_LABEL.fullmatch(n)
                                                 for n in v),
                             "must be a list of namespace names (DNS-1123 labels)")},
    "logging": {"level": (str, lambda v: v in ("debug", "info", "warning", "error"),
                          "must be one of debug, info, warning, error")},
    "reload": {"interval_seconds": ((int, float), lambda v: v > 0, "must be > 0")},
}
_POLICY = CostPolicy()
"""The decision defaults: one definition, in ``extender.core.cost`` (the YAML repeats them
for readers; tests tie the two)."""
COST_KEYS = ("w_mem", "w_util", "default_curve", "curves", "curves_file")
# Kubernetes' rules for a scheduling gate (a qualified name) and a namespace name.
_QUALIFIED_NAME = re.compile(
    r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS_NAME = re.compile(r"[a-z0-9]([-.a-z0-9]{0,251}[a-z0-9])?")
_NEXUS_KEYS = ("path", "gpu_type")


def _check(value: Any, types: Any, test: Callable[[Any], bool] | None, msg: str, path: str,
           problems: list[str]) -> None:
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        problems.append(f"{path}: must be {_type_name(types)}, got a boolean")
    elif not isinstance(value, types):
        problems.append(f"{path}: must be {_type_name(types)}, got {type(value).__name__}")
    elif test is not None and not test(value):
        problems.append(f"{path}: {msg} (got {value!r})")


def _type_name(types: Any) -> str:
    names = [t.__name__ for t in (types if isinstance(types, tuple) else (types,))]
    return " or ".join("null" if n == "NoneType" else n for n in names)


def _relative_to_config(file: str, source_path: str | None) -> str:
    """``file`` relative to the config file, so a config and the files it names can move
    together (the working directory when the config has no file)."""
    base = Path(source_path).parent if source_path else Path.cwd()
    return str(base / Path(file).expanduser())


def _cost_curves(cost: Mapping[str, Any], source_path: str | None, allow_simulated: Any,
                 problems: list[str]) -> tuple[dict[str, InterferenceCurve], str | None]:
    """``cost.curves_file`` entries overlaid by ``cost.curves``, keyed by canonical GPU type."""
    curves: dict[str, InterferenceCurve] = {}
    file = cost.get("curves_file")
    resolved = None
    if file is not None and (not isinstance(file, str) or not file.strip()):
        problems.append("cost.curves_file: must be a path string or null")
    elif file is not None:
        resolved = _relative_to_config(file, source_path)
        try:
            loaded = load_curves(Path(resolved))
        except CurveFileError as exc:
            problems.extend(f"cost.curves_file: {p}" for p in exc.problems)
        else:
            if loaded.simulated and allow_simulated is not True:
                problems.append(f"cost.curves_file: {resolved} was fitted on simulated data; "
                                "set predictor.allow_simulated: true to use it (dry runs only)")
            curves.update({gpu_type_of(k): c for k, c in loaded.curves.items()})
    inline = parse_curves(cost.get("curves"), "cost.curves", problems)
    curves.update({gpu_type_of(k): c for k, c in inline.items()})  # the config file wins
    return curves, resolved


def _nexus_sources(raw: Any, problems: list[str]) -> tuple[NexusProfileSource, ...]:
    if not isinstance(raw, list):
        return ()
    out = []
    for i, entry in enumerate(raw):
        path = f"profiles.nexus[{i}]"
        if not isinstance(entry, Mapping):
            problems.append(f"{path}: must be a mapping with {', '.join(_NEXUS_KEYS)}")
            continue
        for key in entry:
            if key not in _NEXUS_KEYS:
                problems.append(f"{path}.{key}: unknown key (valid: {', '.join(_NEXUS_KEYS)})")
        ok = True
        for key in _NEXUS_KEYS:
            if not isinstance(entry.get(key), str) or not entry[key].strip():
                problems.append(f"{path}.{key}: required, a non-empty string")
                ok = False
        if ok:
            out.append(NexusProfileSource(entry["path"], gpu_type_of(entry["gpu_type"].strip())))
    return tuple(out)


def build_config(raw: Any, source_path: str | None = None) -> ExtenderConfig:
    """Validate a decoded YAML document and build the config; raises ConfigError."""
    problems: list[str] = []
    raw = raw if raw is not None else {}
    if not isinstance(raw, Mapping):
        raise ConfigError(["(top): must be a mapping"])
    valid_top = sorted([*SCHEMA, "cost"])
    for key in raw:
        if key not in valid_top:
            problems.append(f"{key}: unknown section (valid: {', '.join(valid_top)})")
    sections: dict[str, dict[str, Any]] = {}
    for name, fields in SCHEMA.items():
        section = raw.get(name) or {}
        if not isinstance(section, Mapping):
            problems.append(f"{name}: must be a mapping")
            section = {}
        for key, value in section.items():
            if key not in fields:
                problems.append(f"{name}.{key}: unknown key (valid: {', '.join(fields)})")
                continue
            _check(value, *fields[key], f"{name}.{key}", problems)
        sections[name] = dict(section)
    cost = raw.get("cost") or {}
    if not isinstance(cost, Mapping):
        problems.append("cost: must be a mapping")
        cost = {}
    for key in cost:
        if key not in COST_KEYS:
            problems.append(f"cost.{key}: unknown key (valid: {', '.join(COST_KEYS)})")
    for key in ("w_mem", "w_util"):
        if key in cost:
            _check(cost[key], (int, float), lambda v: v >= 0, "must be >= 0", f"cost.{key}",
                   problems)
    curves, curves_file = _cost_curves(cost, source_path,
                                       sections["predictor"].get("allow_simulated"), problems)
    default_curve = parse_curve(cost.get("default_curve", {}), "cost.default_curve", problems)
    files = _profile_files(sections["profiles"], problems)
    nexus = _nexus_sources(sections["profiles"].get("nexus", []), problems)
    sources = sections["predictor"].get("allowed_model_sources", [])
    for i, prefix in enumerate(sources if isinstance(sources, list) else []):
        problem = source_problem(prefix)
        if problem is not None:
            problems.append(f"predictor.allowed_model_sources[{i}]: {problem} (got {prefix!r})")
    tls = sections["server"]
    if bool(tls.get("tls_cert_file")) != bool(tls.get("tls_key_file")):
        problems.append("server.tls_cert_file/tls_key_file: give both or neither")
    pair_prior = _pair_prior(sections["learning"], source_path, problems)
    if problems:
        raise ConfigError(problems)
    reports = ReportsConfig(**sections["reports"])
    policy = CostPolicy(
        w_mem=float(cost.get("w_mem", _POLICY.w_mem)),
        w_util=float(cost.get("w_util", _POLICY.w_util)),
        curves=curves, default_curve=default_curve,
        max_pods_per_gpu=sections["limits"].get("max_pods_per_gpu", _POLICY.max_pods_per_gpu),
        min_best_effort_slack_percent=float(sections["limits"].get(
            "min_best_effort_slack_percent", _POLICY.min_best_effort_slack_percent)),
        min_colocation_gain_percent=_optional_float(
            sections["limits"].get("min_colocation_gain_percent", DEFAULT_MIN_COLOCATION_GAIN)),
        max_colocated_util_percent=_optional_float(
            sections["limits"].get("max_colocated_util_percent")),
        max_share_score=sections["limits"].get("max_share_score"),
        staleness_seconds=float(reports.staleness_seconds),
        packing=PackingPolicy(**{k: float(v) if isinstance(v, int) and k.startswith("w_") else v
                                 for k, v in sections["packing"].items()}),
    )
    return ExtenderConfig(
        server=_server(sections["server"]), state=StateConfig(**sections["state"]),
        reports=reports, policy=policy, handoff=HandoffConfig(
            mode=sections["handoff"].get("mode", "device-plugin"),
            timeout_seconds=float(sections["handoff"].get("timeout_seconds", 30.0))),
        profile_files=files, nexus_profiles=nexus, predictor=PredictorConfig(**{
            **sections["predictor"], "allowed_model_sources": tuple(sources)}),
        learning=_learning(sections["learning"], pair_prior),
        queue=_queue_settings(sections["queue"]),
        log_level=sections["logging"].get("level", "info"),
        reload_interval_seconds=float(sections["reload"].get("interval_seconds", 5.0)),
        source_path=source_path, curves_file=curves_file,
    )


def _profile_files(section: Mapping[str, Any], problems: list[str]) -> tuple[str, ...]:
    """``profiles.files``: path strings, each other entry a problem."""
    files = section.get("files", [])
    if not isinstance(files, list):
        return ()
    problems.extend(f"profiles.files[{i}]: must be a path string"
                    for i, f in enumerate(files) if not isinstance(f, str))
    return tuple(files)


def _server(section: Mapping[str, Any]) -> ServerConfig:
    values = dict(section)
    if "scheduler_client_names" in values:
        values["scheduler_client_names"] = tuple(values["scheduler_client_names"])
    return ServerConfig(**values)


def _pair_prior(section: Mapping[str, Any], source_path: str | None,
                problems: list[str]) -> dict[str, Any]:
    """``learning.pair_prior`` resolved and read: the fields it sets, problems appended."""
    prior = section.get("pair_prior")
    if not isinstance(prior, str) or not prior.strip():
        return {}
    resolved = _relative_to_config(prior, source_path)
    try:
        tables = load_interference_file(resolved)
    except InterferenceFileError as exc:
        problems.extend(f"learning.pair_prior: {p}" for p in exc.problems)
        return {}
    return {"pair_prior": resolved,
            "pair_prior_tables": {gpu_type_of(t): v for t, v in tables.items()}}


def _learning(section: Mapping[str, Any], prior: Mapping[str, Any]) -> LearningConfig:
    values = {**section, **prior}
    for key in ("cold_start_util_percent", "ewma_alpha", "persist_interval_seconds",
                "min_observed_seconds", "warmup_seconds", "spread_margin",
                "curve_max_step", "curve_outlier_mads", "curve_refit_interval_seconds",
                "pair_explore_bonus", "revert_losing_seconds"):
        if key in values:
            values[key] = float(values[key])
    return LearningConfig(**values)


def _queue_settings(section: Mapping[str, Any]) -> QueueSettings:
    values = dict(section)
    fair = {key: values.pop(key) for key in ("k", "beta", "starvation_seconds") if key in values}
    if "starvation_seconds" in fair:
        fair["starvation_seconds"] = float(fair["starvation_seconds"])
    if "interval_seconds" in values:
        values["interval_seconds"] = float(values["interval_seconds"])
    values["namespaces"] = tuple(values.get("namespaces") or ())
    return QueueSettings(fair=QueueConfig(**fair), **values)


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)
