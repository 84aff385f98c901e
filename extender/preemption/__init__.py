"""Preemption for GPU shortages, decided and carried out by the extender (docs/troubleshooting.md).

The victim choice is pure (``extender.core.preemption``); ``kube_api`` is the
API server's side (bound pods, PodDisruptionBudgets, the Eviction API, the
preemptor's ``status.nominatedNodeName``) and ``executor`` carries a choice out
and keeps the freed GPU for the preemptor.
"""
