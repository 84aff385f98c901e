"""Mutating admission webhook: pods adopt tandem without editing their manifests."""
