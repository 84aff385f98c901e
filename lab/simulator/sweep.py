"""``tandem simulate --sweep``: grid search over the extender's weights and limits.

Each setting runs the ``tandem`` policy (extender core + weighted-fair queue) on
the same trace; settings are ranked by makespan, then mean wait, then their
position in the grid (stable). The best one is written as a snippet of the
extender's YAML configuration (``cost.w_mem``, ``cost.w_util``,
``limits.max_pods_per_gpu``, ``limits.min_colocation_gain_percent``,
``limits.max_colocated_util_percent``; ``off`` in a grid stands for ``null``,
the rule switched off), checked by :func:`extender.config.schema.build_config`
before it is returned. Queue settings (``k``, ``beta``, ``starvation_seconds``)
go to the ``queue:`` section; ``enabled`` is left out so that pasting a snippet
never switches the gate on.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from extender.core import CostPolicy
from extender.core.snapshot import NodeSpec
from extender.queue.fair import QueueConfig
from lab.simulator.engine import EngineConfig
from lab.simulator.jobs import SimJob
from lab.simulator.metrics import SimulationResult
from lab.simulator.policies import PolicyOptions
from lab.simulator.runner import simulate

Value = float | None
"""A grid value; None switches an optional rule off (``off`` on the command line)."""

DEFAULT_GRID: dict[str, tuple[Value, ...]] = {
    "w_mem": (0.5, 1.0, 2.0),
    "w_util": (1.0, 2.0, 4.0),
    "max_pods_per_gpu": (2, 3, 8),
}
"""27 points (docs/tuning.md); the co-location rule keys join with ``--grid``."""
OPTIONAL_KEYS = ("min_colocation_gain_percent", "max_colocated_util_percent")
COST_KEYS = ("w_mem", "w_util", "max_pods_per_gpu", *OPTIONAL_KEYS)
QUEUE_KEYS = ("k", "beta")
MAX_SETTINGS = 200
"""Bound on grid size, so a typo cannot start a day-long sweep."""


class SweepError(ValueError):
    """A grid specification is malformed."""


@dataclass(frozen=True)
class SweepRow:
    """One setting and its result."""

    setting: Mapping[str, Value]
    result: SimulationResult


def _value(key: str, text: str) -> Value:
    if text.strip().lower() == "off" and key in OPTIONAL_KEYS:
        return None
    return float(text)


def grid_size(grid: Mapping[str, Sequence[Value]]) -> int:
    """Number of settings in the grid (the product of its value counts)."""
    size = 1
    for values in grid.values():
        size *= len(values)
    return size


def parse_grid(text: str | None) -> dict[str, tuple[Value, ...]]:
    """``"w_util=1,2;min_colocation_gain_percent=off,10"`` -> grid (other keys: defaults)."""
    if not text:
        return dict(DEFAULT_GRID)
    grid: dict[str, tuple[Value, ...]] = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        key, sep, values = part.partition("=")
        key = key.strip()
        if not sep or key not in (*COST_KEYS, *QUEUE_KEYS):
            raise SweepError(f"{part!r}: expected KEY=V1,V2 with KEY in "
                             f"{', '.join((*COST_KEYS, *QUEUE_KEYS))}")
        try:
            grid[key] = tuple(_value(key, v) for v in values.split(",") if v.strip())
        except ValueError:
            extra = " (or off)" if key in OPTIONAL_KEYS else ""
            raise SweepError(f"{part!r}: values must be numbers{extra}") from None
        if not grid[key]:
            raise SweepError(f"{part!r}: no values")
    size = grid_size(grid)
    if size > MAX_SETTINGS:
        raise SweepError(f"the grid has {size} settings (at most {MAX_SETTINGS})")
    return grid


def _cost_value(key: str, value: Value) -> int | float | None:
    if value is None:
        return None
    return int(value) if key == "max_pods_per_gpu" else float(value)


def _options(base_cost: CostPolicy, base_queue: QueueConfig,
             setting: Mapping[str, Value]) -> PolicyOptions:
    cost = replace(base_cost, **{k: _cost_value(k, v) for k, v in setting.items()
                                 if k in COST_KEYS})
    queue = replace(base_queue, **{k: int(v) for k, v in setting.items()
                                   if k in QUEUE_KEYS and v is not None})
    return PolicyOptions(cost=cost, queue=queue)


def run_sweep(jobs: Sequence[SimJob], nodes: Sequence[NodeSpec], base_cost: CostPolicy,
              base_queue: QueueConfig, grid: Mapping[str, Sequence[Value]],
              config: EngineConfig | None = None,
              on_setting: Callable[[], None] | None = None) -> list[SweepRow]:
    """Every setting of ``grid`` (cartesian product), best first; ``on_setting`` after each."""
    keys = list(grid)
    rows = []
    for values in itertools.product(*(grid[k] for k in keys)):
        setting = dict(zip(keys, values, strict=True))
        options = _options(base_cost, base_queue, setting)
        rows.append(SweepRow(setting, simulate(jobs, nodes, "tandem", options, config)))
        if on_setting is not None:
            on_setting()
    order = sorted(range(len(rows)), key=lambda i: (rows[i].result.makespan_s,
                                                    rows[i].result.avg_wait_s, i))
    return [rows[i] for i in order]


def best_snippet(row: SweepRow, base_cost: CostPolicy, base_queue: QueueConfig,
                 label: str) -> str:
    """The best setting as extender config YAML (validated by the extender's own loader)."""
    import yaml

    from extender.config.schema import build_config

    options = _options(base_cost, base_queue, row.setting)
    assert options.cost is not None and options.queue is not None
    doc = {"cost": {"w_mem": options.cost.w_mem, "w_util": options.cost.w_util},
           "limits": {"max_pods_per_gpu": options.cost.max_pods_per_gpu,
                      "min_colocation_gain_percent": options.cost.min_colocation_gain_percent,
                      "max_colocated_util_percent": options.cost.max_colocated_util_percent},
           "queue": {"k": options.queue.k, "beta": options.queue.beta,
                     "starvation_seconds": options.queue.starvation_seconds}}
    build_config(doc)  # raises ConfigError if the keys ever drift from the extender's schema
    r = row.result
    header = (f"# tandem simulate --sweep on {label}: best of the grid by makespan\n"
              f"# makespan_s={r.makespan_s:.0f} avg_wait_s={r.avg_wait_s:.0f} "
              f"avg_gpu_util={r.avg_gpu_util:.1f} avg_jct_s={r.avg_jct_s:.0f} "
              f"avg_run_s={r.avg_run_s:.0f}\n")
    return header + yaml.safe_dump(doc, sort_keys=False)
