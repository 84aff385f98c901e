"""Per-GPU hard constraints: the one implementation the extender and the simulator read.

:func:`gpu_checks` lists, for some rows of a :class:`~extender.core.table.GpuTable`,
each hard constraint as a (mask, reason) pair in precedence order, and
:func:`first_reasons` turns the list into one code per GPU (0 when it fits).
:func:`extender.core.decide.evaluate` calls them on a request's candidate rows;
the simulator's pre-filter (``lab.simulator.horus.FreeView``) calls them on
every row once per round, so the two cannot disagree.

Hard constraints, in the order they are checked per GPU (first one wins):
demand unknown for the GPU type; GPU memory smaller than the job; GPU already
serving the other workload kind; not enough free memory (``capacity`` minus the
load rule of :mod:`extender.core.cost`, ``max(reserved, fresh observed +
reserved since)``); co-location limit; for training jobs with
``min_colocation_gain_percent`` set, the co-location throughput rule below. The
SLO rules of inference sessions need the planner and live in
:mod:`extender.core.session_rules`.

**Co-location throughput rule** (tandem's default; off in the Horus policy).
Horus only *ranks* GPUs by interference cost, so once every GPU is busy it keeps
co-locating even when over-commitment makes the jobs run slower together than
one after another. With training pods on a GPU whose curve predicts each to run
``s(u) = 1 + f(u)`` times slower at cumulative utilisation ``u`` (1 when alone),
a pod spanning ``w`` GPUs moves at the pace of its slowest GPU, so the GPU
advances ``W / s(u)`` GPU-seconds of work per second, ``W`` the summed GPU
counts of its pods. A new pod of utilisation ``j`` may join only if that rate
grows by more than the margin ``g`` (the newcomer counts 1 per GPU: each of its
GPUs answers for its own share)::

    (W + 1) / s(u + j)  >  (1 + g) * W / s(u)          (idle GPUs always pass)

For two single-GPU jobs with ``g = 0`` this is the break-even ``1/s + 1/s > 1``:
co-locate only if it beats running the two in turn. Weighting by GPU count keeps
small jobs from stalling a wide gang (the simulator's production trace showed
16-GPU jobs slowed 1.8x by co-runners on one of their GPUs); pods of one job are
not linked in the table, so a gang of several pods counts per pod. The margin
absorbs prediction error (Horus's utilisation predictor has an RMSLE of 0.13)
and curve fit error. ``max_colocated_util_percent``, when set, also caps a
shared GPU's cumulative predicted utilisation, under the same reason.

A GPU that fails is rejected with the *resolvable* reason
``COLOCATION_SLOWDOWN``: the pod waits for a freed GPU instead of starting
slower. DESIGN scores utilisation instead of filtering it because a filtered pod
waits for a requeue. Here that wait is bounded: what makes the rule pass again
is a job leaving the GPU, i.e. a pod completing or being deleted, which is a
cluster event that moves pending pods back to the active queue (and
kube-scheduler retries unschedulable pods periodically anyway). Utilisation that
passes the rule is still only scored.

Every rule is monotone in the job's demand: a GPU that rejects a job rejects
every job needing at least as much memory and utilisation. The simulator's
pre-filter relies on it (``tests/lab/simulator/test_simulator_prefilter.py`` checks it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from extender.core.cost import CostPolicy, colocation_gain, curve_coefficients, effective_load
from extender.core.reasons import Reason
from extender.core.table import GpuTable

Check = tuple[np.ndarray, Reason]
"""A boolean mask over rows (or shape ``(1,)``, for all rows) and the reason it stands for."""


def colocation_rule_on(policy: CostPolicy) -> bool:
    """True when the co-location throughput rule, the utilisation cap or the share score
    judges training jobs."""
    return (policy.min_colocation_gain_percent is not None
            or policy.max_colocated_util_percent is not None
            or policy.max_share_score is not None)


@dataclass(frozen=True)
class GpuLoad:
    """What the hard constraints read about some rows of a table, under the load rule.

    ``util_now`` and ``coeffs`` are only read when ``with_util`` was asked for (the
    co-location rule or the Horus cost needs them); otherwise they are None.
    """

    capacity_mib: np.ndarray
    used_mib: np.ndarray
    free_mib: np.ndarray
    """``capacity_mib - used_mib`` (negative when observed use exceeds the capacity)."""
    pod_count: np.ndarray
    training_count: np.ndarray
    training_width: np.ndarray
    serving_count: np.ndarray
    util_now: np.ndarray | None
    coeffs: np.ndarray | None
    """Curve coefficients per row, or one shared row when the table has one GPU type."""

    @classmethod
    def read(cls, table: GpuTable, rows: np.ndarray | slice, policy: CostPolicy,
             now_seconds: float, *, with_util: bool) -> GpuLoad:
        """The load of ``rows`` (an index array, or ``slice(None)`` for every row) at a time."""
        used_mib = effective_load(table.reserved_mib[rows], table.observed_mib[rows],
                                  table.observed_at[rows], now_seconds, policy.staleness_seconds,
                                  table.since_mib[rows])
        util_now = coeffs = None
        if with_util:
            util_now = effective_load(table.reserved_util[rows], table.observed_util[rows],
                                      table.observed_at[rows], now_seconds,
                                      policy.staleness_seconds, table.since_util[rows])
            per_type = curve_coefficients(policy, table.type_names)
            # One GPU type (the usual cluster): one shared row broadcasts, without a gather.
            coeffs = per_type if len(table.type_names) <= 1 else per_type[table.type_id[rows]]
        capacity_mib = table.capacity_mib[rows]
        return cls(capacity_mib=capacity_mib, used_mib=used_mib, free_mib=capacity_mib - used_mib,
                   pod_count=table.pod_count[rows], training_count=table.training_count[rows],
                   training_width=table.training_width[rows],
                   serving_count=table.serving_count[rows], util_now=util_now, coeffs=coeffs)


def gpu_checks(load: GpuLoad, policy: CostPolicy, inferring: bool, job_util: np.ndarray,
               job_mem: np.ndarray, unknown: np.ndarray) -> list[Check]:
    """The hard constraints of a job on the rows of ``load``, in precedence order.

    ``job_util``, ``job_mem`` and ``unknown`` (demand unknown for the row's GPU type)
    have one entry per row, or shape ``(1,)`` for all rows. With the co-location rule
    on, ``load`` must have been read ``with_util``.
    """
    other = load.training_count if inferring else load.serving_count
    checks: list[Check] = [
        (unknown, Reason.DEMAND_UNKNOWN),
        (load.capacity_mib < job_mem, Reason.GPU_MEMORY_TOO_SMALL),
        (other > 0, Reason.WORKLOAD_CONFLICT),
        (load.free_mib < job_mem, Reason.INSUFFICIENT_GPU_MEMORY),
        (load.pod_count >= policy.max_pods_per_gpu, Reason.COLOCATION_LIMIT),
    ]
    if not inferring and colocation_rule_on(policy):
        assert load.util_now is not None and load.coeffs is not None, "read the load with_util"
        sharing = load.training_count
        if policy.min_colocation_gain_percent is not None:
            gain = colocation_gain(load.util_now, job_util, sharing, load.coeffs,
                                   load.training_width)
            checks.append((gain <= policy.min_colocation_gain_percent / 100.0,
                           Reason.COLOCATION_SLOWDOWN))
        if policy.max_colocated_util_percent is not None:
            over = load.util_now + job_util > policy.max_colocated_util_percent
            checks.append(((sharing > 0) & over, Reason.COLOCATION_SLOWDOWN))
    return checks


def first_reasons(checks: Sequence[Check], size: int) -> np.ndarray:
    """Per row, the code of the first check that holds (0 when none does).

    Assigned in reverse so that earlier checks overwrite later ones: one masked store
    per check instead of a test against the codes so far. A shape-(1,) mask (one GPU
    type) holds for every row or for none.
    """
    code = np.zeros(size, dtype=np.int64)
    for mask, reason in reversed(checks):
        if mask.shape == code.shape:
            code[mask] = reason.code
        elif mask.any():
            code[:] = reason.code
    return code


def passing(checks: Sequence[Check], size: int) -> np.ndarray:
    """Per row, True when no check holds: ``first_reasons(checks, size) == 0``, cheaper."""
    blocked = np.zeros(size, dtype=bool)
    for mask, _ in checks:
        blocked |= mask
    return ~blocked
