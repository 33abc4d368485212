"""Megatron-LM itself, and the standalone programs of scripts/ run in its environment."""
