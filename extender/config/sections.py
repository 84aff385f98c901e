"""The extender's settings, one frozen dataclass per section of the config file.

Each field's docstring is its documentation (docs/configuration.md repeats it for
readers); the accepted types and ranges are :mod:`extender.config.schema`'s tables,
and decision defaults are ``extender.core.cost.CostPolicy``'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from contracts.interferencefile import PairTable
from extender.core import CostPolicy
from extender.queue.fair import QueueConfig

DEFAULT_MIN_COLOCATION_GAIN = 0.0
"""``limits.min_colocation_gain_percent`` when the file omits it (chosen with the simulator)."""


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

    staleness_seconds: float = CostPolicy.staleness_seconds
    """Observations older than this are ignored (> 0); the default is the policy's."""
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
    """Most (GPU type, model, model) pairs kept; least recently seen dropped, 1..100000 (as
    many group samples besides)."""
    pair_groups: bool = True
    """Learn pairs also from GPUs shared by three or more modelled pods (group samples, the
    rule for three or more jobs solved for the pairs in them); off: only GPUs shared by two."""
    pair_prior: str | None = None
    """A measured interference file (``interference:``, as ``tandem import-interference``
    writes) whose pairs decisions assume until the cluster shows them; relative to the
    config file; null = none (docs/interference.md)."""
    pair_prior_tables: Mapping[str, PairTable] = field(default_factory=dict)
    """That file's tables keyed by canonical GPU type (read when the config is loaded)."""
    revert_losing_seconds: float = 0.0
    """Evict the newest pod of a GPU whose pair was measured to lose (progress) if it arrived
    there at most this many seconds ago, through the Eviction API; 0 = never (the default)."""


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
