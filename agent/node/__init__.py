"""The node agent: GPU sources, pod attribution, reports to the extender, session
sync, per-GPU server supervision."""
