"""Cluster sources: where pods and nodes come from (the kube API or a simulated
cluster file) and how binds are written."""
