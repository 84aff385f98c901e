"""Node agent (NVML metrics, pod attribution, reporting) and the per-GPU inference
server (Nexus duty cycles, Olympian quanta)."""
