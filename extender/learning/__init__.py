"""Learning from the cluster: agent reports turned into samples, the observation
store, online curve refits."""
