"""Benchmarks: the all-reduce sweep in nccl-tests' columns."""
