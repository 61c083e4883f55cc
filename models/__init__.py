"""Learning code: step-cost and acceptance regression, exploration, threshold derivation."""
