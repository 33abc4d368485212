"""Python environments: hashed locks, the environment built from them, its manifest and audit."""
