"""High availability: leader election on a Lease, leadership labels, graceful shutdown."""
