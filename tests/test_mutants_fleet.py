"""Edges of the fleet code that the mutation sample (bench/mutation_sample.py) found unguarded:
each test names what a broken copy got away with."""

import sys
from pathlib import Path

import pytest

from megatron_env import profile
from megatron_env.fleet import fingerprint


def test_the_fingerprint_carries_the_interpreters_torch_cuda_nccl_and_cudnn():
    """A fingerprint without cuDNN (one name dropped from the four it copies from the probe)
    let two nodes with different cuDNN builds look the same to the fleet's drift check."""
    pytest.importorskip("torch")
    python = Path(sys.executable)
    doc = fingerprint.collect(profile.load("core_v0.19.0-cu130"), python)
    # the tests' torch is a CUDA build: it names all four (one probe of it, in a child)
    assert all(doc.get(k) for k in ("torch", "torch_cuda", "nccl", "cudnn")), doc
