"""Extender configuration: one YAML file, environment overrides, full validation, atomic swap.

Loading goes: read YAML -> apply ``TANDEM__SECTION__KEY=value`` environment
overrides (values parsed as YAML scalars) -> validate everything, collecting
every problem with its path (``cost.curves.A100.slope: must be >= 0``) -> build
frozen dataclasses -> only then replace the live config (:class:`ConfigHolder`).
A bad edit during hot reload keeps the old config and reports the problems.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from extender.core import CostPolicy, gpu_type_of
from extender.core.cost import MAX_PODS_RANGE
from extender.queue.fair import BETA_RANGE, K_RANGE, QueueConfig
from predictor.curves import (
    CURVE_KEYS,
    CurveFileError,
    InterferenceCurve,
    load_curves,
    parse_curve,
    parse_curves,
)
from predictor.store import source_problem

ENV_PREFIX = "TANDEM__"
DEFAULT_CONFIG = Path(__file__).with_name("default_config.yaml")
DEFAULT_MIN_COLOCATION_GAIN = 0.0
"""``limits.min_colocation_gain_percent`` when the file omits it (chosen with the simulator)."""


class ConfigError(ValueError):
    """The configuration is invalid; ``problems`` lists every one with its path."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("invalid configuration:\n  " + "\n  ".join(problems))


@dataclass(frozen=True)
class ServerConfig:
    """HTTP server settings."""

    host: str = "127.0.0.1"
    """Listen address; loopback unless TLS and an agent token are configured (exposure.py)."""
    port: int = 8888
    """TCP port, 0..65535 (0 = pick a free one). Default 8888."""
    max_body_bytes: int = 4 * 1024 * 1024
    """Larger request bodies get HTTP 413. Default 4 MiB (NodeLists of hundreds of nodes)."""
    threads: int = 32
    """cheroot worker threads (>= 1): kube-scheduler binds up to 16 pods at once, each
    waiting on the API server, while filter and prioritize go on."""
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_client_ca_file: str | None = None
    """CA of the scheduler's client certificate: the scheduling verbs need one (mTLS);
    without TLS (no ``tls_cert_file``) it has no effect."""
    scheduler_client_names: tuple[str, ...] = ("tandem-scheduler",)
    """Common names of the client certificates the scheduling verbs accept."""
    request_read_timeout_seconds: float = 10.0
    """A request (head and body) must arrive within this of its first byte, or the
    connection is dropped; until it has arrived it holds no worker thread."""


@dataclass(frozen=True)
class StateConfig:
    """Ledger timing."""

    assume_ttl_seconds: float = 30.0
    """How long a bound-but-unconfirmed placement is held before it expires (> 0)."""
    demand_cache_seconds: float = 300.0
    """How long a pod's resolved demand is kept between filter and bind (> 0)."""
    signing_key_file: str | None = None
    """File holding the key that signs placements at bind (preferred over the env var)."""
    signing_key_env: str = "TANDEM_SIGNING_KEY"
    """Environment variable holding the signing key when no file is given."""


@dataclass(frozen=True)
class HandoffConfig:
    """How a bound pod's container gets its GPU (docs/deploy.md, "GPU hand-off")."""

    mode: str = "device-plugin"
    """``env``: the pod copies ``tandem.io/gpu-uuid`` into ``NVIDIA_VISIBLE_DEVICES``;
    ``device-plugin``: tandem's device plugin hands the GPU over at admission, and bind
    keeps at most one pod per node waiting for it."""
    timeout_seconds: float = 30.0
    """How long a node waits for a bound pod to be admitted before the next bind (> 0)."""


@dataclass(frozen=True)
class ReportsConfig:
    """Agent reports."""

    staleness_seconds: float = 10.0
    """Observations older than this are ignored (> 0)."""
    token_file: str | None = None
    """File holding the agents' bearer token (preferred over ``token_env``)."""
    token_env: str = "TANDEM_AGENT_TOKEN"
    """Environment variable holding the token when no file is given."""
    identity: str = "shared-token"
    """``shared-token``: every agent sends the one token above (simulated cluster, demos);
    ``service-account``: each sends its pod's projected ServiceAccount token, reviewed with
    the API server and bound to its pod's node (``extender/state/node_identity.py``)."""
    audience: str = "tandem"
    """Audience the agents' projected tokens are issued for (``service-account``)."""
    service_account: str = "tandem-system/tandem-agent"
    """``namespace/name`` of the agents' ServiceAccount (``service-account``)."""


@dataclass(frozen=True)
class PredictorConfig:
    """The utilisation/memory predictor for pods that name ``tandem.io/model``."""

    enabled: bool = True
    """Ask the predictor for pods that name a model without asserted values."""
    artifacts_dir: str | None = None
    """Directory of ``tandem predictor train`` output (model + card); None = no trained model."""
    model_store: str | None = None
    """Root that plain ``tandem.io/model`` paths resolve under; None = any local path."""
    allow_simulated: bool = False
    """Load artifacts whose model card says ``simulated: true`` (a dry run, not measurements)."""
    allowed_model_sources: tuple[str, ...] = ()
    """URL prefixes (``https://host/path/``) remote ``tandem.io/model`` references may be
    fetched from, in the background; empty = none (only the model store, local paths)."""


@dataclass(frozen=True)
class LearningConfig:
    """Online learning of each model's utilisation from agent reports (learning/learner.py)."""

    enabled: bool = True
    """Turn agent reports into per-model observations and use them in resolution."""
    cold_start_util_percent: float = 100.0
    """Utilisation assumed for a model with no observation and no trained model, (0, 100]."""
    min_observations: int = 5
    """Samples before an observed estimate replaces the prediction, 1..10000."""
    min_observed_seconds: float = 120.0
    """Observed time (after warm-up) before an estimate replaces the prediction, [0, 86400]."""
    min_pods: int = 1
    """Pods whose samples an estimate needs before it replaces the prediction, 1..1000."""
    warmup_seconds: float = 60.0
    """Each pod's first seconds on a GPU give no sample (loading, compiling), [0, 86400]."""
    spread_margin: float = 1.0
    """Standard errors added to a trusted estimate (a safety margin), [0, 10]."""
    ewma_alpha: float = 0.1
    """Weight of one minute of samples once the estimate holds 1/alpha minutes, (0, 1]."""
    max_entries: int = 2000
    """Most (model, batch, workload, GPU type) estimates kept; least recent dropped, 1..100000."""
    configmap: str | None = "tandem-learning"
    """ConfigMap the leader persists estimates in (``kube`` clusters); null = not persisted."""
    namespace: str | None = None
    """Namespace of that ConfigMap; null = the extender's own (in-cluster), else ``default``."""
    persist_interval_seconds: float = 60.0
    """Least time between two writes of the ConfigMap, > 0."""
    prior_correction: bool = True
    """Correct predictions of keys not observed by the bias learned where they were."""
    curves: bool = True
    """Refit each GPU type's interference curve from co-located observations and use it."""
    curve_min_points: int = 30
    """Co-located points (outliers excluded) a GPU type needs before its first refit."""
    curve_max_step: float = 0.2
    """Most a curve coefficient moves per refit, relative to its value, (0, 10]."""
    curve_outlier_mads: float = 3.5
    """Points whose residual exceeds this many scaled MADs are ignored, (0, 100]."""
    curve_refit_interval_seconds: float = 300.0
    """Least time between two refits of one GPU type's curve, [0, 86400]."""
    pairs: bool = False
    """Learn pairwise interference (who slows whom, extender/learning/interference.py) from
    shared GPUs and decide with it on GPU types where something was learned (off: the
    curve alone, as before; docs/interference.md)."""
    pair_explore_bonus: float = 0.05
    """Most predicted progress a placement may give up to try a pair never seen, [0, 1]."""
    pair_max_entries: int = 4000
    """Most (GPU type, model, model) pairs kept; least recently seen dropped, 1..100000."""


@dataclass(frozen=True)
class QueueSettings:
    """Horus's weighted-fair queue as a scheduling gate (``extender/queue/``)."""

    enabled: bool = False
    """Run the gate controller inside ``tandem extender serve`` (while leader)."""
    fair: QueueConfig = QueueConfig()
    """``k``, ``beta`` and ``starvation_seconds``: the queue's own knobs, with their one
    definition of defaults and ranges (``extender.queue.fair.QueueConfig``)."""
    interval_seconds: float = 5.0
    """Time between release rounds."""
    gate_name: str = "tandem.io/queue"
    """The ``spec.schedulingGates`` name the controller removes."""
    namespaces: tuple[str, ...] = ()
    """Namespaces whose pods are queued; empty = all namespaces."""

    @property
    def k(self) -> int:
        """Number of k-means job classes (Horus-f: 3)."""
        return self.fair.k

    @property
    def beta(self) -> int:
        """Pods released per round, in flight included (Horus testbed: 15)."""
        return self.fair.beta

    @property
    def starvation_seconds(self) -> float:
        """A pod gated at least this long is released ahead of the weighted picks."""
        return self.fair.starvation_seconds


@dataclass(frozen=True)
class NexusProfileSource:
    """A Nexus profile file (or directory of ``*.txt``) and the GPU type it was measured on."""

    path: str
    gpu_type: str
    """Canonical GPU type (product name with dashes), e.g. ``NVIDIA-TITAN-X-Pascal``."""


@dataclass(frozen=True)
class ExtenderConfig:
    """The whole validated configuration."""

    server: ServerConfig = ServerConfig()
    state: StateConfig = StateConfig()
    reports: ReportsConfig = ReportsConfig()
    handoff: HandoffConfig = HandoffConfig()
    policy: CostPolicy = CostPolicy()
    profile_files: tuple[str, ...] = ()
    """Batching-profile YAML files for inference pods (plan-file ``profiles:`` form)."""
    nexus_profiles: tuple[NexusProfileSource, ...] = ()
    """Nexus profile files, each mapped to the GPU type it was measured on."""
    predictor: PredictorConfig = PredictorConfig()
    learning: LearningConfig = LearningConfig()
    queue: QueueSettings = QueueSettings()
    log_level: str = "info"
    reload_interval_seconds: float = 5.0
    source_path: str | None = field(default=None, compare=False)
    curves_file: str | None = None
    """The resolved ``cost.curves_file``; a change to it reloads the config too."""


_SCHEMA: dict[str, dict[str, tuple[type | tuple[type, ...], Callable[[Any], bool] | None, str]]] = {
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
                                              "must be null or in (0, 10000]")},
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
_COST_KEYS = ("w_mem", "w_util", "default_curve", "curves", "curves_file")
_CURVE_KEYS = CURVE_KEYS  # documented keys of one curve (docs/configuration.md)
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


def _cost_curves(cost: Mapping[str, Any], source_path: str | None, allow_simulated: Any,
                 problems: list[str]) -> tuple[dict[str, InterferenceCurve], str | None]:
    """``cost.curves_file`` entries overlaid by ``cost.curves``, keyed by canonical GPU type."""
    curves: dict[str, InterferenceCurve] = {}
    file = cost.get("curves_file")
    resolved = None
    if file is not None and (not isinstance(file, str) or not file.strip()):
        problems.append("cost.curves_file: must be a path string or null")
    elif file is not None:
        # relative to the config file, so a config and its curves can move together
        base = Path(source_path).parent if source_path else Path.cwd()
        resolved = str(base / Path(file).expanduser())
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
    valid_top = sorted([*_SCHEMA, "cost"])
    for key in raw:
        if key not in valid_top:
            problems.append(f"{key}: unknown section (valid: {', '.join(valid_top)})")
    sections: dict[str, dict[str, Any]] = {}
    for name, fields in _SCHEMA.items():
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
        if key not in _COST_KEYS:
            problems.append(f"cost.{key}: unknown key (valid: {', '.join(_COST_KEYS)})")
    for key in ("w_mem", "w_util"):
        if key in cost:
            _check(cost[key], (int, float), lambda v: v >= 0, "must be >= 0", f"cost.{key}",
                   problems)
    curves, curves_file = _cost_curves(cost, source_path,
                                       sections["predictor"].get("allow_simulated"), problems)
    default_curve = parse_curve(cost.get("default_curve", {}), "cost.default_curve", problems)
    files = sections["profiles"].get("files", [])
    if isinstance(files, list):
        for i, f in enumerate(files):
            if not isinstance(f, str):
                problems.append(f"profiles.files[{i}]: must be a path string")
    nexus = _nexus_sources(sections["profiles"].get("nexus", []), problems)
    sources = sections["predictor"].get("allowed_model_sources", [])
    for i, prefix in enumerate(sources if isinstance(sources, list) else []):
        problem = source_problem(prefix)
        if problem is not None:
            problems.append(f"predictor.allowed_model_sources[{i}]: {problem} (got {prefix!r})")
    tls = sections["server"]
    if bool(tls.get("tls_cert_file")) != bool(tls.get("tls_key_file")):
        problems.append("server.tls_cert_file/tls_key_file: give both or neither")
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
        staleness_seconds=float(reports.staleness_seconds),
    )
    return ExtenderConfig(
        server=_server(sections["server"]), state=StateConfig(**sections["state"]),
        reports=reports, policy=policy, handoff=HandoffConfig(
            mode=sections["handoff"].get("mode", "device-plugin"),
            timeout_seconds=float(sections["handoff"].get("timeout_seconds", 30.0))),
        profile_files=tuple(files) if isinstance(files, list)
        else (), nexus_profiles=nexus, predictor=PredictorConfig(**{
            **sections["predictor"], "allowed_model_sources": tuple(sources)}),
        learning=_learning(sections["learning"]),
        queue=_queue_settings(sections["queue"]),
        log_level=sections["logging"].get("level", "info"),
        reload_interval_seconds=float(sections["reload"].get("interval_seconds", 5.0)),
        source_path=source_path, curves_file=curves_file,
    )


def _server(section: Mapping[str, Any]) -> ServerConfig:
    values = dict(section)
    if "scheduler_client_names" in values:
        values["scheduler_client_names"] = tuple(values["scheduler_client_names"])
    return ServerConfig(**values)


def _learning(section: Mapping[str, Any]) -> LearningConfig:
    values = dict(section)
    for key in ("cold_start_util_percent", "ewma_alpha", "persist_interval_seconds",
                "min_observed_seconds", "warmup_seconds", "spread_margin",
                "curve_max_step", "curve_outlier_mads", "curve_refit_interval_seconds",
                "pair_explore_bonus"):
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


def apply_env(raw: Mapping[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    """Overlay ``TANDEM__SECTION__KEY[__SUB]=value`` variables (YAML scalars) onto ``raw``."""
    merged: dict[str, Any] = {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in raw.items()}
    for name, text in sorted(environ.items()):
        if not name.startswith(ENV_PREFIX):
            continue
        path = [p.lower() for p in name[len(ENV_PREFIX):].split("__") if p]
        if not path:
            continue
        node = merged
        for part in path[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = dict(child) if isinstance(child, Mapping) else {}
                node[part] = child
            node = child
        try:
            node[path[-1]] = yaml.safe_load(text)
        except yaml.YAMLError:
            node[path[-1]] = text
    return merged


def load_config(path: str | Path | None, environ: Mapping[str, str] | None = None,
                ) -> ExtenderConfig:
    """Load ``path`` (or the packaged default), apply env overrides, validate."""
    file = Path(path) if path is not None else DEFAULT_CONFIG
    try:
        raw = yaml.safe_load(file.read_text())
    except OSError as exc:
        raise ConfigError([f"{file}: cannot read: {exc.strerror}"]) from None
    except yaml.YAMLError as exc:
        raise ConfigError([f"{file}: not valid YAML: {exc}"]) from None
    if raw is not None and not isinstance(raw, Mapping):
        raise ConfigError([f"{file}: top level must be a mapping"])
    raw = apply_env(raw or {}, os.environ if environ is None else environ)
    return build_config(raw, str(file))


class ConfigHolder:
    """The live config, swapped atomically on reload; readers call ``current()``."""

    def __init__(self, config: ExtenderConfig, loader: Callable[[], ExtenderConfig] | None = None):
        self._config = config
        self._loader = loader
        self._lock = threading.Lock()
        self._mtime = _mtimes(config)

    def current(self) -> ExtenderConfig:
        """The config in force now (a frozen value; never mutated)."""
        return self._config

    def policy(self) -> CostPolicy:
        """The decision policy in force now."""
        return self._config.policy

    def reload_if_changed(self) -> list[str] | None:
        """Reload when the file (or its curves file) changed; problems (old kept) or None."""
        mtime = _mtimes(self._config)
        if self._loader is None or mtime == self._mtime:
            return None
        with self._lock:
            self._mtime = mtime
            try:
                new = self._loader()
            except ConfigError as exc:
                return exc.problems
            self._config = new
            self._mtime = _mtimes(new)  # the new config may name another curves file
            return []


def _mtimes(config: ExtenderConfig) -> tuple[float | None, ...]:
    return tuple(_mtime(p) for p in (config.source_path, config.curves_file))


def _mtime(path: str | None) -> float | None:
    try:
        return os.stat(path).st_mtime_ns if path else None
    except OSError:
        return None
