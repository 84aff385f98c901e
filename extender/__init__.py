"""kube-scheduler extender: wire protocol, cluster state, Horus cost, SLO-aware
packing, bind, queue gate and the cluster simulator.

Importing this package must stay cheap and free of Flask/Kubernetes: the agent
imports the pure planner math from ``planner``.
"""
