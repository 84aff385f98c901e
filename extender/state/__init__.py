"""What the extender holds: the placement ledger, agent reports, placement
signatures, device-plugin hand-offs."""
