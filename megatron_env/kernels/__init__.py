"""Kernel builds: a recipe's pinned source patched, compiled into a wheel, cached by content."""
