"""`invoke setup`: the chain of steps from a bare node to a verified environment."""
