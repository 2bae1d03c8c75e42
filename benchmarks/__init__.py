"""Throughput benchmarks, run by hand (see docs/benchmarks.md)."""
