"""The host: facts of a node collected once into a snapshot, parsed, checked against a profile."""
