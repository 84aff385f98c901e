"""The ``tandem.io/*`` pod annotations: key names, accepted ranges, one codec.

Inputs (what a pod owner writes) are parsed by :func:`parse_inputs`, the one
validator the extender (at filter), the node agent (session sync), the session
proxy and, for ``weight``/``priority``/``slo-ms``/``rate-rps``, the inference
server (session registration) all use, so whatever binds can run. A rejection
is an :class:`AnnotationError` naming the field, the value and the problem.

Outputs (what bind writes) are encoded by :func:`encode_outputs` and read back by
:func:`decode_outputs` when the ledger is rebuilt from bound pods; ``decided-by`` is for people.

The ranges are the ones every consumer can honour. ``weight`` and ``priority``
come from the inference server's Olympian quanta: a job of weight ``w`` holds
the token for ``w`` quanta per turn (1000 quanta of a few milliseconds already
starve its peers for seconds), and priority classes are compared as integers.

Nothing here imports another tandem package: values are plain numbers and
strings, and each deployable builds its own types from them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace

PREFIX = "tandem.io/"
GPU_RESOURCE = PREFIX + "gpu"

# Inputs, written by the pod owner.
WORKLOAD = PREFIX + "workload"
MODEL = PREFIX + "model"
BATCH_SIZE = PREFIX + "batch-size"
GPU_UTIL = PREFIX + "gpu-util"
GPU_MEM_MIB = PREFIX + "gpu-mem-mib"
SLO_MS = PREFIX + "slo-ms"
RATE_RPS = PREFIX + "rate-rps"
WEIGHT = PREFIX + "weight"
PRIORITY = PREFIX + "priority"
PROGRESS = PREFIX + "progress"
"""Where a training pod exposes its progress: ``port=<n>[,path=/metrics],steps=<counter>
[,samples=<counter>]``, a Prometheus text endpoint on the pod's own IP and the names of
its monotonically increasing step (and optionally sample) counters
(:func:`parse_progress`)."""

# Outputs, written by the extender at bind.
GPU_INDEX = PREFIX + "gpu-index"
GPU_UUID = PREFIX + "gpu-uuid"
PREDICTED_UTIL = PREFIX + "predicted-gpu-util"
PREDICTED_MEM_MIB = PREFIX + "predicted-gpu-mem-mib"
COST = PREFIX + "cost"
BATCH = PREFIX + "batch"
DUTY_CYCLE_MS = PREFIX + "duty-cycle-ms"
PREDICTION_SOURCE = PREFIX + "prediction-source"
"""Where the predicted numbers came from: ``<utilisation source>+mem:<memory source>``
(``asserted``, ``observed:<n>``, ``observed-shared:<n>``, ``prior-corrected:<n>``,
``xgboost:<digest>...``, ``cold-start``), or ``asserted``."""
INTERFERENCE_SOURCE = PREFIX + "interference-source"
"""Where the interference figure the GPU was scored by came from: ``pair:<n>`` (the pair
seen n times), ``group:<n>`` (solved from n samples of GPUs the two shared with others),
``matrix`` (the measured matrix of ``learning.pair_prior``, calibrated to
the GPU type), ``profile`` (the models' learned sensitivity and aggressiveness), ``curve``
(the GPU type's curve, beside learned pairs); absent where the curve alone decided."""
_MAX_SOURCE = 253  # an annotation value for people; longer text is cut, never refused
DECIDED_BY = PREFIX + "decided-by"  # fit, fragmentation, interference, only or scheduler
CONTAINER_GPUS = PREFIX + "container-gpus"
"""Which container gets which bound GPU: ``c1=2;c2=3`` (GPU indices), for people; the
device plugin reads the same from the extender's state, never from the pod."""
PLACEMENT_SIGNATURE = PREFIX + "placement-signature"
"""HMAC of the pod UID, node and the outputs above, keyed by the extender's signing key."""
SIGNED_OUTPUTS = (GPU_INDEX, GPU_UUID, PREDICTED_UTIL, PREDICTED_MEM_MIB, COST, BATCH,
                  DUTY_CYCLE_MS, CONTAINER_GPUS)

TRAINING = "training"
INFERENCE = "inference"
WORKLOADS = (TRAINING, INFERENCE)

_MAX_TEXT = 64  # longer numeric text is refused before conversion (no 5,000-digit ints)
# ASCII digits only: str.isdigit and int() also take '²' and '١' (and int() refuses text of
# over 4,300 digits with a ValueError); [0-9] in a pattern without re.ASCII is still ASCII.
_INT_TEXT = re.compile(r"[+-]?[0-9]{1,18}")
_NUMBER_TEXT = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]{1,3})?")


class AnnotationError(ValueError):
    """An annotation (or a session field) is unusable; ``field`` names the culprit."""

    def __init__(self, field_name: str, value: object, problem: str):
        self.field = field_name
        self.value = value
        self.problem = problem
        # A field that is missing is named, not shown as Python's ``None``.
        shown = field_name if value is None else f"{field_name}={value!r}"
        super().__init__(f"{shown}: {problem}")


@dataclass(frozen=True)
class NumberRange:
    """Accepted values ``(low, high]`` of a real-valued field."""

    low: float
    high: float

    @property
    def text(self) -> str:
        """``a number in (low, high]``."""
        return f"a number in ({self.low:g}, {self.high:g}]"

    def check(self, value: float, field_name: str) -> float:
        """``value`` if finite and in range, else AnnotationError."""
        if not (math.isfinite(value) and self.low < value <= self.high):
            raise AnnotationError(field_name, value, f"must be {self.text}")
        return value


@dataclass(frozen=True)
class IntRange:
    """Accepted values ``[low, high]`` of an integer field."""

    low: int
    high: int

    @property
    def text(self) -> str:
        """``an integer in [low, high]``."""
        return f"an integer in [{self.low}, {self.high}]"

    def check(self, value: int, field_name: str) -> int:
        """``value`` if an integer (not a bool) in range, else AnnotationError."""
        if isinstance(value, bool) or not isinstance(value, int) \
                or not self.low <= value <= self.high:
            raise AnnotationError(field_name, value, f"must be {self.text}")
        return value


BATCH_SIZE_RANGE = IntRange(1, 65536)
GPU_UTIL_RANGE = NumberRange(0.0, 100.0)
GPU_MEM_MIB_RANGE = NumberRange(0.0, 4.0e6)
SLO_MS_RANGE = NumberRange(0.0, 3.6e6)
RATE_RPS_RANGE = NumberRange(0.0, 1.0e7)
WEIGHT_RANGE = IntRange(1, 1000)
PRIORITY_RANGE = IntRange(-1_000_000, 1_000_000)
GPU_COUNT_RANGE = IntRange(0, 1024)
"""``tandem.io/gpu`` of one container (limits or requests)."""
GPU_INDEX_RANGE = IntRange(0, 65535)
PORT_RANGE = IntRange(1, 65535)
DEFAULT_WEIGHT = 1
DEFAULT_BATCH_SIZE = {TRAINING: 32, INFERENCE: 1}
"""The batch size of a pod that does not give ``tandem.io/batch-size``: placement,
prediction and learning all read it through :attr:`PodInputs.batch`."""


def parse_number(raw: object, field_name: str, valid: NumberRange) -> float:
    """An annotation's text (or a JSON number) as a float in ``valid``; AnnotationError."""
    value = math.nan
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        value = float(raw)
    elif isinstance(raw, str) and len(raw) <= _MAX_TEXT and _NUMBER_TEXT.fullmatch(raw.strip()):
        value = float(raw.strip())
    if not (math.isfinite(value) and valid.low < value <= valid.high):
        raise AnnotationError(field_name, raw, f"must be {valid.text}")
    return value


def parse_integer(raw: object, field_name: str, valid: IntRange) -> int:
    """An annotation's text (ASCII digits, optional sign) or a JSON integer, in ``valid``.

    The one integer reader of every integer annotation and resource count: anything
    else (``'²'``, ``'1_0'``, ``'0x10'``, 5,000 digits) is an AnnotationError saying
    what is accepted, never a ValueError from ``int()``.
    """
    value: int | None = None
    if isinstance(raw, int) and not isinstance(raw, bool):
        value = raw
    elif isinstance(raw, str) and len(raw) <= _MAX_TEXT and _INT_TEXT.fullmatch(raw.strip()):
        value = int(raw.strip())
    if value is None or not valid.low <= value <= valid.high:
        shown = raw if not isinstance(raw, str) or len(raw) <= _MAX_TEXT \
            else f"{raw[:_MAX_TEXT]}... ({len(raw)} characters)"
        raise AnnotationError(field_name, shown, f"must be {valid.text} in ASCII digits")
    return value


def integer_or_none(raw: object, valid: IntRange) -> int | None:
    """:func:`parse_integer` for records that are dropped, not refused, when unreadable."""
    try:
        return parse_integer(raw, "", valid)
    except AnnotationError:
        return None


@dataclass(frozen=True)
class ProgressEndpoint:
    """A pod's progress counters (``tandem.io/progress``): scraped on the pod's own IP
    only, so an annotation never points the node agent at another host."""

    port: int
    steps: str
    path: str = "/metrics"
    samples: str | None = None


_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]{0,199}")
_URL_PATH = re.compile(r"/[A-Za-z0-9._~/-]{0,199}")
_PROGRESS_KEYS = ("port", "path", "steps", "samples")


def parse_progress(value: object) -> ProgressEndpoint:
    """The one reader of ``tandem.io/progress``; AnnotationError names what is wrong."""
    if not isinstance(value, str) or len(value) > 512:
        raise AnnotationError(PROGRESS, value, "must be a string of at most 512 characters")
    fields: dict[str, str] = {}
    for part in value.split(","):
        key, sep, text = part.strip().partition("=")
        if not sep or key not in _PROGRESS_KEYS or key in fields:
            raise AnnotationError(PROGRESS, value, "must be port=<n>[,path=/p],steps=<counter>"
                                  "[,samples=<counter>], each key once")
        fields[key] = text.strip()
    if "port" not in fields or "steps" not in fields:
        raise AnnotationError(PROGRESS, value, "needs port= and steps=")
    port = parse_integer(fields["port"], PROGRESS, PORT_RANGE)
    for key in ("steps", "samples"):
        if key in fields and not _METRIC_NAME.fullmatch(fields[key]):
            raise AnnotationError(PROGRESS, value, f"{key}= must be a Prometheus metric name")
    path = fields.get("path", "/metrics")
    if not _URL_PATH.fullmatch(path) or ".." in path:
        raise AnnotationError(PROGRESS, value, "path= must be an absolute URL path")
    return ProgressEndpoint(port, fields["steps"], path, fields.get("samples"))


@dataclass(frozen=True)
class PodInputs:
    """A pod's ``tandem.io/*`` inputs as typed values (None: not given)."""

    workload: str = TRAINING
    model: str | None = None
    batch_size: int | None = None
    util_percent: float | None = None
    mem_mib: float | None = None
    slo_ms: float | None = None
    rate_rps: float | None = None
    weight: int | None = None
    priority: int | None = None

    @property
    def best_effort(self) -> bool:
        """An inference pod without an SLO: it shares the duty cycle's slack in quanta."""
        return self.workload == INFERENCE and self.slo_ms is None

    @property
    def batch(self) -> int:
        """The batch size the pod is placed and learned at: asserted, else the default."""
        return self.batch_size or DEFAULT_BATCH_SIZE[self.workload]

    @property
    def share_weight(self) -> int:
        """Weight used to spread best-effort sessions (priority sessions count 1)."""
        return self.weight if self.weight is not None and (
            self.priority is None or not self.best_effort) else DEFAULT_WEIGHT


def parse_inputs(ann: Mapping[str, object]) -> PodInputs:
    """Every input annotation, typed, range-checked and cross-checked; AnnotationError."""
    workload = ann.get(WORKLOAD, TRAINING)
    if workload not in WORKLOADS:
        raise AnnotationError(WORKLOAD, workload, "must be training or inference")
    model = ann.get(MODEL)
    if model is not None and (not isinstance(model, str) or not model.strip()):
        raise AnnotationError(MODEL, model, "must be a non-empty string")

    def number(key: str, valid: NumberRange) -> float | None:
        return None if ann.get(key) is None else parse_number(ann[key], key, valid)

    def integer(key: str, valid: IntRange) -> int | None:
        return None if ann.get(key) is None else parse_integer(ann[key], key, valid)

    inputs = PodInputs(
        workload=str(workload), model=model,
        batch_size=integer(BATCH_SIZE, BATCH_SIZE_RANGE),
        util_percent=number(GPU_UTIL, GPU_UTIL_RANGE),
        mem_mib=number(GPU_MEM_MIB, GPU_MEM_MIB_RANGE),
        slo_ms=number(SLO_MS, SLO_MS_RANGE),
        rate_rps=number(RATE_RPS, RATE_RPS_RANGE),
        weight=integer(WEIGHT, WEIGHT_RANGE),
    )
    if inputs.workload == INFERENCE:
        if inputs.model is None:
            raise AnnotationError(MODEL, None, "required for inference pods (the model "
                                  "the inference server loads)")
        if (inputs.slo_ms is None) != (inputs.rate_rps is None):
            missing = SLO_MS if inputs.slo_ms is None else RATE_RPS
            raise AnnotationError(missing, None,
                                  "an SLO session needs both tandem.io/slo-ms and "
                                  "tandem.io/rate-rps (give neither for best effort)")
        # Quanta order best-effort jobs by it; the server's order of sacrifice, SLO sessions.
        inputs = replace(inputs, priority=integer(PRIORITY, PRIORITY_RANGE))
    # A training pod may give nothing but its GPU count: what it does not state is
    # resolved by the cold-start rule (extender.core.demand), as nvidia.com/gpu users expect.
    return inputs


def read_bound_inputs(ann: Mapping[str, object]) -> PodInputs:
    """The inputs of a pod that is already bound, never raising.

    A running pod must stay accounted for even if its annotations no longer
    parse (edited after bind, or bound under older rules): a field that does not
    parse counts as not given, and an SLO needs both of its fields.
    """
    slo = _lenient_number(ann, SLO_MS, SLO_MS_RANGE)
    rate = _lenient_number(ann, RATE_RPS, RATE_RPS_RANGE)
    model = ann.get(MODEL)
    priority = None
    # A priority present but unreadable still makes a priority session (it counts 1).
    if ann.get(PRIORITY) is not None and (slo is None or rate is None):
        priority = _lenient_integer(ann, PRIORITY, PRIORITY_RANGE) or 0
    return PodInputs(
        workload=INFERENCE if ann.get(WORKLOAD) == INFERENCE else TRAINING,
        model=model if isinstance(model, str) and model.strip() else None,
        batch_size=_lenient_integer(ann, BATCH_SIZE, BATCH_SIZE_RANGE),
        slo_ms=slo if rate is not None else None,
        rate_rps=rate if slo is not None else None,
        weight=_lenient_integer(ann, WEIGHT, WEIGHT_RANGE),
        priority=priority,
    )


def _lenient_number(ann: Mapping[str, object], key: str, valid: NumberRange) -> float | None:
    try:
        return None if ann.get(key) is None else parse_number(ann[key], key, valid)
    except AnnotationError:
        return None


def _lenient_integer(ann: Mapping[str, object], key: str, valid: IntRange) -> int | None:
    return None if ann.get(key) is None else integer_or_none(ann[key], valid)


def tandem_annotations(ann: Mapping[str, object]) -> tuple[tuple[str, str], ...]:
    """The ``tandem.io/*`` string annotations, sorted by key (what ``/v1/state`` shows)."""
    return tuple(sorted((k, v) for k, v in ann.items()
                        if isinstance(k, str) and k.startswith(PREFIX) and isinstance(v, str)))


@dataclass(frozen=True)
class BindOutputs:
    """What bind records on a pod: GPUs, predictions, cost and, for sessions, the plan."""

    gpu_indices: tuple[int, ...]
    gpu_uuids: tuple[str, ...] = ()
    util_percent: float = 0.0
    mem_mib: float = 0.0
    cost: float | None = None
    batch: int | None = None
    duty_cycle_ms: float | None = None
    source: str | None = None
    """Where ``util_percent`` and ``mem_mib`` came from (``PREDICTION_SOURCE``)."""
    containers: tuple[tuple[str, tuple[int, ...]], ...] = ()
    """Container name and the GPU indices it gets (``CONTAINER_GPUS``)."""
    interference_source: str | None = None
    """Where the interference figure came from (``INTERFERENCE_SOURCE``)."""


def encode_outputs(out: BindOutputs) -> dict[str, str]:
    """The annotations bind writes (DESIGN outputs plus batch and duty cycle for sessions)."""
    ann = {
        GPU_INDEX: ",".join(str(i) for i in out.gpu_indices),
        GPU_UUID: ",".join(out.gpu_uuids),
        PREDICTED_UTIL: f"{out.util_percent:.2f}",
        PREDICTED_MEM_MIB: f"{out.mem_mib:.0f}",
    }
    if out.cost is not None:
        ann[COST] = f"{out.cost:.4f}"
    if out.batch is not None:
        ann[BATCH] = str(out.batch)
    if out.duty_cycle_ms is not None:
        ann[DUTY_CYCLE_MS] = f"{out.duty_cycle_ms:.3f}"
    if out.source:
        ann[PREDICTION_SOURCE] = out.source[:_MAX_SOURCE]
    if out.containers:
        ann[CONTAINER_GPUS] = ";".join(f"{name}={','.join(str(i) for i in indices)}"
                                       for name, indices in out.containers)
    if out.interference_source:
        ann[INTERFERENCE_SOURCE] = out.interference_source[:_MAX_SOURCE]
    return ann


def decode_outputs(ann: Mapping[str, object]) -> BindOutputs | None:
    """What bind recorded, or None when the pod carries no readable GPU assignment.

    Only ``gpu-index`` is required (a simulated cluster file records just the
    index and the predictions); a missing prediction reads as 0, a negative one
    as 0.
    """
    raw_index = ann.get(GPU_INDEX)
    if not isinstance(raw_index, str) or len(raw_index) > 16 * _MAX_TEXT:
        return None
    read = [integer_or_none(x, GPU_INDEX_RANGE) for x in raw_index.split(",") if x.strip()]
    if None in read:
        return None
    indices = tuple(i for i in read if i is not None)
    try:
        util = float(ann.get(PREDICTED_UTIL, "0"))  # type: ignore[arg-type]
        mem = float(ann.get(PREDICTED_MEM_MIB, "0"))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    if not indices or not (math.isfinite(util) and math.isfinite(mem)):
        return None
    uuids = ann.get(GPU_UUID)
    batch = ann.get(BATCH)
    return BindOutputs(
        gpu_indices=indices,
        gpu_uuids=tuple(u for u in uuids.split(",") if u) if isinstance(uuids, str) else (),
        util_percent=max(util, 0.0), mem_mib=max(mem, 0.0),
        # Records for people only: an unreadable one is dropped, never the placement.
        cost=_float_or_none(ann.get(COST)),
        batch=integer_or_none(batch, _BATCH_RECORD) if isinstance(batch, str) else None,
        duty_cycle_ms=_float_or_none(ann.get(DUTY_CYCLE_MS)),
        source=_source_or_none(ann.get(PREDICTION_SOURCE)),
        interference_source=_source_or_none(ann.get(INTERFERENCE_SOURCE)),
    )


def decode_container_gpus(ann: Mapping[str, object]) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """``CONTAINER_GPUS`` read back (empty when absent or unreadable: a record for people)."""
    raw = ann.get(CONTAINER_GPUS)
    if not isinstance(raw, str) or len(raw) > 4096:
        return ()
    out = []
    for part in raw.split(";"):
        name, _, indices = part.partition("=")
        values = indices.split(",")
        if not name or not all(v.isascii() and v.isdigit() and len(v) <= 4 for v in values):
            return ()
        out.append((name, tuple(int(v) for v in values)))
    return tuple(out)


_BATCH_RECORD = IntRange(0, BATCH_SIZE_RANGE.high)


def _source_or_none(raw: object) -> str | None:
    return raw[:_MAX_SOURCE] if isinstance(raw, str) and raw.isprintable() and raw else None


def _float_or_none(raw: object) -> float | None:
    if not isinstance(raw, str) or len(raw) > _MAX_TEXT or not _NUMBER_TEXT.fullmatch(raw):
        return None
    value = float(raw)
    return value if math.isfinite(value) else None
