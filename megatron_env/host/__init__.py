"""The host: a node's facts collected once into a snapshot, parsed, and checked against a
profile."""
