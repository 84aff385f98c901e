"""A pod's GPU demand: parsed from its annotations, then resolved per GPU type.

Parsing (:func:`parse_demand`) is strict and reports the offending field, so a
typo in ``tandem.io/gpu-util`` is an error the user sees, never a silent default.
The annotation keys, their ranges and the parser are the shared contract in
:mod:`contracts.annotations` (the node agent and the inference server accept
exactly what passes here); this module adds the GPU count and the extender's
policy.

Resolution (:func:`resolve_demand`) turns the parsed request into per-GPU-type
utilisation and memory: user-asserted values win; otherwise the injected
``predict`` callable (the predictor facade behind a small adapter) is asked for
``tandem.io/model`` at its batch size; inference memory comes from the batching
profile of the model on that GPU type. A type whose demand cannot be determined
is a *gap* with a reason, and its GPUs are rejected as ``DEMAND_UNKNOWN``.

Utilisation of a training pod, per GPU type, is taken in this order (its source
in brackets, as ``tandem.io/prediction-source`` records it): the asserted
``tandem.io/gpu-util`` (``asserted``); what the agents observed of this model at
this batch size on this GPU type, once there are at least ``min_observations``
samples (``observed:<n>``); the trained XGBoost model (``xgboost:<digest>``), times
the bias learned where it was observed (``prior-corrected:<n>``, the model's other
GPU types or several other models: :mod:`extender.learning.bias`), raised to
what the pod was observed to use while sharing a GPU when that is more
(``observed-shared:<n>``: a job that shares cannot use more of the GPU
than it would alone, so the shared figure is a floor; it corrects a prediction
that is too low even where the pod never runs alone);
else the **cold-start rule**: the pod counts as using the whole GPU
(``cold_start_util_percent``, default 100) until it has been observed
(``cold-start``); a pod naming no model, by :mod:`extender.core.whole_gpu`. Memory
needs no trained model (Horus Eq. 2 from the ONNX graph), so a model the predictor can
read is never a gap for want of training.
The source string is ``<utilisation source>+mem:<memory source>``, or just
``asserted`` when both numbers were asserted.

Inference pods come in two kinds. With ``tandem.io/slo-ms`` and
``tandem.io/rate-rps`` they are SLO sessions (duty-cycle slots). An SLO session
whose model has no batching profile for a GPU type is placed under the
**session cold-start rule** (``cold-start+profile:server``): only on an idle GPU,
alone, counted as the whole GPU, with the asserted ``tandem.io/gpu-mem-mib`` (else
the predictor's memory); the inference server measures its profile when the
session registers, and nothing else shares that GPU until a profile is
configured. With neither
they are best-effort sessions (batch inference) that share the duty cycle's slack
in quanta by ``tandem.io/weight`` (default 1) or ``tandem.io/priority`` (an
integer; both in the ranges the inference server's quanta honour). A best-effort
session's memory is the asserted ``tandem.io/gpu-mem-mib``, else its batching
profile's, else the predictor's; its utilisation is the asserted or predicted
one, else 100% (a batch job takes all the slack it is given).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from contracts.annotations import (
    GPU_COUNT_RANGE,
    GPU_RESOURCE,
    AnnotationError,
    PodInputs,
    parse_inputs,
    parse_integer,
)
from contracts.pod import PodView
from contracts.resources import containers_requests
from extender.core.profile_index import ProfileIndex, profile_keys  # noqa: F401 - re-exported
from extender.core.snapshot import SessionSpec, Workload
from extender.core.whole_gpu import COLD_START, modelless_numbers

DemandError = AnnotationError  # the pod's request cannot be understood; ``field`` names it


class DemandUnavailable(Exception):
    """The predictor could not give a demand (rejected model, no trained model)."""

    def __init__(self, kind: str, detail: str):
        self.kind = kind
        self.detail = detail
        super().__init__(f"{kind}: {detail}")


class PredictFn(Protocol):
    """``(model_ref, batch_size, gpu_type, workload) -> (util_percent, mem_mib, source)``.

    ``util_percent`` is None when only the memory is known (no trained model).
    """

    def __call__(
        self, model_ref: str, batch_size: int, gpu_type: str, workload: str
    ) -> tuple[float | None, float, str]: ...


class ObservedFn(Protocol):
    """``(model_ref, batch_size, gpu_type, workload) -> (util_percent, samples)`` or None."""

    def __call__(self, model_ref: str, batch_size: int, gpu_type: str, workload: str
                 ) -> tuple[float, int] | None: ...


class CorrectedFn(Protocol):
    """``(model, batch, gpu_type, workload, predicted) -> (util, estimates used)`` or None."""

    def __call__(self, model_ref: str, batch_size: int, gpu_type: str, workload: str,
                 predicted: float) -> tuple[float, int] | None: ...


@dataclass(frozen=True)
class UtilKnowledge:
    """What resolution knows beyond the predictor: observations and the cold-start rule."""

    observed: ObservedFn | None = None
    min_observations: int = 5
    """Samples an observed estimate needs before it replaces the prediction (>= 1)."""
    cold_start_util_percent: float = 100.0
    """Utilisation assumed for a model nobody has measured or predicted (0..100]."""
    shared_floor: ObservedFn | None = None
    """Per-process utilisation observed while sharing a GPU: a floor of the alone one."""
    prior_corrected: CorrectedFn | None = None
    """The prediction corrected by the bias learned where it was observed (or None)."""
    whole_gpu_mib: Callable[[str], float | None] = lambda gpu_type: None
    """A GPU type's memory (its smallest GPU), for pods stating neither model nor memory."""


OBSERVED_SHARED = "observed-shared"
PRIOR_CORRECTED = "prior-corrected"
"""A prediction times the bias learned on observed keys (``extender.learning.bias``)."""
"""A prediction raised to the utilisation observed while sharing (a floor of the alone one)."""
SESSION_COLD_START = "cold-start+profile:server"
"""An SLO session with no batching profile for the GPU type (placed alone, measured there)."""


@dataclass(frozen=True)
class PodRef:
    """Identity of a pod on the wire and in the ledger."""

    namespace: str
    name: str
    uid: str

    @property
    def key(self) -> str:
        """``namespace/name`` for logs and tables."""
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class JobDemand:
    """What a pod asks for: its GPU count and its ``tandem.io/*`` inputs.

    The inputs are the shared contract's own value (:class:`PodInputs`), so the field
    list and the best-effort rule live once; this class adds the GPU count and the
    extender's reading of the inputs (the workload as an enum, the batch size defaulted).
    """

    gpu_count: int
    inputs: PodInputs = PodInputs()
    host: tuple[float, float] = (0.0, 0.0)
    """The pod's CPU (millicores) and memory (MiB) requests (the packing score's host terms)."""
    progress: bool = False
    """The pod names a readable ``tandem.io/progress`` counter (``PodView.reports_progress``):
    learned pair figures place only such pods; one without is judged by the memory rules
    and the curve (:mod:`extender.core.pair_cost`)."""

    @property
    def workload(self) -> Workload:
        """The pod's workload kind."""
        return Workload(self.inputs.workload)

    @property
    def batch_size(self) -> int:
        """The asserted batch size, else the workload's default."""
        return self.inputs.batch

    @property
    def best_effort(self) -> bool:
        """An inference pod without an SLO: it shares the duty cycle's slack."""
        return self.inputs.best_effort

    @property
    def share_weight(self) -> int:
        """Weight used to spread best-effort sessions (priority sessions count 1)."""
        return self.inputs.share_weight


@dataclass(frozen=True)
class TypeDemand:
    """Per-GPU demand of a job on one GPU type, and where the numbers came from."""

    util_percent: float
    mem_mib: float
    source: str


@dataclass(frozen=True)
class ResolvedDemand:
    """A job's demand per GPU type; ``gaps`` maps types with no answer to the reason."""

    job: JobDemand
    by_type: Mapping[str, TypeDemand] = field(default_factory=dict)
    gaps: Mapping[str, str] = field(default_factory=dict)
    session: SessionSpec | None = None

    def for_type(self, gpu_type: str) -> TypeDemand | None:
        """The demand on ``gpu_type``, or None when it is a gap."""
        return self.by_type.get(gpu_type)


def _raise(problem: tuple[str, Any, str] | None) -> None:
    if problem is not None:
        raise DemandError(*problem)


def pod_ref(pod: Mapping[str, Any] | PodView) -> PodRef:
    """Namespace, name and uid of a Pod object (decoded JSON, or its ``PodView``)."""
    view = PodView.of(pod)
    _raise(view.problem("Pod.metadata", "Pod.metadata.name", "Pod.metadata.namespace/uid"))
    return PodRef(view.namespace, view.name, view.uid)


def annotations_of(pod: Mapping[str, Any] | PodView) -> Mapping[str, Any]:
    """The pod's annotations (empty when absent); raises DemandError on a wrong type."""
    view = PodView.of(pod)
    _raise(view.problem("Pod.metadata.annotations"))
    return view.annotations


def container_gpu_counts(pod: Mapping[str, Any] | PodView,
                         ) -> tuple[tuple[str, int, bool], ...]:
    """(container name, ``tandem.io/gpu`` count, init container?) of every container asking
    for GPUs, in the kubelet's admission order (init containers first); DemandError if the
    pod is malformed (``parse_demand`` has refused such a pod already)."""
    view = _containers_readable(PodView.of(pod))
    return tuple((c.name, n, c.init) for c, n in zip(view.containers, _per_container(view),
                                                    strict=True) if n > 0)


def _containers_readable(view: PodView) -> PodView:
    _raise(view.problem("Pod.spec"))
    _raise(view.problem("Pod.spec.containers", "Pod.spec.initContainers"))
    return view


def _per_container(view: PodView) -> list[int]:
    """Each container's ``tandem.io/gpu`` count (limits or requests, the larger)."""
    return [max((_quantity(v, c.path) for v in c.gpu_values), default=0)
            for c in view.containers]


def gpu_count_of(pod: Mapping[str, Any] | PodView) -> int:
    """GPUs requested via ``tandem.io/gpu`` (sum over containers; init containers: max)."""
    view = _containers_readable(PodView.of(pod))
    counts = _per_container(view)
    total = max(sum(n for c, n in zip(view.containers, counts, strict=True) if not c.init),
                max((n for c, n in zip(view.containers, counts, strict=True) if c.init),
                    default=0))
    if total <= 0:
        raise DemandError(f"resources[{GPU_RESOURCE}]", 0, "the pod requests no tandem.io/gpu")
    return total


def _quantity(value: object, path: str) -> int:
    return parse_integer(value, path, GPU_COUNT_RANGE)  # a whole number of GPUs


def parse_demand(pod: Mapping[str, Any] | PodView) -> JobDemand:
    """Read a Pod's GPU count and ``tandem.io/*`` annotations; raises DemandError."""
    pod = PodView.of(pod)
    inputs = parse_inputs(annotations_of(pod))
    workload = Workload(inputs.workload)
    # The default batch size is stored, so a pod that asserts it reads the same as one
    # that leaves it out.
    inputs = replace(inputs, batch_size=inputs.batch)
    job = JobDemand(gpu_count_of(pod), inputs,
                    containers_requests((c.init, c.resources) for c in pod.containers),
                    pod.reports_progress)
    if workload is Workload.INFERENCE and job.gpu_count != 1:
        raise DemandError(GPU_RESOURCE, job.gpu_count, "an inference session takes 1 GPU")
    return job


def resolve_demand(
    job: JobDemand,
    gpu_types: Iterable[str],
    predict: PredictFn | None,
    profiles: Mapping[tuple[str, str], Any] | None = None,
    session_name: str = "",
    knowledge: UtilKnowledge | None = None,
) -> ResolvedDemand:
    """Per-type demand for every type in ``gpu_types``; failures become gaps."""
    by_type: dict[str, TypeDemand] = {}
    gaps: dict[str, str] = {}
    for gpu_type in sorted(set(gpu_types)):
        try:
            by_type[gpu_type] = _one_type(job, gpu_type, predict, profiles or {},
                                          knowledge or UtilKnowledge())
        except DemandUnavailable as exc:
            gaps[gpu_type] = str(exc)
    session = None
    ask = job.inputs
    if job.workload is Workload.INFERENCE and ask.model and ask.slo_ms and ask.rate_rps:
        session = SessionSpec(session_name, ask.model, ask.slo_ms, ask.rate_rps)
    return ResolvedDemand(job, by_type, gaps, session)


def _one_type(
    job: JobDemand, gpu_type: str, predict: PredictFn | None,
    profiles: Mapping[tuple[str, str], Any], knowledge: UtilKnowledge,
) -> TypeDemand:
    ask = job.inputs
    if job.workload is Workload.INFERENCE:
        assert ask.model is not None
        profile = next((profiles[(k, gpu_type)] for k in profile_keys(ask.model)
                        if (k, gpu_type) in profiles), None)
        if job.best_effort:
            return _best_effort_type(job, gpu_type, profile, predict, knowledge)
        if profile is None:
            return _cold_session_type(job, gpu_type, predict)
        mem = ask.mem_mib if ask.mem_mib is not None else float(profile.memory_mib)
        return TypeDemand(0.0, mem, "profile")
    if ask.util_percent is not None and ask.mem_mib is not None:
        return TypeDemand(ask.util_percent, ask.mem_mib, "asserted")
    if ask.model is None:
        numbers = modelless_numbers(ask.util_percent, ask.mem_mib,
                                    knowledge.cold_start_util_percent,
                                    knowledge.whole_gpu_mib(gpu_type))
        if numbers is None:
            raise DemandUnavailable("no-memory", "give tandem.io/gpu-mem-mib or tandem.io/model")
        return TypeDemand(*numbers)
    if predict is None:
        raise DemandUnavailable("no-predictor", "no predictor is configured for tandem.io/model")
    util, mem, source = predict(ask.model, job.batch_size, gpu_type, job.workload.value)
    util_source, _, mem_source = source.partition("+mem:")
    mem_source = mem_source or source
    predicted = util is not None
    if ask.util_percent is not None:
        util, util_source = ask.util_percent, "asserted"
    else:
        seen = knowledge.observed(ask.model, job.batch_size, gpu_type, job.workload.value) \
            if knowledge.observed is not None else None
        fixed = knowledge.prior_corrected(ask.model, job.batch_size, gpu_type,  # records it
                                          job.workload.value, util) \
            if knowledge.prior_corrected is not None and util is not None else None
        if seen is not None and seen[1] >= knowledge.min_observations:
            util, util_source = seen[0], f"observed:{seen[1]}"
        elif util is None:
            util, util_source = knowledge.cold_start_util_percent, COLD_START
        else:
            util_source = ""  # the predictor's own, already in ``source``
            if fixed is not None:
                util, util_source = fixed[0], f"{PRIOR_CORRECTED}:{fixed[1]}"
            floor = knowledge.shared_floor(ask.model, job.batch_size, gpu_type,
                                           job.workload.value) \
                if knowledge.shared_floor is not None else None
            if floor is not None and floor[1] >= knowledge.min_observations \
                    and floor[0] > util:
                util, util_source = floor[0], f"{OBSERVED_SHARED}:{floor[1]}"
    if ask.mem_mib is not None:
        mem, mem_source = ask.mem_mib, "asserted"
    composed = source if predicted and not util_source and ask.mem_mib is None else \
        f"{util_source or source.partition('+mem:')[0]}+mem:{mem_source}"
    return TypeDemand(float(util), float(mem), composed)


def _cold_session_type(job: JobDemand, gpu_type: str, predict: PredictFn | None) -> TypeDemand:
    """An SLO session without a batching profile: the cold-start rule (module doc).

    It may take only an idle GPU, alone, as the whole GPU; the inference server
    measures its profile when it registers. Its memory must still be known."""
    ask = job.inputs
    assert ask.model is not None
    if ask.mem_mib is not None:
        return TypeDemand(100.0, ask.mem_mib, SESSION_COLD_START)
    if predict is None:
        raise DemandUnavailable("no-profile", f"no batching profile for {ask.model} and no "
                                "tandem.io/gpu-mem-mib to place it under the cold-start rule")
    _, mem, _ = predict(ask.model, job.batch_size, gpu_type, job.workload.value)
    return TypeDemand(100.0, float(mem), SESSION_COLD_START)


def _best_effort_type(job: JobDemand, gpu_type: str, profile: Any,
                      predict: PredictFn | None, knowledge: UtilKnowledge) -> TypeDemand:
    """Memory: asserted, else profile, else predicted. Utilisation: asserted, else a
    trustworthy observed estimate of the model's inference on this GPU type
    (``observed:<n>``), else predicted, else 100 (a batch job is greedy: quanta give it
    the slack, never more)."""
    ask = job.inputs
    assert ask.model is not None
    mem = ask.mem_mib if ask.mem_mib is not None else (
        float(profile.memory_mib) if profile is not None else None)
    known = "asserted" if ask.mem_mib is not None else "profile"
    seen = knowledge.observed(ask.model, job.batch_size, gpu_type, job.workload.value) \
        if knowledge.observed is not None and ask.util_percent is None else None
    if seen is not None and seen[1] >= knowledge.min_observations:
        observed = f"observed:{seen[1]}"
        if mem is not None:
            return TypeDemand(seen[0], mem, f"{observed}+mem:{known}")
        if predict is None:
            raise DemandUnavailable("no-profile", f"no batching profile, predictor or "
                                    f"tandem.io/gpu-mem-mib for {ask.model}")
        _, predicted_mem, source = predict(ask.model, job.batch_size, gpu_type,
                                           job.workload.value)
        return TypeDemand(seen[0], float(predicted_mem),
                          f"{observed}+mem:{source.partition('+mem:')[2] or source}")
    greedy = ask.util_percent if ask.util_percent is not None else 100.0
    if mem is not None and (ask.util_percent is not None or predict is None):
        return TypeDemand(greedy, mem, known)
    if predict is None:
        raise DemandUnavailable("no-profile", f"no batching profile, predictor or "
                                f"tandem.io/gpu-mem-mib for {ask.model}")
    try:
        util, predicted_mem, source = predict(ask.model, job.batch_size, gpu_type,
                                              job.workload.value)
    except DemandUnavailable:
        if mem is None:
            raise
        return TypeDemand(greedy, mem, known)
    if util is None and ask.util_percent is None:  # memory-only prediction: greedy, as above
        util = 100.0
        source = f"{COLD_START}+mem:{source.partition('+mem:')[2] or source}"
    return TypeDemand(ask.util_percent if ask.util_percent is not None else float(util),
                      mem if mem is not None else float(predicted_mem), source)
