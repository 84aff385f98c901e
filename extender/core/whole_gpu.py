"""A training pod that names no model: the cold-start rule without a prediction.

A pod written for ``nvidia.com/gpu`` (what the webhook's translation gives) or one
that states only ``tandem.io/gpu-mem-mib`` has nothing to predict from. It is
counted at what it asserts, the cold-start utilisation for the rest, and, when it
states no memory either, its GPU's whole memory (``mem:whole-gpu``), so nothing
shares the GPU with it, as ``nvidia.com/gpu`` would have given it. Pure: no I/O.
"""

from __future__ import annotations

COLD_START = "cold-start"
WHOLE_GPU = "whole-gpu"
"""Memory source of a pod that states neither model nor memory: its GPU's whole memory."""
IDLE_ALLOWANCE_MIB = 1024.0
"""What a GPU running nothing may show in use (driver, ECC, an idle context): left out of
the whole-GPU memory so that an idle GPU fits it (at most half the GPU's memory)."""


def modelless_numbers(util_percent: float | None, mem_mib: float | None,
                      cold_start_util_percent: float, gpu_mib: float | None,
                      ) -> tuple[float, float, str] | None:
    """``(util, mem, source)`` of such a pod on a GPU type of ``gpu_mib`` (its smallest GPU;
    None: unknown), or None when the pod states no memory and the GPU's is unknown."""
    util, util_source = (util_percent, "asserted") if util_percent is not None \
        else (cold_start_util_percent, COLD_START)
    if mem_mib is not None:
        return util, mem_mib, f"{util_source}+mem:asserted"
    if gpu_mib is None:
        return None
    return util, max(gpu_mib - IDLE_ALLOWANCE_MIB, gpu_mib / 2), f"{util_source}+mem:{WHOLE_GPU}"
