"""Per-GPU inference server: one executor thread, Nexus duty cycles, Olympian quanta."""
