"""PyTorch's flight recorder in triage: which rank never arrived, from the per-rank dumps.

Why its own package: the dumps are a second kind of input beside the console logs, with their
own trust problem (a pickle runs code when loaded: `dump` reads it with an allow-list and never
imports torch), their own analysis (`analysis`: pure functions of the entries, per process
group, and the wait-for chain from the ranks that time out back to the one that stalled) and
their own finding (`report`: `job.hang`, fused with what the logs said).
"""
