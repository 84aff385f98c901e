"""GPU fragmentation as the arriving workload sees it (FGD, Weng et al., USENIX ATC'23).

A workload is a set of pod *shapes* ``m`` (GPUs, GPU capacity per GPU, host CPU and
memory) with weights ``p_m`` summing to 1. A node's fragmentation for shape ``m``,
``F_n(m)``, is the free GPU capacity on ``n`` that ``m`` cannot use: all of it when
``m`` cannot run there at all (CPU, memory or GPUs short), otherwise the free
capacity of each GPU with less free than ``m`` needs per GPU. A CPU-only shape uses
no GPU, so every free GPU is a fragment to it. The node's expected fragmentation is
``F_n = sum_m p_m F_n(m)``; placing a pod where ``F_n`` grows least keeps the most
capacity usable for what is likely to arrive next.

Written as what ``m`` *can* use: ``F_n = T_n - sum_m p_m [m fits on n] S_n(u_m)``,
with ``T_n`` the node's free GPU capacity and ``S_n(u)`` the free capacity on GPUs with
at least ``u`` free; ``m`` fits when the node has its CPU and memory and at least
``k_m`` GPUs with ``u_m`` free. Shapes are grouped by ``(k, u)``, so one evaluation is a
few array operations over (states x GPUs x groups) plus one (states x shapes) product.

Units are the caller's: tandem's core passes GPU memory in MiB (a pod's per-GPU
demand is its memory), the trace simulator thousandths of a GPU. Nodes are padded
to a common width with free 0, which no shape can use and which counts nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

import numpy as np

WEIGHTINGS = ("count", "volume")
"""``count``: a shape weighs as often as it arrives (FGD); ``volume``: by its GPU demand too."""


@dataclass(frozen=True)
class Shape:
    """One pod shape: ``gpus`` GPUs with ``per_gpu`` free each, ``cpu`` and ``mem`` on the host."""

    gpus: int
    per_gpu: float
    cpu: float = 0.0
    mem: float = 0.0


@dataclass(frozen=True)
class Shapes:
    """A workload's shapes with weights, grouped by (GPU count, per-GPU need).

    ``host_table[c, m, j]`` is the weight of group ``j``'s shapes needing at most the
    ``c``-th CPU and ``m``-th memory figure of the grids (index 0: less than any), so
    which shapes a node's CPU and memory admit is two binary searches and a gather.
    """

    gpus: np.ndarray
    per_gpu: np.ndarray
    cpu: np.ndarray
    mem: np.ndarray
    weight: np.ndarray
    """Sums to 1 (or all zero for an empty workload)."""
    group_gpus: np.ndarray = field(repr=False)
    group_need: np.ndarray = field(repr=False)
    group_of: np.ndarray = field(repr=False)
    """Per shape its group, -1 for CPU-only shapes."""
    cpu_grid: np.ndarray = field(repr=False)
    mem_grid: np.ndarray = field(repr=False)
    host_table: np.ndarray = field(repr=False)

    @classmethod
    def of(cls, weighted: Mapping[Shape, float], weighting: str = "count") -> Shapes:
        """Shapes from counts (``weighting`` ``volume`` multiplies by each one's GPU demand)."""
        shapes = sorted(weighted, key=lambda s: (s.gpus, s.per_gpu, s.cpu, s.mem))
        keys = sorted({(s.gpus, s.per_gpu) for s in shapes if s.gpus > 0})
        index = {k: j for j, k in enumerate(keys)}
        cpu = np.array([s.cpu for s in shapes], dtype=np.float64)
        mem = np.array([s.mem for s in shapes], dtype=np.float64)
        base = cls(gpus=np.array([s.gpus for s in shapes], dtype=np.int64),
                   per_gpu=np.array([s.per_gpu for s in shapes], dtype=np.float64),
                   cpu=cpu, mem=mem, weight=np.zeros(len(shapes)),
                   group_gpus=np.array([k for k, _ in keys], dtype=np.int64),
                   group_need=np.array([u for _, u in keys], dtype=np.float64),
                   group_of=np.array([index.get((s.gpus, s.per_gpu), -1) if s.gpus > 0 else -1
                                      for s in shapes], dtype=np.int64),
                   cpu_grid=np.unique(cpu), mem_grid=np.unique(mem),
                   host_table=np.zeros((1, 1, len(keys))))
        return base.reweighted(np.array([weighted[s] for s in shapes], dtype=np.float64),
                               weighting)

    def reweighted(self, counts: np.ndarray, weighting: str = "count") -> Shapes:
        """The same shapes with ``counts`` (one per shape, this order) as their weights."""
        if weighting not in WEIGHTINGS:
            raise ValueError(f"weighting {weighting!r} (valid: {', '.join(WEIGHTINGS)})")
        weight = counts * self.gpus * self.per_gpu if weighting == "volume" else counts
        total = weight.sum()
        weight = weight / total if total > 0 else weight
        table = np.zeros((self.cpu_grid.size + 1, self.mem_grid.size + 1,
                          self.group_need.size))
        gpu = self.group_of >= 0
        np.add.at(table, (np.searchsorted(self.cpu_grid, self.cpu[gpu]) + 1,
                          np.searchsorted(self.mem_grid, self.mem[gpu]) + 1,
                          self.group_of[gpu]), weight[gpu])
        table = table.cumsum(axis=0).cumsum(axis=1)
        return replace(self, weight=weight, host_table=table)

    @property
    def empty(self) -> bool:
        """True when no GPU shape carries weight (the term has nothing to say)."""
        return not bool(self.weight[self.group_of >= 0].any())


def host_weights(cpu: np.ndarray, mem: np.ndarray, shapes: Shapes) -> np.ndarray:
    """(states, groups): the weight of each group's shapes whose CPU and memory fit."""
    c = np.searchsorted(shapes.cpu_grid, cpu, side="right")
    m = np.searchsorted(shapes.mem_grid, mem, side="right")
    return shapes.host_table[c, m]


def gpu_usable(free: np.ndarray, shapes: Shapes) -> tuple[np.ndarray, np.ndarray]:
    """(states, groups) each: GPUs with the group's need free, and their free capacity."""
    usable = free[:, :, None] >= shapes.group_need                        # (states, GPUs, groups)
    return usable.sum(axis=1), np.einsum("sg,sgj->sj", free, usable)


def _expected(total: np.ndarray, weights: np.ndarray, count: np.ndarray, usable: np.ndarray,
              shapes: Shapes) -> np.ndarray:
    usable = np.where(count >= shapes.group_gpus, usable, 0.0)
    return total * shapes.weight.sum() - (weights * usable).sum(axis=1)


def fragmentation(free: np.ndarray, cpu: np.ndarray, mem: np.ndarray,
                  shapes: Shapes) -> np.ndarray:
    """Expected fragmentation ``F`` per state: ``free`` (states, GPUs); ``cpu``, ``mem``."""
    free = np.maximum(free, 0.0)
    if not shapes.group_need.size:
        return free.sum(axis=1) * shapes.weight.sum()
    return _expected(free.sum(axis=1), host_weights(cpu, mem, shapes),
                     *gpu_usable(free, shapes), shapes)


Pod = Shape
"""The pod being placed has a shape too: ``gpus`` GPUs of ``per_gpu`` each, ``cpu``, ``mem``."""


def placement_deltas(free: np.ndarray, fits: np.ndarray, cpu: np.ndarray, mem: np.ndarray,
                     shapes: Shapes, pod: Pod) -> np.ndarray:
    """Growth of ``F`` per (node, GPU) if ``pod`` goes there; ``inf`` where it cannot.

    ``free``/``fits`` are (nodes, GPUs): free capacity and whether the pod may use the
    GPU; ``cpu``/``mem`` each node's free host resources. A 1-GPU pod is costed per GPU;
    a pod of several GPUs takes its node's tightest fitting GPUs, and that node's
    growth is given on each of its fitting GPUs. A CPU-only pod: the node's growth on
    every GPU slot (``fits`` ignored).
    """
    nodes, width = free.shape
    out = np.full((nodes, width), np.inf)
    cpu_after, mem_after = cpu - pod.cpu, mem - pod.mem
    host_ok = (cpu_after >= 0) & (mem_after >= 0)
    if pod.gpus == 0:
        ok = np.flatnonzero(host_ok)
        before = fragmentation(free[ok], cpu[ok], mem[ok], shapes)
        after = fragmentation(free[ok], cpu_after[ok], mem_after[ok], shapes)
        out[ok] = (after - before)[:, None]
        return out
    fits = fits & host_ok[:, None]
    enough = np.flatnonzero(fits.sum(axis=1) >= pod.gpus)
    if enough.size == 0:
        return out
    if pod.gpus == 1:
        out[enough] = _one_gpu_deltas(np.maximum(free[enough], 0.0), fits[enough], cpu[enough],
                                      mem[enough], pod, shapes)
        return out
    before = fragmentation(free[enough], cpu[enough], mem[enough], shapes)
    taken = tightest(free[enough], fits[enough], pod.gpus)
    states = free[enough] - pod.per_gpu * taken
    after = fragmentation(states, cpu_after[enough], mem_after[enough], shapes)
    block = np.where(fits[enough], (after - before)[:, None], np.inf)
    out[enough] = block
    return out


def _one_gpu_deltas(free: np.ndarray, fits: np.ndarray, cpu: np.ndarray, mem: np.ndarray,
                    pod: Pod, shapes: Shapes) -> np.ndarray:
    """Growth of ``F`` per (node, GPU) for a 1-GPU pod: only the chosen GPU's free changes,
    so each candidate is its node's usable figures corrected for that one GPU."""
    out = np.full(free.shape, np.inf)
    node_of, gpu_of = np.nonzero(fits)
    need = pod.per_gpu
    if not shapes.group_need.size:
        out[node_of, gpu_of] = -need * shapes.weight.sum()
        return out
    count, usable = gpu_usable(free, shapes)
    before = _expected(free.sum(axis=1), host_weights(cpu, mem, shapes), count, usable, shapes)
    weights = host_weights(cpu - pod.cpu, mem - pod.mem, shapes)
    # GPUs of one node with equal free space give equal states: cost each once.
    free_of = free[node_of, gpu_of]
    _, first, inverse = np.unique(node_of * (free.max() + 1.0) + free_of, return_index=True,
                                  return_inverse=True)
    node, was = node_of[first], free_of[first][:, None]
    now = was - need
    was_ok, now_ok = was >= shapes.group_need, now >= shapes.group_need
    count_after = count[node] - was_ok + now_ok
    usable_after = usable[node] - was * was_ok + now * now_ok
    total_after = free.sum(axis=1)[node] - need
    after = _expected(total_after, weights[node], count_after, usable_after, shapes)
    out[node_of, gpu_of] = (after - before[node])[inverse.ravel()]
    return out


def tightest(free: np.ndarray, fits: np.ndarray, count: int) -> np.ndarray:
    """(nodes, GPUs) 0/1: each node's ``count`` fitting GPUs with least free (lower index first)."""
    order = np.argsort(np.where(fits, free, np.inf), axis=1, kind="stable")[:, :count]
    taken = np.zeros(free.shape)
    np.put_along_axis(taken, order, 1.0, axis=1)
    return taken


def padded(values: np.ndarray, owner: np.ndarray, positions: int,
           fill: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Rows grouped by ``owner`` (ascending, contiguous) as a (positions, width) matrix.

    Returns the matrix and each row's slot in it, so ``matrix[owner, slot]`` is the row.
    """
    counts = np.bincount(owner, minlength=positions)
    width = int(counts.max()) if counts.size else 0
    starts = np.r_[0, np.cumsum(counts)[:-1]]
    slot = np.arange(owner.size) - starts[owner]
    matrix = np.full((positions, width), fill, dtype=np.float64)
    matrix[owner, slot] = values
    return matrix, slot


class ShapeStats:
    """The shapes a scheduler has seen, bounded: at most ``max_shapes``, recent ones weigh more.

    Counts are halved whenever ``window`` pods have arrived since the last halving, so
    the distribution follows the workload as it changes; past ``max_shapes`` the
    lightest shape is forgotten. ``document()``/``from_document`` are its persisted form.
    """

    def __init__(self, max_shapes: int = 256, window: int = 10_000):
        if max_shapes < 1 or window < 1:
            raise ValueError("max_shapes and window must be at least 1")
        self.max_shapes, self.window = max_shapes, window
        self.counts: dict[Shape, float] = {}
        self._since_halving = 0
        self._cached: dict[str, Shapes] = {}
        self._base: Shapes | None = None
        self._order: list[Shape] = []

    def observe(self, shape: Shape) -> None:
        """Count one arrived pod of ``shape``."""
        self._cached.clear()
        self._since_halving += 1
        if self._since_halving >= self.window:
            self.counts = {s: c / 2 for s, c in self.counts.items()}
            self._since_halving = 0
        if shape not in self.counts and len(self.counts) >= self.max_shapes:
            del self.counts[min(self.counts, key=self.counts.__getitem__)]
        self.counts[shape] = self.counts.get(shape, 0.0) + 1.0

    def shapes(self, weighting: str = "count") -> Shapes:
        """The distribution now (cached until the next observation)."""
        found = self._cached.get(weighting)
        if found is None:
            if self._base is None or set(self._order) != self.counts.keys():
                self._base = Shapes.of(self.counts, weighting)
                self._order = sorted(self.counts, key=lambda s: (s.gpus, s.per_gpu, s.cpu,
                                                                  s.mem))
            counts = np.array([self.counts[s] for s in self._order], dtype=np.float64)
            found = self._cached[weighting] = self._base.reweighted(counts, weighting)
        return found

    def document(self) -> list[list[float]]:
        """``[[gpus, per_gpu, cpu, mem, count], ...]``: what persistence stores."""
        return [[s.gpus, s.per_gpu, s.cpu, s.mem, c] for s, c in self.counts.items()]

    @classmethod
    def from_document(cls, rows: Iterable[Iterable[float]], max_shapes: int = 256,
                      window: int = 10_000) -> ShapeStats:
        """Stats from ``document()`` rows; a malformed row raises ValueError."""
        stats = cls(max_shapes, window)
        for row in rows:
            gpus, per_gpu, cpu, mem, count = (float(v) for v in row)
            if gpus < 0 or gpus != int(gpus) or min(per_gpu, cpu, mem, count) < 0:
                raise ValueError(f"bad shape row {list(row)!r}")
            stats.counts[Shape(int(gpus), per_gpu, cpu, mem)] = count
        while len(stats.counts) > max_shapes:
            del stats.counts[min(stats.counts, key=stats.counts.__getitem__)]
        return stats
