"""Pinned sources: git repositories by commit through cached mirrors, and patch series."""
