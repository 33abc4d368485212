"""Many nodes: preflight through srun, fingerprints, and the fleet's verdict on each node."""
