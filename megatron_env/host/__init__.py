"""The host: facts of a node collected once into a snapshot, parsed, and checked against a
profile."""
