"""CPU time of the processes in a scheduler-pattern run, read from ``/proc``: this process
(the scheduler, ``scheduler_pattern.py``'s load generator) and the servers' (the extender,
its loopback API server), so a run can say which of them used the machine's cores.

A process's utime + stime count its ended threads too (the API server's threads per
connection end when their connection closes), in clock ticks (10 ms on Linux): summed over
many windows of a few tens of milliseconds the rounding averages out."""

from __future__ import annotations

import os
import resource
from collections.abc import Mapping

TICK_SECONDS = 1.0 / os.sysconf("SC_CLK_TCK")
SCHEDULER = "scheduler"


def process_cpu_seconds(pid: int) -> float:
    """utime + stime of process ``pid`` (every thread, ended ones included), in seconds."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) * TICK_SECONDS


class CpuMeter:
    """This process's CPU time beside each named server process's, read together."""

    def __init__(self, pids: Mapping[str, int]):
        self.pids = dict(pids)

    def read(self) -> dict[str, float]:
        """Seconds of CPU so far: ``scheduler`` (this process) and each named process."""
        own = resource.getrusage(resource.RUSAGE_SELF)
        out = {SCHEDULER: own.ru_utime + own.ru_stime}
        out.update({name: process_cpu_seconds(pid) for name, pid in self.pids.items()})
        return out


class Windows:
    """CPU time by process and wall time summed over measured windows (the bursts)."""

    def __init__(self, meter: CpuMeter):
        self.meter, self.wall, self.count = meter, 0.0, 0
        self.cpu: dict[str, float] = {}

    def add(self, wall: float, before: Mapping[str, float], after: Mapping[str, float]) -> None:
        """One window: its wall seconds and the meter's readings at its two ends."""
        self.wall += wall
        self.count += 1
        for name, value in after.items():
            self.cpu[name] = self.cpu.get(name, 0.0) + value - before[name]

    def summary(self) -> dict[str, object]:
        """Per window, ms of wall and of CPU by process; each process's cores busy (CPU over
        wall: one interpreter lock holds a Python process under 1 core), and all together."""
        if not self.count or self.wall <= 0:
            return {}
        return {"windows": self.count, "wall_ms": round(1000 * self.wall / self.count, 2),
                "cpu_ms": {k: round(1000 * v / self.count, 2) for k, v in self.cpu.items()},
                "cores_busy": {**{k: round(v / self.wall, 2) for k, v in self.cpu.items()},
                               "all": round(sum(self.cpu.values()) / self.wall, 2)}}
